//! Fuzz targets (bolero): the admission endpoints' decoding, node-report parsing, the decision
//! engine, GPU quantity sums and observation summaries, fed generated input. Under `cargo test` each runs a bounded number of random inputs;
//! `hack/fuzz.sh SECONDS` runs them for a set time each (release build) and prints how many
//! inputs each took. Every input must get an answer, never a panic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use offload_api::quantity::ParameterCount;
use offload_api::report::NodeReport;
use offload_api::v1alpha1::{
    Framework, FrameworkSpec, ModeSetting, ModelHints, OffloadProfileSpec, OffloadSpec,
    OverlapSetting, RatioSetting, Switch,
};
use offload_operator::cluster::view::MemoryView;
use offload_operator::decision::{DeepSpeedRequest, JobRequest, class_admits, resolve_offload};
use offload_operator::index::{NodeIndex, NodeInfo};
use offload_operator::ops::metrics::Metrics;
use offload_operator::webhook::{WebhookState, paths, router};
use offload_testenv::fixtures;
use serde_json::{Value, json};
use tower::ServiceExt;

/// How long each target runs: `OFFLOAD_FUZZ_SECONDS` (hack/fuzz.sh), else a bounded number of
/// inputs for the test command.
fn budget() -> Option<Duration> {
    std::env::var("OFFLOAD_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
}

macro_rules! bounded {
    ($check:expr) => {
        match budget() {
            Some(d) => $check.with_test_time(d),
            None => $check.with_iterations(5_000),
        }
    };
}

fn node(name: &str, fixture: &str) -> NodeInfo {
    NodeInfo::from_report(name, &NodeReport::parse(fixture).unwrap())
}

fn app() -> axum::Router {
    let mut registry = prometheus_client::registry::Registry::default();
    router(WebhookState {
        view: Arc::new(MemoryView::new(
            vec![
                node("gh200-0", fixtures::GH200_REFERENCE),
                node("h200-0", fixtures::H200_READING),
            ],
            BTreeMap::from([("default".to_string(), OffloadProfileSpec::default())]),
        )),
        metrics: Metrics::new(&mut registry),
        configs: Default::default(),
        events: None,
    })
}

const PATHS: [&str; 5] = paths::ALL;

/// A review of a Pod whose object is whatever the input parses to.
fn review_around(object: Value, path: &str) -> Vec<u8> {
    let (group, version, kind, resource) = match path {
        paths::VALIDATE_TRAINING_JOB | paths::MUTATE_TRAINING_JOB => {
            ("offload.dev", "v1alpha1", "TrainingJob", "trainingjobs")
        }
        paths::VALIDATE_PROFILE => (
            "offload.dev",
            "v1alpha1",
            "OffloadProfile",
            "offloadprofiles",
        ),
        paths::MUTATE_WORKLOAD => ("batch", "v1", "Job", "jobs"),
        _ => ("", "v1", "Pod", "pods"),
    };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u", "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "operation": "CREATE", "userInfo": {}, "namespace": "ns", "object": object
        }
    }))
    .unwrap_or_default()
}

#[test]
fn admission_decoding() {
    // With timers: the webhook bounds how long it reads a body.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The router and runtime are only read from the target: no state survives a panic.
    let app = std::panic::AssertUnwindSafe(app());
    let rt = std::panic::AssertUnwindSafe(rt);
    bounded!(bolero::check!())
        .with_max_len(64 * 1024)
        .for_each(|input: &[u8]| {
            // Whole-variable uses, so the closure captures the unwind-safe wrappers.
            let (app, rt) = (&app, &rt);
            let path = PATHS[input.first().map_or(0, |b| usize::from(*b) % PATHS.len())];
            // The raw bytes as a body, and (when they are JSON) as the object of a review.
            let mut bodies = vec![input.to_vec()];
            if let Ok(object) = serde_json::from_slice::<Value>(input) {
                bodies.push(review_around(object, path));
            }
            for body in bodies {
                let res = rt.block_on(
                    app.0.clone().oneshot(
                        Request::post(path)
                            .header("content-type", "application/json")
                            .body(Body::from(body))
                            .unwrap(),
                    ),
                );
                let status = res.unwrap().status();
                assert!(!status.is_server_error(), "{path}: {status}");
            }
        });
}

