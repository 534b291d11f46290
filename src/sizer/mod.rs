//! The sizer: the program that reads a model's own code to size its training step
//! (`sizer/offload_sizer.py`, shipped inside this binary), and how it is run — on this machine
//! for `offload-operator explain --trace` ([`local`]), or in the cluster before a job's pods
//! exist ([`cluster`]: its Job and what its pod says).

pub mod cluster;
pub mod local;

use std::time::Duration;

/// The sizer program, as this release ships it.
pub const SCRIPT: &str = include_str!("../../sizer/offload_sizer.py");

/// How the operator runs the sizer in a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizerOptions {
    /// The namespace the traces are kept in (the operator's own).
    pub namespace: String,
    /// The sizer image (pinned torch and transformers); `None`: only the job's own image.
    pub image: Option<String>,
    /// Try the job's own image first: its libraries build the model as the job will.
    pub job_image: bool,
    /// How long a job waits for its trace before the counted model decides.
    pub timeout: Duration,
    /// CPU of the sizer's container (request and limit).
    pub cpu: String,
    /// Memory of the sizer's container (request and limit).
    pub memory: String,
    /// How long a failure is remembered before a job of the same step tries again.
    pub retry_after: Duration,
}

impl Default for SizerOptions {
    fn default() -> Self {
        SizerOptions {
            namespace: "offload-system".into(),
            image: None,
            job_image: true,
            timeout: Duration::from_secs(300),
            cpu: "2".into(),
            memory: "4Gi".into(),
            retry_after: Duration::from_secs(3600),
        }
    }
}
