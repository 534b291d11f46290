//! The node views: the index shared until a node changes, heartbeats that change nothing,
//! and a change taken in by reading the changed nodes alone.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::core::ObjectMeta;
use kube::runtime::{reflector, watcher};
use offload_testenv::fixtures;

use super::*;
use crate::index::tests::{annotations_of, labels_of};
use offload_api::v1alpha1::NodeClass;

/// The views hand every caller the same index until a node changes, and see changes and
/// deletions at once.
#[test]
fn node_views_share_the_index_until_a_node_changes() {
    let meta = |name: &str, rv: &str, fixture: &str| -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                labels: Some(labels_of(fixture)),
                annotations: Some(annotations_of(name, fixture)),
                ..Default::default()
            },
            ..Default::default()
        }
    };
    let (nodes, mut writer) = reflector::store::<Node>();
    writer.apply_watcher_event(&watcher::Event::Apply(meta(
        "gpu-0",
        "1",
        fixtures::H200_READING,
    )));
    writer.apply_watcher_event(&watcher::Event::Apply(meta(
        "gpu-1",
        "1",
        fixtures::H200_READING,
    )));
    let views = NodeViews::new(nodes);

    let first = views.get();
    assert_eq!(first.nodes().len(), 2);
    assert_eq!(first.class(NodeClass::Discrete).count(), 2);
    assert!(
        Arc::ptr_eq(&first, &views.get()),
        "unchanged nodes: the same index is shared"
    );

    // The agent re-publishes gpu-0 as a coherent node.
    writer.apply_watcher_event(&watcher::Event::Apply(meta(
        "gpu-0",
        "2",
        fixtures::GH200_REFERENCE,
    )));
    let changed = views.get();
    assert!(!Arc::ptr_eq(&first, &changed));
    let coherent: Vec<&str> = changed
        .class(NodeClass::Coherent)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(coherent, ["gpu-0"]);
    assert_eq!(changed.class(NodeClass::Discrete).count(), 1);

    writer.apply_watcher_event(&watcher::Event::Delete(meta(
        "gpu-1",
        "2",
        fixtures::H200_READING,
    )));
    let after_delete = views.get();
    assert_eq!(after_delete.nodes().len(), 1);
    assert_eq!(after_delete.get(0).unwrap().name, "gpu-0");
}

/// A Node at resourceVersion `rv` with the labels and report the agent publishes for `fixture`.
fn reported_node(name: &str, rv: &str, fixture: &str) -> Node {
    Node {
        metadata: kube::core::ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            labels: Some(offload_api::labels::published(
                &offload_api::report::NodeReport::parse(fixture).unwrap(),
            )),
            annotations: Some(annotations_of(name, fixture)),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Told of each change the cache takes in, the views hand the index out without looking at a
/// node while nothing changed, keep it (and what was worked out from it) through a change that
/// leaves every view as it was (a heartbeat), and rebuild it when a view changes.
#[test]
fn a_heartbeat_keeps_the_index_and_a_new_report_replaces_it() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let meta = reported_node;
    let (nodes, mut writer) = reflector::store::<Node>();
    let generation = Arc::new(AtomicU64::new(0));
    let apply = |writer: &mut reflector::store::Writer<Node>, node: Node| {
        writer.apply_watcher_event(&watcher::Event::Apply(node));
        generation.fetch_add(1, Ordering::Release);
    };
    apply(&mut writer, meta("gpu-0", "1", fixtures::H200_READING));
    let views = NodeViews::new(nodes).with_generations(generation.clone(), None);
    let first = views.get();
    let job_visits = first.visits();
    assert!(Arc::ptr_eq(&first, &views.get()));
    assert_eq!(
        first.visits(),
        job_visits,
        "nothing read while nothing changed"
    );
    // A heartbeat: a new resourceVersion, the same labels and report.
    apply(&mut writer, meta("gpu-0", "2", fixtures::H200_READING));
    assert!(
        Arc::ptr_eq(&first, &views.get()),
        "a change the index does not read keeps it"
    );
    // A new report: a new index.
    apply(&mut writer, meta("gpu-0", "3", fixtures::GH200_REFERENCE));
    let changed = views.get();
    assert!(!Arc::ptr_eq(&first, &changed));
    assert_eq!(changed.class(NodeClass::Coherent).count(), 1);
}

/// A caller that finds the snapshot busy (another caller rebuilding it) is handed the last
/// index only while nothing changed since it was built: a reconcile woken by a node's change
/// never reads an index older than that change (it would not be woken again).
#[test]
fn a_busy_snapshot_hands_out_the_last_index_only_while_it_is_current() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (nodes, mut writer) = reflector::store::<Node>();
    let generation = Arc::new(AtomicU64::new(0));
    let apply = |writer: &mut reflector::store::Writer<Node>, node: Node| {
        writer.apply_watcher_event(&watcher::Event::Apply(node));
        generation.fetch_add(1, Ordering::Release);
    };
    apply(
        &mut writer,
        reported_node("gpu-0", "1", fixtures::H200_READING),
    );
    let views = NodeViews::new(nodes).with_generations(generation.clone(), None);
    let first = views.get();
    {
        // Another caller holds the snapshot: one who comes now, with nothing changed, is not
        // kept waiting (it gets the index it would have got).
        let _busy = views.snapshot.lock().unwrap();
        let handed = std::thread::scope(|s| s.spawn(|| views.get()).join().unwrap());
        assert!(Arc::ptr_eq(&first, &handed));
    }
    // A new report comes in: the last index is no longer current for anyone.
    apply(
        &mut writer,
        reported_node("gpu-0", "2", fixtures::GH200_REFERENCE),
    );
    let now = Some((generation.load(Ordering::Acquire), None));
    assert!(
        views.published_for(now).is_none(),
        "an index older than the change is never handed out"
    );
    assert!(views.published_for(Some((1, None))).is_some());
    let changed = views.get();
    assert_eq!(changed.class(NodeClass::Coherent).count(), 1);
    assert!(
        views
            .published_for(now)
            .is_some_and(|p| Arc::ptr_eq(&p, &changed))
    );
}

