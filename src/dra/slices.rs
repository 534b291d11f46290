//! What a GPU driver's ResourceSlices say about each node: how many GPUs, their addressing
//! mode (NVIDIA's driver publishes `addressingMode`: `ATS`, `HMM` or `None`, and omits it
//! where the GPU cannot say), product and memory. A second witness beside the agent's report.
//!
//! Slices are written by the driver, not by this project: what does not read (an unknown mode,
//! a capacity that is not a quantity, more devices than any node has) is set aside with a
//! reason and never changes what other slices or nodes say.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::cluster::tolerant::Tolerant;

use super::api::{Device, ResourceSlice};
use offload_api::report::{AddressingMode, NodeMemoryModel};
use offload_api::text::bounded;

/// Most devices of one driver counted on one node: past this the slices are not believed
/// (a node has at most a few dozen GPUs; the API allows 128 devices a slice, any number of
/// slices).
pub const MAX_DEVICES_PER_NODE: u64 = 256;

/// What the driver's slices say about one node's GPUs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverWitness {
    /// The driver that published them.
    pub driver: String,
    /// Full GPUs (devices of type `gpu`, or without a type); MIG and other devices are not
    /// counted.
    pub gpus: u64,
    /// GPUs by the addressing mode the driver publishes for them.
    pub modes: BTreeMap<&'static str, u64>,
    /// GPUs without an addressing mode (older driver, or the GPU cannot say).
    pub without_mode: u64,
    /// Memory of the smallest GPU, bytes, where the driver states it.
    pub gpu_memory: Option<u64>,
    /// Product names (`NVIDIA GH200 480GB`).
    pub products: BTreeSet<String>,
    /// GPUs whose addressing mode does not read.
    pub unreadable_modes: u64,
    /// What could not be read, each with the device it concerns.
    pub problems: Vec<String>,
    /// A figure no GPU can have (memory beyond any GPU of its product): the slices are not
    /// believed.
    pub impossible: Option<String>,
}

/// The driver's word on a node's addressing mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverSays {
    /// Every GPU has this mode.
    All(AddressingMode),
    /// GPUs differ (or some have none, or one could not be read): no single mode.
    Mixed,
    /// No GPU has the attribute: the driver does not say.
    Nothing,
}

impl DriverWitness {
    /// The node's addressing mode in the driver's words.
    pub fn says(&self) -> DriverSays {
        if self.gpus == 0 || (self.modes.is_empty() && self.unreadable_modes == 0) {
            return DriverSays::Nothing;
        }
        match (self.modes.len(), self.without_mode, self.unreadable_modes) {
            (1, 0, 0) => match self.modes.keys().next().copied() {
                Some("ATS") => DriverSays::All(AddressingMode::Ats),
                Some("HMM") => DriverSays::All(AddressingMode::Hmm),
                Some("None") => DriverSays::All(AddressingMode::None),
                _ => DriverSays::Mixed,
            },
            _ => DriverSays::Mixed,
        }
    }

    /// The memory model the driver's word gives, where it gives one: ATS is coherent (ATS
    /// exists only over NVLink-C2C), HMM and None are discrete.
    pub fn memory_model(&self) -> Option<NodeMemoryModel> {
        match self.says() {
            DriverSays::All(AddressingMode::Ats) => Some(NodeMemoryModel::Coherent),
            DriverSays::All(AddressingMode::Hmm) => Some(NodeMemoryModel::Hmm),
            DriverSays::All(_) => Some(NodeMemoryModel::Discrete),
            DriverSays::Mixed | DriverSays::Nothing => None,
        }
    }

    /// The word in a sentence: `ATS on 8 GPUs`, `HMM on 4 and ATS on 4 GPUs`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .modes
            .iter()
            .map(|(mode, n)| format!("{mode} on {n}"))
            .collect();
        if self.without_mode > 0 {
            parts.push(format!("no addressing mode on {}", self.without_mode));
        }
        if self.unreadable_modes > 0 {
            parts.push(format!(
                "an unreadable addressing mode on {}",
                self.unreadable_modes
            ));
        }
        let gpus = if self.gpus == 1 { "GPU" } else { "GPUs" };
        format!("{} {gpus}", parts.join(" and "))
    }
}

/// The value of a device attribute of the driver: unqualified, or qualified with the driver's
/// own domain.
fn attribute<'d>(
    device: &'d Device,
    driver: &str,
    name: &str,
) -> Option<&'d super::api::DeviceAttribute> {
    device
        .attributes
        .get(name)
        .or_else(|| device.attributes.get(&format!("{driver}/{name}")))
}

