//! `offload-operator check` (what `helm test` runs against an installation) and
//! `offload-operator cleanup` (what the chart's uninstall hook runs).

use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};

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
    /// Something did not happen in time.
    #[error("{0}")]
    Stuck(String),
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

/// What `offload-operator cleanup` removes.
#[derive(Clone, Debug)]
pub struct Cleanup {
    /// The operator's namespace.
    pub namespace: String,
    /// The operator-managed webhook certificate Secret.
    pub secret: String,
    /// The leader Lease.
    pub lease: String,
    /// The operator Deployment, stopped first (scaled to zero, its pods waited for) so that no
    /// running replica re-creates the Lease or the Secret once they are gone.
    pub deployment: Option<String>,
    /// Label selector of the operator's pods.
    pub selector: String,
}

/// How long `cleanup` waits for the operator's pods to stop.
const STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Removes what the operator made at run time and no chart object owns: stops the operator,
/// then deletes the webhook certificate Secret and the leader Lease. One line per step.
pub async fn remove_runtime_objects(what: &Cleanup) -> Result<Vec<String>, CheckError> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::api::{Patch, PatchParams};
    let client = Client::try_default().await.map_err(CheckError::Client)?;
    let ns = what.namespace.as_str();
    let mut done = Vec::new();
    if let Some(name) = &what.deployment {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let scaled = gone(
            deployments
                .patch_scale(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({"spec": {"replicas": 0}})),
                )
                .await
                .map(|_| ()),
        )
        .map_err(|source| CheckError::Step {
            step: "scaling the operator Deployment to zero",
            source,
        })?;
        if scaled {
            let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
            let lp = ListParams::default().labels(&what.selector);
            let start = std::time::Instant::now();
            loop {
                let left = pods.list(&lp).await.map_err(|source| CheckError::Step {
                    step: "listing the operator's pods",
                    source,
                })?;
                if left.items.is_empty() {
                    break;
                }
                if start.elapsed() > STOP_TIMEOUT {
                    return Err(CheckError::Stuck(format!(
                        "{} operator pod(s) still running {}s after scaling {name} to zero",
                        left.items.len(),
                        STOP_TIMEOUT.as_secs()
                    )));
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            done.push(format!(
                "Deployment {ns}/{name}: scaled to zero, its pods gone"
            ));
        } else {
            done.push(format!("Deployment {ns}/{name}: not present"));
        }
    }
    let deleted = delete_if_present(
        Api::<Secret>::namespaced(client.clone(), ns),
        &what.secret,
        "deleting the webhook certificate Secret",
    )
    .await?;
    done.push(deleted_line("Secret", ns, &what.secret, deleted));
    let deleted = delete_if_present(
        Api::<Lease>::namespaced(client, ns),
        &what.lease,
        "deleting the leader Lease",
    )
    .await?;
    done.push(deleted_line("Lease", ns, &what.lease, deleted));
    Ok(done)
}

/// `Ok(true)` where the request did it, `Ok(false)` where the object was not there (404).
fn gone(r: Result<(), kube::Error>) -> Result<bool, kube::Error> {
    match r {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes `name` through `api`: whether it was there; `step` names a failure.
async fn delete_if_present<K>(
    api: Api<K>,
    name: &str,
    step: &'static str,
) -> Result<bool, CheckError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    gone(
        api.delete(name, &kube::api::DeleteParams::default())
            .await
            .map(|_| ()),
    )
    .map_err(|source| CheckError::Step { step, source })
}

/// One cleanup line: `Secret ns/name: deleted` (or `not present`).
fn deleted_line(kind: &str, ns: &str, name: &str, deleted: bool) -> String {
    format!(
        "{kind} {ns}/{name}: {}",
        if deleted { "deleted" } else { "not present" }
    )
}
