//! What runs taught: the store's bounds, fading, merging and refusals.

use super::*;

const NOW: &str = "2026-12-01T12:00:00Z";

fn now() -> jiff::Timestamp {
    NOW.parse().unwrap()
}

fn run(job: &str, a: f64, h: Option<f64>, at: &str) -> Run {
    Run {
        job: job.into(),
        activations: a,
        host: h,
        failed: false,
        parameters: None,
        allocator: false,
        ran_as: None,
        trained: false,
        trial: false,
        step_seconds: None,
        at: at.into(),
    }
}

#[test]
fn the_allocators_figure_of_a_run_replaces_the_devices() {
    let mut s = store(vec![run("a", 1.5, None, NOW)]);
    let told = Run {
        allocator: true,
        ..run("a", 0.8, None, NOW)
    };
    assert!(s.record("p", NodeClass::Discrete, "k", "k", told).unwrap());
    let f = s.factors("p", NodeClass::Discrete, "k", now()).unwrap();
    assert!((f.activations - 0.9).abs() < 1e-9, "{f:?}");
    // A later device window of the same run does not undo it.
    s.record("p", NodeClass::Discrete, "k", "k", run("a", 1.7, None, NOW))
        .unwrap();
    let f = s.factors("p", NodeClass::Discrete, "k", now()).unwrap();
    assert!((f.activations - 0.9).abs() < 1e-9, "{f:?}");
}

fn store(runs: Vec<Run>) -> LearnedMemory {
    let mut s = LearnedMemory::default();
    for r in runs {
        s.record("p", NodeClass::Discrete, "k", "8B", r).unwrap();
    }
    s
}

#[test]
fn one_run_below_goes_half_way_and_two_go_all_the_way() {
    let one = store(vec![run("a", 0.4, Some(0.8), NOW)]);
    let f = one.factors("p", NodeClass::Discrete, "k", now()).unwrap();
    assert!((f.activations - 0.7).abs() < 1e-9, "{f:?}");
    assert!((f.host - 0.9).abs() < 1e-9, "{f:?}");
    let two = store(vec![run("a", 0.4, None, NOW), run("b", 0.45, None, NOW)]);
    let f = two.factors("p", NodeClass::Discrete, "k", now()).unwrap();
    assert!(
        (f.activations - 0.45).abs() < 1e-9,
        "the larger of the two: {f:?}"
    );
    assert_eq!(f.host, 1.0, "no host figure: unchanged");
    assert_eq!(f.runs, 2);
    assert!(
        two.factors("p", NodeClass::Coherent, "k", now()).is_none(),
        "another class learned nothing"
    );
    assert!(two.factors("q", NodeClass::Discrete, "k", now()).is_none());
}

#[test]
fn one_run_above_grows_it_with_a_margin_and_age_fades_it() {
    let s = store(vec![run("a", 0.5, None, NOW), run("b", 1.5, None, NOW)]);
    let f = s.factors("p", NodeClass::Discrete, "k", now()).unwrap();
    assert!((f.activations - 1.575).abs() < 1e-9, "{f:?}");
    // Two half-lives later the lesson is a quarter as strong; after 90 days it is gone.
    let later: jiff::Timestamp = "2026-12-29T12:00:00Z".parse().unwrap();
    let f = s.factors("p", NodeClass::Discrete, "k", later).unwrap();
    assert!((f.activations - 1.125 * 1.05).abs() < 1e-9, "{f:?}");
    let gone: jiff::Timestamp = "2027-04-01T12:00:00Z".parse().unwrap();
    assert!(s.factors("p", NodeClass::Discrete, "k", gone).is_none());
}

#[test]
fn a_run_dated_in_the_future_is_never_used() {
    // A hand-made entry of year 2999: not a run that "never fades", no run at all.
    let s = store(vec![run("a", 3.0, Some(2.0), "2999-01-01T00:00:00Z")]);
    assert!(s.factors("p", NodeClass::Discrete, "k", now()).is_none());
    // Beside a real run, only the real one counts; a few minutes ahead (another replica's
    // clock) is a real run.
    let s = store(vec![
        run("a", 3.0, None, "2999-01-01T00:00:00Z"),
        run("b", 1.5, None, NOW),
    ]);
    let f = s.factors("p", NodeClass::Discrete, "k", now()).unwrap();
    assert!((f.activations - 1.575).abs() < 1e-9, "{f:?}");
    let s = store(vec![run("b", 1.5, None, "2026-12-01T12:05:00Z")]);
    assert!(s.factors("p", NodeClass::Discrete, "k", now()).is_some());
}

