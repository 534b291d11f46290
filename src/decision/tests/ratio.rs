//! The offload ratio, fixed or sized from the node report and model hints.

use super::*;
use offload_api::v1alpha1::RatioSetting;

// ---- ratio -----------------------------------------------------------------------------------

#[test]
fn a_job_ratio_the_framework_cannot_take_is_rejected_with_what_to_change() {
    let mut job = deepspeed("0.19.8");
    job.offload.offload_ratio = RatioSetting::Fixed(0.5);
    job.deepspeed.stage_in_spec = Some(2);
    let err = resolve(&job, &[h200("h")]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("stage 3") && msg.contains("set spec.offload.offloadRatio to 1 or Auto"),
        "{msg}"
    );

    let mut old = deepspeed("0.12.2");
    old.offload.offload_ratio = RatioSetting::Fixed(0.5);
    let msg = resolve(&old, &[h200("h")]).unwrap_err().to_string();
    assert!(msg.contains("0.12.3"), "{msg}");

    let mut f = fsdp("2.6.0");
    f.offload.offload_ratio = RatioSetting::Fixed(0.5);
    assert!(
        resolve(&f, &[h200("h")])
            .unwrap_err()
            .to_string()
            .contains("FSDP has no partial-offload")
    );
}

#[test]
fn a_profile_ratio_the_framework_cannot_take_is_lowered() {
    let mut p = profile();
    p.offload_ratio = RatioSetting::Fixed(0.5);
    let res = resolve_offload(&fsdp("2.6.0"), "half", &p, &idx(&[h200("h")])).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("lowered"));
    let res = resolve_offload(&deepspeed("0.19.8"), "half", &p, &idx(&[h200("h")])).unwrap();
    assert_eq!(res.ratio, 0.5);
    assert!(ds_plan(&res).write_ratio);
}

#[test]
fn auto_ratio_is_the_smallest_share_that_fits_and_says_whether_the_cpu_keeps_up() {
    // 9.1B parameters on one H200 (the benchmark's model): it does not fit without offload,
    // a partial share does.
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(9_122_865_152, 2048, 44));
    let res = resolve(&job, &[h200("h-a")]).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert!((0.25..=0.45).contains(&res.ratio), "{}", res.ratio);
    let why = reason(&res, Field::OffloadRatio);
    assert!(
        why.starts_with(&format!("{}: the smallest share", res.ratio)),
        "the reason gives the value written: {why}"
    );
    assert!(why.contains("each GPU can hold"), "{why}");
    // H200 reading: 1.2e9 params/s CPU, 3e14 FLOP/s GPU, 2048 tokens: the CPU updates about
    // 0.3% of the state within backward, far below the share written.
    assert!(why.contains("the CPU is the bottleneck"), "{why}");
    let plan = ds_plan(&res);
    assert!(plan.write_ratio && !plan.offload_params);
    assert_eq!(plan.sub_group_size, Some(92_000_000));

    // A slower node of the class is the one named.
    let slower = with_report(h200("h-b"), |r| r.selftest.cpu_update_rate = Some(0.6e9));
    let res = resolve(&job, &[h200("h-a"), slower]).unwrap();
    assert!(reason(&res, Field::OffloadRatio).contains("on h-b"));

    // Where the CPU keeps up with the share written, the reason says so.
    let fast = with_report(h200("h-a"), |r| r.selftest.cpu_update_rate = Some(1e14));
    let res = resolve(&job, &[fast]).unwrap();
    assert!(
        reason(&res, Field::OffloadRatio)
            .contains("within the GPU's backward time on every chosen node"),
        "{}",
        reason(&res, Field::OffloadRatio)
    );
}

#[test]
fn auto_ratio_without_hints_is_one_and_says_how_to_size_it() {
    let res = resolve(&deepspeed("0.19.8"), &[h200("h")]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("without model hints"));
    assert!(reason(&res, Field::Mode).contains("set spec.model.parameters"));
}

#[test]
fn a_framework_without_partial_offload_offloads_whole_when_it_must() {
    // FSDP has no ratio: a model that does not fit gets FSDP's CPU offload (parameters,
    // gradients and optimizer state), ratio 1.
    let mut job = fsdp("2.6.0");
    job.model = Some(bench_hints(9_122_865_152, 2048, 44));
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert_eq!(res.ratio, 1.0);
    assert!(matches!(res.framework, FrameworkPlan::Fsdp(p) if p.offload_params));
}

#[test]
fn a_ratio_out_of_range_is_refused_whatever_path_it_came_by() {
    // Found by the decision fuzz target: the API's schema refuses these, but the decision must
    // not trust its caller.
    for r in [1.024, 0.0, -0.5, f64::NAN, f64::INFINITY] {
        let mut job = deepspeed("0.19.8");
        job.offload.offload_ratio = offload_api::v1alpha1::RatioSetting::Fixed(r);
        let err = resolve(&job, &[h200("h")]).unwrap_err();
        assert_eq!(err.category(), "InvalidOffloadRatio", "{r}: {err}");
    }
}
