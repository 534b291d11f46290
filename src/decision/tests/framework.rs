//! Framework versions, FSDP and Generic.

use super::*;
use crate::api::{ModeSetting, OffloadMode};

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
    job.deepspeed.offload_params = true;
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
