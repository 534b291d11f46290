//! The local control plane's certificates: its CA (the operator's own CA type), the API
//! server's serving certificate, the admin client certificate and the service-account keys.

use std::time::Duration;

use offload_operator::ops::certs::{CertAuthority, CertError, ExtendedKeyUsagePurpose, IssuedCert};
use rcgen::KeyPair;

/// A key could not be made or read.
#[derive(Debug, thiserror::Error)]
#[error("service-account key: {0}")]
pub struct KeyError(#[from] rcgen::Error);

/// A client certificate: Kubernetes reads the user from CN and the groups from O.
pub fn issue_client(
    ca: &CertAuthority,
    user: &str,
    groups: &[&str],
    valid_for: Duration,
) -> Result<IssuedCert, CertError> {
    ca.issue(
        &[],
        user,
        groups,
        ExtendedKeyUsagePurpose::ClientAuth,
        valid_for,
    )
}

/// A private key in PEM (PKCS#8, ECDSA P-256), for service-account token signing.
pub fn generate_key_pem() -> Result<String, KeyError> {
    Ok(KeyPair::generate()?.serialize_pem())
}

/// The public key in PEM of a private key in PEM.
pub fn public_key_pem(private_key_pem: &str) -> Result<String, KeyError> {
    Ok(KeyPair::from_pem(private_key_pem)?.public_key_pem())
}
