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
    /// Leadership was lost; the process exits so a fresh start re-joins the election.
    #[error("lost the leader lease {0}; exiting so another replica takes over cleanly")]
    LostLease(String),
}

/// Runs until `shutdown` is cancelled (SIGTERM in `main`) or leadership is lost.
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
    let admin = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, admin::router(admin_state))
            .with_graceful_shutdown(admin_shutdown.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "admin server stopped");
        }
    });

    // Leader election: controllers run only on the leader; losing the lease ends the process.
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
        loop {
            if *channel.borrow_and_update() {
                break;
            }
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
    let controllers = tokio::spawn(controller::run(
        client.clone(),
        metrics.clone(),
        options.controller.clone(),
        controllers_shutdown.clone(),
        ready_tx,
    ));
    if let Ok(readiness) = ready_rx.await {
        let ready = ready.clone();
        tokio::spawn(async move {
            if readiness.wait().await {
                ready.store(true, Ordering::Relaxed);
            }
        });
    }

    let result = match lease_state {
        Some((mut channel, task, name)) => {
            let lost = async {
                while channel.changed().await.is_ok() {
                    if !*channel.borrow_and_update() {
                        return;
                    }
                }
            };
            let outcome = tokio::select! {
                _ = lost => Err(RunError::LostLease(name)),
                _ = shutdown.cancelled() => Ok(()),
            };
            controllers_shutdown.cancel();
            drop(channel);
            // Closing the channel makes the manager release the lease.
            let _ = task.await;
            outcome
        }
        None => {
            shutdown.cancelled().await;
            Ok(())
        }
    };
    controllers_shutdown.cancel();
    let _ = controllers.await;
    let _ = admin.await;
    result
}