/// Witnesses per node name from every cached slice of `driver`. Slices of other drivers, of
/// several nodes (no `nodeName`) and ones that do not deserialize are skipped; of a pool whose
/// slices have different generations only the newest generation counts (the driver is
/// replacing the older).
pub fn witnesses(
    slices: &[Arc<Tolerant<ResourceSlice>>],
    driver: &str,
) -> BTreeMap<String, DriverWitness> {
    // Newest generation per (node, pool).
    let mine: Vec<&ResourceSlice> = slices
        .iter()
        .filter_map(|s| s.0.as_ref().ok())
        .filter(|s| s.spec.driver == driver && s.spec.node_name.is_some())
        .collect();
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for s in &mine {
        let (node, pool, generation) = key(s);
        let g = newest.entry((node, pool)).or_insert(generation);
        *g = (*g).max(generation);
    }
    let mut out: BTreeMap<String, DriverWitness> = BTreeMap::new();
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    for s in mine {
        let (node, pool, generation) = key(s);
        if newest.get(&(node, pool)) != Some(&generation) {
            continue;
        }
        let w = out
            .entry(node.to_string())
            .or_insert_with(|| DriverWitness {
                driver: driver.to_string(),
                ..DriverWitness::default()
            });
        for device in &s.spec.devices {
            // A device listed twice in a pool counts once.
            if !seen.insert((node.to_string(), pool.to_string(), device.name.clone())) {
                continue;
            }
            add_device(w, device, driver);
        }
    }
    for w in out.values_mut() {
        if let Some(why) = w.impossible.take() {
            *w = DriverWitness {
                driver: driver.to_string(),
                problems: vec![format!("{why}: not believed")],
                ..DriverWitness::default()
            };
            continue;
        }
        if w.gpus > MAX_DEVICES_PER_NODE {
            let gpus = w.gpus;
            *w = DriverWitness {
                driver: driver.to_string(),
                problems: vec![format!(
                    "{gpus} GPU devices, more than the {MAX_DEVICES_PER_NODE} a node can have: not believed"
                )],
                ..DriverWitness::default()
            };
        }
    }
    out
}

fn key(s: &ResourceSlice) -> (&str, &str, i64) {
    let node = s.spec.node_name.as_deref().unwrap_or_default();
    let (pool, generation) = s
        .spec
        .pool
        .as_ref()
        .map_or((node, 0), |p| (p.name.as_str(), p.generation));
    (node, pool, generation)
}

fn add_device(w: &mut DriverWitness, device: &Device, driver: &str) {
    // NVIDIA's driver types its devices: `gpu`, `mig`, `vfio`; only whole GPUs count here.
    let kind = attribute(device, driver, "type").and_then(|a| a.string.as_deref());
    if kind.is_some_and(|k| k != "gpu") {
        return;
    }
    w.gpus = w.gpus.saturating_add(1);
    let name = bounded(&device.name);
    match attribute(device, driver, "addressingMode").map(|a| a.string.as_deref()) {
        None => w.without_mode += 1,
        Some(Some(mode @ ("ATS" | "HMM" | "None"))) => {
            let mode: &'static str = match mode {
                "ATS" => "ATS",
                "HMM" => "HMM",
                _ => "None",
            };
            *w.modes.entry(mode).or_default() += 1;
        }
        Some(Some(other)) => {
            w.unreadable_modes += 1;
            note(
                w,
                format!(
                    "device {name}: addressingMode {:?} is none of ATS, HMM, None",
                    bounded(other)
                ),
            );
        }
        Some(None) => {
            w.unreadable_modes += 1;
            note(w, format!("device {name}: addressingMode is not a string"));
        }
    }
    if let Some(p) = attribute(device, driver, "productName").and_then(|a| a.string.as_deref())
        && w.products.len() < 8
    {
        w.products.insert(bounded(p));
    }
    if let Some(c) = device.capacity.get("memory") {
        let product = attribute(device, driver, "productName")
            .and_then(|a| a.string.as_deref())
            .unwrap_or_default();
        match offload_api::quantity::bytes(&c.value) {
            Ok(b) if b > 0 => {
                if let Some(why) = offload_api::report::impossible_gpu_memory(product, b) {
                    w.impossible.get_or_insert(format!(
                        "device {name}: memory capacity {} is {why}",
                        bounded(&c.value.0)
                    ));
                }
                w.gpu_memory = Some(w.gpu_memory.map_or(b, |m| m.min(b)));
            }
            _ => note(
                w,
                format!(
                    "device {name}: memory capacity {:?} is not a size",
                    bounded(&c.value.0)
                ),
            ),
        }
    }
}

/// Most problems kept per node: the first few say what is wrong.
const MAX_PROBLEMS: usize = 4;

fn note(w: &mut DriverWitness, problem: String) {
    if w.problems.len() < MAX_PROBLEMS {
        w.problems.push(problem);
    }
}

#[cfg(test)]
mod tests;