#[test]
fn node_report_parsing() {
    bounded!(bolero::check!())
        .with_max_len(64 * 1024)
        .for_each(|input: &[u8]| {
            let text = String::from_utf8_lossy(input);
            let parsed = NodeReport::parse(&text);
            let info = NodeInfo::from_metadata(
                "n",
                BTreeMap::new(),
                &BTreeMap::from([(
                    offload_api::names::ANNOTATION_NODE_REPORT.to_string(),
                    text.to_string(),
                )]),
            );
            // A report that parsed is believed only if it is consistent with the labels.
            if parsed.is_err() {
                assert!(info.class().is_none(), "an unreadable report places no job");
            }
        });
}

#[test]
fn decision_engine() {
    let nodes = NodeIndex::new(vec![
        node("gh200-0", fixtures::GH200_REFERENCE),
        node("h200-0", fixtures::H200_READING),
        node("hmm-0", fixtures::HMM_UNPINNED),
    ]);
    bounded!(bolero::check!())
        .with_type::<(u8, u8, u16, u8, u8, u8, u32, u8, u16)>()
        .for_each(
            |&(mode, overlap, ratio, framework, version, stage, pods, flags, min_eff)| {
                let job = JobRequest {
                    offload: OffloadSpec {
                        mode: [
                            ModeSetting::Auto,
                            ModeSetting::UnifiedMemory,
                            ModeSetting::CpuCopy,
                            ModeSetting::Disabled,
                        ][usize::from(mode % 4)],
                        overlap: [
                            OverlapSetting::Auto,
                            OverlapSetting::Enabled,
                            OverlapSetting::Disabled,
                        ][usize::from(overlap % 3)],
                        offload_ratio: if ratio == 0 {
                            RatioSetting::Auto
                        } else {
                            RatioSetting::Fixed(f64::from(ratio) / 10_000.0)
                        },
                        pin_memory: [Switch::Auto, Switch::Enabled, Switch::Disabled]
                            [usize::from(flags % 3)],
                    },
                    framework: FrameworkSpec {
                        name: [Framework::DeepSpeed, Framework::Fsdp, Framework::Generic]
                            [usize::from(framework % 3)],
                        version: ["0.19.8", "0.17.4", "0.9.0", "2.6.0", "junk", ""]
                            .get(usize::from(version % 7))
                            .map(|s| s.to_string()),
                    },
                    deepspeed: DeepSpeedRequest {
                        stage_in_config: (stage & 0x80 != 0).then_some(stage % 5),
                        stage_in_spec: (stage & 0x40 != 0).then_some((stage >> 2) % 5),
                        offload_params: [None, Some(true), Some(false)]
                            [usize::from((flags >> 2) % 3)],
                        super_offload: [None, Some(true), Some(false)]
                            [usize::from((flags >> 4) % 3)],
                        zen_flow: [None, Some(true), Some(false)][usize::from((flags >> 6) % 3)],
                        zenflow_in_config: flags & 1 == 1,
                        bf16_optimizer_states: [None, Some(true), Some(false)]
                            [usize::from((stage >> 3) % 3)],
                        bf16_in_config: flags & 2 == 2,
                        bf16_states_in_config: stage & 1 == 1,
                    },
                    // Model hints from 1 parameter to 10^15, with and without the step's tokens.
                    model: (flags & 4 == 4).then(|| ModelHints {
                        tokens_per_step: (min_eff % 2 == 0).then_some(i64::from(min_eff) * 64 + 1),
                        hidden_size: (min_eff % 3 == 0).then_some(i64::from(ratio % 16_384) + 1),
                        ..ModelHints::parameters(
                            ParameterCount::new(
                                (1u64 << ((pods >> 16) % 50)).min(1_000_000_000_000_000),
                            )
                            .unwrap(),
                        )
                    }),
                    pods: pods % 64,
                    gpus_per_pod: (pods >> 8) % 9,
                    ..JobRequest::default()
                };
                let profile = OffloadProfileSpec {
                    min_overlap_efficiency: f64::from(min_eff) / f64::from(u16::MAX),
                    allow_cpu_copy_on_coherent_nodes: flags & 2 == 2,
                    allow_zen_flow: flags & 8 == 8,
                    ..OffloadProfileSpec::default()
                };
                if let Ok(res) = resolve_offload(&job, "p", &profile, &nodes) {
                    // Whatever is decided, the pods land only where the configuration was made for.
                    if let Some(class) = res.node_class {
                        for n in nodes.nodes() {
                            if let (Some(model), true) =
                                (n.memory_model(), n.class() == Some(class))
                            {
                                assert!(class_admits(class, model), "{class} on {model:?}");
                            }
                        }
                    }
                    // A share in (0, 1], or 0 where nothing is offloaded.
                    if res.mode == offload_api::v1alpha1::OffloadMode::Disabled {
                        assert_eq!(res.ratio, 0.0);
                    } else {
                        assert!(res.ratio > 0.0 && res.ratio <= 1.0, "{}", res.ratio);
                    }
                }
            },
        );
}