/// Told by the node cache which nodes changed, the views read only those: a heartbeat, a new
/// report, a deletion at 2,000 nodes each read one node, and the index they hand out is the
/// one a full read would build. A new listing of the nodes is read whole.
#[test]
fn a_change_is_taken_in_by_reading_the_changed_node_alone() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let node = |name: &str, rv: u64, fixture: &str| reported_node(name, &rv.to_string(), fixture);
    let (nodes, mut writer) = reflector::store::<Node>();
    let generation = Arc::new(AtomicU64::new(0));
    let log = Arc::new(crate::cluster::caches::ChangeLog::default());
    // As the cache's drive does it: the store, then the name, then the generation.
    let apply = |writer: &mut reflector::store::Writer<Node>, event: watcher::Event<Node>| {
        writer.apply_watcher_event(&event);
        match &event {
            watcher::Event::Apply(n) | watcher::Event::Delete(n) => {
                log.record(n.metadata.name.as_deref());
            }
            _ => log.record(None),
        }
        generation.fetch_add(1, Ordering::Release);
    };
    let views = NodeViews::new(nodes.clone())
        .with_generations(generation.clone(), None)
        .with_change_log(log.clone());
    let name = |i: usize| format!("gpu-{i:05}");
    for i in 0..2000 {
        apply(
            &mut writer,
            watcher::Event::Apply(node(&name(i), 1, fixtures::H200_READING)),
        );
    }
    let first = views.get();
    assert_eq!(first.nodes().len(), 2000);
    assert_eq!(views.node_reads(), 2000, "the first read is whole");

    // A heartbeat of one node: one node read, the same index.
    apply(
        &mut writer,
        watcher::Event::Apply(node(&name(7), 2, fixtures::H200_READING)),
    );
    assert!(Arc::ptr_eq(&first, &views.get()));
    assert_eq!(views.node_reads(), 2001);

    // A new report on one node: one node read, a new index that says so.
    apply(
        &mut writer,
        watcher::Event::Apply(node(&name(9), 3, fixtures::GH200_REFERENCE)),
    );
    let changed = views.get();
    assert_eq!(views.node_reads(), 2002);
    assert!(!Arc::ptr_eq(&first, &changed));
    let full = NodeViews::new(nodes.clone()).get();
    assert_eq!(*changed, *full, "the same index as a full read");

    // A deletion: one node read, the node gone.
    apply(
        &mut writer,
        watcher::Event::Delete(node(&name(3), 4, fixtures::H200_READING)),
    );
    let fewer = views.get();
    assert_eq!(views.node_reads(), 2003);
    assert_eq!(fewer.nodes().len(), 1999);
    assert!(fewer.by_name(&name(3)).is_none());
    assert_eq!(*fewer, *NodeViews::new(nodes.clone()).get());

    // Nothing changed: nothing read.
    assert!(Arc::ptr_eq(&fewer, &views.get()));
    assert_eq!(views.node_reads(), 2003);

    // A new listing (a resumed watch): read whole.
    writer.apply_watcher_event(&watcher::Event::Init);
    for i in (0..2000).filter(|i| *i != 3) {
        let fixture = if i == 9 {
            fixtures::GH200_REFERENCE
        } else {
            fixtures::H200_READING
        };
        writer.apply_watcher_event(&watcher::Event::InitApply(node(&name(i), 5, fixture)));
    }
    apply(&mut writer, watcher::Event::InitDone);
    let relisted = views.get();
    assert_eq!(views.node_reads(), 2003 + 1999);
    assert!(Arc::ptr_eq(&fewer, &relisted), "nothing it holds changed");
}
