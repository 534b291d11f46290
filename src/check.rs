//! `offload-operator check` (what `helm test` runs against an installation) and
//! `offload-operator cleanup` (what the chart's uninstall hook runs).

use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

use crate::api::{OffloadProfile, TrainingJob};
use crate::names;

/// An installation check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// No usable credentials.
    #[error("no usable kubeconfig or in-cluster service account: {0}")]
    Client(#[source] kube::Error),
    /// A step failed.
    #[error("{step}: {source}")]
    Step {
        /// What was checked.
        step: &'static str,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// The check's TrainingJob could not be built (a bug).
    #[error("building the dry-run TrainingJob: {0}")]
    Build(#[from] serde_json::Error),
}

/// Runs the checks; returns one line per check passed.
pub async fn installation(profile: &str, namespace: &str) -> Result<Vec<String>, CheckError> {
    let client = Client::try_default().await.map_err(CheckError::Client)?;
    let mut passed = Vec::new();
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    let listed = profiles
        .list(&ListParams::default().limit(50))
        .await
        .map_err(|source| CheckError::Step {
            step: "listing OffloadProfiles (are the CRDs installed?)",
            source,
        })?;
    passed.push(format!(
        "the offload.dev CRDs are served ({} OffloadProfile(s))",
        listed.items.len()
    ));
    if !profile.is_empty() {
        profiles
            .get(profile)
            .await
            .map_err(|source| CheckError::Step {
                step: "reading the OffloadProfile jobs use for `auto`",
                source,
            })?;
        passed.push(format!("OffloadProfile {profile:?} exists"));
    }
    // The webhooks are called for a dry run (they declare no side effects); one that cannot be
    // reached fails the request under failurePolicy Fail.
    let tj: TrainingJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "offload-operator-check",
                     "annotations": {names::PROFILE_ANNOTATION: names::PROFILE_AUTO}},
        "spec": {"framework": {"name": "Generic"},
                 "template": {"spec": {"containers": [{"name": "check", "image": "check"}]}}}
    }))?;
    let created = Api::<TrainingJob>::namespaced(client, namespace)
        .create(
            &PostParams {
                dry_run: true,
                field_manager: Some(names::OPERATOR_MANAGER.to_string()),
            },
            &tj,
        )
        .await
        .map_err(|source| CheckError::Step {
            step: "a dry-run TrainingJob through the admission webhooks",
            source,
        })?;
    passed.push(format!(
        "the admission webhooks answered a dry-run TrainingJob in {namespace} ({})",
        created.name_any()
    ));
    Ok(passed)
}

/// Deletes what the operator made at run time that no chart object owns: the managed webhook
/// certificate Secret and the leader Lease. Absent objects are fine (already gone).
pub async fn remove_runtime_objects(
    namespace: &str,
    secret: &str,
    lease: &str,
) -> Result<Vec<String>, CheckError> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::DeleteParams;
    let client = Client::try_default().await.map_err(CheckError::Client)?;
    let mut done = Vec::new();
    let gone = |r: Result<_, kube::Error>| match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    };
    let deleted = gone(
        Api::<Secret>::namespaced(client.clone(), namespace)
            .delete(secret, &DeleteParams::default())
            .await
            .map(|_| ()),
    )
    .map_err(|source| CheckError::Step {
        step: "deleting the webhook certificate Secret",
        source,
    })?;
    done.push(format!(
        "Secret {namespace}/{secret}: {}",
        if deleted { "deleted" } else { "not present" }
    ));
    let deleted = gone(
        Api::<Lease>::namespaced(client, namespace)
            .delete(lease, &DeleteParams::default())
            .await
            .map(|_| ()),
    )
    .map_err(|source| CheckError::Step {
        step: "deleting the leader Lease",
        source,
    })?;
    done.push(format!(
        "Lease {namespace}/{lease}: {}",
        if deleted { "deleted" } else { "not present" }
    ));
    Ok(done)
}
