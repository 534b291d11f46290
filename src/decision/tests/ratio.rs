//! The offload ratio, fixed or sized from the node report and model hints.

use super::*;
use crate::api::{ModelHints, RatioSetting};

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
fn auto_ratio_uses_model_hints_and_the_slowest_node() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(ModelHints {
        parameters: 1_000_000_000,
        tokens_per_step: 4096,
    });
    // H200 reading: 1.2e9 params/s CPU, 3e14 FLOP/s GPU.
    // t_backward = 4 * 1e9 * 4096 / 3e14 = 54.6 ms; t_cpu = 1e9 / 1.2e9 = 833 ms; share 6.55 %.
    let res = resolve(&job, &[h200("h-a")]).unwrap();
    assert_eq!(res.ratio, 0.06);
    assert!(
        reason(&res, Field::OffloadRatio).contains("7%"),
        "{}",
        reason(&res, Field::OffloadRatio)
    );

    let slower = with_report(h200("h-b"), |r| r.selftest.cpu_update_rate = Some(0.6e9));
    let res = resolve(&job, &[h200("h-a"), slower]).unwrap();
    assert_eq!(
        res.ratio, 0.05,
        "half the CPU rate halves the share, floored at the minimum"
    );
    assert!(reason(&res, Field::OffloadRatio).contains("h-b"));

    job.model = Some(ModelHints {
        parameters: 1_000_000_000,
        tokens_per_step: 1_000_000,
    });
    let res = resolve(&job, &[h200("h-a")]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("headroom"));
}

#[test]
fn auto_ratio_without_hints_or_rates_is_one_and_says_why() {
    let res = resolve(&deepspeed("0.19.8"), &[h200("h")]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("without model hints"));

    let mut job = deepspeed("0.19.8");
    job.model = Some(ModelHints {
        parameters: 1,
        tokens_per_step: 1,
    });
    let no_rates = with_report(h200("h"), |r| r.selftest.cpu_update_rate = None);
    let res = resolve(&job, &[no_rates]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("lacks"));
}

#[test]
fn auto_ratio_is_lowered_where_the_framework_cannot_take_it() {
    let mut job = fsdp("2.6.0");
    job.model = Some(ModelHints {
        parameters: 1_000_000_000,
        tokens_per_step: 4096,
    });
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("lowered because FSDP"));
}

#[test]
fn a_ratio_out_of_range_is_refused_whatever_path_it_came_by() {
    // Found by the decision fuzz target: the API's schema refuses these, but the decision must
    // not trust its caller.
    for r in [1.024, 0.0, -0.5, f64::NAN, f64::INFINITY] {
        let mut job = deepspeed("0.19.8");
        job.offload.offload_ratio = crate::api::RatioSetting::Fixed(r);
        let err = resolve(&job, &[h200("h")]).unwrap_err();
        assert_eq!(err.category(), "InvalidOffloadRatio", "{r}: {err}");
    }
}
