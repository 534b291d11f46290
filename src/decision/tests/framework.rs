//! Framework versions, FSDP and Generic.

use super::*;
use offload_api::v1alpha1::{ModeSetting, OffloadMode};

// ---- framework versions ----------------------------------------------------------------------

#[test]
fn superoffload_is_lowered_on_deepspeed_without_it() {
    let res = resolve(&deepspeed("0.17.4"), &[gh200("gh-a")]).unwrap();
    assert!(res.overlap);
    assert!(!ds_plan(&res).super_offload);
    assert!(reason(&res, Field::Framework).contains("lowered"));
}

#[test]
fn superoffload_before_its_fixes_comes_with_a_warning() {
    let res = resolve(&deepspeed("0.18.2"), &[gh200("gh-a")]).unwrap();
    assert!(ds_plan(&res).super_offload);
    assert!(reason(&res, Field::Framework).contains("0.18.9"));
}

#[test]
fn superoffload_on_grace_without_mpams_resctrl_says_what_its_setup_lacks() {
    // The GH200 reference reading with what its agent reads of the kernel.
    let grace = |name: &str, resctrl: Option<offload_api::report::Resctrl>, arch: &str| {
        let mut report = NodeReport::parse(fixtures::GH200_REFERENCE).unwrap();
        report.node = name.to_string();
        report.cpu_architecture = Some(arch.to_string());
        report.resctrl = resctrl;
        NodeInfo::from_report(name, &report)
    };
    use offload_api::report::Resctrl;
    let setup = |res: &Resolution| {
        res.reasons
            .iter()
            .find(|r| r.code == offload_api::v1alpha1::ReasonCode::SuperOffloadSetup)
            .map(|r| r.message.clone())
    };
    let off = Resctrl {
        supported: false,
        mounted: false,
    };
    let res = resolve(&deepspeed("0.19.8"), &[grace("gh-a", Some(off), "aarch64")]).unwrap();
    assert!(ds_plan(&res).super_offload);
    let said = setup(&res).expect("a setup reason");
    assert!(
        said.contains("gh-a (no resctrl in its kernel (MPAM off))") && said.contains("NUMA node"),
        "{said}"
    );
    let unmounted = Resctrl {
        supported: true,
        mounted: false,
    };
    let res = resolve(
        &deepspeed("0.19.8"),
        &[grace("gh-a", Some(unmounted), "aarch64")],
    )
    .unwrap();
    assert!(setup(&res).unwrap().contains("resctrl not mounted"));
    // Mounted, or not Grace, or not read: nothing to say.
    let ready = Resctrl {
        supported: true,
        mounted: true,
    };
    for node in [
        grace("gh-a", Some(ready), "aarch64"),
        grace("gh-a", Some(off), "x86_64"),
        grace("gh-a", None, "aarch64"),
    ] {
        let res = resolve(&deepspeed("0.19.8"), &[node]).unwrap();
        assert!(ds_plan(&res).super_offload);
        assert_eq!(setup(&res), None);
    }
}

#[test]
fn explicit_superoffload_needs_a_version_that_has_it() {
    let mut job = deepspeed("0.17.4");
    job.deepspeed.super_offload = Some(true);
    let err = resolve(&job, &[gh200("gh-a")]).unwrap_err();
    assert_eq!(err.category(), "FrameworkCannotTakeConfig");
    assert!(err.to_string().contains("0.18.0"), "{err}");
    assert!(!err.depends_on_cluster());

    let mut job = deepspeed("0.19.8");
    job.deepspeed.super_offload = Some(true);
    let res = resolve(&job, &[h200("h-a")]).unwrap();
    assert!(
        ds_plan(&res).super_offload,
        "explicitly asked for, even on discrete nodes"
    );
    assert!(reason(&res, Field::Framework).contains("slower"));
}

#[test]
fn versions_are_required_parsed_and_bounded() {
    let mut job = deepspeed("0.19.8");
    job.framework.version = None;
    assert_eq!(
        resolve(&job, &[h200("h")]).unwrap_err().category(),
        "MissingFrameworkVersion"
    );
    let err = resolve(&deepspeed("latest"), &[h200("h")]).unwrap_err();
    assert_eq!(err.category(), "InvalidFrameworkVersion");
    assert!(err.to_string().contains("latest"));
    let err = resolve(&deepspeed("0.9.5"), &[h200("h")]).unwrap_err();
    assert_eq!(err.category(), "UnsupportedFrameworkVersion");
    assert!(err.to_string().contains("0.10.0"), "{err}");
    assert_eq!(
        resolve(&fsdp("1.10"), &[h200("h")]).unwrap_err().category(),
        "UnsupportedFrameworkVersion"
    );
    // Generic needs no version.
    assert!(resolve(&generic(), &[h200("h")]).is_ok());
}

#[test]
fn zero_stage_comes_from_spec_or_config_and_must_agree() {
    let mut job = deepspeed("0.19.8");
    job.deepspeed.stage_in_spec = Some(2);
    job.deepspeed.stage_in_config = Some(3);
    assert_eq!(
        resolve(&job, &[h200("h")]).unwrap_err().category(),
        "ZeroStageConflict"
    );
    job.deepspeed.stage_in_spec = None;
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert_eq!(ds_plan(&res).stage, 3);
    assert!(!ds_plan(&res).write_stage);
    let res = resolve(&deepspeed("0.19.8"), &[h200("h")]).unwrap();
    assert!(ds_plan(&res).write_stage);
    assert!(reason(&res, Field::Framework).contains("assumed"));
}

