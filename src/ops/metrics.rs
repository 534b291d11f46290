//! Prometheus metrics of the operator: one registry, built at start-up and shared.
//!
//! Labels are fixed categories (error category, mode, node class), never error text, so the
//! number of series stays bounded.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a reconcile of one kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `TrainingJob` or `OffloadProfile`.
    pub kind: &'static str,
}

/// Labels of a reconcile error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `TrainingJob` or `OffloadProfile`.
    pub kind: &'static str,
    /// Fixed error category.
    pub category: &'static str,
}

/// Labels of a decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// Concrete mode, or the failure category when unresolved.
    pub mode: &'static str,
    /// Node class, or `none`.
    pub node_class: &'static str,
}

/// Labels of an admission request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// Endpoint, e.g. `mutate-pod`.
    pub endpoint: &'static str,
}

/// Labels of an admission denial.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DenialLabels {
    /// Endpoint.
    pub endpoint: &'static str,
    /// Fixed reason category.
    pub reason: &'static str,
}

/// All metrics of the operator process.
pub struct Metrics {
    /// Reconciles started, by kind.
    pub reconciles: Family<KindLabels, Counter>,
    /// Reconcile errors, by kind and category.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Reconcile duration in seconds, by kind.
    pub reconcile_duration: Family<KindLabels, Histogram>,
    /// Offload decisions made, by mode and node class.
    pub decisions: Family<DecisionLabels, Counter>,
    /// Admission requests, by endpoint.
    pub admission_requests: Family<AdmissionLabels, Counter>,
    /// Admission latency in seconds, by endpoint.
    pub admission_duration: Family<AdmissionLabels, Histogram>,
    /// Admission denials, by endpoint and reason category.
    pub admission_denials: Family<DenialLabels, Counter>,
    /// Watch errors of the caches, by kind (the watch backs off and retries).
    pub watch_errors: Family<KindLabels, Counter>,
    /// Observed GPU-busy fraction of each running TrainingJob (0 to 1), from the node agents.
    pub job_gpu_busy: Family<JobLabels, Gauge<f64, AtomicU64>>,
    /// Whether a running TrainingJob with overlap on is flagged for idle GPUs (1) or not (0).
    pub job_overlap_flagged: Family<JobLabels, Gauge>,
    /// 1 for each TrainingJob held without a configuration, labelled with the code that
    /// holds it.
    pub job_held: Family<HeldLabels, Gauge>,
    /// 1 for each TrainingJob whose out-of-memory re-decisions are spent (`maxMemoryRetries`).
    pub job_recovery_exhausted: Family<JobLabels, Gauge>,
    /// The jobs that have per-job series, so the series of a deleted job can be removed.
    job_series: std::sync::Mutex<std::collections::HashSet<JobLabels>>,
    /// The held series of each job (one at a time: the code that holds it now).
    held_series: std::sync::Mutex<std::collections::HashMap<JobLabels, HeldLabels>>,
}

/// Labels of a held job's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldLabels {
    /// Namespace of the TrainingJob.
    pub namespace: String,
    /// Name of the TrainingJob.
    pub trainingjob: String,
    /// The code that holds it (`InsufficientMemory`, `NoReportedNodes`, …).
    pub reason: &'static str,
}

