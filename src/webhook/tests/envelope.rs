//! Bodies that are not AdmissionReviews, garbage inside a readable one, and reviews as large as the API server sends.

use futures::StreamExt as _;

use super::*;

// ---- malformed bodies ------------------------------------------------------------------------

#[tokio::test]
async fn unreadable_envelopes_get_400_with_a_json_error() {
    for path in [
        paths::VALIDATE_TRAINING_JOB,
        paths::VALIDATE_PROFILE,
        paths::MUTATE_TRAINING_JOB,
        paths::MUTATE_WORKLOAD,
        paths::MUTATE_POD,
    ] {
        for body in [
            b"".to_vec(),
            b"not json".to_vec(),
            b"{\"apiVersion\": 3}".to_vec(),
            b"[1,2]".to_vec(),
            vec![0xff, 0xfe, 0x00],
        ] {
            let (status, json) = post(coherent_cluster(), path, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body:?}");
            assert!(
                json["error"].as_str().unwrap().contains("AdmissionReview"),
                "{json}"
            );
        }
        // A review without a request.
        let (status, json) = post(
            coherent_cluster(),
            path,
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    }
}

#[tokio::test]
async fn garbage_inside_a_readable_envelope_is_denied_with_the_uid_kept() {
    let bad = json!({"apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "x"}, "spec": {"framework": {"name": "Caffe"}}});
    let r = validate_new(coherent_cluster(), bad).await;
    assert!(denial(&r).contains("TrainingJob is invalid"), "{r}");
    let bad_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "nope"}});
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", bad_pod, None),
    )
    .await;
    assert_eq!(r["allowed"], false);
}

/// An UPDATE review carries the old and the new object; for a TrainingJob near the API
/// server's object size limit that is well over 2 MiB, which the webhook refused with 413.
#[tokio::test]
async fn reviews_as_large_as_the_api_server_sends_are_read() {
    let mut tj = training_job(json!({}), json!({"name": "Generic"}));
    tj["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "BIG", "value": "x".repeat(1_500_000)}]);
    let body = serde_json::to_vec(&tj_review("UPDATE", tj.clone(), Some(tj))).unwrap();
    assert!(body.len() > 3_000_000, "{} bytes", body.len());
    let (status, answer) = post(discrete_cluster(), paths::VALIDATE_TRAINING_JOB, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

/// A client that sends the start of a review and then nothing more is answered once the body
/// deadline has passed, not held for as long as it keeps the connection open.
#[tokio::test(start_paused = true)]
async fn a_body_that_stops_arriving_is_answered_at_the_deadline() {
    let first = futures::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::from_static(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"#,
    ))]);
    let stalled = first.chain(futures::stream::pending());
    let started = tokio::time::Instant::now();
    let answer = coherent_cluster().oneshot(
        Request::post(paths::VALIDATE_TRAINING_JOB)
            .header("content-type", "application/json")
            .body(Body::from_stream(stalled))
            .unwrap(),
    );
    let res = tokio::time::timeout(super::super::READ_TIMEOUT * 3, answer)
        .await
        .expect("no answer within three times the body deadline")
        .unwrap();
    let waited = started.elapsed();
    assert!(res.status().is_client_error(), "{}", res.status());
    assert!(
        waited >= super::super::READ_TIMEOUT && waited < super::super::READ_TIMEOUT * 2,
        "answered after {waited:?}"
    );
}
