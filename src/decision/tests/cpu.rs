//! The CPU a pod really gets (issue #50): the CPU-update check counts the training container's
//! cores — its CPU limit, else its share of the node's — not every core the node's self-test
//! used, and says so with the figures; what is rendered fits the quota.

use super::*;
use crate::index::{Allocatable, NodeInfo};

/// The recorded H200 (16 cores) with its CPU rate set so that the whole node updates about
/// 80 % of the optimizer state within the GPU's backward time at 2048 tokens.
fn node(name: &str, gpus: u64, policy: Option<&str>) -> NodeInfo {
    with_report(h200(name), |r| {
        r.selftest.cpu_update_rate = Some(3e10);
        r.cpu_manager_policy = policy.map(str::to_string);
        let first = r.gpus[0].clone();
        r.gpus = (0..gpus)
            .map(|i| offload_api::report::GpuReport {
                index: u32::try_from(i).unwrap(),
                uuid: format!("{}-{i}", first.uuid),
                ..first.clone()
            })
            .collect();
    })
    .with_allocatable(Allocatable {
        memory: Some(125 << 30),
        gpus: Some(gpus),
        cpus: Some(16),
        ..Default::default()
    })
}

fn job() -> JobRequest {
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(9_122_865_152, 2048, 44));
    job
}

#[test]
fn a_cpu_limit_is_the_cores_the_update_check_counts() {
    let unlimited = resolve(&job(), &[node("h", 1, None)]).unwrap();
    let why = reason(&unlimited, Field::OffloadRatio);
    assert!(why.contains("the CPU keeps up"), "{why}");
    assert!(unlimited.cpu_threads.is_none() && unlimited.cpu_cores.is_none());
    // Two cores of a quota: an eighth of the rate the self-test measured with 16.
    let mut limited = job();
    limited.cpu_limit = Some((2.0, None));
    let res = resolve(&limited, &[node("h", 1, None)]).unwrap();
    let why = reason(&res, Field::OffloadRatio);
    assert!(
        why.contains("the training container's 2 cores (its CPU limit, a CFS quota) of the 16 threads its self-test measured")
            && why.contains("the CPU is the bottleneck"),
        "{why}"
    );
    assert_eq!((res.cpu_cores, res.cpu_threads), (Some(2.0), Some(2)));
    let threads = reason(&res, Field::Framework);
    assert!(
        threads.contains("OMP_NUM_THREADS=2 where the training container sets none")
            && threads.contains("its CPU limit is 2 cores,"),
        "{threads}"
    );
    assert!(
        !reason(&unlimited, Field::Framework).contains("OMP_NUM_THREADS"),
        "no limit, no threads rendered"
    );
    // A namespace's default limit says whose it is.
    limited.cpu_limit = Some((2.0, Some("team-defaults".into())));
    let why = reason(
        &resolve(&limited, &[node("h", 1, None)]).unwrap(),
        Field::OffloadRatio,
    );
    assert!(why.contains("LimitRange \"team-defaults\""), "{why}");
    let threads = reason(
        &resolve(&limited, &[node("h", 1, None)]).unwrap(),
        Field::Framework,
    );
    assert!(
        threads.contains("its CPU limit is 2 cores, LimitRange \"team-defaults\"'s default"),
        "{threads}"
    );
}

#[test]
fn whole_cores_under_a_static_cpu_manager_are_the_containers_own() {
    let mut exclusive = job();
    exclusive.cpu_limit = Some((8.0, None));
    exclusive.cpu_request = Some(8.0);
    let res = resolve(&exclusive, &[node("h", 1, Some("static"))]).unwrap();
    let why = reason(&res, Field::OffloadRatio);
    assert!(
        why.contains("whole cores of its own under the node's static CPU manager"),
        "{why}"
    );
    // The same limit on a node without the static policy is a quota.
    let why = reason(
        &resolve(&exclusive, &[node("h", 1, None)]).unwrap(),
        Field::OffloadRatio,
    );
    assert!(why.contains("a CFS quota"), "{why}");
}

