//! Every metric the operator and the agent serve, from their own registries.

use offload_operator::ops::metrics::{
    AdmissionLabels, DecisionLabels, DenialLabels, ErrorLabels, HeldLabels, JobLabels, KindLabels,
    Metrics,
};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use super::markdown::{GENERATED, table};

/// The page.
pub fn page() -> Result<String, String> {
    let mut operator = Registry::default();
    one_series_each(&offload_operator::ops::metrics::Metrics::new(&mut operator));
    let agent = offload_agent::daemon::metrics_registry();
    let mut out = format!(
        "{GENERATED}\n\n# Metrics\n\nBoth serve Prometheus' text format on `/metrics`: the operator on \
         `metrics.port` (8080), the agent on port 8081 of its pod. Counters are exposed with the \
         `_total` suffix, histograms as `_bucket`, `_sum` and `_count`.\n"
    );
    for (title, registry) in [("The operator", &operator), ("The agent", &agent)] {
        out.push_str(&format!("\n## {title}\n\n"));
        out.push_str(&table(
            &["metric", "type", "labels", "meaning"],
            &rows(registry)?,
        ));
    }
    Ok(out)
}

/// A series in every family (a registry leaves empty families out), so each is listed with its
/// labels.
fn one_series_each(m: &Metrics) {
    let kind = KindLabels { kind: "x" };
    let _ = m.reconciles.get_or_create(&kind);
    let _ = m.reconcile_errors.get_or_create(&ErrorLabels {
        kind: "x",
        category: "x",
    });
    let _ = m.reconcile_duration.get_or_create(&kind);
    let _ = m.decisions.get_or_create(&DecisionLabels {
        mode: "x",
        node_class: "x",
    });
    let endpoint = AdmissionLabels { endpoint: "x" };
    let _ = m.admission_requests.get_or_create(&endpoint);
    let _ = m.admission_duration.get_or_create(&endpoint);
    let _ = m.admission_denials.get_or_create(&DenialLabels {
        endpoint: "x",
        reason: "x",
    });
    let _ = m.watch_errors.get_or_create(&kind);
    let job = JobLabels {
        namespace: "x".into(),
        trainingjob: "x".into(),
    };
    let _ = m.job_gpu_busy.get_or_create(&job);
    let _ = m.job_overlap_flagged.get_or_create(&job);
    let _ = m.job_recovery_exhausted.get_or_create(&job);
    let _ = m.job_held.get_or_create(&HeldLabels {
        namespace: "x".into(),
        trainingjob: "x".into(),
        reason: "x",
    });
}

/// The label names of a sample line (`name{a="x",b="y"} 0`).
fn labels(sample: &str) -> Vec<String> {
    let Some((_, rest)) = sample.split_once('{') else {
        return Vec::new();
    };
    let inner = rest.split('}').next().unwrap_or_default();
    inner
        .split(',')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| format!("`{k}`")))
        .filter(|k| k != "`le`")
        .collect()
}

/// One row per metric family: its name as queried, its type and its help.
fn rows(registry: &Registry) -> Result<Vec<Vec<String>>, String> {
    let mut text = String::new();
    encode(&mut text, registry).map_err(|e| e.to_string())?;
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut help: Option<(String, String)> = None;
    let mut awaiting_sample = false;
    for line in text.lines() {
        if awaiting_sample && !line.starts_with('#') {
            if let Some(row) = rows.last_mut() {
                row[2] = labels(line).join(", ");
            }
            awaiting_sample = false;
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name.to_string(), text.trim_end_matches('.').to_string()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let meaning = match &help {
                Some((n, t)) if n == name => t.clone(),
                _ => return Err(format!("metric {name} has no help text")),
            };
            let queried = match kind {
                "counter" => format!("`{name}_total`"),
                _ => format!("`{name}`"),
            };
            rows.push(vec![queried, kind.to_string(), String::new(), meaning]);
            awaiting_sample = true;
        }
    }
    if rows.is_empty() {
        return Err("a registry holds no metrics".into());
    }
    Ok(rows)
}
