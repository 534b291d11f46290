//! Prometheus metrics of the operator: one registry, built at start-up and shared.
//!
//! Labels are fixed categories (error category, mode, node class), never error text, so the
//! number of series stays bounded.

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
        Arc::new(m)
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
