//! Megatron-core's flags, and the same settings as NeMo / Megatron-Bridge overrides.
//!
//! Only flags the declared version's `megatron/training/arguments.py` accepts are written: the
//! decision's plan has offload only from 0.12.0, where `--optimizer-cpu-offload`,
//! `--optimizer-offload-fraction`, `--overlap-cpu-optimizer-d2h-h2d`,
//! `--use-precision-aware-optimizer` and `--no-pin-cpu-grads` / `--no-pin-cpu-params` came
//! together; `--use-distributed-optimizer`, `--manual-gc` and `--manual-gc-interval` are older
//! than every supported version (0.12.0's parser has them). The NeMo form writes Megatron-Bridge's
//! `optimizer.*` (Megatron-core's `OptimizerConfig`) and `train.manual_gc*` (its
//! `TrainingConfig`).

use crate::decision::{MANUAL_GC_INTERVAL, MegatronPlan};

use super::format_ratio;

/// The flags for Megatron-core's launch line, in order.
pub fn args(plan: &MegatronPlan, pin_memory: bool) -> Vec<String> {
    let mut out = Vec::new();
    if plan.distributed_optimizer {
        out.push("--use-distributed-optimizer".to_string());
    }
    if plan.cpu_offload {
        out.push("--optimizer-cpu-offload".to_string());
        // The hybrid device optimizer reuses this flag's code path and refuses to start
        // without it.
        out.push("--use-precision-aware-optimizer".to_string());
        out.push("--optimizer-offload-fraction".to_string());
        out.push(format_ratio(plan.fraction));
        if plan.overlap {
            out.push("--overlap-cpu-optimizer-d2h-h2d".to_string());
        }
        if !pin_memory {
            out.push("--no-pin-cpu-grads".to_string());
            out.push("--no-pin-cpu-params".to_string());
        }
        if plan.manual_gc {
            out.push("--manual-gc".to_string());
            out.push("--manual-gc-interval".to_string());
            out.push(MANUAL_GC_INTERVAL.to_string());
        }
    }
    out
}

/// The flags as one line, what `OFFLOAD_MEGATRON_ARGS` holds for the launch line to expand.
pub fn args_line(plan: &MegatronPlan, pin_memory: bool) -> String {
    args(plan, pin_memory).join(" ")
}

