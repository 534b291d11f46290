//! The human-readable form of an explanation.

use super::{CandidateMemory, Explanation};
use crate::render::deepspeed;

/// A memory estimate in one line: `GPU 24.3 of 130.6 GiB, host 3.5 of 125.0 GiB per pod`.
fn memory_line(m: &CandidateMemory) -> String {
    #[allow(clippy::cast_precision_loss)]
    let g = |b: u64| b as f64 / f64::from(1u32 << 30);
    let host = match m.host_budget_bytes {
        Some(b) => format!(
            "host {:.1} of {:.1} GiB per pod",
            g(m.host_bytes_per_pod),
            g(b)
        ),
        None => format!(
            "host {:.1} GiB per pod (not checked: no node memory known; --node-memory NODE=SIZE checks it)",
            g(m.host_bytes_per_pod)
        ),
    };
    format!(
        "{}: GPU {:.1} of {:.1} GiB, {host}{}",
        m.placement,
        g(m.gpu_bytes),
        g(m.gpu_budget_bytes),
        if m.fits { "" } else { " — does not fit" }
    )
}

/// The human-readable form.
pub fn to_text(e: &Explanation) -> String {
    let mut s = String::new();
    loop_section(&mut s, e);
    decision_section(&mut s, e);
    observed_section(&mut s, e);
    pod_section(&mut s, e);
    config_section(&mut s, e);
    s
}

/// With `--observed`: each run and what it taught.
fn loop_section(s: &mut String, e: &Explanation) {
    use std::fmt::Write as _;
    for (i, step) in e.closed_loop.iter().enumerate() {
        let _ = writeln!(
            s,
            "run {} ({}): {} {}",
            i + 1,
            step.source,
            step.configuration,
            step.outcome
        );
        if let Some(d) = &step.decided {
            let _ = writeln!(s, "  decided so: {d}");
        }
        if let Some(l) = &step.lesson {
            let _ = writeln!(s, "  learned: {l}");
        }
    }
    if !e.closed_loop.is_empty() {
        let _ = writeln!(s, "next decision, after {} run(s):", e.closed_loop.len());
    }
}

/// The job, its decision (or why there is none) and the memory estimate.
fn decision_section(s: &mut String, e: &Explanation) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "{} {}", e.kind, e.name);
    if !e.resolved && e.decision.is_some() {
        let _ = writeln!(
            s,
            "  not configured ({}): {}",
            e.reason.as_deref().unwrap_or("?"),
            e.message
        );
    }
    match &e.decision {
        Some(d) => {
            let _ = writeln!(
                s,
                "  decision: mode={} overlap={} ratio={} pinMemory={} nodeClass={} profile={}{}",
                d.mode,
                if d.overlap { "on" } else { "off" },
                d.ratio,
                d.pin_memory,
                d.node_class.as_deref().unwrap_or("none"),
                d.profile,
                d.overlap_efficiency
                    .map(|x| format!(" (measured overlap efficiency {x:.2})"))
                    .unwrap_or_default()
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  not configured ({}): {}",
                e.reason.as_deref().unwrap_or("?"),
                e.message
            );
        }
    }
    if let Some(m) = e.decision.as_ref().and_then(|d| d.memory.as_ref()) {
        let _ = writeln!(s, "  memory: {}", memory_line(m));
    }
}

/// What the agents observed the job's GPUs doing, and the reasons of the decision.
fn observed_section(s: &mut String, e: &Explanation) {
    use std::fmt::Write as _;
    if let Some(o) = &e.observed {
        let _ = writeln!(
            s,
            "  observed: GPUs busy {:.0} % ({} GPU(s){}; windows of {:.0} s, oldest ending {})",
            o.gpu_busy * 100.0,
            o.gpus,
            o.cpu_cores
                .map(|c| format!(", {c:.1} CPU cores"))
                .unwrap_or_default(),
            o.window_seconds,
            o.observed_at
        );
        for n in &o.nodes {
            let _ = writeln!(
                s,
                "    {:<24} busy {:.0} % on {} GPU(s){}",
                n.node,
                n.gpu_busy * 100.0,
                n.gpus,
                n.cpu_cores
                    .map(|c| format!(", {c:.1} CPU cores"))
                    .unwrap_or_default()
            );
        }
    }
    if let Some(v) = &e.overlap_observed {
        let _ = writeln!(s, "  overlap observed: {v}");
    }
    if !e.reasons.is_empty() {
        let _ = writeln!(s, "  why:");
        for r in &e.reasons {
            let _ = writeln!(s, "    {:<13} {}: {}", r.field, r.code, r.message);
        }
    }
}

/// What the pods get: env, required node affinity, pinned claim templates, the start-up guard.
fn pod_section(s: &mut String, e: &Explanation) {
    use std::fmt::Write as _;
    if !e.env.is_empty() {
        let _ = writeln!(s, "  env:");
        for v in &e.env {
            let _ = writeln!(s, "    {}={}", v.name, v.value.as_deref().unwrap_or(""));
        }
    }
    if let Some(reqs) = e
        .node_affinity
        .as_ref()
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .and_then(|r| r.node_selector_terms.first())
        .and_then(|t| t.match_expressions.as_ref())
    {
        let _ = writeln!(s, "  node affinity (required):");
        for r in reqs {
            let _ = writeln!(
                s,
                "    {} {} {}",
                r.key,
                r.operator,
                r.values.clone().unwrap_or_default().join(",")
            );
        }
    }
    for t in &e.claim_templates {
        let name = t
            .pointer("/metadata/name")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let _ = writeln!(
            s,
            "  claim template {name} (the pods' GPU claim, pinned to the class):"
        );
        for r in t
            .pointer("/spec/spec/devices/requests")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            let _ = writeln!(s, "    request {}", r);
        }
    }
    for c in &e.init_containers {
        let _ = writeln!(
            s,
            "  start-up guard: init container {} ({}) {}",
            c.name,
            c.image.as_deref().unwrap_or(""),
            c.args.clone().unwrap_or_default().join(" ")
        );
    }
}

/// The DeepSpeed configuration written and, with `--candidates`, every candidate considered.
fn config_section(s: &mut String, e: &Explanation) {
    use std::fmt::Write as _;
    if let Some(cfg) = &e.deepspeed_config {
        let _ = writeln!(s, "  DeepSpeed config ({}):", deepspeed::CONFIG_FILE_NAME);
        let text = serde_json::to_string_pretty(cfg).unwrap_or_default();
        for line in text.lines() {
            let _ = writeln!(s, "    {line}");
        }
    }
    if !e.candidates.is_empty() {
        let _ = writeln!(s, "  candidates:");
        for c in &e.candidates {
            let zero = c
                .deepspeed_config
                .as_ref()
                .and_then(|v| v.get("zero_optimization"))
                .map(|z| z.to_string())
                .or_else(|| c.megatron_args.clone())
                .unwrap_or_default();
            let note = match (&c.refused, c.same_semantics) {
                (Some(r), _) => format!(" [not written: {r}]"),
                (None, false) => " [changes the optimisation: needs consent]".to_string(),
                (None, true) => String::new(),
            };
            let _ = writeln!(s, "    {:<24} {zero}{note}", c.label);
            if let Some(m) = &c.memory {
                let _ = writeln!(s, "    {:<24} memory: {}", "", memory_line(m));
            }
        }
    }
}
