//! A stand-in for NVIDIA's DRA driver (k8s-dra-driver-gpu), named as such: it publishes
//! ResourceSlices shaped as that driver's kubelet plugin publishes them (driver
//! `gpu.nvidia.com`, one pool per node named after it, devices `gpu-<minor>` with the
//! attributes `type`, `uuid`, `productName`, `architecture`, `addressingMode` and a `memory`
//! capacity), and the DeviceClass its Helm chart installs. No GPU is behind them: the tests
//! check what the operator and kube-scheduler do with what the driver says.

use kube::api::{Api, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

/// The stand-in's driver name, NVIDIA's.
pub const DRIVER: &str = "gpu.nvidia.com";

/// One published GPU: its addressing mode as the driver writes it (`ATS`, `HMM`, `None`, or
/// anything else to test what does not read; `None` omits the attribute).
#[derive(Clone, Debug)]
pub struct StandInGpu {
    /// The `addressingMode` attribute's value, or no attribute.
    pub addressing_mode: Option<String>,
    /// Product name.
    pub product: String,
    /// The `memory` capacity (a quantity).
    pub memory: String,
}

impl StandInGpu {
    /// A GH200's GPU: ATS.
    pub fn gh200() -> Self {
        StandInGpu {
            addressing_mode: Some("ATS".into()),
            product: "NVIDIA GH200 480GB".into(),
            memory: "97871Mi".into(),
        }
    }

    /// A PCIe H200: no ATS.
    pub fn h200() -> Self {
        StandInGpu {
            addressing_mode: Some("None".into()),
            product: "NVIDIA H200".into(),
            memory: "143771Mi".into(),
        }
    }

    /// A PCIe H100 of 80 GB: no ATS, less memory.
    pub fn h100() -> Self {
        StandInGpu {
            addressing_mode: Some("None".into()),
            product: "NVIDIA H100 80GB HBM3".into(),
            memory: "81559Mi".into(),
        }
    }
}

fn api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind)),
    )
}

/// The slice of `gpus[first..]` on `node` (slice `index` of `count` in the node's pool).
pub fn slice(node: &str, index: usize, count: usize, first: usize, gpus: &[StandInGpu]) -> Value {
    let devices: Vec<Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let minor = first + i;
            let mut attributes = json!({
                "type": {"string": "gpu"},
                "uuid": {"string": format!("GPU-{node}-{minor}")},
                "productName": {"string": g.product},
                "architecture": {"string": "Hopper"},
                "driverVersion": {"version": "580.95.5"},
            });
            if let Some(mode) = &g.addressing_mode {
                attributes["addressingMode"] = json!({"string": mode});
            }
            json!({"name": format!("gpu-{minor}"), "attributes": attributes,
                   "capacity": {"memory": {"value": g.memory}}})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{DRIVER}-{index}")},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
                 "devices": devices}
    })
}

/// Publishes `gpus` for `node` in slices of at most 128 devices (the API's limit), as the
/// driver's plugin does on its node.
pub async fn publish(
    client: &kube::Client,
    node: &str,
    gpus: &[StandInGpu],
) -> Result<(), kube::Error> {
    let chunks: Vec<&[StandInGpu]> = gpus.chunks(128).collect();
    let slices = api(client, "ResourceSlice");
    for (i, chunk) in chunks.iter().enumerate() {
        let obj: DynamicObject =
            serde_json::from_value(slice(node, i, chunks.len(), i * 128, chunk))
                .map_err(kube::Error::SerdeError)?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        slices
            .patch(
                &name,
                &PatchParams::apply("dra-stand-in").force(),
                &Patch::Apply(&obj),
            )
            .await?;
    }
    Ok(())
}

/// The DeviceClass NVIDIA's chart installs for whole GPUs.
pub async fn device_class(client: &kube::Client) -> Result<(), kube::Error> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression":
            format!("device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'")}}]}
    }))
    .map_err(kube::Error::SerdeError)?;
    api(client, "DeviceClass")
        .patch(
            DRIVER,
            &PatchParams::apply("dra-stand-in").force(),
            &Patch::Apply(&obj),
        )
        .await?;
    Ok(())
}
