//! The sizer run on this machine, with a Python that has `torch` and `transformers` (what
//! `offload-operator explain --trace` shows before a job is submitted).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};

use offload_api::trace::{MAX_TRACE_BYTES, ModelTrace, TraceError};

use crate::decision::model::shape::ConfigDigest;
use crate::decision::{SizerRequest, TraceInput};

/// The traces an offline view holds (given as files) or makes (the sizer run here, once per
/// step).
#[derive(Clone, Debug, Default)]
pub struct TraceBook {
    /// Traces given, by the key of the step each was made for (`""`: written without a key,
    /// taken for a step it fits).
    pub given: BTreeMap<String, Arc<ModelTrace>>,
    /// The sizer to run here, where traces are made.
    pub sizer: Option<LocalSizer>,
    made: Arc<Mutex<BTreeMap<String, TraceInput>>>,
}

/// A Python with `torch` and `transformers`, and the models' `config.json` it may trace.
#[derive(Clone, Debug, Default)]
pub struct LocalSizer {
    /// The interpreter.
    pub python: String,
    /// Each `config.json`'s text, by digest.
    pub configs: BTreeMap<ConfigDigest, String>,
}

impl LocalSizer {
    /// The sizer run with `python` over these `config.json` texts (one that is not JSON is left
    /// out: the decision refuses it on its own).
    pub fn new<'a>(python: &str, configs: impl IntoIterator<Item = &'a String>) -> Self {
        LocalSizer {
            python: python.to_string(),
            configs: configs
                .into_iter()
                .filter_map(|text| {
                    let v: serde_json::Value = serde_json::from_str(text).ok()?;
                    Some((ConfigDigest::of(&v), text.clone()))
                })
                .collect(),
        }
    }
}

impl TraceBook {
    /// A trace file's text added to the book.
    pub fn add(&mut self, text: &str) -> Result<(), String> {
        let trace = ModelTrace::parse(text).map_err(|e| e.to_string())?;
        self.given
            .insert(trace.key.clone().unwrap_or_default(), Arc::new(trace));
        Ok(())
    }

    /// The trace of `step`: a given one made for it, a given one without a key that fits it, or
    /// one the sizer makes here (once per step).
    pub fn trace(&self, step: &SizerRequest) -> TraceInput {
        if let Some(t) = self.given.get(&step.key()) {
            return TraceInput::Traced(t.clone());
        }
        if let Some(t) = self.given.get("") {
            return match step.accepts(t) {
                Ok(()) => TraceInput::Traced(t.clone()),
                Err(why) => TraceInput::Untraced(why),
            };
        }
        let Some(sizer) = &self.sizer else {
            return if self.given.is_empty() {
                TraceInput::None
            } else {
                TraceInput::Untraced(format!(
                    "no trace given is of this job's step ({}, key {})",
                    step.describe(),
                    step.key()
                ))
            };
        };
        let mut made = self
            .made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        made.entry(step.key())
            .or_insert_with(|| match sizer.configs.get(&step.config) {
                None => TraceInput::None,
                Some(config) => match run(&sizer.python, config, step) {
                    Ok(t) => TraceInput::Traced(Arc::new(t)),
                    Err(why) => TraceInput::Untraced(why),
                },
            })
            .clone()
    }
}

/// Runs the sizer with `python` on `config` (a model's `config.json`) for `step`.
pub fn run(python: &str, config: &str, step: &SizerRequest) -> Result<ModelTrace, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder for the sizer: {e}"))?;
    let script = dir.path().join("offload_sizer.py");
    let config_path = dir.path().join("config.json");
    write(&script, super::SCRIPT)?;
    write(&config_path, config)?;
    let out = Command::new(python)
        .arg(&script)
        .arg("--config")
        .arg(&config_path)
        .args(step.args())
        // No download, no GPU: the sizer reads the config and builds on fake tensors.
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .map_err(|e| format!("running {python}: {e} (give a Python with torch and transformers: --python or OFFLOAD_SIZER_PYTHON)"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    let Some(text) = last.filter(|t| t.len() <= MAX_TRACE_BYTES) else {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
        return Err(format!(
            "the sizer printed no trace (exit {}): {}",
            out.status
                .code()
                .map_or("by signal".into(), |c| c.to_string()),
            offload_api::text::bounded_to(&tail, 400)
        ));
    };
    ModelTrace::parse(text).map_err(|e| match e {
        TraceError::Sizer(f) => format!(
            "the sizer could not trace the model ({}): {}",
            f.code, f.message
        ),
        other => other.to_string(),
    })
}

fn write(path: &std::path::Path, text: &str) -> Result<(), String> {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}
