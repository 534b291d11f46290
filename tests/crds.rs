//! The committed CRDs under `crds/` are exactly what the code generates, and every schema field
//! carries a description (what `kubectl explain` shows).

use std::path::Path;

use offload_api::v1alpha1::{crd_file_name, crd_yaml, crds};

#[test]
fn committed_crds_match_the_code() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    for crd in crds() {
        let path = dir.join(crd_file_name(&crd));
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{} is missing ({e}); run `cargo run -- crd --out-dir crds`",
                path.display()
            )
        });
        let generated = crd_yaml(&crd).unwrap();
        assert!(
            committed == generated,
            "{} differs from the code: run `cargo run -- crd --out-dir crds` and commit the result",
            path.display()
        );
    }
}

#[test]
fn the_charts_crds_are_the_committed_crds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for crd in crds() {
        let file = crd_file_name(&crd);
        let committed = std::fs::read_to_string(root.join("crds").join(&file)).unwrap();
        let charted =
            std::fs::read_to_string(root.join("charts/offload-operator/crds").join(&file))
                .unwrap_or_else(|e| {
                    panic!("charts/offload-operator/crds/{file}: {e}; copy crds/ into the chart")
                });
        assert!(
            committed == charted,
            "charts/offload-operator/crds/{file} differs from crds/{file}: cp crds/*.yaml charts/offload-operator/crds/"
        );
    }
}

/// Walks a JSON schema and collects the paths of properties without a description.
fn undocumented(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, prop) in props {
            let here = format!("{path}.{name}");
            if prop
                .get("description")
                .and_then(|d| d.as_str())
                .is_none_or(str::is_empty)
            {
                out.push(here.clone());
            }
            undocumented(prop, &here, out);
        }
    }
    if let Some(items) = schema.get("items") {
        undocumented(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        undocumented(extra, &format!("{path}{{}}"), out);
    }
}

#[test]
fn every_crd_field_is_documented() {
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        for version in &crd.spec.versions {
            let schema =
                serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap();
            let mut missing = Vec::new();
            // metadata and the apiVersion/kind boilerplate are Kubernetes' own.
            for (field, prop) in schema["properties"].as_object().unwrap() {
                if matches!(field.as_str(), "spec" | "status") {
                    undocumented(prop, field, &mut missing);
                }
            }
            assert!(
                missing.is_empty(),
                "{name}: fields without a description: {missing:?}"
            );
        }
    }
}

#[test]
fn printer_columns_are_the_documented_ones() {
    let crds = crds();
    let columns = |kind: &str| -> Vec<String> {
        let crd = crds.iter().find(|c| c.spec.names.kind == kind).unwrap();
        crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.to_uppercase())
            .collect()
    };
    assert_eq!(
        columns("OffloadProfile"),
        [
            "MODE",
            "OVERLAP",
            "UMA-NODES",
            "NODES",
            "JOBS",
            "LEARNED",
            "AGE"
        ]
    );
    assert_eq!(
        columns("TrainingJob"),
        [
            "MODE",
            "OVERLAP",
            "RATIO",
            "RESOLUTION",
            "PHASE",
            "GPU-BUSY",
            "GPU-MEM",
            "LEARNED",
            "AGE"
        ]
    );
}

/// `offload-operator crd | head`: a reader that closes the pipe early ends the command quietly
/// (no panic from `println!`, nothing on stderr), as it ends `cat`. The pipe is made smaller
/// than the output, so the command is still writing when it closes.
#[test]
fn a_closed_pipe_ends_the_cli_quietly() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::process::{Command, Stdio};
    let (mut reader, writer) = std::io::pipe().unwrap();
    // SAFETY: resizes a pipe this test owns.
    let size = unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    assert!(size >= 4096, "F_SETPIPE_SZ: {size}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_offload-operator"))
        .arg("crd")
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    reader.read_exact(&mut first).unwrap();
    drop(reader);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(stderr.is_empty(), "{stderr}");
    assert_ne!(status.code(), Some(101), "a panic's exit code: {status:?}");
}
