//! HTTP as tests and benches speak it: plain GETs on the operator's admin server (hyper-util's
//! client), keep-alive POSTs over TLS to a webhook (hyper's HTTP/1.1 connection over
//! tokio-rustls), and `/metrics` text, of the operator or of the API server, read with
//! `prometheus-parse`.

use std::sync::Arc;

use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Why an HTTP exchange over TLS failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The connection could not be made.
    #[error("connect: {0}")]
    Io(#[from] std::io::Error),
    /// TLS set-up failed (the CA did not read, or the handshake was refused).
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Hyper(#[from] hyper::Error),
    /// The request could not be built.
    #[error("HTTP request: {0}")]
    Request(#[from] http::Error),
}

/// A TLS client configuration that trusts only the CA certificates in `ca_pem`.
pub fn trusting(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, HttpError> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| rustls::Error::General(format!("CA certificate: {e}")))?;
        roots.add(cert)?;
    }
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    ))
}

/// One keep-alive HTTP/1.1 connection over TLS to `127.0.0.1`.
pub struct TlsConnection(hyper::client::conn::http1::SendRequest<Full<bytes::Bytes>>);

impl TlsConnection {
    /// Connects to `port` on loopback, verifying the server as `127.0.0.1` with `tls`.
    pub async fn connect(port: u16, tls: Arc<rustls::ClientConfig>) -> Result<Self, HttpError> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        tcp.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Self(send))
    }

    /// POSTs `body` as JSON to `path`; the status and the body of the answer.
    pub async fn post(
        &mut self,
        path: &str,
        body: bytes::Bytes,
    ) -> Result<(u16, bytes::Bytes), HttpError> {
        let req = http::Request::post(path)
            .header("content-type", "application/json")
            .header("host", "127.0.0.1")
            .body(Full::new(body))?;
        let res = self.0.send_request(req).await?;
        let status = res.status().as_u16();
        Ok((status, res.into_body().collect().await?.to_bytes()))
    }
}

/// One answer of the admin server.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The body, as text.
    pub body: String,
}

/// HTTP GET of `path` on a local admin server (the operator's `/readyz`, `/metrics`); `None`
/// when nothing answers or the answer does not arrive whole.
pub async fn get(port: u16, path: &str) -> Option<Answer> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let uri: http::Uri = format!("http://127.0.0.1:{port}{path}").parse().ok()?;
    let response = client.get(uri).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Whether the admin server at `port` answers `/readyz` with 200.
pub async fn ready(port: u16) -> bool {
    get(port, "/readyz").await.is_some_and(|a| a.status == 200)
}

/// The admin server's `/metrics` at `port`, parsed; `None` when it does not answer 200.
pub async fn metrics(port: u16) -> Option<Metrics> {
    let answer = get(port, "/metrics").await?;
    (answer.status == 200).then(|| Metrics::parse(&answer.body))
}

/// A Prometheus (or OpenMetrics) text exposition, parsed.
#[derive(Debug, Clone)]
pub struct Metrics(prometheus_parse::Scrape);

impl Metrics {
    /// Parses exposition text; lines that are not samples, types or help are skipped.
    pub fn parse(text: &str) -> Self {
        let lines = text.lines().map(|l| Ok(l.to_string()));
        // Reading from memory cannot fail: every line is `Ok`.
        let scrape = prometheus_parse::Scrape::parse(lines).unwrap_or(prometheus_parse::Scrape {
            docs: Default::default(),
            samples: Vec::new(),
        });
        Self(scrape)
    }

    /// Every sample named `metric` (a histogram's `_sum` and `_count` are their own names), with
    /// its labels and value.
    pub fn samples<'a>(
        &'a self,
        metric: &'a str,
    ) -> impl Iterator<Item = (&'a prometheus_parse::Labels, f64)> + 'a {
        self.0
            .samples
            .iter()
            .filter(move |s| s.metric == metric)
            .filter_map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => Some((&s.labels, v)),
                _ => None,
            })
    }

    /// The value of the first sample named `metric` whose labels include every pair of `labels`.
    pub fn value(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples(metric)
            .find(|(have, _)| labels.iter().all(|(k, v)| have.get(k) == Some(*v)))
            .map(|(_, v)| v)
    }

    /// A histogram's (sum, count) for the series whose labels include every pair of `labels`.
    pub fn sum_and_count(&self, histogram: &str, labels: &[(&str, &str)]) -> Option<(f64, f64)> {
        Some((
            self.value(&format!("{histogram}_sum"), labels)?,
            self.value(&format!("{histogram}_count"), labels)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;

    #[test]
    fn reads_the_operator_and_api_server_shapes() {
        let text = "# HELP offload_operator_admission_duration_seconds Time.\n\
            # TYPE offload_operator_admission_duration_seconds histogram\n\
            offload_operator_admission_duration_seconds_sum{endpoint=\"mutate-pod\"} 0.5\n\
            offload_operator_admission_duration_seconds_count{endpoint=\"mutate-pod\"} 20\n\
            offload_operator_admission_duration_seconds_bucket{endpoint=\"mutate-pod\",le=\"+Inf\"} 20\n\
            offload_operator_admission_duration_seconds_sum{endpoint=\"validate\"} 9\n\
            offload_operator_admission_duration_seconds_count{endpoint=\"validate\"} 3\n\
            # TYPE apiserver_request_total counter\n\
            apiserver_request_total{code=\"200\",resource=\"pods\",subresource=\"\",verb=\"GET\"} 7\n\
            # EOF\n";
        let m = Metrics::parse(text);
        assert_eq!(
            m.sum_and_count(
                "offload_operator_admission_duration_seconds",
                &[("endpoint", "mutate-pod")]
            ),
            Some((0.5, 20.0))
        );
        assert_eq!(
            m.sum_and_count(
                "offload_operator_admission_duration_seconds",
                &[("endpoint", "validate")]
            ),
            Some((9.0, 3.0))
        );
        assert_eq!(
            m.value(
                "apiserver_request_total",
                &[("verb", "GET"), ("subresource", "")]
            ),
            Some(7.0)
        );
        assert_eq!(m.value("apiserver_request_total", &[("verb", "PUT")]), None);
        assert_eq!(
            Metrics::parse("not metrics at all\n").samples("x").count(),
            0
        );
    }
}
