//! Overlap and pinned memory.

use super::*;

// ---- overlap ---------------------------------------------------------------------------------

#[test]
fn overlap_auto_compares_the_lowest_efficiency_with_the_profile_minimum() {
    let mut strict = profile();
    strict.min_overlap_efficiency = 0.95;
    let res = resolve_offload(
        &deepspeed("0.19.8"),
        "strict",
        &strict,
        &idx(&[gh200("gh-a")]),
    )
    .unwrap();
    assert!(!res.overlap);
    let why = reason(&res, Field::Overlap);
    assert!(why.contains("0.91") && why.contains("0.95"), "{why}");
    assert_eq!(res.overlap_efficiency, Some(0.91));
    assert!(!ds_plan(&res).super_offload, "no overlap, no SuperOffload");

    let slow = with_report(gh200("gh-b"), |r| r.selftest.efficiency = Some(0.82));
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh-a"), slow]).unwrap();
    assert!(res.overlap);
    assert!(reason(&res, Field::Overlap).contains("0.82 on gh-b"));
}

#[test]
fn overlap_auto_is_off_when_any_chosen_node_is_untested_or_unreadable() {
    let untested = with_report(gh200("gh-b"), |r| {
        r.selftest.verdict = offload_api::report::OverlapVerdict::Untested;
        r.selftest.efficiency = None;
    });
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh-a"), untested]).unwrap();
    assert!(!res.overlap);
    assert!(reason(&res, Field::Overlap).contains("gh-b has not run"));

    // A label that contradicts the report is a conflict, not a verdict.
    let conflicting = with_label(gh200("gh-c"), names::LABEL_OVERLAP, "failed");
    let res = resolve(&deepspeed("0.19.8"), &[conflicting]).unwrap();
    assert!(!res.overlap);
    let why = reason(&res, Field::Overlap);
    assert!(why.contains("contradicts its report"), "{why}");

    // An unreadable report makes the node no candidate at all.
    let broken = NodeInfo::new(
        "gh-d",
        gh200("gh-d").labels,
        Some(NodeReport::parse("{\"schemaVersion\": 99}")),
    );
    let err = resolve(&deepspeed("0.19.8"), &[broken]).unwrap_err();
    assert!(matches!(err, ResolveError::NoReportedNodes { .. }), "{err}");
}

#[test]
fn overlap_enabled_or_disabled_by_the_job_wins() {
    let mut job = deepspeed("0.19.8");
    job.offload.overlap = OverlapSetting::Enabled;
    let res = resolve(&job, &[hmm("p-a")]).unwrap();
    assert!(res.overlap);
    assert!(reason(&res, Field::Overlap).contains("0.12"));
    job.offload.overlap = OverlapSetting::Disabled;
    let res = resolve(&job, &[gh200("gh-a")]).unwrap();
    assert!(!res.overlap);
    assert!(!ds_plan(&res).super_offload);
}