#[test]
fn without_a_limit_a_pod_gets_its_share_of_the_nodes_cores() {
    // Eight GPUs, one a pod: the node holds eight of the job's pods, two cores each.
    let res = resolve(&job(), &[node("h8", 8, None)]).unwrap();
    let why = reason(&res, Field::OffloadRatio);
    assert!(
        why.contains("16 allocatable over the 8 pods of the job it holds: 2.0")
            && why.contains("the CPU is the bottleneck"),
        "{why}"
    );
    assert!(res.cpu_threads.is_none(), "no quota: nothing to fit");
}

/// A partial share past the measured crossover is slower than offloading parameters too only
/// while the CPU steps the whole optimizer state fast: on a pod of fewer cores it is the other
/// way round, and the decision weighs the rungs for the pod's cores.
#[test]
fn fewer_cores_keep_a_partial_share_before_offloading_parameters_too() {
    use crate::decision::model::memory::PARTIAL_BEFORE_PARAMS_UP_TO;
    use crate::decision::model::memory::Placement;
    use crate::decision::pod::cpu::MAX_PARTIAL_BEFORE_PARAMS;
    use crate::decision::pod::cpu::partial_before_params;
    // A host large enough for the parameters too; 9.1B at 8,192 tokens needs 62 % offloaded.
    let roomy = with_allocatable_memory(node("h", 1, None), 480 << 30);
    let mut job = job();
    job.model = Some(bench_hints(9_122_865_152, 8192, 44));
    let unlimited = resolve(&job, std::slice::from_ref(&roomy)).unwrap();
    assert_eq!(
        unlimited.memory.as_ref().unwrap().placement,
        Placement::OptimizerAndParams,
        "{}",
        unlimited.summary()
    );
    let placement_with = |cores: f64| {
        let mut limited = job.clone();
        limited.cpu_limit = Some((cores, None));
        resolve(&limited, std::slice::from_ref(&roomy)).unwrap()
    };
    // Two cores of the sixteen the self-test measured with: an eighth of the CPU steps the
    // whole state, so the 62 % share is the faster.
    let two = placement_with(2.0);
    let Placement::PartialOptimizer(r) = two.memory.as_ref().unwrap().placement else {
        panic!("{}", two.summary());
    };
    assert!(r > PARTIAL_BEFORE_PARAMS_UP_TO, "{r}");
    let why = reason(&two, Field::OffloadRatio);
    assert!(
        why.contains("with the training container's 2 cores (its CPU limit, a CFS quota), a partial share up to 72% runs faster than offloading parameters too"),
        "{why}"
    );
    // Twelve of sixteen: the crossover moves to 50 %, below the share: parameters go too.
    let twelve = placement_with(12.0);
    assert_eq!(
        twelve.memory.as_ref().unwrap().placement,
        Placement::OptimizerAndParams
    );
    let why = format!("{:?}", twelve.reasons);
    assert!(
        why.contains("a partial share runs faster than offloading parameters too only up to 50%, and this job needs 62%"),
        "{why}"
    );
    // The crossover itself: the measured one with the 16 cores it was measured with or more
    // (more are not extrapolated), 1 − (1 − 0.45) × (cores / 16)^⅓ below (measured on an
    // H100: 60 % is slower than everything offloaded at 8 cores, faster at 4), never past its
    // bound; a pod that shares its node counts its share of the node's cores.
    let cpu = |cpus| crate::decision::pod::cpu::NodeCpu {
        cpus: Some(cpus),
        gpus: 8,
        static_policy: false,
        threads: Some(64.0),
    };
    let mut limited = job.clone();
    for (cores, expected) in [
        (Some(16.0), PARTIAL_BEFORE_PARAMS_UP_TO),
        (Some(32.0), PARTIAL_BEFORE_PARAMS_UP_TO),
        (Some(8.0), 1.0 - 0.55 * 0.5f64.cbrt()),
        (Some(4.0), 1.0 - 0.55 * 0.25f64.cbrt()),
        (Some(0.5), 1.0 - 0.55 * (0.5f64 / 16.0).cbrt()),
        (Some(0.0), MAX_PARTIAL_BEFORE_PARAMS),
        // An 8-GPU node of 224 cores: 28 for a one-GPU pod, more than the crossover's 16.
        (None, PARTIAL_BEFORE_PARAMS_UP_TO),
    ] {
        limited.cpu_limit = cores.map(|c| (c, None));
        let (got, note) = partial_before_params(&limited, [&cpu(224)]);
        assert!((got - expected).abs() < 1e-9, "{cores:?}: {got}");
        assert_eq!(note.is_some(), cores.is_some_and(|c| c < 16.0), "{cores:?}");
    }
    // The same node of 64 cores: 8 a pod, half of what the crossover was measured with.
    limited.cpu_limit = None;
    let (got, note) = partial_before_params(&limited, [&cpu(64)]);
    assert!((got - (1.0 - 0.55 * 0.5f64.cbrt())).abs() < 1e-9, "{got}");
    assert!(note.unwrap().contains("share of the node's cores"));
    // Where neither a limit nor the node's cores are known, nothing moves.
    let unknown = crate::decision::pod::cpu::NodeCpu {
        cpus: None,
        ..cpu(16)
    };
    assert_eq!(
        partial_before_params(&limited, [&unknown]).0,
        PARTIAL_BEFORE_PARAMS_UP_TO
    );
}