#[test]
fn offload_params_needs_stage_three() {
    let mut job = deepspeed("0.19.8");
    job.deepspeed.offload_params = Some(true);
    job.deepspeed.stage_in_spec = Some(2);
    let err = resolve(&job, &[h200("h")]).unwrap_err();
    assert!(err.to_string().contains("stage 3"), "{err}");
    job.deepspeed.stage_in_spec = Some(3);
    assert!(ds_plan(&resolve(&job, &[h200("h")]).unwrap()).offload_params);
}

// ---- FSDP and Generic ------------------------------------------------------------------------

#[test]
fn fsdp_gets_its_generation_and_param_offload_only_for_cpu_copy() {
    let res = resolve(&fsdp("2.6.0+cu124"), &[h200("h")]).unwrap();
    assert_eq!(
        res.framework,
        FrameworkPlan::Fsdp(FsdpPlan {
            fsdp_version: 2,
            offload_params: true
        })
    );
    let res = resolve(&fsdp("2.5.1"), &[gh200("gh")]).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory);
    assert_eq!(
        res.framework,
        FrameworkPlan::Fsdp(FsdpPlan {
            fsdp_version: 1,
            offload_params: false
        })
    );
    assert!(reason(&res, Field::Framework).contains("no unified-memory switch"));
}

#[test]
fn generic_jobs_get_env_only() {
    let res = resolve(&generic(), &[gh200("gh")]).unwrap();
    assert_eq!(res.framework, FrameworkPlan::Generic);
    assert!(reason(&res, Field::Framework).contains("env vars only"));
}

#[test]
fn concrete_spec_has_no_auto_left() {
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh")]).unwrap();
    let spec = res.concrete_spec();
    assert!(spec.is_concrete());
    assert_eq!(spec.mode, ModeSetting::UnifiedMemory);
    assert_eq!(spec.overlap, OverlapSetting::Enabled);
}

// ---- rules measured on the GPU (docs/benchmarks/decision-h200.md) ----------------------------

#[test]
fn zero3_copy_offload_offloads_parameters_unless_told_not_to() {
    let job = deepspeed("0.19.8");
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert!(ds_plan(&res).offload_params, "measured 1.5x faster");
    assert!(reason(&res, Field::Framework).contains("measured about 1.5x faster"));
    let mut refused = job.clone();
    refused.deepspeed.offload_params = Some(false);
    assert!(!ds_plan(&resolve(&refused, &[h200("h")]).unwrap()).offload_params);
    // Not on coherent nodes (not measured there) nor below ZeRO-3.
    assert!(!ds_plan(&resolve(&job, &[gh200("gh")]).unwrap()).offload_params);
    let mut z2 = job;
    z2.deepspeed.stage_in_spec = Some(2);
    assert!(!ds_plan(&resolve(&z2, &[h200("h")]).unwrap()).offload_params);
}

#[test]
fn zenflow_needs_consent_and_a_place_where_it_applies() {
    let mut job = deepspeed("0.19.8");
    job.deepspeed.stage_in_spec = Some(2);
    // No consent: off, and not even mentioned.
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert!(!ds_plan(&res).zenflow);
    assert!(reason(&res, Field::Framework).contains("writes no DeepSpeed key"));
    // The job's consent.
    job.deepspeed.zen_flow = Some(true);
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert!(ds_plan(&res).zenflow);
    assert!(
        reason(&res, Field::Framework).contains("ZenFlow on because deepspeed.zenFlow is true")
    );
    // The profile's consent, and a job that refuses it anyway.
    job.deepspeed.zen_flow = None;
    let allowing = OffloadProfileSpec {
        allow_zen_flow: true,
        ..profile()
    };
    let res = resolve_offload(&job, "p", &allowing, &idx(&[h200("h")])).unwrap();
    assert!(ds_plan(&res).zenflow);
    job.deepspeed.zen_flow = Some(false);
    let res = resolve_offload(&job, "p", &allowing, &idx(&[h200("h")])).unwrap();
    assert!(!ds_plan(&res).zenflow);
    assert!(reason(&res, Field::Framework).contains("ZenFlow off"));
    // A zenflow section in the user's own config is consent.
    job.deepspeed.zen_flow = None;
    job.deepspeed.zenflow_in_config = true;
    assert!(ds_plan(&resolve(&job, &[h200("h")]).unwrap()).zenflow);
    // Consent, but a DeepSpeed without it: not written, with the reason.
    let mut old = deepspeed("0.17.4");
    old.deepspeed.zen_flow = Some(true);
    let res = resolve(&old, &[h200("h")]).unwrap();
    assert!(!ds_plan(&res).zenflow);
    assert!(reason(&res, Field::Framework).contains("0.17.5"), "{res:?}");
    // Consent, but ZeRO stage 0.
    let mut z0 = deepspeed("0.19.8");
    z0.deepspeed.stage_in_spec = Some(0);
    z0.deepspeed.zen_flow = Some(true);
    assert!(!ds_plan(&resolve(&z0, &[h200("h")]).unwrap()).zenflow);
}

#[test]
fn overlap_says_what_it_changes_in_every_framework() {
    let res = resolve(&fsdp("2.6.0"), &[h200("h")]).unwrap();
    assert!(reason(&res, Field::Framework).contains("FSDP has no switch for overlapping"));
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh")]).unwrap();
    assert!(reason(&res, Field::Framework).contains("SuperOffload on"));
}
