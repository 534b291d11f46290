//! The operator process: one client, one metrics registry, the admin server, leader election,
//! and the controllers, with graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::cluster::caches::Caches;
use crate::controller::{self, ControllerOptions};
use crate::ops::admin::{self, AdminState};
use crate::ops::metrics::Metrics;

/// How the operator runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    pub admin_addr: SocketAddr,
    /// Run the controllers only while holding this Lease (`None`: always, for one replica).
    pub leader_election: Option<LeaderElection>,
    /// Controller tuning.
    pub controller: ControllerOptions,
    /// The admission webhook, served by every replica (leader or not); `None` to not serve it.
    pub webhook: Option<crate::webhook::WebhookOptions>,
    /// Dynamic Resource Allocation: the GPU driver whose ResourceSlices and the DeviceClasses
    /// whose claims the operator reads (`None`: DRA off).
    pub dra: Option<crate::dra::DraOptions>,
    /// The namespace whose ConfigMap keeps what runs taught the memory model (the operator's
    /// own; `None`: nothing is learned or used).
    pub learned_namespace: Option<String>,
    /// How the sizer traces models' steps before their jobs' pods exist (`None`: it does not,
    /// and the counted model decides).
    pub sizer: Option<crate::sizer::SizerOptions>,
}

/// Where the leader-election Lease lives.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity: unique to the process (a restarted container is a new
    /// candidate, not the old leader).
    pub identity: String,
    /// How long the lease lasts without renewal: a standby takes over within this time after
    /// the leader dies.
    pub duration: std::time::Duration,
}

/// The operator failed to start or lost leadership.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The admin server could not bind.
    #[error("admin server on {addr}: {source}")]
    Admin {
        /// Address.
        addr: SocketAddr,
        /// Bind error.
        #[source]
        source: std::io::Error,
    },
    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(String),
    /// The webhook could not start.
    #[error("webhook: {0}")]
    Webhook(#[from] crate::webhook::tls::TlsError),
    /// A cache's feed ended before it had been read once (nothing is decided from half a
    /// cluster).
    #[error("{0}")]
    CachesUnsynced(&'static str),
    /// Leadership was lost; the process exits so a fresh start re-joins the election.
    #[error("lost the leader lease {0}; exiting so another replica takes over cleanly")]
    LostLease(String),
}

/// The admin server (metrics, health, readiness) on `addr`, bound now and served until `stop`.
async fn serve_admin(
    addr: SocketAddr,
    state: AdminState,
    stop: CancellationToken,
) -> Result<impl std::future::Future<Output = ()>, RunError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Admin { addr, source })?;
    Ok(async move {
        if let Err(e) = axum::serve(listener, admin::router(state))
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "admin server stopped");
        }
    })
}

/// Runs until `shutdown` is cancelled (SIGTERM in `main`) or leadership is lost.
///
/// The caches are built once and shared: the webhook serves from them on every replica, and
/// the controllers run from them while this replica leads. A replica is ready as soon as its
/// caches have synced (and its webhook listens), whether it leads or not, so every replica
/// answers admission requests and a leader's restart never leaves the webhook Service empty.
///
/// Everything runs inside the returned future (no detached tasks), so dropping it stops the
/// whole operator at once, as a crash would.
pub async fn run(
    client: Client,
    options: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    // Everything below stops with `stop`: on shutdown, and also when the controllers end on
    // their own (a lost lease), so the process exits and re-joins the election fresh.
    let stop = shutdown.child_token();
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let ready = Arc::new(AtomicBool::new(false));
    let admin_state = AdminState {
        registry: Arc::new(registry),
        ready: ready.clone(),
    };
    let admin = serve_admin(options.admin_addr, admin_state, stop.clone()).await?;
    let (caches, drive_caches) = caches_and_stores(&client, &metrics, &options, &stop);
    // The webhook serves on every replica, so it starts before the leader election.
    let webhook = start_webhook(&client, &caches, &metrics, &options, &stop).await?;
    let mark_ready = async {
        tokio::select! {
            synced = caches.wait_synced() => {
                ready.store(synced, Ordering::Relaxed);
                if synced {
                    tracing::info!("caches synced; ready");
                }
            }
            () = stop.cancelled() => {}
        }
    };
    // The controllers' and servers' state machines are large: keep them on the heap so the
    // caller's stack (a test thread, `main`) never has to hold them.
    let work = Box::pin(async {
        let outcome = lead_and_control(client, &caches, metrics, &options, &stop).await;
        stop.cancel();
        outcome
    });
    let (_, _, _, _, result) = tokio::join!(
        Box::pin(admin),
        Box::pin(drive_caches),
        Box::pin(webhook),
        Box::pin(mark_ready),
        work
    );
    result
}

