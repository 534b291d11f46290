//! Which unresolved jobs a change of a profile, a node or a ConfigMap concerns.

use crate::cluster::tolerant::Tolerant;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::controller::Context;
use crate::decision::{opted_in, profile_name_for};
use offload_api::names;
use offload_api::observed::ObservedSummary;
use offload_api::v1alpha1::{ConfigMapKeyRef, TrainingJob};

/// Whether the job still waits for its workload.
pub(super) fn unresolved(tj: &TrainingJob) -> bool {
    tj.status
        .as_ref()
        .and_then(|s| s.workload.as_ref())
        .is_none()
}

/// The cached jobs that deserialized, still wait for their workload and satisfy `keep`, as
/// references (the jobs are borrowed from the cache, never copied: these mappers run on every
/// change of a watched object, over every job).
fn waiting_jobs(
    ctx: &Context,
    keep: impl Fn(&TrainingJob) -> bool,
) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    ctx.jobs
        .state()
        .iter()
        .filter_map(|g| g.ok())
        .filter(|tj| unresolved(tj) && keep(tj))
        .map(job_ref)
        .collect()
}

fn job_ref(tj: &TrainingJob) -> ObjectRef<Tolerant<TrainingJob>> {
    ObjectRef::new(&tj.name_any()).within(&tj.namespace().unwrap_or_default())
}

/// Unresolved jobs that name a profile, for re-triggering when it changes.
pub fn jobs_for_profile(ctx: &Context, profile: &str) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    waiting_jobs(ctx, |tj| opted_in(tj) && profile_name_for(tj) == profile)
}

/// Unresolved jobs whose profile could use a node (its selector matches, or it has none, or the
/// profile does not exist yet), for re-triggering when the node's labels or report change.
pub fn jobs_for_node(ctx: &Context, node: &Node) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    waiting_jobs(ctx, |tj| {
        if !opted_in(tj) {
            return false;
        }
        let selector = ctx
            .profile(&profile_name_for(tj))
            .and_then(|p| p.spec.node_selector.clone());
        match selector.map(kube::core::Selector::try_from) {
            Some(Ok(sel)) => kube::core::SelectorExt::matches(&sel, &labels),
            _ => true,
        }
    })
}

/// The jobs a node's new observation lists (each pod's `offload.dev/training-job`), for
/// recording it in their status; also forgets the metrics of jobs that are gone.
pub fn jobs_for_observation(ctx: &Context, node: &Node) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    ctx.metrics
        .retain_jobs(|ns, name| ctx.jobs.get(&ObjectRef::new(name).within(ns)).is_some());
    let Some(summary) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANNOTATION_OBSERVED))
        .and_then(|json| ObservedSummary::parse(json).ok())
    else {
        return Vec::new();
    };
    let mut refs: Vec<_> = summary
        .pods
        .iter()
        .filter_map(|p| {
            let job = p.training_job.as_deref()?;
            Some(ObjectRef::new(job).within(&p.namespace))
        })
        .collect();
    refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    refs.dedup();
    refs
}

/// Unresolved jobs in `namespace` whose DeepSpeed config or model `config.json` is the ConfigMap `name`, for
/// re-triggering when the user fixes it.
pub fn jobs_for_config_map(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    waiting_jobs(ctx, |tj| {
        let named = |r: Option<&ConfigMapKeyRef>| r.is_some_and(|r| r.name == name);
        tj.metadata.namespace.as_deref() == Some(namespace)
            && (named(
                tj.spec
                    .deepspeed
                    .as_ref()
                    .and_then(|d| d.config_map_ref.as_ref()),
            ) || named(
                tj.spec
                    .model
                    .as_ref()
                    .and_then(|m| m.config_map_ref.as_ref()),
            ))
    })
}

/// Unresolved jobs in `namespace` whose pod template names the ResourceClaimTemplate `name`,
/// for re-triggering when it is created or changed.
pub fn jobs_for_claim_template(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    waiting_jobs(ctx, |tj| {
        opted_in(tj)
            && tj.metadata.namespace.as_deref() == Some(namespace)
            && tj
                .spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.resource_claims.as_ref())
                .is_some_and(|claims| {
                    claims
                        .iter()
                        .any(|c| c.resource_claim_template_name.as_deref() == Some(name))
                })
    })
}

/// Unresolved opted-in jobs of `namespace`, for re-triggering when one of its LimitRanges
/// (the memory limit its containers get) changes.
pub fn jobs_in_namespace(ctx: &Context, namespace: &str) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    waiting_jobs(ctx, |tj| {
        opted_in(tj) && tj.metadata.namespace.as_deref() == Some(namespace)
    })
}

/// Unresolved opted-in jobs, for re-triggering when the GPU driver's ResourceSlices of a node
/// change (a node it classes may take them now).
pub fn jobs_for_slices(ctx: &Context) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    waiting_jobs(ctx, opted_in)
}
