//! OffloadProfile validation.

use super::*;

// ---- OffloadProfile --------------------------------------------------------------------------

fn profile_review(spec: Value) -> Value {
    review(
        "offload.dev",
        "v1alpha1",
        "OffloadProfile",
        "offloadprofiles",
        "CREATE",
        json!({"apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile", "metadata": {"name": "p"}, "spec": spec}),
        None,
    )
}

#[tokio::test]
async fn profiles_with_bad_or_empty_selectors() {
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_PROFILE,
        profile_review(
            json!({"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Near"}]}}),
        ),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.nodeSelector is not a valid label selector")
    );
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_PROFILE,
        profile_review(json!({"nodeSelector": {"matchLabels": {"pool": "nowhere"}}})),
    )
    .await;
    assert_eq!(r["allowed"], true);
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap()
            .contains("matches none of the 2 GPU node(s)")
    );
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_PROFILE,
        profile_review(json!({"mode": "Auto"})),
    )
    .await;
    assert_eq!(r["allowed"], true);
}
