//! `offload-bench control-plane`: start-up time of the local control plane and each process's
//! memory.

use std::time::Instant;

use offload_testenv::devcluster::{ClusterOptions, DevCluster};

use super::error::Result;
use super::measure::machine;

/// Starts the control plane `runs` times (etcd + apiserver), then once with everything.
pub async fn run(runs: u32) -> Result<()> {
    println!("# control plane start-up ({})", machine());
    let mut apiserver = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let c = DevCluster::start(ClusterOptions::default()).await?;
        apiserver.push(t.elapsed().as_secs_f64());
        drop(c);
    }
    let t = Instant::now();
    let full = DevCluster::start(ClusterOptions::full()).await?;
    let full_ready = t.elapsed().as_secs_f64();
    // Memory is read once the controllers have done their first sync: a fixed settle time is
    // the measurement's definition, not a wait for a condition.
    tokio::time::sleep(std::time::Duration::from_secs(15)).await;
    println!(
        "etcd + kube-apiserver to /readyz, {runs} runs: {}",
        apiserver
            .iter()
            .map(|s| format!("{s:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("with controller-manager, scheduler, kwok (apiserver ready): {full_ready:.2} s");
    println!("resident memory 15 s after start:");
    for (name, kib) in full.memory_kib() {
        #[allow(clippy::cast_precision_loss)]
        let mib = kib as f64 / 1024.0;
        println!("  {name:<24} {mib:>6.0} MiB");
    }
    Ok(())
}
