//! Which unresolved jobs a change of a profile, a node or a ConfigMap concerns.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::ObjectRef;

use crate::api::TrainingJob;
use crate::controller::Context;
use crate::decision::{opted_in, profile_name_for};

/// Whether the job still waits for its workload.
pub(super) fn unresolved(tj: &TrainingJob) -> bool {
    tj.status
        .as_ref()
        .and_then(|s| s.workload.as_ref())
        .is_none()
}

/// The jobs in the cache that deserialized.
fn valid_jobs(ctx: &Context) -> impl Iterator<Item = TrainingJob> {
    ctx.jobs
        .state()
        .into_iter()
        .filter_map(|g| g.0.as_ref().ok().cloned())
}

fn job_ref(tj: &TrainingJob) -> ObjectRef<DeserializeGuard<TrainingJob>> {
    ObjectRef::new(&tj.name_any()).within(&tj.namespace().unwrap_or_default())
}

/// Unresolved jobs that name a profile, for re-triggering when it changes.
pub fn jobs_for_profile(
    ctx: &Context,
    profile: &str,
) -> Vec<ObjectRef<DeserializeGuard<TrainingJob>>> {
    valid_jobs(ctx)
        .filter(|tj| opted_in(tj) && unresolved(tj) && profile_name_for(tj) == profile)
        .map(|tj| job_ref(&tj))
        .collect()
}

/// Unresolved jobs whose profile could use a node (its selector matches, or it has none, or the
/// profile does not exist yet), for re-triggering when the node's labels or report change.
pub fn jobs_for_node(
    ctx: &Context,
    node: &PartialObjectMeta<Node>,
) -> Vec<ObjectRef<DeserializeGuard<TrainingJob>>> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    valid_jobs(ctx)
        .filter(|tj| opted_in(tj) && unresolved(tj))
        .filter(|tj| {
            let selector = ctx
                .profile(&profile_name_for(tj))
                .and_then(|p| p.spec.node_selector.clone());
            match selector.map(kube::core::Selector::try_from) {
                Some(Ok(sel)) => kube::core::SelectorExt::matches(&sel, &labels),
                _ => true,
            }
        })
        .map(|tj| job_ref(&tj))
        .collect()
}

/// Unresolved jobs in `namespace` whose DeepSpeed config is the ConfigMap `name`, for
/// re-triggering when the user fixes it.
pub fn jobs_for_config_map(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Vec<ObjectRef<DeserializeGuard<TrainingJob>>> {
    valid_jobs(ctx)
        .filter(|tj| tj.namespace().as_deref() == Some(namespace) && unresolved(tj))
        .filter(|tj| {
            tj.spec
                .deepspeed
                .as_ref()
                .and_then(|d| d.config_map_ref.as_ref())
                .is_some_and(|r| r.name == name)
        })
        .map(|tj| job_ref(&tj))
        .collect()
}