/// The caches, with the learned and trace stores where the operator keeps them, and the one
/// future that drives every watch until `stop`.
fn caches_and_stores(
    client: &Client,
    metrics: &Arc<Metrics>,
    options: &RunOptions,
    stop: &CancellationToken,
) -> (Caches, impl std::future::Future<Output = ()> + use<>) {
    let (mut caches, drive_caches) = Caches::new(client, metrics.clone(), options.dra.as_ref());
    caches.learned = options
        .learned_namespace
        .as_deref()
        .map(crate::cluster::learned::LearnedStore::new);
    caches.traces = options
        .sizer
        .clone()
        .map(crate::cluster::traces::TraceStore::new);
    caches.extended_resource_toleration = options.controller.extended_resource_toleration;
    let learned = caches.learned.clone();
    let traces = caches.traces.clone();
    let watch_client = client.clone();
    let watch_stop = stop.clone();
    let drive = async move {
        let learned = async {
            if let Some(store) = learned {
                store.watch(watch_client.clone(), watch_stop.clone()).await;
            }
        };
        let traces = async {
            if let Some(store) = traces {
                store.watch(watch_client.clone(), watch_stop.clone()).await;
            }
        };
        // Each watch on the heap: polled side by side in one task, their states would make its
        // frames deep (the caller's stack may be a test thread's 2 MiB).
        tokio::select! {
            ((), (), ()) = futures::future::join3(
                Box::pin(drive_caches),
                Box::pin(learned),
                Box::pin(traces),
            ) => {},
            () = watch_stop.cancelled() => {},
        }
    };
    (caches, drive)
}

/// The admission webhook bound and serving from the caches until `stop` (a future that ends at
/// once where the operator serves none).
async fn start_webhook(
    client: &Client,
    caches: &Caches,
    metrics: &Arc<Metrics>,
    options: &RunOptions,
    stop: &CancellationToken,
) -> Result<impl std::future::Future<Output = ()> + use<>, RunError> {
    let serve = match options.webhook.clone() {
        Some(wh) => {
            let state = crate::webhook::WebhookState {
                view: Arc::new(
                    crate::webhook::admit::StoreView::new(caches)
                        .with_guard_image(options.controller.render.guard_image.clone()),
                ),
                metrics: metrics.clone(),
                configs: crate::webhook::ConfigSource::Api(client.clone()),
                events: Some(crate::webhook::events::EventSink::start(
                    client.clone(),
                    "offload-operator-webhook",
                )),
            };
            let (_rotator, bound, serve) =
                crate::webhook::serve(client.clone(), wh, state, stop.clone()).await?;
            tracing::info!(addr = %bound, "webhook listening");
            Some(serve)
        }
        None => None,
    };
    Ok(async move {
        if let Some(w) = serve {
            w.await;
        }
    })
}

/// When the lease is held by an earlier process of this same pod (the leader's container was
/// killed and restarted), waits one lease duration before competing, so that a standby replica,
/// which has been ready all along, takes over rather than racing the restarted one.
async fn yield_to_standby(client: &Client, le: &LeaderElection, shutdown: &CancellationToken) {
    use k8s_openapi::api::coordination::v1::Lease;
    let Some((pod, _)) = le.identity.rsplit_once('_') else {
        return;
    };
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), &le.namespace);
    let holder = match leases.get_opt(&le.lease_name).await {
        Ok(Some(lease)) => lease.spec.and_then(|s| s.holder_identity),
        _ => None,
    };
    let Some(holder) = holder else { return };
    if holder != le.identity && holder.rsplit_once('_').is_some_and(|(p, _)| p == pod) {
        tracing::info!(
            previous = %holder,
            "an earlier process of this pod held the lease; giving the standby the first chance"
        );
        tokio::select! {
            () = tokio::time::sleep(le.duration) => {},
            () = shutdown.cancelled() => {},
        }
    }
}

