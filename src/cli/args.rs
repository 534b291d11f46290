//! The command line's values read with their bounds: each a clear error at start-up, never a
//! value the operator would misuse.

use std::time::Duration;

/// The leader lease's duration: 5 s to 5 minutes.
pub(crate) fn parse_seconds(s: &str) -> Result<Duration, String> {
    offload_api::duration::parse_bounded(s, Duration::from_secs(5), Duration::from_secs(300))
}

/// The sizer's time-out: from 10 s (a model is built and traced in seconds) to an hour (a job
/// waits no longer for its trace).
pub(crate) fn parse_sizer_timeout(s: &str) -> Result<Duration, String> {
    offload_api::duration::parse_bounded(s, Duration::from_secs(10), Duration::from_secs(3600))
}

/// A CPU quantity of at least a tenth of a core.
pub(crate) fn parse_cpu(s: &str) -> Result<String, String> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.to_string());
    match offload_api::quantity::cpu_cores(&q) {
        Ok(c) if (0.1..=1024.0).contains(&c) => Ok(s.to_string()),
        Ok(c) => Err(format!("{c} cores: give 0.1 to 1024")),
        Err(e) => Err(e.to_string()),
    }
}

/// A memory quantity of at least 512 MiB.
pub(crate) fn parse_memory(s: &str) -> Result<String, String> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.to_string());
    match offload_api::quantity::bytes(&q) {
        Ok(b) if b >= 512 << 20 => Ok(s.to_string()),
        Ok(b) => Err(format!("{b} bytes: the sizer needs at least 512Mi")),
        Err(e) => Err(e.to_string()),
    }
}
