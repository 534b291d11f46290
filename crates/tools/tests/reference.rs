//! The book's reference pages under `docs/reference/` are exactly what the code generates.

use std::process::Command;

#[test]
fn reference_pages_match_the_code() {
    let out = Command::new(env!("CARGO_BIN_EXE_offload-reference"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_stale_page_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_offload-reference"))
        .args(["--check", "--out-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("crds.md") && stderr.contains("metrics.md"),
        "{stderr}"
    );
}

/// Links into the repository's tree (raw-file folders, examples: what the book cannot hold as
/// pages) name paths that exist; mdBook's link checker covers every other link.
#[test]
fn repository_links_in_the_docs_name_existing_paths() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let prefix = "https://github.com/offload-dev/offload-operator/";
    let mut pages = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.ends_with("raw") {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut checked = 0;
    let mut missing = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            let end = rest.find([')', ' ', '>', '\n']).unwrap_or(rest.len());
            let link = &rest[..end];
            let Some(path) = link
                .strip_prefix("tree/main/")
                .or_else(|| link.strip_prefix("blob/main/"))
            else {
                continue;
            };
            checked += 1;
            if !root.join(path.split('#').next().unwrap()).exists() {
                missing.push(format!("{}: {link}", page.display()));
            }
        }
    }
    assert!(checked > 0, "no repository links found: the scan is broken");
    assert!(
        missing.is_empty(),
        "links to paths that do not exist: {missing:#?}"
    );
}

/// Every operator or agent metric the chart's dashboard and alerts query is one the code
/// serves (as the reference page lists it), so a renamed metric cannot leave a panel empty.
#[test]
fn the_dashboard_and_alerts_query_metrics_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let listed = std::fs::read_to_string(root.join("docs/reference/metrics.md")).unwrap();
    let served: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert!(served.len() > 10, "{served:?}");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("charts/offload-operator/files/dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(queries.len() >= 12, "{queries:?}");
    let alerts =
        std::fs::read_to_string(root.join("charts/offload-operator/files/alerts.yaml")).unwrap();
    queries.extend(
        alerts
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr: "))
            .map(str::to_string),
    );
    let mut missing = Vec::new();
    for query in &queries {
        for (at, _) in query.match_indices("offload_") {
            let name: String = query[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            if !served.contains(&base) {
                missing.push(format!("{name} in {query}"));
            }
        }
    }
    assert!(missing.is_empty(), "metrics no code serves: {missing:#?}");
}
