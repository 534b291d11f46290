//! What the operator's and the agent's processes do around their work: one tokio runtime per
//! process, SIGTERM (what the kubelet sends) or Ctrl-C to stop it, and a quiet end for a
//! command whose output is cut short.
#![deny(missing_docs)]
// Shipped functions fit on a screen (clippy counts code lines, not comments; threshold in
// clippy.toml); tests, which read as scenarios, are not held to it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

use tokio_util::sync::CancellationToken;

/// The process's runtime: multi-threaded with `workers` threads (at least 1), timers and I/O on.
///
/// # Panics
/// When the operating system refuses the runtime's threads or its I/O driver (start-up only).
#[allow(clippy::expect_used)] // start-up
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .enable_all()
        .build()
        .expect("start-up: tokio runtime")
}

/// For a command that prints and exits (never a server: its sockets need SIGPIPE ignored, as
/// Rust sets it): a closed stdout (`offload-operator crd | head`) ends the process quietly, as
/// it ends `cat`, instead of a panic in `println!`. Call it first in `main`, before any thread.
pub fn quiet_on_closed_pipe() {
    // SAFETY: restores the default action of one signal; no handler of ours is replaced, and
    // no other thread exists yet to race with it.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Returns once SIGTERM or Ctrl-C arrives (only Ctrl-C where SIGTERM cannot be watched).
pub async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// A token cancelled when SIGTERM or Ctrl-C arrives (logged as "shutting down"); the watch runs
/// on the current runtime until then.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let on_signal = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        on_signal.cancel();
    });
    token
}
