//! The benchmarks' cluster: CRDs, simulated GPU nodes with recorded reports, the default
//! profile, and the release operator as its own process.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use offload_api::api::OffloadProfile;
use offload_api::report::NodeReport;
use offload_testenv::devcluster::{DevCluster, free_port, repo_root};
use offload_testenv::fixtures;
use serde_json::json;

use super::error::{BenchError, Result};

/// A node carrying a recorded report and the labels the agent derives from it.
pub fn reported_node(name: &str, fixture: &str) -> Result<Node> {
    let mut report =
        NodeReport::parse(fixture).map_err(|e| BenchError::unexpected(format!("fixture: {e}")))?;
    report.node = name.to_string();
    let mut labels: BTreeMap<String, String> = report.labels();
    labels.insert("kubernetes.io/hostname".into(), name.into());
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {offload_api::names::ANNOTATION_NODE_REPORT: report.to_annotation()?}}
    }))?)
}

/// Applies the CRDs and waits until they are served.
pub async fn apply_crds(client: &kube::Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in offload_api::api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("offload-bench").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .map_err(|_| BenchError::unexpected(format!("CRD {name} not established in 60 s")))?
        .map_err(|e| BenchError::unexpected(format!("waiting for CRD {name}: {e}")))?;
    }
    Ok(())
}

/// CRDs, 8 coherent and 8 discrete recorded nodes, and the `default` profile.
pub async fn setup_cluster(cluster: &DevCluster) -> Result<kube::Client> {
    let client = cluster.client().await?;
    apply_crds(&client).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..8 {
        nodes
            .create(
                &PostParams::default(),
                &reported_node(&format!("gh200-{i}"), fixtures::GH200_REFERENCE)?,
            )
            .await?;
        nodes
            .create(
                &PostParams::default(),
                &reported_node(&format!("h200-{i}"), fixtures::H200_READING)?,
            )
            .await?;
    }
    let profile: OffloadProfile = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": "default"}, "spec": {}
    }))?;
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    Ok(client)
}

/// Starts the release operator; returns it with its admin (metrics) port.
pub fn spawn_operator(cluster: &DevCluster, webhook_port: Option<u16>) -> Result<(Child, u16)> {
    let bin = repo_root().join("target/release/offload-operator");
    if !bin.exists() {
        return Err(BenchError::unexpected(
            "build the release binaries first: cargo build --release --workspace --bins",
        ));
    }
    let admin = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "warn")
        .args(["run", "--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(["--namespace", "offload-system"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    match webhook_port {
        Some(p) => cmd.args([
            "--webhook-addr",
            &format!("127.0.0.1:{p}"),
            "--webhook-names",
            "127.0.0.1",
        ]),
        None => cmd.args(["--webhook-addr", ""]),
    };
    Ok((cmd.spawn()?, admin))
}

/// Plain HTTP GET of a path on a local port (the admin server), the body as text.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    Some(text)
}

/// Waits until the operator at `admin_port` reports ready (its caches synced).
pub async fn wait_ready(admin_port: u16, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_millis(20);
    loop {
        if http_get(admin_port, "/readyz")
            .is_some_and(|t| t.starts_with("HTTP/1.0 200") || t.starts_with("HTTP/1.1 200"))
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(BenchError::unexpected(format!(
                "the operator was not ready after {timeout:?}"
            )));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(250));
    }
}

/// The operator's own measure of one admission handler: (sum seconds, count) of
/// `offload_operator_admission_duration_seconds{endpoint="…"}` from its `/metrics`.
pub fn handler_seconds(admin_port: u16, endpoint: &str) -> Option<(f64, f64)> {
    let wanted = format!("endpoint=\"{endpoint}\"");
    let text = http_get(admin_port, "/metrics")?;
    let metric = |name: &str| -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(&wanted))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .next()
    };
    Some((
        metric("offload_operator_admission_duration_seconds_sum")?,
        metric("offload_operator_admission_duration_seconds_count")?,
    ))
}