/// The leader lease, held: the manager's channel (false once it is lost), its task, and the
/// Lease's name.
struct HeldLease {
    channel: tokio::sync::watch::Receiver<bool>,
    task: tokio::task::JoinHandle<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
    name: String,
}

/// Waits for the leader lease (`None`: shut down first).
async fn acquire_lease(
    client: &Client,
    le: &LeaderElection,
    shutdown: &CancellationToken,
) -> Result<Option<HeldLease>, RunError> {
    yield_to_standby(client, le, shutdown).await;
    let duration = le.duration.as_secs().max(2);
    // Renew well before expiry; the lease manager needs grace < duration.
    let grace = (duration / 5).clamp(1, duration - 1);
    // The lease manager's field manager must be unique per candidate: mutual exclusion rests on
    // server-side-apply conflicts between candidates.
    let manager = LeaseManagerBuilder::new(client.clone(), &le.lease_name)
        .with_namespace(&le.namespace)
        .with_identity(&le.identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_field_manager(format!(
            "{}-lease-{}",
            offload_api::names::OPERATOR_MANAGER,
            le.identity
        ))
        .build()
        .await
        .map_err(|e| RunError::Lease(e.to_string()))?;
    let (mut channel, task) = manager.watch().await;
    tracing::info!(lease = %le.lease_name, identity = %le.identity, "waiting for the leader lease");
    while !*channel.borrow_and_update() {
        tokio::select! {
            changed = channel.changed() => {
                if changed.is_err() {
                    return Err(RunError::Lease("lease manager stopped".into()));
                }
            }
            () = shutdown.cancelled() => return Ok(None),
        }
    }
    tracing::info!("acquired the leader lease");
    Ok(Some(HeldLease {
        channel,
        task,
        name: le.lease_name.clone(),
    }))
}

/// Waits for the leader lease (when configured), then runs the controllers until shutdown or
/// until the lease is lost.
async fn lead_and_control(
    client: Client,
    caches: &Caches,
    metrics: Arc<Metrics>,
    options: &RunOptions,
    shutdown: &CancellationToken,
) -> Result<(), RunError> {
    let lease_state = match &options.leader_election {
        Some(le) => match acquire_lease(&client, le, shutdown).await? {
            Some(held) => Some(held),
            None => return Ok(()),
        },
        None => None,
    };

    // No decision before every cache (and what runs taught) has been read once: a job decided
    // from a half-read cluster would be written a configuration its next reconcile takes back.
    tokio::select! {
        synced = caches.wait_synced() => {
            if !synced {
                return Err(RunError::CachesUnsynced(
                    "a cache's feed ended before it was read once; nothing was decided",
                ));
            }
        }
        () = shutdown.cancelled() => return Ok(()),
    }
    let controllers_shutdown = shutdown.child_token();
    let controllers = Box::pin(controller::run(
        client.clone(),
        caches,
        metrics,
        options.controller.clone(),
        controllers_shutdown.clone(),
    ));
    let stop = async {
        match lease_state {
            Some(HeldLease {
                mut channel,
                task,
                name,
            }) => {
                let outcome = tokio::select! {
                    () = async {
                        while channel.changed().await.is_ok() {
                            if !*channel.borrow_and_update() {
                                return;
                            }
                        }
                    } => Err(RunError::LostLease(name)),
                    () = shutdown.cancelled() => Ok(()),
                };
                controllers_shutdown.cancel();
                // Closing the channel makes the manager release the lease.
                drop(channel);
                let _ = task.await;
                outcome
            }
            None => {
                shutdown.cancelled().await;
                controllers_shutdown.cancel();
                Ok(())
            }
        }
    };
    // The leader writes what it learned; every replica reads it (see `run`).
    let writes = async {
        if let Some(store) = caches.learned.clone() {
            store
                .write_batches(client.clone(), controllers_shutdown.clone())
                .await;
        }
    };
    let ((), outcome, ()) = tokio::join!(controllers, stop, writes);
    outcome
}
