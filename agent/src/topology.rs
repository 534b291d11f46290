//! Where each GPU sits among the node's CPUs and memory, as the kernel says (sysfs), and how the
//! kubelet hands out cores: the CPUs local to a GPU's PCI device, the memory of its NUMA node,
//! and the kubelet's CPU manager policy. A training process whose CPU optimizer runs on the
//! GPU's own socket does not cross the socket link for every copy; a Guaranteed pod with a
//! whole-core request gets its cores to itself only under the `static` policy.
//!
//! Every reading is optional: a file that is absent or does not read leaves the field out.

use std::path::Path;

/// Where the kubelet keeps its CPU manager's state (read-only mounted into the agent's pod).
pub const CPU_MANAGER_STATE: &str = "/var/lib/kubelet/cpu_manager_state";

/// Most bytes read of any one of these files.
const MAX_FILE_BYTES: u64 = 64 * 1024;

fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The sysfs name of a PCI device from NVML's bus id (`00000000:65:00.0` → `0000:65:00.0`).
pub fn sysfs_pci_name(nvml_bus_id: &str) -> Option<String> {
    let id = nvml_bus_id.trim().to_ascii_lowercase();
    let (domain, rest) = id.split_once(':')?;
    if domain.is_empty() || !domain.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let domain = &domain[domain.len().saturating_sub(4)..];
    Some(format!("{domain:0>4}:{rest}"))
}

/// How many CPUs a kernel CPU list names (`0-31,64-95` → 64); `None` where it does not read.
pub fn cpu_list_count(list: &str) -> Option<u32> {
    cpu_list(list).and_then(|cpus| u32::try_from(cpus.len()).ok())
}

/// Most CPUs a list may name for [`cpu_list`] (Linux's `CONFIG_NR_CPUS` tops out at 8192).
pub const MAX_LISTED_CPUS: u32 = 8192;

/// The CPUs a kernel CPU list names (`0-3,8` → 0, 1, 2, 3, 8), in order; `None` where it does
/// not read or names a CPU past [`MAX_LISTED_CPUS`].
pub fn cpu_list(list: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b): (u32, u32) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let a = part.trim().parse().ok()?;
                (a, a)
            }
        };
        if a > b || b >= MAX_LISTED_CPUS {
            return None;
        }
        cpus.extend(a..=b);
    }
    cpus.sort_unstable();
    cpus.dedup();
    (!cpus.is_empty()).then_some(cpus)
}

/// The CPUs local to the PCI device `bus_id` (NVML's form), and how many.
pub fn local_cpus(sys: &Path, bus_id: &str) -> Option<(String, u32)> {
    let name = sysfs_pci_name(bus_id)?;
    let text = read_small(&sys.join("bus/pci/devices").join(name).join("local_cpulist"))?;
    let list = text.trim().to_string();
    let count = cpu_list_count(&list)?;
    Some((list, count))
}

/// The memory of NUMA node `node`, bytes (its `meminfo`'s `MemTotal`).
pub fn numa_memory_bytes(sys: &Path, node: i32) -> Option<u64> {
    if node < 0 {
        return None;
    }
    let text = read_small(
        &sys.join("devices/system/node")
            .join(format!("node{node}"))
            .join("meminfo"),
    )?;
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once("MemTotal:")?;
        let kb: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kb.checked_mul(1024)
    })
}

/// The NUMA nodes without CPUs that hold memory (`None`: the kernel's NUMA view could not be
/// read): where a coherent platform in NUMA mode shows its GPUs' memory.
pub fn memory_only_nodes(sys: &Path) -> Option<Vec<offload_api::report::MemoryOnlyNode>> {
    let root = sys.join("devices/system/node");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&root).ok()?.flatten() {
        let name = entry.file_name();
        let Some(node) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cpus = read_small(&entry.path().join("cpulist")).unwrap_or_default();
        if !cpus.trim().is_empty() {
            continue;
        }
        let bytes = i32::try_from(node)
            .ok()
            .and_then(|n| numa_memory_bytes(sys, n))
            .unwrap_or(0);
        if bytes > 0 && out.len() < offload_api::report::MAX_MEMORY_ONLY_NODES {
            out.push(offload_api::report::MemoryOnlyNode { node, bytes });
        }
    }
    out.sort_by_key(|n| n.node);
    Some(out)
}

/// The kernel's resource control: whether it has `resctrl` (`filesystems`: the text of
/// `/proc/filesystems`) and whether it is mounted under `sys` (`fs/resctrl/info`).
pub fn resctrl(filesystems: Option<&str>, sys: &Path) -> Option<offload_api::report::Resctrl> {
    let supported = filesystems?
        .lines()
        .any(|l| l.split_whitespace().last() == Some("resctrl"));
    Some(offload_api::report::Resctrl {
        supported,
        mounted: sys.join("fs/resctrl/info").is_dir(),
    })
}