/// The same settings as `optimizer.*` overrides of NeMo / Megatron-Bridge, whose optimizer
/// config is Megatron-core's `OptimizerConfig` (the same field names).
pub fn nemo_overrides(plan: &MegatronPlan, pin_memory: bool) -> Vec<String> {
    let flag = |b: bool| if b { "true" } else { "false" };
    let mut out = vec![format!(
        "optimizer.use_distributed_optimizer={}",
        flag(plan.distributed_optimizer)
    )];
    out.push(format!(
        "optimizer.optimizer_cpu_offload={}",
        flag(plan.cpu_offload)
    ));
    if plan.cpu_offload {
        out.push("optimizer.use_precision_aware_optimizer=true".to_string());
        out.push(format!(
            "optimizer.optimizer_offload_fraction={}",
            format_ratio(plan.fraction)
        ));
        out.push(format!(
            "optimizer.overlap_cpu_optimizer_d2h_h2d={}",
            flag(plan.overlap)
        ));
        out.push(format!("optimizer.pin_cpu_grads={}", flag(pin_memory)));
        out.push(format!("optimizer.pin_cpu_params={}", flag(pin_memory)));
        if plan.manual_gc {
            out.push("train.manual_gc=true".to_string());
            out.push(format!("train.manual_gc_interval={MANUAL_GC_INTERVAL}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::decision::{FrameworkPlan, JobRequest, Resolution, resolve_offload};
    use crate::index::{NodeIndex, NodeInfo};
    use offload_api::report::NodeReport;
    use offload_api::v1alpha1::{
        Framework, FrameworkSpec, ModeSetting, OffloadProfileSpec, RatioSetting, Switch,
    };
    use offload_testenv::fixtures;

    fn resolved(version: &str, fixture: &str, edit: impl FnOnce(&mut JobRequest)) -> Resolution {
        let mut job = JobRequest {
            framework: FrameworkSpec {
                name: Framework::Megatron,
                version: Some(version.to_string()),
            },
            ..JobRequest::default()
        };
        edit(&mut job);
        let node = NodeInfo::from_report("n", &NodeReport::parse(fixture).unwrap());
        resolve_offload(
            &job,
            "default",
            &OffloadProfileSpec::default(),
            &NodeIndex::new(vec![node]),
        )
        .unwrap()
    }

    fn plan(res: &Resolution) -> &MegatronPlan {
        match &res.framework {
            FrameworkPlan::Megatron(p) => p,
            other => panic!("expected a Megatron plan, got {other:?}"),
        }
    }

    fn env(res: &Resolution) -> BTreeMap<String, String> {
        super::super::env_vars(res, None)
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect()
    }

    /// The recorded flags of each release's argument parser.
    fn parser_flags() -> BTreeMap<String, BTreeSet<String>> {
        serde_json::from_str(fixtures::MEGATRON_OPTIMIZER_FLAGS).unwrap()
    }

    #[test]
    fn copy_offload_renders_the_hybrid_optimizer_flags_and_the_nemo_overrides() {
        let res = resolved("0.19.0", fixtures::H200_READING, |j| {
            j.offload.mode = ModeSetting::CpuCopy;
            j.offload.offload_ratio = RatioSetting::Fixed(0.4);
        });
        let env = env(&res);
        assert_eq!(env["OFFLOAD_MODE"], "cpu-copy");
        let overlap = if res.overlap {
            " --overlap-cpu-optimizer-d2h-h2d"
        } else {
            ""
        };
        assert_eq!(
            env["OFFLOAD_MEGATRON_ARGS"],
            format!(
                "--use-distributed-optimizer --optimizer-cpu-offload --use-precision-aware-optimizer --optimizer-offload-fraction 0.4{overlap} --manual-gc --manual-gc-interval 100"
            )
        );
        let nemo = &env["OFFLOAD_NEMO_OVERRIDES"];
        for want in [
            "optimizer.use_distributed_optimizer=true",
            "optimizer.optimizer_cpu_offload=true",
            "optimizer.use_precision_aware_optimizer=true",
            "optimizer.optimizer_offload_fraction=0.4",
            "optimizer.pin_cpu_grads=true",
            "train.manual_gc=true",
            "train.manual_gc_interval=100",
        ] {
            assert!(nemo.split(' ').any(|o| o == want), "{want} in {nemo}");
        }
    }

    #[test]
    fn unpinned_and_without_overlap_says_so_in_flags() {
        let res = resolved("0.12.0", fixtures::H200_READING, |j| {
            j.offload.mode = ModeSetting::CpuCopy;
            j.offload.pin_memory = Switch::Disabled;
            j.offload.overlap = offload_api::v1alpha1::OverlapSetting::Disabled;
        });
        let args = args(plan(&res), res.pin_memory);
        assert!(args.contains(&"--no-pin-cpu-grads".to_string()), "{args:?}");
        assert!(args.contains(&"--no-pin-cpu-params".to_string()));
        assert!(!args.contains(&"--overlap-cpu-optimizer-d2h-h2d".to_string()));
        let nemo = nemo_overrides(plan(&res), res.pin_memory);
        assert!(nemo.contains(&"optimizer.pin_cpu_params=false".to_string()));
        assert!(nemo.contains(&"optimizer.overlap_cpu_optimizer_d2h_h2d=false".to_string()));
    }

    #[test]
    fn manual_gc_false_renders_no_collection() {
        let decide = |manual_gc: Option<bool>| {
            resolved("0.14.0", fixtures::H200_READING, |j| {
                j.offload.mode = ModeSetting::CpuCopy;
                j.offload.offload_ratio = RatioSetting::Fixed(0.4);
                j.megatron.manual_gc = manual_gc;
            })
        };
        let (on, off) = (decide(None), decide(Some(false)));
        assert!(plan(&on).manual_gc && !plan(&off).manual_gc);
        let args = args(plan(&off), off.pin_memory);
        assert!(
            !args.iter().any(|a| a.starts_with("--manual-gc")),
            "{args:?}"
        );
        let nemo = nemo_overrides(plan(&off), off.pin_memory);
        assert!(
            !nemo.iter().any(|o| o.starts_with("train.manual_gc")),
            "{nemo:?}"
        );
        assert!(
            off.reasons
                .iter()
                .any(|r| r.message.contains("--manual-gc off")),
            "{:?}",
            off.reasons
        );
        // No offload: nothing to collect, nothing rendered whatever the field says.
        let none = resolved("0.14.0", fixtures::H200_READING, |j| {
            j.offload.mode = ModeSetting::Disabled;
            j.megatron.manual_gc = Some(true);
        });
        assert!(!plan(&none).manual_gc);
    }

    #[test]
    fn without_offload_only_the_distributed_optimizer_is_written() {
        let res = resolved("0.11.0", fixtures::H200_READING, |j| {
            j.offload.mode = ModeSetting::Disabled;
        });
        assert_eq!(
            env(&res)["OFFLOAD_MEGATRON_ARGS"],
            "--use-distributed-optimizer"
        );
        let res = resolved("0.19.0", fixtures::H200_READING, |j| {
            j.offload.mode = ModeSetting::Disabled;
            j.megatron.distributed_optimizer = Some(false);
        });
        let env = env(&res);
        assert_eq!(env["OFFLOAD_MEGATRON_ARGS"], "");
        assert!(env["OFFLOAD_NEMO_OVERRIDES"].contains("optimizer.optimizer_cpu_offload=false"));
    }

    #[test]
    fn no_rendered_flag_is_one_the_declared_version_rejects() {
        let parsers = parser_flags();
        for (version, flags) in &parsers {
            for mode in [
                ModeSetting::Disabled,
                ModeSetting::Auto,
                ModeSetting::CpuCopy,
            ] {
                for pin in [Switch::Enabled, Switch::Disabled] {
                    let mut job = JobRequest {
                        framework: FrameworkSpec {
                            name: Framework::Megatron,
                            version: Some(version.clone()),
                        },
                        ..JobRequest::default()
                    };
                    job.offload.mode = mode;
                    job.offload.pin_memory = pin;
                    let node = NodeInfo::from_report(
                        "n",
                        &NodeReport::parse(fixtures::H200_READING).unwrap(),
                    );
                    let Ok(res) = resolve_offload(
                        &job,
                        "default",
                        &OffloadProfileSpec::default(),
                        &NodeIndex::new(vec![node]),
                    ) else {
                        // Refused (offload asked of a version without it): nothing rendered.
                        continue;
                    };
                    for flag in args(plan(&res), res.pin_memory)
                        .iter()
                        .filter(|a| a.starts_with("--"))
                    {
                        assert!(
                            flags.contains(flag),
                            "Megatron-core {version} ({mode:?}, pin {pin:?}) got {flag}, which its parser does not have"
                        );
                    }
                }
            }
        }
        // The recorded parsers say what the gate says: offload flags from 0.12.0 only.
        assert!(!parsers["0.11.0"].contains("--optimizer-cpu-offload"));
        assert!(parsers["0.12.0"].contains("--optimizer-cpu-offload"));
    }
}
