use super::*;
use kube::core::ObjectMeta;

fn node(name: &str, rv: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn names(objs: &[Arc<Node>]) -> Vec<String> {
    let mut v: Vec<String> = objs
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    v.sort();
    v
}

type Events = futures::channel::mpsc::UnboundedSender<Result<watcher::Event<Node>, watcher::Error>>;

/// A Node cache fed from the returned sender, its drive running.
fn node_cache() -> (Events, Cache<Node>, tokio::task::JoinHandle<()>) {
    let metrics = Metrics::new(&mut prometheus_client::registry::Registry::default());
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let (cache, drive) = super::cache::<Node, _>(rx, "Node", metrics, slim_node);
    (tx, cache, tokio::spawn(drive))
}

/// The drive logs each changed name before the generation moves, nothing until a reader
/// enables the log, and a new listing as everything.
#[tokio::test]
async fn the_change_log_names_what_changed_once_enabled() {
    use std::sync::atomic::Ordering;
    let (tx, cache, driver) = node_cache();
    let log = cache.change_log();
    let generation = cache.generation();
    let wait_for = |n: u64| {
        let generation = generation.clone();
        async move {
            while generation.load(Ordering::Acquire) < n {
                tokio::task::yield_now().await;
            }
        }
    };
    tx.unbounded_send(Ok(watcher::Event::Apply(node("a", "1"))))
        .unwrap();
    wait_for(1).await;
    assert_eq!(log.take(), Changed::default(), "off: nothing kept");

    log.enable();
    assert!(log.take().all, "what came before is everything");
    for (name, rv) in [("a", "2"), ("b", "1"), ("a", "3")] {
        tx.unbounded_send(Ok(watcher::Event::Apply(node(name, rv))))
            .unwrap();
    }
    tx.unbounded_send(Ok(watcher::Event::Delete(node("c", "4"))))
        .unwrap();
    wait_for(5).await;
    let changed = log.take();
    assert!(!changed.all);
    let mut names: Vec<_> = changed.names.into_iter().collect();
    names.sort();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(log.take(), Changed::default());

    for event in [watcher::Event::Init, watcher::Event::InitDone] {
        tx.unbounded_send(Ok(event)).unwrap();
    }
    wait_for(6).await;
    assert!(log.take().all);
    driver.abort();
}

/// A late subscriber (a controller that just won the lease) sees what is already cached,
/// then changes; one that falls behind is handed the whole cache again, and the feed never
/// waits for it.
#[tokio::test]
async fn late_and_slow_subscribers_see_every_object() {
    let (tx, cache, driver) = node_cache();
    for event in [
        watcher::Event::Init,
        watcher::Event::InitApply(node("a", "1")),
        watcher::Event::InitApply(node("b", "1")),
        watcher::Event::InitDone,
    ] {
        tx.unbounded_send(Ok(event)).unwrap();
    }
    cache.store().wait_until_ready().await.unwrap();
    // Wait until the driver has handled the events (the store is filled at InitDone).
    while cache.store().state().len() < 2 {
        tokio::task::yield_now().await;
    }

    let mut late = Box::pin(cache.subscribe());
    let first: Vec<_> = late.as_mut().take(2).collect().await;
    assert_eq!(names(&first), ["a", "b"]);
    tx.unbounded_send(Ok(watcher::Event::Apply(node("c", "2"))))
        .unwrap();
    let next = late.next().await.unwrap();
    assert_eq!(next.metadata.name.as_deref(), Some("c"));

    // A subscriber that never reads does not hold the feed up.
    let mut slow = Box::pin(cache.subscribe());
    let _ = slow.as_mut().take(3).collect::<Vec<_>>().await;
    for i in 0..(SUBSCRIBER_BUFFER + 10) {
        tx.unbounded_send(Ok(watcher::Event::Apply(node("d", &i.to_string()))))
            .unwrap();
    }
    tx.unbounded_send(Ok(watcher::Event::Apply(node("e", "9"))))
        .unwrap();
    while cache.store().state().len() < 5 {
        tokio::task::yield_now().await;
    }
    // It lagged: it gets the whole cache again, which includes the newest object.
    let resent: Vec<_> = slow.as_mut().take(5).collect().await;
    assert_eq!(names(&resent), ["a", "b", "c", "d", "e"]);
    drop(tx);
    driver.await.unwrap();
}
