//! The peer webhook: the operator's server stack (axum, rustls, TCP_NODELAY) with a handler
//! that only reads the request uid and answers allowed — `/noop` without a patch, `/replay`
//! with the operator's patch for the same pod. What a webhook call costs the API server,
//! without our work. It runs as its own process (`offload-bench peer-webhook DIR PORT`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use offload_testenv::devcluster::{DevCluster, free_port};
use serde_json::json;

use super::super::error::{BenchError, Result};
use super::creation::PodKind;
use offload_testenv::http::{TlsConnection, trusting};

/// The peer webhook process and what the benchmark needs of it.
pub struct Peer {
    pub child: Child,
    pub port: u16,
    /// Trusts the peer's own CA.
    pub tls: Arc<rustls::ClientConfig>,
    /// The operator's patch for a bench pod (what the peer replays).
    pub configuration: json_patch::Patch,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The operator's patch for a bench pod as the API server would send it (defaulted): one
/// created unlabelled, read back, labelled and sent to the operator's webhook directly. The
/// patch as the webhook answered it (base64) and decoded.
async fn operators_patch(
    podsapi: &Api<Pod>,
    operator_port: u16,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<(String, json_patch::Patch)> {
    let probe: Pod =
        serde_json::from_value(PodKind::Without.pod("probe", &json_patch::Patch(Vec::new())))?;
    let stored = podsapi.create(&PostParams::default(), &probe).await?;
    let mut object = serde_json::to_value(&stored)?;
    object["metadata"]["labels"] = PodKind::Operator.labels();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "00000000-0000-0000-0000-000000000001",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "bench", "operation": "CREATE",
                    "userInfo": {"username": "bench"}, "object": object}
    });
    let mut conn = TlsConnection::connect(operator_port, tls.clone()).await?;
    let (_, body) = conn
        .post(
            "/mutate/pod",
            bytes::Bytes::from(serde_json::to_vec(&review)?),
        )
        .await?;
    let answer: serde_json::Value = serde_json::from_slice(&body)?;
    let patch = answer
        .pointer("/response/patch")
        .and_then(|p| p.as_str())
        .ok_or_else(|| {
            BenchError::unexpected(format!(
                "the operator's webhook did not patch the probe pod: {answer}"
            ))
        })?
        .to_string();
    let configuration: json_patch::Patch =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &patch)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| {
                BenchError::unexpected("the operator's patch is not base64 JSON Patch")
            })?;
    let mut check = PodKind::Without.pod("check", &configuration);
    json_patch::patch(&mut check, &configuration)?;
    Ok((patch, configuration))
}

/// Starts the peer webhook as its own process (this binary, `peer-webhook`), with a CA of its
/// own, the operator's patch for a bench pod to replay, and a configuration that sends the
/// peer-labelled pods to it; returns once the API server calls it.
pub async fn start(
    cluster: &DevCluster,
    client: &kube::Client,
    podsapi: &Api<Pod>,
    operator_port: u16,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<Peer> {
    let (patch, configuration) = operators_patch(podsapi, operator_port, tls).await?;

    let ca = offload_operator::ops::certs::CertAuthority::generate(
        "offload-bench-peer",
        Duration::from_secs(3600),
    )?;
    let serving = ca.issue_server(&["127.0.0.1".to_string()], Duration::from_secs(3600))?;
    let dir = cluster
        .kubeconfig
        .parent()
        .ok_or_else(|| BenchError::unexpected("the cluster has no directory"))?
        .join("peer-webhook");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("tls.crt"), &serving.cert_pem)?;
    std::fs::write(dir.join("tls.key"), &serving.key_pem)?;
    std::fs::write(dir.join("patch"), &patch)?;
    let port = free_port()?;
    let child = Command::new(std::env::current_exe()?)
        .arg("peer-webhook")
        .arg(&dir)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let bundle = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        ca.cert.cert_pem.as_bytes(),
    );
    let hook = |name: &str, path: &str, value: &str| {
        json!({"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
               "failurePolicy": "Fail", "timeoutSeconds": 5,
               "clientConfig": {"url": format!("https://127.0.0.1:{port}/{path}"), "caBundle": bundle},
               "objectSelector": {"matchLabels": {"bench.offload.dev/peer": value}},
               "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}]})
    };
    let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "offload-bench-peer"},
        "webhooks": [hook("noop.bench.offload.dev", "noop", "noop"),
                     hook("replay.bench.offload.dev", "replay", "replay")]
    }))?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await?;
    // Ready when a replay pod comes back with the operator's env (the peer serves and the API
    // server has loaded the configuration).
    let mut last = String::from("no attempt");
    for i in 0..100 {
        let pod: Pod = serde_json::from_value(
            PodKind::PeerReplay.pod(&format!("peer-ready-{i}"), &configuration),
        )?;
        match podsapi.create(&PostParams::default(), &pod).await {
            Ok(p)
                if p.spec
                    .iter()
                    .flat_map(|s| &s.containers)
                    .flat_map(|c| c.env.iter().flatten())
                    .any(|e| e.name == offload_api::names::ENV_MODE) =>
            {
                return Ok(Peer {
                    child,
                    port,
                    tls: trusting(ca.cert.cert_pem.as_bytes())?,
                    configuration,
                });
            }
            Ok(_) => last = "created without the replayed patch".into(),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(BenchError::unexpected(format!(
        "the peer webhook did not come into use: {last}"
    )))
}

/// Serves the peer webhook from `dir` (`tls.crt`, `tls.key`, `patch`) on `port`.
pub async fn serve(dir: PathBuf, port: u16) -> Result<()> {
    use axum::routing::post;
    use axum_server::accept::NoDelayAcceptor;
    use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
    let patch = Arc::new(std::fs::read_to_string(dir.join("patch"))?);
    let config = RustlsConfig::from_pem_file(dir.join("tls.crt"), dir.join("tls.key")).await?;
    let answer = |patch: Option<Arc<String>>| {
        move |body: bytes::Bytes| async move {
            let review: serde_json::Value = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => return (hyper::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
            };
            let mut response = json!({
                "uid": review.pointer("/request/uid").cloned().unwrap_or_default(),
                "allowed": true
            });
            if let Some(p) = patch {
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(*p);
            }
            axum::Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})).into_response()
        }
    };
    use axum::response::IntoResponse;
    let app = axum::Router::new()
        .route("/noop", post(answer(None)))
        .route("/replay", post(answer(Some(patch))));
    axum_server::bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .acceptor(RustlsAcceptor::new(config).acceptor(NoDelayAcceptor::new()))
        .serve(app.into_make_service())
        .await?;
    Ok(())
}