#[test]
fn a_jobs_later_windows_update_its_own_run_and_only_rise() {
    let mut s = store(vec![run("a", 0.5, Some(1.0), NOW)]);
    assert!(
        !s.record(
            "p",
            NodeClass::Discrete,
            "k",
            "8B",
            run("a", 0.502, Some(1.0), NOW)
        )
        .unwrap(),
        "under 1 %: not worth a write"
    );
    assert!(
        s.record(
            "p",
            NodeClass::Discrete,
            "k",
            "8B",
            run("a", 0.6, Some(0.9), NOW)
        )
        .unwrap()
    );
    assert_eq!(s.entries[0].runs.len(), 1);
    assert_eq!(s.entries[0].runs[0].activations, 0.6);
    assert_eq!(s.entries[0].runs[0].host, Some(1.0), "the higher is kept");
    for i in 0..20 {
        s.record(
            "p",
            NodeClass::Discrete,
            "k",
            "8B",
            run(&format!("j{i}"), 1.0, None, NOW),
        )
        .unwrap();
    }
    assert_eq!(s.entries[0].runs.len(), MAX_RUNS);
}

fn ran(ratio: f64) -> RanAs {
    RanAs {
        placement: StatePlacement::PartialOptimizer,
        ratio,
        ranks: 1,
        gpu_bytes: 150_754_820_096,
    }
}

#[test]
fn runs_keep_what_they_ran_and_how_it_ended() {
    let mut s = LearnedMemory::default();
    let trained = Run {
        ran_as: Some(ran(0.36)),
        trained: true,
        allocator: true,
        ..run("a", 0.9, None, NOW)
    };
    s.record("p", NodeClass::Discrete, "k", "8B", trained.clone())
        .unwrap();
    let ev = s.evidence("p", NodeClass::Discrete, "k", now());
    assert_eq!(ev.len(), 1);
    assert!(ev[0].trained && !ev[0].failed && ev[0].allocator);
    assert_eq!(ev[0].ran_as, ran(0.36));
    // A later window of the same run that ran out: it did not train after all.
    let out = Run {
        failed: true,
        trained: false,
        ..trained.clone()
    };
    assert!(s.record("p", NodeClass::Discrete, "k", "8B", out).unwrap());
    let ev = s.evidence("p", NodeClass::Discrete, "k", now());
    assert!(!ev[0].trained && ev[0].failed, "{ev:?}");
    // Runs recorded before configurations were kept are no evidence; nor are runs of
    // another class, or dated after now.
    s.record(
        "p",
        NodeClass::Discrete,
        "k",
        "8B",
        run("b", 1.0, None, NOW),
    )
    .unwrap();
    let future = Run {
        ran_as: Some(ran(0.2)),
        trained: true,
        ..run("c", 1.0, None, "2999-01-01T00:00:00Z")
    };
    s.record("p", NodeClass::Discrete, "k", "8B", future)
        .unwrap();
    assert_eq!(s.evidence("p", NodeClass::Discrete, "k", now()).len(), 1);
    assert!(s.evidence("p", NodeClass::Coherent, "k", now()).is_empty());
    // The setting: the same ranks and GPUs within 1 %.
    assert!(ran(0.3).same_setting(1, 150_000_000_000));
    assert!(!ran(0.3).same_setting(2, 150_754_820_096));
    assert!(!ran(0.3).same_setting(1, 85_520_809_984));
}

