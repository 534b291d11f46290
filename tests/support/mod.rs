//! The operator's integration tests share the test environment's helpers.
#![allow(unused_imports, dead_code)]

pub mod controller;

pub use offload_testenv::support::*;

use std::time::Duration;

use kube::api::Api;
use offload_api::api::TrainingJob;

/// Whether the TrainingJob reports `WorkloadCreated=True`.
pub fn has_workload(tj: &TrainingJob) -> bool {
    tj.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "WorkloadCreated" && c.status == "True")
    })
}

/// Waits until `api` lists exactly `count` TrainingJobs and every one has its workload.
pub async fn every_job_has_its_workload(
    api: &Api<TrainingJob>,
    count: usize,
    what: &str,
    timeout: Duration,
) {
    wait_list(
        api.clone(),
        kube::runtime::watcher::Config::default(),
        what,
        timeout,
        |tjs| (tjs.len() == count && tjs.iter().all(|tj| has_workload(tj))).then_some(()),
    )
    .await;
}
