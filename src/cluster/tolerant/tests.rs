use kube::core::{DeserializeGuard, ObjectList, WatchEvent};
use serde_json::json;

use super::*;
use offload_api::v1alpha1::TrainingJob;

/// `{"a":{"a":…1…}}`, `levels` objects deep.
fn nested(levels: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(levels), "}".repeat(levels))
}

fn job(name: &str, extra_container_field: Option<&str>) -> String {
    let mut container = json!({"name": "train", "image": "train:1"}).to_string();
    if let Some(raw) = extra_container_field {
        container.insert_str(container.len() - 1, &format!(",\"x\":{raw}"));
    }
    format!(
        r#"{{"apiVersion":"offload.dev/v1alpha1","kind":"TrainingJob",
             "metadata":{{"name":"{name}","namespace":"ml","uid":"u-{name}","resourceVersion":"7"}},
             "spec":{{"framework":{{"name":"Generic"}},
                      "template":{{"spec":{{"containers":[{container}]}}}}}}}}"#
    )
}

fn list(items: &[String]) -> String {
    format!(
        r#"{{"apiVersion":"offload.dev/v1alpha1","kind":"TrainingJobList","metadata":{{"resourceVersion":"9"}},"items":[{}]}}"#,
        items.join(",")
    )
}

#[test]
fn a_deep_object_no_longer_fails_the_whole_list() {
    let deep = job("deep", Some(&nested(200)));
    let body = list(&[job("plain", None), deep, job("after", None)]);
    // Before: kube's guard buffers every object under serde_json's depth limit, so the list
    // as a whole does not read and the controller sees no TrainingJob at all.
    assert!(serde_json::from_str::<ObjectList<DeserializeGuard<TrainingJob>>>(&body).is_err());
    let read: ObjectList<Tolerant<TrainingJob>> = serde_json::from_str(&body).unwrap();
    let names: Vec<_> = read.items.iter().map(|g| g.meta().name.clone()).collect();
    assert_eq!(
        names,
        [
            Some("plain".into()),
            Some("deep".into()),
            Some("after".into())
        ]
    );
    // The deep part is an unknown field, which the type skips: the object reads whole.
    assert!(read.items.iter().all(|g| g.ok().is_some()));
}

#[test]
fn deep_managed_fields_are_dropped_and_the_object_read() {
    let deep = nested(300);
    let text = job("managed", None).replacen(
        r#""resourceVersion":"7""#,
        &format!(
            r#""resourceVersion":"7","managedFields":[{{"manager":"kubectl","operation":"Update","fieldsType":"FieldsV1","fieldsV1":{deep}}}]"#
        ),
        1,
    );
    let g: Tolerant<TrainingJob> = serde_json::from_str(&text).unwrap();
    let tj = g.ok().expect("read without its managed fields");
    assert_eq!(tj.meta().name.as_deref(), Some("managed"));
    assert!(tj.meta().managed_fields.is_none());
}

#[test]
fn an_object_that_cannot_be_read_is_named_with_the_reason() {
    // Deep in a typed field (labels are strings) and wrong types: not readable as a job.
    let wrong_type = job("typed", None).replacen(r#""template":"#, r#""template":5,"x":"#, 1);
    let g: Tolerant<TrainingJob> = serde_json::from_str(&wrong_type).unwrap();
    let invalid = g.0.as_ref().unwrap_err();
    assert_eq!(invalid.metadata.name.as_deref(), Some("typed"));
    assert_eq!(invalid.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(invalid.metadata.uid.as_deref(), Some("u-typed"));
    assert_eq!(invalid.metadata.resource_version.as_deref(), Some("7"));
    assert!(invalid.error.contains("invalid type"), "{}", invalid.error);

    // A kind with a free-form field (here any object): nesting past serde_json's limit there
    // is named as such, and the object's name still read.
    let deep: Tolerant<kube::api::DynamicObject> =
        serde_json::from_str(&job("free", Some(&nested(200)))).unwrap();
    let invalid = deep.0.unwrap_err();
    assert!(
        invalid.error.contains("nested more than 128 levels"),
        "{}",
        invalid.error
    );
    assert_eq!(invalid.metadata.name.as_deref(), Some("free"));
}

#[test]
fn watch_events_carry_deep_objects_too() {
    let line = format!(
        r#"{{"type":"ADDED","object":{}}}"#,
        job("watched", Some(&nested(250)))
    );
    let event: WatchEvent<Tolerant<TrainingJob>> = serde_json::from_str(&line).unwrap();
    let WatchEvent::Added(g) = event else {
        panic!("not an ADDED event");
    };
    assert_eq!(g.ok().unwrap().meta().name.as_deref(), Some("watched"));
}

#[test]
fn values_read_the_same_as_text() {
    let value: serde_json::Value = serde_json::from_str(&job("v", None)).unwrap();
    let g: Tolerant<TrainingJob> = serde_json::from_value(value).unwrap();
    assert_eq!(g.ok().unwrap().meta().name.as_deref(), Some("v"));
    // Not an object at all: no name, a reason.
    let g: Tolerant<TrainingJob> = serde_json::from_str("[1,2]").unwrap();
    assert!(g.0.unwrap_err().metadata.name.is_none());
}
