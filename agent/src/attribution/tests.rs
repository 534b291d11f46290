use super::*;
use crate::devices::{DRA_DRIVER, GPU_RESOURCE, dra_minor};

#[test]
fn devices_are_joined_per_pod_for_the_gpu_resource_only() {
    let pods = vec![
        v1::PodResources {
            name: "train-0".into(),
            namespace: "ml".into(),
            containers: vec![
                v1::ContainerResources {
                    name: "train".into(),
                    devices: vec![
                        v1::ContainerDevices {
                            resource_name: GPU_RESOURCE.into(),
                            device_ids: vec!["GPU-b".into(), "GPU-a".into()],
                            ..Default::default()
                        },
                        v1::ContainerDevices {
                            resource_name: "rdma/hca".into(),
                            device_ids: vec!["mlx5_0".into()],
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
                v1::ContainerResources {
                    name: "sidecar".into(),
                    devices: vec![v1::ContainerDevices {
                        resource_name: GPU_RESOURCE.into(),
                        device_ids: vec!["GPU-a".into()],
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
        },
        v1::PodResources {
            name: "web".into(),
            namespace: "ml".into(),
            containers: vec![],
        },
    ];
    let by_pod = devices_by_pod(&pods, GPU_RESOURCE, Some(DRA_DRIVER));
    assert_eq!(by_pod.len(), 1);
    assert_eq!(
        by_pod[&("ml".to_string(), "train-0".to_string())],
        ["GPU-a", "GPU-b"]
    );
}

#[test]
fn gpus_allocated_through_dra_claims_count_for_their_pod() {
    let claim = |driver: &str, device: &str| v1::ClaimResource {
        driver_name: driver.into(),
        pool_name: "node-a".into(),
        device_name: device.into(),
        ..Default::default()
    };
    let pods = vec![v1::PodResources {
        name: "train-0".into(),
        namespace: "ml".into(),
        containers: vec![v1::ContainerResources {
            name: "train".into(),
            dynamic_resources: vec![v1::DynamicResource {
                claim_name: "train-0-gpus-x1".into(),
                claim_namespace: "ml".into(),
                claim_resources: vec![
                    claim(DRA_DRIVER, "gpu-1"),
                    claim(DRA_DRIVER, "gpu-0"),
                    claim("rdma.example.com", "nic-0"),
                ],
            }],
            ..Default::default()
        }],
    }];
    let by_pod = devices_by_pod(&pods, GPU_RESOURCE, Some(DRA_DRIVER));
    assert_eq!(
        by_pod[&("ml".to_string(), "train-0".to_string())],
        ["gpu-0", "gpu-1"]
    );
    assert!(devices_by_pod(&pods, GPU_RESOURCE, None).is_empty());
    assert_eq!(dra_minor("gpu-12"), Some(12));
    assert_eq!(dra_minor("gpu-12-mig-1-0-1"), None);
    assert_eq!(dra_minor("GPU-0a1b"), None);
    // From the kubelet's wire format, encoded by hand with the upstream field numbers
    // (api.proto of k8s.io/kubelet: ContainerResources.dynamic_resources = 5,
    // DynamicResource.claim_name = 2 … claim_resources = 4, ClaimResource.cdi_devices = 1,
    // driver_name = 2, pool_name = 3, device_name = 4).
    use prost::Message;
    let field = |tag: u8, body: &[u8]| -> Vec<u8> {
        let mut out = vec![tag, u8::try_from(body.len()).unwrap()];
        out.extend_from_slice(body);
        out
    };
    let cdi = field(0x0a, &field(0x0a, b"k8s.gpu.nvidia.com/device=gpu-3"));
    let resource = [
        cdi,
        field(0x12, DRA_DRIVER.as_bytes()),
        field(0x1a, b"node-a"),
        field(0x22, b"gpu-3"),
    ]
    .concat();
    let dynamic = [
        field(0x12, b"claim"),
        field(0x1a, b"ml"),
        field(0x22, &resource),
    ]
    .concat();
    let container = [field(0x0a, b"train"), field(0x2a, &dynamic)].concat();
    let decoded = v1::ContainerResources::decode(container.as_slice()).unwrap();
    let r = &decoded.dynamic_resources[0].claim_resources[0];
    assert_eq!(
        (
            r.driver_name.as_str(),
            r.pool_name.as_str(),
            r.device_name.as_str()
        ),
        (DRA_DRIVER, "node-a", "gpu-3")
    );
    assert_eq!(decoded.dynamic_resources[0].claim_name, "claim");
}

#[test]
fn the_response_decodes_from_the_kubelets_wire_format() {
    use prost::Message;
    // Encoded with the upstream field numbers (cpu_ids, tag 3 of ContainerResources; topology,
    // tag 3 of ContainerDevices, as the kubelet sends them).
    let devices = v1::ContainerDevices {
        resource_name: GPU_RESOURCE.into(),
        device_ids: vec!["GPU-0".into()],
        ..Default::default()
    };
    let mut dev_bytes = devices.encode_to_vec();
    dev_bytes.extend([0x1a, 0x00]); // topology: empty message
    let mut container = Vec::new();
    prost::encoding::string::encode(1, &"c".to_string(), &mut container);
    prost::encoding::bytes::encode(2, &dev_bytes, &mut container);
    prost::encoding::int64::encode_packed(3, &[0, 1], &mut container);
    let mut pod = Vec::new();
    prost::encoding::string::encode(1, &"p".to_string(), &mut pod);
    prost::encoding::string::encode(2, &"ns".to_string(), &mut pod);
    prost::encoding::bytes::encode(3, &container, &mut pod);
    let mut response = Vec::new();
    prost::encoding::bytes::encode(1, &pod, &mut response);
    let decoded = v1::ListPodResourcesResponse::decode(response.as_slice()).unwrap();
    assert_eq!(decoded.pod_resources[0].namespace, "ns");
    assert_eq!(
        decoded.pod_resources[0].containers[0].devices[0].device_ids,
        ["GPU-0"]
    );
}

#[test]
fn a_missing_socket_is_a_clear_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(list_pod_resources(
            Path::new("/nonexistent/pod-resources/kubelet.sock"),
            Duration::from_secs(1),
        ))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "kubelet pod-resources API at /nonexistent/pod-resources/kubelet.sock: connecting"
        ),
        "{err}"
    );
}

#[test]
fn pod_cgroups_are_found_in_both_driver_layouts_and_their_cpu_read() {
    let root = tempfile::tempdir().unwrap();
    let uid = "0d6c7f39-1b8e-4e57-9a5c-3d0f1a2b3c4d";
    let systemd = root.path().join(format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        uid.replace('-', "_")
    ));
    std::fs::create_dir_all(&systemd).unwrap();
    std::fs::write(
        systemd.join("cpu.stat"),
        "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n",
    )
    .unwrap();
    assert_eq!(pod_cgroup(root.path(), uid), Some(systemd.clone()));
    assert_eq!(cpu_usage_usec(&systemd), Some(1_234_567));

    let root2 = tempfile::tempdir().unwrap();
    let cgroupfs = root2.path().join(format!("kubepods/besteffort/pod{uid}"));
    std::fs::create_dir_all(&cgroupfs).unwrap();
    assert_eq!(pod_cgroup(root2.path(), uid), Some(cgroupfs.clone()));
    assert_eq!(cpu_usage_usec(&cgroupfs), None, "no cpu.stat: unknown");
    assert_eq!(pod_cgroup(root2.path(), "other-uid"), None);
}

#[test]
fn cgroup_v1_below_a_kubelet_cgroup_root_is_found_and_read() {
    // v1 as on this machine's real node: the cpuacct hierarchy, the kubelet's
    // --cgroup-root one level down.
    let root = tempfile::tempdir().unwrap();
    let uid = "5e1f2a3b-0000-4c4c-8d8d-000000000001";
    let acct = root.path().join("cpuacct");
    std::fs::create_dir_all(&acct).unwrap();
    std::fs::write(acct.join("cpuacct.usage"), "1\n").unwrap();
    std::fs::create_dir_all(acct.join("system.slice/a/b/c/d")).unwrap();
    let pod = acct.join(format!("node-cg/kubepods/burstable/pod{uid}"));
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join("cpuacct.usage"), "2500000000\n").unwrap();
    std::fs::create_dir_all(root.path().join("memory/node-cg/kubepods")).unwrap();
    assert_eq!(pod_cgroup(root.path(), uid), Some(pod.clone()));
    assert_eq!(cpu_usage_usec(&pod), Some(2_500_000));
    // Too deep below the root to be the kubelet's: not searched.
    let deep_uid = "5e1f2a3b-0000-4c4c-8d8d-000000000002";
    std::fs::create_dir_all(acct.join(format!("a/b/c/kubepods/pod{deep_uid}"))).unwrap();
    assert_eq!(pod_cgroup(root.path(), deep_uid), None);
}

#[test]
fn host_memory_is_read_from_the_kernels_high_water_mark_in_both_versions() {
    let root = tempfile::tempdir().unwrap();
    let uid = "5e1f2a3b-0000-4c4c-8d8d-000000000003";
    // v1: the memory hierarchy has its own copy of the pod's cgroup.
    let memory = root.path().join("memory");
    std::fs::create_dir_all(&memory).unwrap();
    std::fs::write(memory.join("memory.usage_in_bytes"), "1\n").unwrap();
    let pod = memory.join(format!("node-cg/kubepods/burstable/pod{uid}"));
    std::fs::create_dir_all(pod.join("container-a")).unwrap();
    std::fs::write(pod.join("memory.max_usage_in_bytes"), "8589934592\n").unwrap();
    std::fs::write(pod.join("memory.usage_in_bytes"), "4294967296\n").unwrap();
    std::fs::write(pod.join("cgroup.procs"), "").unwrap();
    std::fs::write(pod.join("container-a/cgroup.procs"), "41\n0\n42\n").unwrap();
    assert_eq!(pod_memory_cgroup(root.path(), uid), Some(pod.clone()));
    assert_eq!(
        host_memory_peak(&pod),
        Some((8_589_934_592, HostMemorySource::CgroupMaxUsage))
    );
    assert_eq!(host_memory_current(&pod), Some(4_294_967_296));
    assert_eq!(
        pod_pids(&pod).into_iter().collect::<Vec<_>>(),
        [41, 42],
        "a process outside the agent's PID namespace reads as 0 and is left out"
    );

    // v2: one tree; memory.peak where the kernel has it (5.19 and later).
    let v2 = tempfile::tempdir().unwrap();
    std::fs::write(v2.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
    let pod = v2.path().join(format!("kubepods/pod{uid}"));
    std::fs::create_dir_all(&pod).unwrap();
    std::fs::write(pod.join("memory.current"), "1000\n").unwrap();
    assert_eq!(host_memory_peak(&pod), None, "an older kernel: no peak");
    std::fs::write(pod.join("memory.peak"), "2000\n").unwrap();
    assert_eq!(
        host_memory_peak(&pod),
        Some((2000, HostMemorySource::CgroupPeak))
    );
    assert_eq!(
        pod_memory_cgroup(v2.path(), uid),
        pod_cgroup(v2.path(), uid)
    );
    std::fs::write(pod.join("memory.peak"), "not a number\n").unwrap();
    assert_eq!(host_memory_peak(&pod), None);
}

/// A stand-in for NVML on two GPUs that are not here: utilization and memory in use, with the
/// compute processes NVML would list.
struct TwoGpus;

impl UtilizationSource for TwoGpus {
    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        Ok(devices.iter().map(|&i| (i, 50)).collect())
    }

    fn memory(&self, devices: &[u32]) -> Result<Vec<crate::utilization::MemorySample>, String> {
        Ok(devices
            .iter()
            .map(|&i| crate::utilization::MemorySample {
                index: i,
                used: (60 + u64::from(i)) << 30,
                total: 140 << 30,
                // PID 42 is the pod's; 7 is someone else's on the same GPU.
                processes: vec![(42, (59 + u64::from(i)) << 30), (7, 1 << 30)],
            })
            .collect())
    }
}

#[test]
fn a_pods_memory_is_its_busiest_gpus_and_its_own_processes() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
    let dir = root.path().join("kubepods/podu");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cgroup.procs"), "42\n").unwrap();
    std::fs::write(dir.join("memory.current"), "3000\n").unwrap();
    let pod = ObservedPod {
        namespace: "ml".into(),
        name: "train-0".into(),
        training_job: Some("train".into()),
        devices: vec!["GPU-0".into(), "GPU-1".into()],
        cgroup: Some(dir.clone()),
        memory_cgroup: Some(dir.clone()),
    };
    let resolve = |id: &str| id.strip_prefix("GPU-")?.parse().ok();
    let summary = summarize(
        "n",
        std::slice::from_ref(&pod),
        &TwoGpus,
        &resolve,
        Duration::from_millis(30),
        Duration::from_millis(5),
        BusySource::RecordedTrace,
    )
    .unwrap();
    let p = &summary.pods[0];
    assert_eq!(p.gpu_memory_peak_bytes, Some(61 << 30), "the busier GPU");
    assert_eq!(p.gpu_memory_total_bytes, Some(140 << 30));
    assert_eq!(
        p.process_gpu_memory_peak_bytes,
        Some(60 << 30),
        "PID 42 only"
    );
    // No memory.peak in this cgroup: sampled.
    assert_eq!(p.host_memory_peak_bytes, Some(3000));
    assert_eq!(p.host_memory_source, Some(HostMemorySource::SampledCurrent));
    summary.check().unwrap();

    // A process the agent cannot see: no per-process figure, the device's stands.
    let mut unseen = pod.clone();
    unseen.cgroup = None;
    unseen.memory_cgroup = None;
    let summary = summarize(
        "n",
        &[unseen],
        &TwoGpus,
        &resolve,
        Duration::ZERO,
        Duration::ZERO,
        BusySource::RecordedTrace,
    )
    .unwrap();
    let p = &summary.pods[0];
    assert_eq!(p.process_gpu_memory_peak_bytes, None);
    assert_eq!(p.gpu_memory_peak_bytes, Some(61 << 30));
    assert_eq!(p.host_memory_peak_bytes, None);
}

/// A source whose memory reads cannot be true (more in use than the GPU has, a GPU of no
/// bytes): those samples are left out rather than reported.
struct Broken;

impl UtilizationSource for Broken {
    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        Ok(devices.iter().map(|&i| (i, 50)).collect())
    }

    fn memory(&self, devices: &[u32]) -> Result<Vec<crate::utilization::MemorySample>, String> {
        Ok(devices
            .iter()
            .map(|&i| crate::utilization::MemorySample {
                index: i,
                used: if i == 0 { u64::MAX } else { 5 },
                total: if i == 0 { 10 } else { 0 },
                processes: vec![],
            })
            .collect())
    }
}

#[test]
fn memory_reads_no_gpu_can_have_are_left_out() {
    let pod = ObservedPod {
        namespace: "ml".into(),
        name: "train-0".into(),
        training_job: None,
        devices: vec!["GPU-0".into(), "GPU-1".into()],
        cgroup: None,
        memory_cgroup: None,
    };
    let resolve = |id: &str| id.strip_prefix("GPU-")?.parse().ok();
    let summary = summarize(
        "n",
        &[pod],
        &Broken,
        &resolve,
        Duration::ZERO,
        Duration::ZERO,
        BusySource::RecordedTrace,
    )
    .unwrap();
    assert_eq!(summary.pods[0].gpu_memory_peak_bytes, None);
    summary.check().unwrap();
}
