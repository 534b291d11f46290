//! The operator process: one client, one metrics registry, the admin server, leader election,
//! and the controllers, with graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState};
use crate::controller::{self, ControllerOptions};
use crate::metrics::Metrics;

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
}

/// Where the leader-election Lease lives.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
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
    /// Leadership was lost; the process exits so a fresh start re-joins the election.
    #[error("lost the leader lease {0}; exiting so another replica takes over cleanly")]
    LostLease(String),
}

/// Runs until `shutdown` is cancelled (SIGTERM in `main`) or leadership is lost.
///
/// Everything runs inside the returned future (no detached tasks), so dropping it stops the
/// whole operator at once, as a crash would.
pub async fn run(
    client: Client,
    options: RunOptions,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    let ready = Arc::new(AtomicBool::new(false));
    let admin_state = AdminState {
        registry: Arc::new(registry),
        ready: ready.clone(),
    };
    let listener = tokio::net::TcpListener::bind(options.admin_addr)
        .await
        .map_err(|source| RunError::Admin {
            addr: options.admin_addr,
            source,
        })?;
    let admin_shutdown = shutdown.clone();
    let admin = async move {
        if let Err(e) = axum::serve(listener, admin::router(admin_state))
            .with_graceful_shutdown(admin_shutdown.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "admin server stopped");
        }
    };
    // The webhook serves on every replica, so it starts before the leader election.
    let webhook = match options.webhook.clone() {
        Some(wh) => {
            let (view, drive) = crate::webhook::cluster_view(&client, shutdown.clone());
            let state = crate::webhook::WebhookState {
                view,
                metrics: metrics.clone(),
            };
            let (_rotator, bound, serve) =
                crate::webhook::serve(client.clone(), wh, state, shutdown.clone()).await?;
            tracing::info!(addr = %bound, "webhook listening");
            Some(async move {
                tokio::join!(drive, serve);
            })
        }
        None => None,
    };
    let webhook = async move {
        if let Some(w) = webhook {
            w.await;
        }
    };
    // The controllers' and servers' state machines are large: keep them on the heap so the
    // caller's stack (a test thread, `main`) never has to hold them.
    let work = Box::pin(lead_and_control(client, metrics, options, ready, shutdown));
    let (_, _, result) = tokio::join!(Box::pin(admin), Box::pin(webhook), work);
    result
}

/// Waits for the leader lease (when configured), then runs the controllers until shutdown or
/// until the lease is lost.
async fn lead_and_control(
    client: Client,
    metrics: Arc<Metrics>,
    options: RunOptions,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let mut lease_state = None;
    if let Some(le) = &options.leader_election {
        let manager = LeaseManagerBuilder::new(client.clone(), &le.lease_name)
            .with_namespace(&le.namespace)
            .with_identity(&le.identity)
            .with_field_manager(crate::names::OPERATOR_MANAGER)
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
                _ = shutdown.cancelled() => return Ok(()),
            }
        }
        tracing::info!("acquired the leader lease");
        lease_state = Some((channel, task, le.lease_name.clone()));
    }

    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let controllers_shutdown = shutdown.child_token();
    let controllers = Box::pin(controller::run(
        client.clone(),
        metrics,
        options.controller.clone(),
        controllers_shutdown.clone(),
        ready_tx,
    ));
    let mark_ready = async {
        if let Ok(readiness) = ready_rx.await {
            tokio::select! {
                synced = readiness.wait() => ready.store(synced, Ordering::Relaxed),
                _ = shutdown.cancelled() => {}
            }
        }
    };
    let stop = async {
        match lease_state {
            Some((mut channel, task, name)) => {
                let outcome = tokio::select! {
                    _ = async {
                        while channel.changed().await.is_ok() {
                            if !*channel.borrow_and_update() {
                                return;
                            }
                        }
                    } => Err(RunError::LostLease(name)),
                    _ = shutdown.cancelled() => Ok(()),
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
    let ((), (), outcome) = tokio::join!(controllers, mark_ready, stop);
    outcome
}