/// Labels of per-job metrics. One series per TrainingJob, removed when the job is deleted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// Namespace of the TrainingJob.
    pub namespace: String,
    /// Name of the TrainingJob (not `job`: Prometheus' own target label).
    pub trainingjob: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs to about 13 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Metrics {
    /// Creates the metrics and registers them under the `offload_operator` prefix.
    pub fn new(registry: &mut Registry) -> Arc<Self> {
        let m = Metrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(latency_histogram),
            decisions: Family::default(),
            admission_requests: Family::default(),
            admission_duration: Family::new_with_constructor(latency_histogram),
            admission_denials: Family::default(),
            watch_errors: Family::default(),
            job_gpu_busy: Family::default(),
            job_overlap_flagged: Family::default(),
            job_held: Family::default(),
            job_recovery_exhausted: Family::default(),
            job_series: std::sync::Mutex::default(),
            held_series: std::sync::Mutex::default(),
        };
        let r = registry.sub_registry_with_prefix("offload_operator");
        r.register("reconciles", "Reconciles started", m.reconciles.clone());
        r.register(
            "reconcile_errors",
            "Reconcile errors by fixed category",
            m.reconcile_errors.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Reconcile duration",
            m.reconcile_duration.clone(),
        );
        r.register(
            "decisions",
            "Offload decisions by mode and node class",
            m.decisions.clone(),
        );
        r.register(
            "admission_requests",
            "Admission requests by endpoint",
            m.admission_requests.clone(),
        );
        r.register(
            "admission_duration_seconds",
            "Admission handling latency",
            m.admission_duration.clone(),
        );
        r.register(
            "admission_denials",
            "Admission denials by reason category",
            m.admission_denials.clone(),
        );
        r.register(
            "watch_errors",
            "Watch errors of the caches by kind",
            m.watch_errors.clone(),
        );
        r.register(
            "job_gpu_busy_ratio",
            "Observed busy fraction of a running TrainingJob's GPUs",
            m.job_gpu_busy.clone(),
        );
        r.register(
            "job_overlap_flagged",
            "1 when a TrainingJob with overlap on keeps its GPUs idle below its profile's threshold",
            m.job_overlap_flagged.clone(),
        );
        r.register(
            "job_held",
            "1 while a TrainingJob is held without a configuration, by the code that holds it",
            m.job_held.clone(),
        );
        r.register(
            "job_recovery_exhausted",
            "1 when a TrainingJob ran out of memory more often than its profile's maxMemoryRetries",
            m.job_recovery_exhausted.clone(),
        );
        Arc::new(m)
    }

    /// Records a job's observed busy fraction and, where judged, whether it is flagged.
    pub fn set_job(&self, labels: &JobLabels, busy: f64, flagged: Option<bool>) {
        self.job_gpu_busy.get_or_create(labels).set(busy);
        if let Some(f) = flagged {
            self.job_overlap_flagged
                .get_or_create(labels)
                .set(i64::from(f));
        }
        if let Ok(mut series) = self.job_series.lock() {
            series.insert(labels.clone());
        }
    }

    /// Records whether a job is held, and by which code (`None`: it has a configuration).
    pub fn set_held(&self, job: &JobLabels, reason: Option<&'static str>) {
        let now = reason.map(|reason| HeldLabels {
            namespace: job.namespace.clone(),
            trainingjob: job.trainingjob.clone(),
            reason,
        });
        {
            // Released before `track` takes the job set's lock: `retain_jobs` takes the two
            // in the other order.
            let Ok(mut held) = self.held_series.lock() else {
                return;
            };
            if let Some(before) = held.get(job)
                && Some(before) != now.as_ref()
            {
                self.job_held.remove(before);
            }
            match &now {
                Some(labels) => {
                    self.job_held.get_or_create(labels).set(1);
                    held.insert(job.clone(), labels.clone());
                }
                None => {
                    held.remove(job);
                }
            }
        }
        if now.is_some() {
            self.track(job);
        }
    }

    /// Records that a job's out-of-memory re-decisions are spent.
    pub fn set_recovery_exhausted(&self, job: &JobLabels) {
        self.job_recovery_exhausted.get_or_create(job).set(1);
        self.track(job);
    }

    fn track(&self, job: &JobLabels) {
        if let Ok(mut series) = self.job_series.lock() {
            series.insert(job.clone());
        }
    }

    /// Removes the series of every job `live` says is gone.
    pub fn retain_jobs(&self, live: impl Fn(&str, &str) -> bool) {
        let Ok(mut series) = self.job_series.lock() else {
            return;
        };
        series.retain(|labels| {
            let keep = live(&labels.namespace, &labels.trainingjob);
            if !keep {
                self.job_gpu_busy.remove(labels);
                self.job_overlap_flagged.remove(labels);
                self.job_recovery_exhausted.remove(labels);
                if let Ok(mut held) = self.held_series.lock()
                    && let Some(h) = held.remove(labels)
                {
                    self.job_held.remove(&h);
                }
            }
            keep
        });
    }

    /// Counts a reconcile and returns a timer that records its duration when dropped.
    pub fn reconcile_timer(&self, kind: &'static str) -> ReconcileTimer<'_> {
        self.reconciles.get_or_create(&KindLabels { kind }).inc();
        ReconcileTimer {
            metrics: self,
            kind,
            start: Instant::now(),
        }
    }
}

/// Records a reconcile's duration on drop.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    kind: &'static str,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .get_or_create(&KindLabels { kind: self.kind })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn a_held_job_has_one_series_with_the_code_that_holds_it_until_it_is_decided_or_gone() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        let job = JobLabels {
            namespace: "ml".into(),
            trainingjob: "llama".into(),
        };
        m.set_held(&job, Some("NoReportedNodes"));
        m.set_held(&job, Some("InsufficientMemory"));
        let shown = text(&registry);
        assert!(
            shown.contains(
                r#"offload_operator_job_held{namespace="ml",trainingjob="llama",reason="InsufficientMemory"} 1"#
            ),
            "{shown}"
        );
        assert!(!shown.contains("NoReportedNodes"), "{shown}");
        m.set_held(&job, None);
        assert!(!text(&registry).contains("offload_operator_job_held{"));

        m.set_held(&job, Some("InsufficientMemory"));
        m.set_recovery_exhausted(&job);
        assert!(text(&registry).contains("offload_operator_job_recovery_exhausted{"));
        m.retain_jobs(|_, _| false);
        let shown = text(&registry);
        assert!(!shown.contains("offload_operator_job_held{"), "{shown}");
        assert!(
            !shown.contains("offload_operator_job_recovery_exhausted{"),
            "{shown}"
        );
    }
}
