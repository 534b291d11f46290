//! `offload-reference`: the book's reference pages, generated from the code — every CRD field
//! (from the CRD schemas the API types generate), every well-known label, annotation, env var
//! and Event reason (from `offload_api::names` and its doc comments), every metric (from the
//! operator's and the agent's registries) and every chart value (from the chart's values schema
//! and defaults).
//!
//! `offload-reference` writes them into `docs/reference/`; `offload-reference --check` compares
//! and fails on any difference (the test command runs it).

// No unwrap or expect outside tests (clippy.toml allows them there).
#![warn(clippy::unwrap_used, clippy::expect_used)]

mod crds;
mod markdown;
mod metrics;
mod names;
mod reasons;
mod values;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

/// Generate (or check) the reference pages of the book.
#[derive(Parser)]
#[command(name = "offload-reference")]
struct Args {
    /// Compare the generated pages with those in the folder; fail and name each that differs.
    #[arg(long)]
    check: bool,
    /// The folder of the reference pages.
    #[arg(long, default_value_os_t = default_dir())]
    out_dir: PathBuf,
}

fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference")
}

/// A generated page: its file name and text.
pub struct Page {
    file: &'static str,
    text: String,
}

/// What writes one page.
type Generator = fn() -> Result<String, String>;

fn pages() -> Result<Vec<Page>, String> {
    let generators: [(&'static str, Generator); 7] = [
        ("crds.md", crds::page),
        ("labels-annotations.md", names::labels_page),
        ("env.md", names::env_page),
        ("reasons.md", reasons::page),
        ("events.md", names::events_page),
        ("metrics.md", metrics::page),
        ("chart-values.md", values::page),
    ];
    generators
        .into_iter()
        .map(|(file, page)| {
            Ok(Page {
                file,
                text: page()?,
            })
        })
        .collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let pages = match pages() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stale = Vec::new();
    for page in &pages {
        let path = args.out_dir.join(page.file);
        if args.check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(page.text.as_str()) {
                stale.push(path.display().to_string());
            }
        } else if let Err(e) = std::fs::write(&path, &page.text) {
            eprintln!("error: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    match reasons::longest_of_examples() {
        Ok((n, text)) => {
            println!(
                "the longest reason sentence of the examples' decisions: {n} characters (bound {}): {text}",
                offload_operator::decision::MAX_SHORT_CHARS
            );
            if n > offload_operator::decision::MAX_SHORT_CHARS {
                eprintln!("error: a reason sentence is over the bound");
                return ExitCode::FAILURE;
            }
        }
        Err(e) => {
            eprintln!("error: deciding the examples: {e}");
            return ExitCode::FAILURE;
        }
    }
    if stale.is_empty() {
        if !args.check {
            println!(
                "wrote {} pages into {}",
                pages.len(),
                args.out_dir.display()
            );
        }
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: reference pages differ from the code: {}; run `cargo run -p offload-tools --bin offload-reference` and commit the result",
            stale.join(", ")
        );
        ExitCode::FAILURE
    }
}
