//! Which changes of the watched kinds trigger a reconcile: each stream passes an object on only
//! when what the decision or the status reads of it changed, so the operator's own writes and
//! the nodes' heartbeats do not wake the controllers.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::cluster::tolerant::Tolerant;
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};

/// TrainingJob changes other than status: a new job, a new generation (spec), labels,
/// annotations, deletion. The controller's own status writes are left out, so a reconcile does
/// not trigger the next one.
pub(super) fn spec_changes(
    jobs: impl Stream<Item = Arc<Tolerant<TrainingJob>>>,
    store: Store<Tolerant<TrainingJob>>,
) -> impl Stream<Item = Arc<Tolerant<TrainingJob>>> {
    use kube::Resource;
    use std::hash::{Hash, Hasher};
    let mut seen: std::collections::HashMap<(String, String), u64> =
        std::collections::HashMap::new();
    jobs.filter(move |job| {
        let meta = job.meta();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        meta.uid.hash(&mut h);
        meta.generation.hash(&mut h);
        meta.labels.hash(&mut h);
        meta.annotations.hash(&mut h);
        meta.deletion_timestamp.as_ref().map(|t| t.0).hash(&mut h);
        // A job that does not deserialize is reported once per change of its content.
        if job.0.is_err() {
            meta.resource_version.hash(&mut h);
        }
        let key = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        let digest = h.finish();
        let changed = seen.insert(key, digest) != Some(digest);
        // Forget deleted jobs now and then (deletions are not passed on to this stream).
        if seen.len() > 2 * store.len() + 1024 {
            seen.retain(|(ns, name), _| store.get(&ObjectRef::new(name).within(ns)).is_some());
        }
        futures::future::ready(changed)
    })
}

/// For each job whose recorded decision names a different profile than when last seen (its
/// first decision, a re-decision under another profile) or that was deleted: the profile(s)
/// whose job count that changes.
pub(super) fn decision_profile_changes(
    jobs: impl Stream<Item = Arc<Tolerant<TrainingJob>>>,
    store: Store<Tolerant<TrainingJob>>,
) -> impl Stream<Item = ObjectRef<OffloadProfile>> {
    use kube::Resource;
    let mut seen: std::collections::HashMap<(String, String), String> =
        std::collections::HashMap::new();
    jobs.flat_map(move |job| {
        let meta = job.meta();
        let key = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        let gone = store.get(&ObjectRef::new(&key.1).within(&key.0)).is_none();
        let profile = job
            .0
            .as_ref()
            .ok()
            .and_then(|j| j.status.as_ref())
            .and_then(|s| s.offload.as_ref())
            .map(|o| o.profile.clone());
        let mut out = Vec::new();
        if gone {
            out.extend(seen.remove(&key));
        } else if let Some(p) = profile {
            match seen.insert(key, p.clone()) {
                Some(before) if before == p => {}
                Some(before) => out.extend([before, p]),
                None => out.push(p),
            }
        }
        futures::stream::iter(out.into_iter().map(|p| ObjectRef::new(&p)))
    })
}

/// Node changes that matter to decisions: labels, annotations and allocatable resources, less
/// the agent's observation of running pods (which changes every minute and concerns running
/// jobs only).
pub(super) fn metadata_changes(
    nodes: impl Stream<Item = Arc<Node>>,
    store: Store<Node>,
) -> impl Stream<Item = Arc<Node>> {
    changes_by(nodes, store, |node, h| {
        use std::hash::Hash;
        node.metadata.labels.hash(h);
        if let Some(alloc) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) {
            for (k, v) in alloc {
                (k, &v.0).hash(h);
            }
        }
        if let Some(annotations) = &node.metadata.annotations {
            for (k, v) in annotations {
                if k != names::ANNOTATION_OBSERVED {
                    (k, v).hash(h);
                }
            }
        }
    })
}

/// Node changes of the agent's observation annotation only.
pub(super) fn observation_changes(
    nodes: impl Stream<Item = Arc<Node>>,
    store: Store<Node>,
) -> impl Stream<Item = Arc<Node>> {
    changes_by(nodes, store, |node, h| {
        use std::hash::Hash;
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::ANNOTATION_OBSERVED))
            .hash(h);
    })
}

/// Passes a node on when the digest `hash` feeds changed since its last pass (and on deletion).
fn changes_by(
    nodes: impl Stream<Item = Arc<Node>>,
    store: Store<Node>,
    hash: fn(&Node, &mut std::collections::hash_map::DefaultHasher),
) -> impl Stream<Item = Arc<Node>> {
    use std::hash::Hasher;
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    nodes.filter(move |node| {
        if store.get(&ObjectRef::from_obj(node.as_ref())).is_none() {
            seen.remove(&node.name_any());
            return futures::future::ready(true);
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        hash(node, &mut h);
        let digest = h.finish();
        futures::future::ready(seen.insert(node.name_any(), digest) != Some(digest))
    })
}