/// The kubelet's CPU manager policy from its state file (`{"policyName":"static",…}`).
pub fn cpu_manager_policy(path: &Path) -> Option<String> {
    let text = read_small(path)?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let name = v.get("policyName")?.as_str()?;
    (!name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric()))
        .then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(cpu_list_count("0-31,64-95"), Some(64));
        assert_eq!(cpu_list_count("0-71\n"), Some(72));
        assert_eq!(cpu_list_count("3"), Some(1));
        assert_eq!(cpu_list_count(""), None);
        assert_eq!(cpu_list_count("5-2"), None);
        assert_eq!(cpu_list_count("a-b"), None);
        assert_eq!(cpu_list_count("0-4294967295,1"), None, "no overflow");
    }

    #[test]
    fn cpu_lists_name_their_cpus() {
        assert_eq!(cpu_list("0-3,8\n"), Some(vec![0, 1, 2, 3, 8]));
        assert_eq!(cpu_list("8,0-1,1"), Some(vec![0, 1, 8]));
        assert_eq!(cpu_list(""), None);
        assert_eq!(cpu_list("5-2"), None);
        assert_eq!(
            cpu_list("0-4294967295"),
            None,
            "bounded, not four billion entries"
        );
        assert_eq!(cpu_list("x"), None);
    }

    #[test]
    fn nvml_bus_ids_name_their_sysfs_device() {
        assert_eq!(
            sysfs_pci_name("00000000:65:00.0").as_deref(),
            Some("0000:65:00.0")
        );
        assert_eq!(
            sysfs_pci_name("00000009:01:00.0").as_deref(),
            Some("0009:01:00.0")
        );
        assert_eq!(sysfs_pci_name("nonsense"), None);
        assert_eq!(sysfs_pci_name("zz:01:00.0"), None);
    }

    /// A recorded two-socket reading (a GPU on socket 1 of a 2 × 32-core host), laid out as
    /// sysfs lays it out.
    #[test]
    fn a_two_socket_node_is_read_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        let dev = sys.join("bus/pci/devices/0000:ca:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("local_cpulist"), "32-63,96-127\n").unwrap();
        let node = sys.join("devices/system/node/node1");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(
            node.join("meminfo"),
            "Node 1 MemTotal:       528279852 kB\nNode 1 MemFree:        501234560 kB\n",
        )
        .unwrap();
        assert_eq!(
            local_cpus(sys, "00000000:CA:00.0"),
            Some(("32-63,96-127".into(), 64))
        );
        assert_eq!(numa_memory_bytes(sys, 1), Some(528_279_852 * 1024));
        assert_eq!(numa_memory_bytes(sys, 0), None);
        assert_eq!(numa_memory_bytes(sys, -1), None);
        let state = sys.join("cpu_manager_state");
        std::fs::write(
            &state,
            r#"{"policyName":"static","defaultCpuSet":"0-1,64-65","checksum":1}"#,
        )
        .unwrap();
        assert_eq!(cpu_manager_policy(&state).as_deref(), Some("static"));
        std::fs::write(&state, "not json").unwrap();
        assert_eq!(cpu_manager_policy(&state), None);
        assert_eq!(cpu_manager_policy(&sys.join("absent")), None);
    }

    #[test]
    fn memory_only_nodes_are_the_nodes_without_cpus_that_hold_memory() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        // A GH200 in NUMA mode as the kernel lays it out: CPUs and LPDDR5X on node 0, the GPU's
        // memory on node 1, empty memory-only nodes beside it.
        for (node, cpus, kb) in [
            (0, "0-71\n", 500_000_000u64),
            (1, "\n", 96_626_276),
            (2, "\n", 0),
        ] {
            let d = sys.join(format!("devices/system/node/node{node}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), cpus).unwrap();
            std::fs::write(
                d.join("meminfo"),
                format!("Node {node} MemTotal:       {kb} kB\n"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(sys.join("devices/system/node/possible")).unwrap();
        let nodes = memory_only_nodes(sys).unwrap();
        assert_eq!(
            nodes,
            vec![offload_api::report::MemoryOnlyNode {
                node: 1,
                bytes: 96_626_276 * 1024
            }]
        );
        assert_eq!(memory_only_nodes(&sys.join("absent")), None);
        // An MPAM kernel with resctrl, not mounted; then mounted; a kernel without it.
        let with = "nodev\tsysfs\nnodev\tresctrl\n";
        let r = resctrl(Some(with), sys).unwrap();
        assert!(r.supported && !r.mounted);
        std::fs::create_dir_all(sys.join("fs/resctrl/info")).unwrap();
        assert!(resctrl(Some(with), sys).unwrap().mounted);
        assert!(!resctrl(Some("nodev\tsysfs\n"), sys).unwrap().supported);
        assert_eq!(resctrl(None, sys), None);
    }
}