#[test]
fn configurations_no_run_ran_are_refused() {
    let mut s = LearnedMemory::default();
    for (bad, says) in [
        (ran(1.5), "ratio 1.5"),
        (ran(0.0), "without a share"),
        (
            RanAs {
                ranks: 0,
                ..ran(0.3)
            },
            "0 ranks",
        ),
        (
            RanAs {
                gpu_bytes: 1 << 50,
                ..ran(0.3)
            },
            "GPUs of",
        ),
    ] {
        let r = Run {
            ran_as: Some(bad),
            ..run("a", 1.0, None, NOW)
        };
        let err = s
            .record("p", NodeClass::Discrete, "k", "8B", r)
            .unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    let both = Run {
        trained: true,
        failed: true,
        ..run("a", 1.0, None, NOW)
    };
    let err = s
        .record("p", NodeClass::Discrete, "k", "8B", both)
        .unwrap_err();
    assert!(err.to_string().contains("both trained"), "{err}");
    assert!(s.entries.is_empty());
}

#[test]
fn bad_lessons_and_documents_are_refused() {
    let mut s = LearnedMemory::default();
    for bad in [
        run("a", f64::NAN, None, NOW),
        run("a", 0.01, None, NOW),
        run("a", 1e9, None, NOW),
        run("a", 1.0, Some(-1.0), NOW),
        run("a", 1.0, None, "yesterday"),
        Run {
            step_seconds: Some(-2.0),
            ..run("a", 1.0, None, NOW)
        },
        Run {
            step_seconds: Some(f64::INFINITY),
            ..run("a", 1.0, None, NOW)
        },
        Run {
            step_seconds: Some(1e9),
            ..run("a", 1.0, None, NOW)
        },
    ] {
        assert!(
            s.record("p", NodeClass::Discrete, "k", "8B", bad.clone())
                .is_err(),
            "{bad:?}"
        );
    }
    assert!(s.entries.is_empty(), "nothing recorded");
    let good = store(vec![run("a", 0.5, None, NOW)]).to_json().unwrap();
    assert!(LearnedMemory::parse(&good).is_ok());
    for (text, want) in [
        ("not json".to_string(), "not valid JSON"),
        (
            good.replace("\"schemaVersion\":1", "\"schemaVersion\":9"),
            "schema version 9",
        ),
        (good.replace("0.5", "1e300"), "activation factor"),
        (
            good.replace("\"at\"", "\"stepSeconds\":-1,\"at\""),
            "steps in -1 s",
        ),
        ("x".repeat(MAX_LEARNED_BYTES + 1), "bytes, more than"),
    ] {
        let err = LearnedMemory::parse(&text).unwrap_err().to_string();
        assert!(err.contains(want), "{err} should say {want}");
    }
    let mut twice: LearnedMemory = serde_json::from_str(&good).unwrap();
    twice.entries.push(twice.entries[0].clone());
    let err = LearnedMemory::parse(&twice.to_json().unwrap()).unwrap_err();
    assert!(err.to_string().contains("listed twice"), "{err}");
}

/// A trial taken counts for its shape until its job's run is recorded, for 24 hours at most,
/// in its namespace, and never against the job that took it.
#[test]
fn a_trial_taken_counts_until_its_run_is_recorded() {
    let mut s = store(vec![]);
    let taken = |job: &str, at: &str| Reservation {
        profile: "p".into(),
        class: NodeClass::Discrete,
        shape: "k".into(),
        job: job.into(),
        at: at.into(),
    };
    s.reservations = vec![
        taken("ns/a/1", NOW),
        taken("other/b/2", NOW),
        taken("ns/old/3", "2026-11-01T00:00:00Z"),
    ];
    let count = |s: &LearnedMemory, ns: Option<&str>, except: Option<&str>| {
        s.reserved_trials("p", NodeClass::Discrete, "k", now(), ns, except)
    };
    assert_eq!(count(&s, None, None), 2);
    assert_eq!(count(&s, Some("ns"), None), 1);
    assert_eq!(count(&s, Some("ns"), Some("ns/a/1")), 0);
    assert_eq!(
        s.reserved_trials("p", NodeClass::Coherent, "k", now(), None, None),
        0
    );
    // Its run recorded: the run counts, not the reservation.
    s.record(
        "p",
        NodeClass::Discrete,
        "k",
        "k",
        run("ns/a/1", 1.0, None, NOW),
    )
    .unwrap();
    assert_eq!(count(&s, Some("ns"), None), 0);
}
