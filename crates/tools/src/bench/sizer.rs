//! `offload-bench sizer`: what the sizer costs on this machine. Runs the sizer this release ships
//! (`sizer/offload_sizer.py`) on each model's `config.json` at its micro-batch, `runs` times, and
//! prints one Markdown row per model: the process's wall time (median and slowest, the Python
//! start and the imports included), its peak resident memory (the process's own `ru_maxrss`,
//! as the sizer reports it), and what it traced. The time a job's pods wait for it in a cluster
//! is this plus the sizer pod's start (scheduling, and pulling the image where the node has not).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

use super::error::BenchError;

/// One model at one micro-batch: `CONFIG.json:MICROxSEQ`.
#[derive(Clone, Debug)]
pub struct Case {
    config: PathBuf,
    micro: u64,
    sequence: u64,
}

impl std::str::FromStr for Case {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (config, shape) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s}: give CONFIG.json:MICROxSEQ"))?;
        let (micro, sequence) = shape
            .split_once('x')
            .ok_or_else(|| format!("{shape}: give MICROxSEQ, e.g. 1x8192"))?;
        Ok(Case {
            config: PathBuf::from(config),
            micro: micro.parse().map_err(|e| format!("{micro}: {e}"))?,
            sequence: sequence.parse().map_err(|e| format!("{sequence}: {e}"))?,
        })
    }
}

fn gib(b: f64) -> String {
    format!("{:.2}", b / f64::from(1u32 << 30))
}

/// Runs every case `runs` times with `python` and prints the table.
pub fn run(python: &str, root: &Path, cases: &[Case], runs: u32) -> Result<(), BenchError> {
    let script = root.join("sizer/offload_sizer.py");
    println!(
        "sizer {} with {python}; {} CPUs\n",
        script.display(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    println!(
        "| model | micro-batch | parameters | kernels | wall median / slowest (s) | peak RSS (GiB) | kept for backward / step peak (GiB) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for case in cases {
        let mut walls = Vec::new();
        let mut rss: f64 = 0.0;
        let mut last = Value::Null;
        for _ in 0..runs.max(1) {
            let t0 = Instant::now();
            let out = Command::new(python)
                .arg(&script)
                .arg("--config")
                .arg(&case.config)
                .args(["--micro-batch", &case.micro.to_string()])
                .args(["--sequence", &case.sequence.to_string()])
                .output()?;
            walls.push(t0.elapsed().as_secs_f64());
            let text = String::from_utf8_lossy(&out.stdout);
            last = serde_json::from_str(text.lines().last().unwrap_or_default())?;
            if last.get("kind").and_then(Value::as_str) != Some("ModelTrace") {
                return Err(BenchError::Command {
                    what: format!("the sizer on {}", case.config.display()),
                    detail: last.to_string(),
                });
            }
            rss = rss.max(last["maxRssBytes"].as_f64().unwrap_or(0.0));
        }
        walls.sort_by(f64::total_cmp);
        let f = |k: &str| last.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        println!(
            "| {} ({}) | {} × {} | {:.3}B | {} | {:.1} / {:.1} | {} | {} / {} |",
            case.config
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            last["modelType"].as_str().unwrap_or_default(),
            case.micro,
            case.sequence,
            f("parameters") / 1e9,
            last["kernels"],
            walls[walls.len() / 2],
            walls[walls.len() - 1],
            gib(rss),
            gib(f("savedBytes")),
            gib(f("peakBytes")),
        );
    }
    Ok(())
}
