//! A corpus of hostile AdmissionReviews, sent to every endpoint: each gets a clear answer (a 400
//! or 413 with a JSON error, or a review that denies with a message), never a panic, a 5xx or a
//! hang. The cases are generated, so the corpus stays exhaustive as the endpoints grow.

use super::*;

const PATHS: [&str; 5] = paths::ALL;

/// Nests `depth` objects: `{"a":{"a":…}}`.
fn nested(depth: usize) -> String {
    let mut s = String::with_capacity(depth * 6 + 2);
    for _ in 0..depth {
        s.push_str("{\"a\":");
    }
    s.push('1');
    for _ in 0..depth {
        s.push('}');
    }
    s
}

/// A review of the kind each endpoint expects, with `object` in it.
fn review_for(path: &str, object: Value) -> Value {
    match path {
        paths::VALIDATE_TRAINING_JOB | paths::MUTATE_TRAINING_JOB => {
            tj_review("CREATE", object, None)
        }
        paths::VALIDATE_PROFILE => review(
            "offload.dev",
            "v1alpha1",
            "OffloadProfile",
            "offloadprofiles",
            "CREATE",
            object,
            None,
        ),
        paths::MUTATE_WORKLOAD => review("batch", "v1", "Job", "jobs", "CREATE", object, None),
        _ => review("", "v1", "Pod", "pods", "CREATE", object, None),
    }
}

/// The cases: a name and the raw body.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let base = review("", "v1", "Pod", "pods", "CREATE", json!({}), None);
    // Every field of the request with the wrong type.
    for (field, value) in [
        ("uid", json!(42)),
        ("kind", json!("Pod")),
        ("resource", json!([])),
        ("operation", json!("DESTROY")),
        ("operation", json!(null)),
        ("userInfo", json!("root")),
        ("object", json!("a string")),
        ("object", json!([1, 2, 3])),
        ("oldObject", json!(7)),
        ("namespace", json!({"a": 1})),
        ("dryRun", json!("yes")),
    ] {
        let mut r = base.clone();
        r["request"][field] = value.clone();
        out.push((
            format!("request.{field} = {value}"),
            serde_json::to_vec(&r).unwrap(),
        ));
    }
    // Envelopes of other versions and kinds.
    for (k, v) in [
        ("apiVersion", "admission.k8s.io/v2"),
        ("apiVersion", "admission.k8s.io/v1beta1"),
        ("kind", "ConversionReview"),
    ] {
        let mut r = base.clone();
        r[k] = json!(v);
        out.push((format!("{k} = {v}"), serde_json::to_vec(&r).unwrap()));
    }
    // Nesting far past any parser's recursion limit, inside the object and as the whole body.
    let deep = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"operation":"CREATE","userInfo":{{}},"object":{}}}}}"#,
        nested(100_000)
    );
    out.push(("an object nested 100,000 deep".into(), deep.into_bytes()));
    out.push((
        "a body nested 100,000 deep".into(),
        nested(100_000).into_bytes(),
    ));
    // Just over the body limit.
    let mut big = serde_json::to_vec(&base).unwrap();
    big.extend(std::iter::repeat_n(b' ', crate::webhook::MAX_REVIEW_BYTES));
    out.push(("a body over the 16 MiB limit".into(), big));
    // Truncated at every few bytes of a valid review.
    let valid = serde_json::to_vec(&base).unwrap();
    for cut in (1..valid.len()).step_by(valid.len() / 8 + 1) {
        out.push((format!("a review cut at byte {cut}"), valid[..cut].to_vec()));
    }
    out
}

/// Objects each endpoint must refuse or ignore with a reason.
fn hostile_objects() -> Vec<(&'static str, Value)> {
    vec![
        ("an empty object", json!({})),
        ("metadata as a list", json!({"metadata": [], "spec": {}})),
        (
            "labels of the wrong type",
            json!({"metadata": {"name": "x", "labels": {"offload.dev/profile": 7}}, "spec": {}}),
        ),
        (
            "100,000 containers",
            json!({"metadata": {"name": "x", "labels": {"offload.dev/profile": "auto"}},
                   "spec": {"containers": vec![json!({"name": "c", "image": "i"}); 100_000]}}),
        ),
        (
            "replicas past every integer type",
            json!({"apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
                   "metadata": {"name": "x", "annotations": {"offload.dev/profile": "auto"}},
                   "spec": {"replicas": 1e300, "framework": {"name": "Generic"},
                            "template": {"spec": {"containers": []}}}}),
        ),
        (
            "an offload ratio that is not a number",
            json!({"apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
                   "metadata": {"name": "x"},
                   "spec": {"replicas": 1, "framework": {"name": "Generic"},
                            "offload": {"offloadRatio": "NaN"},
                            "template": {"spec": {"containers": []}}}}),
        ),
        (
            "a profile efficiency of 2",
            json!({"apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
                   "metadata": {"name": "p"}, "spec": {"minOverlapEfficiency": 2.0}}),
        ),
        (
            "a 10 MB annotation",
            json!({"metadata": {"name": "x", "labels": {"offload.dev/profile": "auto"},
                                "annotations": {"offload.dev/framework": "x".repeat(10_000_000)}},
                   "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        ),
    ]
}

/// What every answer must look like: a clear refusal or a well-formed review.
fn check_answer(case: &str, path: &str, status: StatusCode, body: &Value) {
    assert!(
        !status.is_server_error(),
        "{path} {case}: server error {status}: {body}"
    );
    if status == StatusCode::OK {
        let response = &body["response"];
        assert!(response["allowed"].is_boolean(), "{path} {case}: {body}");
        if response["allowed"] == false {
            let msg = response["status"]["message"].as_str().unwrap_or_default();
            assert!(msg.len() > 10, "{path} {case}: a denial says why: {body}");
        }
    } else {
        assert!(
            [StatusCode::BAD_REQUEST, StatusCode::PAYLOAD_TOO_LARGE].contains(&status),
            "{path} {case}: {status}"
        );
    }
}

#[tokio::test]
async fn hostile_envelopes_get_a_clear_answer_on_every_endpoint() {
    for path in PATHS {
        for (case, body) in corpus() {
            let (status, answer) = post(coherent_cluster(), path, body).await;
            check_answer(&case, path, status, &answer);
        }
    }
}

#[tokio::test]
async fn hostile_objects_are_refused_or_ignored_with_a_reason_on_every_endpoint() {
    for path in PATHS {
        for (case, object) in hostile_objects() {
            let body = serde_json::to_vec(&review_for(path, object)).unwrap();
            let (status, answer) = post(coherent_cluster(), path, body).await;
            check_answer(case, path, status, &answer);
        }
    }
}

#[test]
fn the_corpus_reaches_every_routed_endpoint() {
    assert_eq!(crate::webhook::ENDPOINTS.map(|(path, _, _)| path), PATHS);
}
