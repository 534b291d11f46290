//! The benchmarks' one error type: every failure keeps its source.

use offload_testenv::devcluster::DevClusterError;

/// Why a benchmark could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The local control plane failed.
    #[error(transparent)]
    Cluster(#[from] DevClusterError),
    /// An API call failed.
    #[error("API: {0}")]
    Kube(#[from] kube::Error),
    /// File or process I/O failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// JSON could not be read or written.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// TLS set-up failed.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// An HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// An HTTP exchange of the test environment's client failed.
    #[error(transparent)]
    Client(#[from] offload_testenv::http::HttpError),
    /// An HTTP request could not be built.
    #[error("HTTP request: {0}")]
    Request(#[from] http::Error),
    /// A certificate could not be made.
    #[error(transparent)]
    Cert(#[from] offload_operator::ops::certs::CertError),
    /// A JSON patch did not apply.
    #[error("JSON patch: {0}")]
    Patch(#[from] json_patch::PatchError),
    /// A command failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// The command.
        what: String,
        /// Its error output.
        detail: String,
    },
    /// The system under test did something the benchmark does not expect.
    #[error("{0}")]
    Unexpected(String),
}

impl BenchError {
    /// An unexpected outcome, with what was seen.
    pub fn unexpected(what: impl Into<String>) -> Self {
        BenchError::Unexpected(what.into())
    }
}

/// The benchmarks' result type.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