/// GPU counts and memory limits as Kubernetes quantities, summed over containers: any string
/// in any container either reads as a count in range or is refused, never wraps.
#[test]
fn quantity_sums() {
    bounded!(bolero::check!())
        .with_type::<Vec<(String, String)>>()
        .for_each(|containers: &Vec<(String, String)>| {
            let spec: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(json!({
                "containers": containers.iter().enumerate().map(|(i, (gpu, mem))| json!({
                    "name": format!("c{i}"),
                    "resources": {"limits": {"nvidia.com/gpu": gpu, "memory": mem}}
                })).collect::<Vec<_>>()
            }))
            .unwrap();
            match offload_operator::decision::PodResources::of(Some(&spec)) {
                Ok(r) => {
                    assert!(r.gpus <= offload_api::quantity::MAX_GPUS, "{r:?}");
                    let each: Option<u64> = containers
                        .iter()
                        .map(|(g, _)| {
                            offload_api::quantity::device_count(
                                &k8s_openapi::apimachinery::pkg::api::resource::Quantity(g.clone()),
                            )
                            .ok()
                        })
                        .sum();
                    assert_eq!(Some(r.gpus), each, "the sum of what each container reads");
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        });
}

/// Observation summaries as a node would write them, with any figures: whatever a summary
/// says, the job's figures stay in range and count no more GPUs than the node has.
#[test]
fn observation_summaries() {
    bounded!(bolero::check!())
        .with_type::<(f64, f64, u16, u16, u8, bool)>()
        .for_each(
            |&(busy, window, gpus, pods, samples, other_node): &(f64, f64, u16, u16, u8, bool)| {
                // Half the inputs with figures in range, so the summary is believed and counted.
                let (busy, window) = if samples % 2 == 0 && busy.is_finite() && window.is_finite() {
                    (busy.abs().fract(), 1.0 + window.abs() % 600.0)
                } else {
                    (busy, window)
                };
                // Pods and GPUs named apart (or, for odd sample counts, the same names again: a
                // summary that lists a pod or a GPU twice is refused whole).
                let distinct = samples % 2 == 0;
                let pods: Vec<Value> = (0..pods % 40)
                .map(|i| {
                    let pod = if distinct { i } else { i % 3 };
                    let gpus: Vec<String> = (0..gpus % 8)
                        .map(|j| if distinct { format!("GPU-{i}-{j}") } else { "GPU-0".into() })
                        .collect();
                    json!({"namespace": "ns", "name": format!("job-{pod}"), "trainingJob": "job",
                           "gpus": gpus, "gpuBusy": busy,
                           "samples": u16::from(samples) + u16::from(distinct), "cpuCores": window})
                })
                .collect();
                let summary = json!({
                    "schemaVersion": offload_api::observed::OBSERVED_SCHEMA_VERSION,
                    "node": if other_node { "other" } else { "n" },
                    "observedAt": jiff::Timestamp::now().to_string(),
                    "windowSeconds": window, "source": "nvml-device", "pods": pods
                });
                let annotations = BTreeMap::from([(
                    offload_api::names::ANNOTATION_OBSERVED.to_string(),
                    summary.to_string(),
                )]);
                let node = NodeInfo::from_metadata("n", BTreeMap::new(), &annotations)
                    .with_allocatable(offload_operator::index::Allocatable {
                        memory: None,
                        gpus: Some(2),
                        cpus: None,
                        ..Default::default()
                    });
                let index = NodeIndex::new(vec![node]);
                let observed = offload_operator::controller::overlap_observed::gather(
                    &index,
                    "ns",
                    "job",
                    jiff::Timestamp::now(),
                    &|_, _| true,
                );
                if let Some(o) = observed {
                    assert!(
                        !other_node,
                        "a summary naming another node counts for nothing"
                    );
                    assert!((0.0..=1.0).contains(&o.gpu_busy), "{o:?}");
                    assert!(o.gpus <= 2, "{o:?}");
                }
            },
        );
}
