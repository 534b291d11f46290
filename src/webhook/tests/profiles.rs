//! OffloadProfile validation.

use super::*;

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
    assert!(
        denial(&r).contains("spec.nodeSelector is not a valid label selector"),
        "{r}"
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
