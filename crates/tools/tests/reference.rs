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
