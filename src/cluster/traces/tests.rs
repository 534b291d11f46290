use std::collections::BTreeMap;

use super::*;
use crate::decision::tests::traced::{NEMOTRON, job_of};

const TRACE: &str = include_str!("../../../tests/fixtures/traces/nemotron-4b-4096.json");

fn step() -> SizerRequest {
    SizerRequest::of(&job_of(NEMOTRON, 4096, None)).unwrap()
}

fn now() -> jiff::Timestamp {
    "2026-12-07T12:00:00Z".parse().unwrap()
}

fn kept(key: &str, text: &str, at: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some("x".into()),
            annotations: Some(BTreeMap::from([(
                names::ANNOTATION_TRACED_AT.to_string(),
                at.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(key.to_string(), text.to_string())])),
        ..Default::default()
    }
}

#[test]
fn a_namespaces_trace_is_named_apart_from_the_clusters_and_from_another_namespaces() {
    let key = step().key();
    let a = config_map_name(&key, Scope::Namespace("team-a"));
    let b = config_map_name(&key, Scope::Namespace("team-b"));
    let c = config_map_name(&key, Scope::Cluster);
    assert!(a != b && a != c && b != c);
    assert!(c.starts_with("offload-trace-") && c.len() <= 63 && a.len() <= 63);
    offload_api::validation::object_name(&a).unwrap();
}

#[test]
fn a_kept_trace_is_used_a_recent_failure_is_said_and_an_old_one_is_tried_again() {
    let options = SizerOptions::default();
    match read(
        &kept(TRACE_KEY, TRACE, "2026-12-07T11:00:00Z"),
        &options,
        now(),
    ) {
        Some(TraceInput::Traced(t)) => assert_eq!(t.parameters, 4_190_509_056),
        other => panic!("{other:?}"),
    }
    let failure = r#"{"code": "CustomCode", "message": "built by the model's own code"}"#;
    match read(
        &kept(FAILURE_KEY, failure, "2026-12-07T11:30:00Z"),
        &options,
        now(),
    ) {
        Some(TraceInput::Untraced(why)) => assert!(why.contains("(CustomCode)"), "{why}"),
        other => panic!("{other:?}"),
    }
    // An hour and more ago: the step is traced again.
    assert_eq!(
        read(
            &kept(FAILURE_KEY, failure, "2026-12-07T10:00:00Z"),
            &options,
            now()
        ),
        None
    );
    // Dated in the future past a clock's skew, or not at all: taken as old.
    assert_eq!(
        read(
            &kept(FAILURE_KEY, failure, "2026-12-08T10:00:00Z"),
            &options,
            now()
        ),
        None
    );
    assert_eq!(
        read(&kept(FAILURE_KEY, failure, "yesterday"), &options, now()),
        None
    );
    // A kept trace someone edited into nonsense is said, not used.
    match read(
        &kept(TRACE_KEY, "{}", "2026-12-07T11:00:00Z"),
        &options,
        now(),
    ) {
        Some(TraceInput::Untraced(why)) => assert!(why.contains("delete it"), "{why}"),
        other => panic!("{other:?}"),
    }
}