fn with_allocatable_memory(node: NodeInfo, bytes: u64) -> NodeInfo {
    let mut a = node.allocatable;
    a.memory = Some(bytes);
    node.with_allocatable(a)
}

/// A profile's `wholeCores`: the training container asks for its CPU limit as whole cores of
/// its own, its memory request equal to its limit (the pod Guaranteed), only where every node of
/// the class runs the static CPU manager and the pod's other containers allow Guaranteed; each
/// missing condition is said.
#[test]
fn whole_cores_are_asked_only_where_the_nodes_and_the_pod_can_have_them() {
    let whole = OffloadProfileSpec {
        whole_cores: true,
        ..profile()
    };
    let decide = |job: &JobRequest, nodes: &[NodeInfo]| {
        resolve_offload(job, "near", &whole, &idx(nodes)).unwrap()
    };
    let mut job = job();
    job.training_container = Some((0, None));
    job.cpu_limit = Some((8.0, None));
    let statics = [node("a", 1, Some("static")), node("b", 1, Some("static"))];
    let res = decide(&job, &statics);
    let w = res.whole_cores.expect("whole cores asked");
    let counted = res.memory_request.expect("host memory counted").bytes;
    assert_eq!((w.container, w.cores, w.memory_bytes), (0, 8, counted));
    assert_eq!(res.cpu_cores, Some(8.0));
    assert!(
        reason(&res, Field::Framework).contains("OMP_NUM_THREADS=8 where the training container sets none — its 8 whole cores of its own"),
        "{}",
        reason(&res, Field::Framework)
    );
    let why = reason(&res, Field::Mode);
    assert!(
        why.contains("asks for 8 whole cores")
            && why.contains("the host memory the decision counts on")
            && why.contains("topologyManagerPolicy is single-numa-node or restricted"),
        "{why}"
    );
    // The user's memory limit stays the figure.
    job.training_memory_limit = Some(200 << 30);
    assert_eq!(
        decide(&job, &statics).whole_cores.unwrap().memory_bytes,
        200 << 30
    );

    let not = |job: &JobRequest, nodes: &[NodeInfo], says: &str| {
        let res = decide(job, nodes);
        assert!(res.whole_cores.is_none(), "{says}");
        let why = reason(&res, Field::Mode);
        assert!(
            why.contains("whole cores not asked") && why.contains(says),
            "{why}"
        );
        assert_eq!(res.cpu_cores, job.cpu_limit.as_ref().map(|(c, _)| *c));
    };
    not(
        &job,
        &[node("a", 1, Some("static")), node("b", 1, None)],
        "1 node(s) of the class run no static CPU manager policy as the agent read it (the kubelet's cpu_manager_state; chart value agent.cpuManagerState): b —",
    );
    let mut sidecar = job.clone();
    sidecar.not_guaranteed = vec!["log-shipper".into()];
    not(
        &sidecar,
        &statics,
        "container(s) \"log-shipper\" do not set CPU and memory limits",
    );
    sidecar.not_guaranteed = (0..5).map(|i| format!("s{i}")).collect();
    not(
        &sidecar,
        &statics,
        "container(s) \"s0\", \"s1\", \"s2\" and 2 more do not",
    );
    let mut fraction = job.clone();
    fraction.cpu_limit = Some((7.5, None));
    not(
        &fraction,
        &statics,
        "CPU limit is 7.5 cores, not a whole number",
    );
    let mut unlimited = job.clone();
    unlimited.cpu_limit = None;
    not(&unlimited, &statics, "states no CPU limit of its own");
    let mut defaulted = job.clone();
    defaulted.cpu_limit = Some((8.0, Some("team-defaults".into())));
    not(&defaulted, &statics, "states no CPU limit of its own");
    // The profile did not ask: nothing said.
    assert!(
        !reason(&resolve(&job, &statics).unwrap(), Field::Mode).contains("whole cores"),
        "off by default"
    );
}

