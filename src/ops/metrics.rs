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
    /// The jobs that have per-job series, so the series of a deleted job can be removed.
    job_series: std::sync::Mutex<std::collections::HashSet<JobLabels>>,
}

/// Labels of per-job metrics. One series per TrainingJob, removed when the job is deleted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// Namespace of the TrainingJob.
    pub namespace: String,
    /// Name of the TrainingJob.
    pub job: String,
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
            job_series: std::sync::Mutex::default(),
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

    /// Removes the series of every job `live` says is gone.
    pub fn retain_jobs(&self, live: impl Fn(&str, &str) -> bool) {
        let Ok(mut series) = self.job_series.lock() else {
            return;
        };
        series.retain(|labels| {
            let keep = live(&labels.namespace, &labels.job);
            if !keep {
                self.job_gpu_busy.remove(labels);
                self.job_overlap_flagged.remove(labels);
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
