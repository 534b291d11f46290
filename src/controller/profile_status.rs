//! OffloadProfile status: nodes per memory model and overlap result, jobs using it, `Ready`.

use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::conditions::{self, ConditionType, Reason};
use super::{Context, Error, kube_err};
use crate::index::NodeIndex;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use offload_api::names;
use offload_api::report::{NodeMemoryModel, OverlapVerdict};
use offload_api::v1alpha1::{NodeCounts, OffloadProfile, OffloadProfileStatus};

/// Ignored nodes a profile's status names, each with its reason; the rest are counted.
const NAMED_IGNORED: usize = 3;

/// Counts the reported nodes a profile's selector matches, and the nodes it ignores with the
/// first few reasons. `Err` carries the selector error.
pub fn count_nodes(
    profile: &OffloadProfile,
    nodes: &NodeIndex,
) -> Result<(NodeCounts, Option<String>), String> {
    let selector = match &profile.spec.node_selector {
        Some(s) => Some(Selector::try_from(s.clone()).map_err(|e| e.to_string())?),
        None => None,
    };
    let mut counts = NodeCounts::default();
    let mut named: Vec<String> = Vec::new();
    for node in nodes.nodes() {
        if selector.as_ref().is_some_and(|s| !s.matches(&node.labels)) {
            continue;
        }
        if let Some(why) = node.ignored_because() {
            counts.ignored += 1;
            if named.len() < NAMED_IGNORED {
                named.push(format!("node {} is ignored: {why}", node.name));
            }
            continue;
        }
        let Some(model) = node.memory_model() else {
            continue;
        };
        counts.total += 1;
        match model {
            NodeMemoryModel::Coherent => counts.coherent += 1,
            NodeMemoryModel::Hmm => counts.hmm += 1,
            _ => counts.discrete += 1,
        }
        match node.overlap_verdict() {
            OverlapVerdict::Verified => counts.overlap_verified += 1,
            OverlapVerdict::Failed => counts.overlap_failed += 1,
            OverlapVerdict::Untested => {}
        }
    }
    let first_ignored = (!named.is_empty()).then(|| named.join("; "));
    Ok((counts, first_ignored))
}

/// How many reported GPU nodes the profile's selector matches, and its Ready condition.
fn readiness(
    profile: &OffloadProfile,
    nodes: &NodeIndex,
    existing: &[Condition],
    generation: Option<i64>,
) -> (NodeCounts, Condition) {
    match count_nodes(profile, nodes) {
        Ok((c, ignored)) if c.total > 0 => {
            let mut msg = format!(
                "{} reported GPU node(s) match: {} coherent, {} HMM, {} discrete; overlap verified on {}, failed on {}",
                c.total, c.coherent, c.hmm, c.discrete, c.overlap_verified, c.overlap_failed
            );
            if let Some(why) = ignored {
                msg.push_str(&format!("; {} more ignored ({why})", c.ignored));
            }
            (
                c,
                conditions::condition(
                    existing,
                    ConditionType::Ready,
                    true,
                    Reason::NodesAvailable,
                    msg,
                    generation,
                ),
            )
        }
        Ok((c, ignored)) => {
            let msg = match ignored {
                Some(why) => format!(
                    "no usable GPU node reported by offload-agent matches this profile's nodeSelector; {} ignored ({why})",
                    c.ignored
                ),
                None => "no GPU node reported by offload-agent matches this profile's nodeSelector"
                    .to_string(),
            };
            (
                c,
                conditions::condition(
                    existing,
                    ConditionType::Ready,
                    false,
                    Reason::NoMatchingNodes,
                    msg,
                    generation,
                ),
            )
        }
        Err(e) => (
            NodeCounts::default(),
            conditions::condition(
                existing,
                ConditionType::Ready,
                false,
                Reason::InvalidSelector,
                format!("nodeSelector is invalid: {e}"),
                generation,
            ),
        ),
    }
}

/// Reconciles one profile's status.
pub async fn reconcile(profile: Arc<OffloadProfile>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("OffloadProfile");
    let name = profile.name_any();
    let nodes = ctx.nodes();
    let jobs = ctx
        .jobs
        .state()
        .iter()
        .filter_map(|g| g.0.as_ref().ok())
        .filter(|j| {
            j.status
                .as_ref()
                .and_then(|s| s.offload.as_ref())
                .is_some_and(|o| o.profile == name)
        })
        .count();
    let existing = profile.status.clone().unwrap_or_default();
    let generation = profile.metadata.generation;
    let (counts, ready) = readiness(&profile, &nodes, &existing.conditions, generation);
    let learned = ctx.view.learned.as_ref().and_then(|store| {
        let (shapes, runs) = store.summary(&name);
        (shapes > 0).then(|| offload_api::v1alpha1::LearnedSummary {
            shapes: i32::try_from(shapes).unwrap_or(i32::MAX),
            runs: i32::try_from(runs).unwrap_or(i32::MAX),
            summary: format!("{shapes} shapes / {runs} runs"),
        })
    });
    let mut status = OffloadProfileStatus {
        nodes: counts,
        jobs: i32::try_from(jobs).unwrap_or(i32::MAX),
        observed_generation: generation,
        learned,
        conditions: existing.conditions.clone(),
    };
    conditions::set(&mut status.conditions, ready);
    if status != existing {
        let patch = json!({
            "apiVersion": OffloadProfile::api_version(&()),
            "kind": OffloadProfile::kind(&()),
            "status": status,
        });
        Api::<OffloadProfile>::all(ctx.client.clone())
            .patch_status(
                &name,
                &PatchParams::apply(names::OPERATOR_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(kube_err("writing OffloadProfile status"))?;
    }
    // What was learned changes without a profile or node event: look again now and then.
    if ctx.view.learned.is_some() {
        return Ok(Action::requeue(LEARNED_RECHECK));
    }
    Ok(Action::await_change())
}

/// How often a profile's status looks again at what was learned.
const LEARNED_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);
