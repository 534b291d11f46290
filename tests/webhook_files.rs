//! The webhook serving certificates from files (the cert-manager mode): real TLS on loopback,
//! and a re-issued certificate picked up without a restart.

use std::sync::Arc;
use std::time::Duration;

use offload_operator::ops::certs::CertAuthority;
use offload_operator::ops::metrics::Metrics;
use offload_operator::webhook::admit::StoreView;
use offload_operator::webhook::tls::FileCerts;
use offload_operator::webhook::{self, CertMode, WebhookOptions, WebhookState};
use offload_testenv::http::{HttpError, TlsConnection, trusting};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn write_cert(dir: &std::path::Path, ca: &CertAuthority) {
    let cert = ca.issue_server(&["127.0.0.1".to_string()], DAY).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), cert.key_pem).unwrap();
}

/// POSTs an unreadable body over TLS, trusting only `ca`; returns the HTTP status.
async fn post_garbage(port: u16, ca: &CertAuthority) -> Result<u16, HttpError> {
    let tls = trusting(ca.cert.cert_pem.as_bytes())?;
    let mut conn = TlsConnection::connect(port, tls).await?;
    let (status, _) = conn
        .post("/mutate/pod", "not an admission review".into())
        .await?;
    Ok(status)
}

#[tokio::test]
async fn file_certificates_are_served_and_reloaded_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first_ca = CertAuthority::generate("first", DAY).unwrap();
    write_cert(dir.path(), &first_ca);

    // No cluster is needed for file certificates: a client that is never used.
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let (profiles, _) = kube::runtime::reflector::store();
    let (nodes, _) = kube::runtime::reflector::store();
    let mut registry = prometheus_client::registry::Registry::default();
    let state = WebhookState {
        view: Arc::new(StoreView::from_stores(profiles, nodes)),
        metrics: Metrics::new(&mut registry),
        configs: Default::default(),
        events: None,
    };
    let options = WebhookOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        certs: CertMode::Files(FileCerts {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        }),
        check_interval: Duration::from_secs(3600),
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (rotator, addr, serve) = webhook::serve(client, options, state, shutdown.clone())
        .await
        .unwrap();
    let server = tokio::spawn(serve);

    let status = post_garbage(addr.port(), &first_ca).await.unwrap();
    assert_eq!(status, 400, "an unreadable body gets 400 over TLS");

    // cert-manager re-issues from another CA: the server picks it up on the next check.
    let second_ca = CertAuthority::generate("second", DAY).unwrap();
    write_cert(dir.path(), &second_ca);
    rotator.rotate().await.unwrap();
    let status = post_garbage(addr.port(), &second_ca).await.unwrap();
    assert_eq!(status, 400);
    assert!(
        post_garbage(addr.port(), &first_ca).await.is_err(),
        "the old certificate is no longer served"
    );

    shutdown.cancel();
    server.await.unwrap();
}