/// Which of a pod's other containers keep it from being Guaranteed: any without a CPU or memory
/// limit, or with a request other than its limit; the operator's own guard is not one.
#[test]
fn the_containers_that_keep_a_pod_from_being_guaranteed_are_named() {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let q = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), Quantity((*v).into())))
                .collect(),
        )
    };
    let c = |name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]| Container {
        name: name.into(),
        resources: Some(ResourceRequirements {
            requests: q(requests),
            limits: q(limits),
            claims: None,
        }),
        ..Default::default()
    };
    let both = [("cpu", "1"), ("memory", "1Gi")];
    let spec = PodSpec {
        containers: vec![
            c("train", &[], &[("cpu", "8"), ("nvidia.com/gpu", "1")]),
            c("limits-only", &[], &both),
            c("equal", &[("cpu", "1000m"), ("memory", "1024Mi")], &both),
            c("less", &[("cpu", "500m"), ("memory", "1Gi")], &both),
            c("no-memory", &[], &[("cpu", "1")]),
        ],
        init_containers: Some(vec![
            c(crate::render::GUARD_CONTAINER, &[], &[]),
            c("fetch", &[], &[]),
        ]),
        ..Default::default()
    };
    let r = PodResources::of(Some(&spec)).unwrap();
    assert_eq!(r.training_container, Some(0));
    assert_eq!(r.not_guaranteed, ["less", "no-memory", "fetch"]);
}

/// A CPU limit of 0 sets no CFS quota (the kubelet writes none) and takes no namespace default:
/// the container has the node's cores, and no threads are written for it.
#[test]
fn a_cpu_limit_of_zero_is_no_limit() {
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let with_cpu_limit = |cpu: &str| PodSpec {
        containers: vec![Container {
            name: "train".into(),
            resources: Some(ResourceRequirements {
                limits: Some(
                    [("cpu", cpu), ("nvidia.com/gpu", "1")]
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), Quantity((*v).into())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let r = PodResources::of(Some(&with_cpu_limit("0"))).unwrap();
    assert_eq!(r.training_cpu_limit, None);
    assert_eq!(
        PodResources::of(Some(&with_cpu_limit("2")))
            .unwrap()
            .training_cpu_limit,
        Some((2.0, None))
    );
    let mut job = job();
    job.cpu_limit = r.training_cpu_limit.clone();
    let res = resolve(&job, &[node("h", 1, None)]).unwrap();
    assert_eq!((res.cpu_cores, res.cpu_threads), (None, None));
}
