//! A small certificate authority on rcgen: the webhook's operator-managed CA issues its serving
//! certificates with it (the local control plane of the tests uses it too).

use std::time::Duration;

pub use rcgen::ExtendedKeyUsagePurpose;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::OffsetDateTime;

/// A certificate could not be made or read.
#[derive(Debug, thiserror::Error)]
#[error("certificate {what}: {source}")]
pub struct CertError {
    what: &'static str,
    #[source]
    source: rcgen::Error,
}

fn ctx(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError { what, source }
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedCert {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
    /// Expiry.
    pub not_after: OffsetDateTime,
}

/// A certificate authority that can issue certificates.
pub struct CertAuthority {
    /// The CA certificate and key.
    pub cert: IssuedCert,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority")
            .field("not_after", &self.cert.not_after)
            .finish_non_exhaustive()
    }
}

fn validity(params: &mut CertificateParams, valid_for: Duration) -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    // Back-date a little so clocks that lag slightly still accept the certificate.
    params.not_before = now - time::Duration::minutes(5);
    let not_after = now + valid_for;
    params.not_after = not_after;
    not_after
}

fn name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for org in organizations {
        dn.push(DnType::OrganizationName, *org);
    }
    dn
}

impl CertAuthority {
    /// Creates a new self-signed CA.
    pub fn generate(common_name: &str, valid_for: Duration) -> Result<Self, CertError> {
        let key = KeyPair::generate().map_err(ctx("key generation"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ctx("parameters"))?;
        params.distinguished_name = name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let not_after = validity(&mut params, valid_for);
        let cert = params.self_signed(&key).map_err(ctx("self-signing"))?;
        let issued = IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after,
        };
        Ok(CertAuthority {
            cert: issued,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA from its PEM certificate and key (e.g. from a Secret).
    pub fn from_pem(
        cert_pem: &str,
        key_pem: &str,
        not_after: OffsetDateTime,
    ) -> Result<Self, CertError> {
        let key = KeyPair::from_pem(key_pem).map_err(ctx("CA key parsing"))?;
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(ctx("CA certificate parsing"))?;
        Ok(CertAuthority {
            cert: IssuedCert {
                cert_pem: cert_pem.to_string(),
                key_pem: key_pem.to_string(),
                not_after,
            },
            issuer,
        })
    }

    /// Issues a serving certificate for DNS names and IP addresses.
    pub fn issue_server(
        &self,
        names: &[String],
        valid_for: Duration,
    ) -> Result<IssuedCert, CertError> {
        let common = names.first().map(String::as_str).unwrap_or("server");
        self.issue(
            names,
            common,
            &[],
            ExtendedKeyUsagePurpose::ServerAuth,
            valid_for,
        )
    }

    /// Issues a certificate for `names` (DNS names or IP addresses) with this subject and
    /// extended key usage.
    pub fn issue(
        &self,
        names: &[String],
        common_name: &str,
        organizations: &[&str],
        usage: ExtendedKeyUsagePurpose,
        valid_for: Duration,
    ) -> Result<IssuedCert, CertError> {
        let key = KeyPair::generate().map_err(ctx("key generation"))?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(ctx("parameters"))?;
        params.distinguished_name = name(common_name, organizations);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let not_after = validity(&mut params, valid_for);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(ctx("signing"))?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after,
        })
    }
}
