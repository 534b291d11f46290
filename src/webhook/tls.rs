//! Serving certificates of the webhook.
//!
//! By default the operator manages its own CA and serving certificate: both live in one Secret
//! (so every replica serves the same certificate), the CA bundle is patched into the webhook
//! configurations, and the serving certificate is re-issued before it expires and hot-swapped
//! into the running server (connections in flight keep the old one). With cert-manager, the
//! certificate comes from mounted files, re-read when they change.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use time::OffsetDateTime;

use crate::ops::certs::{CertAuthority, IssuedCert};

/// CA lifetime (Kyverno's default).
pub const CA_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Serving certificate lifetime (Kyverno's default).
pub const SERVING_VALIDITY: Duration = Duration::from_secs(150 * 24 * 3600);
/// Re-issue the serving certificate when it has less than this left.
pub const SERVING_RENEW_BEFORE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Re-create the CA when it has less than this left (it must outlive every serving certificate).
pub const CA_RENEW_BEFORE: Duration = Duration::from_secs(160 * 24 * 3600);

const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CRT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const BUNDLE: &str = "ca-bundle.crt";
const CA_NOT_AFTER: &str = "offload.dev/ca-not-after";
const TLS_NOT_AFTER: &str = "offload.dev/tls-not-after";

/// What the server presents and what the API server must trust.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServingCerts {
    /// Serving certificate (PEM).
    pub cert_pem: String,
    /// Its key (PEM).
    pub key_pem: String,
    /// CA bundle for the webhook configurations: the current CA, plus the previous one during a
    /// CA rollover.
    pub bundle_pem: String,
}

/// Where the operator keeps and publishes its certificates.
#[derive(Clone, Debug)]
pub struct ManagedCerts {
    /// Namespace of the Secret.
    pub namespace: String,
    /// Name of the Secret.
    pub secret: String,
    /// DNS names (and IP addresses) of the serving certificate.
    pub names: Vec<String>,
    /// MutatingWebhookConfiguration to patch the CA bundle into.
    pub mutating: Option<String>,
    /// ValidatingWebhookConfiguration to patch the CA bundle into.
    pub validating: Option<String>,
}

/// Certificate management failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// A certificate could not be made.
    #[error(transparent)]
    Cert(#[from] crate::ops::certs::CertError),
    /// The Secret lacks a certificate field after being written.
    #[error("secret {0} does not hold a complete certificate set")]
    Incomplete(String),
    /// Certificate files could not be read.
    #[error("reading {path}: {source}")]
    File {
        /// Path.
        path: String,
        /// Error.
        #[source]
        source: std::io::Error,
    },
    /// The certificate or key is not usable PEM.
    #[error("loading the serving certificate and key: {0}")]
    Pem(#[source] std::io::Error),
    /// The listen address could not be bound.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// Address.
        addr: std::net::SocketAddr,
        /// Error.
        #[source]
        source: std::io::Error,
    },
}

fn kerr(action: impl Into<String>) -> impl FnOnce(kube::Error) -> TlsError {
    let action = action.into();
    move |source| TlsError::Kube { action, source }
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Option<String> {
    data.get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|s| !s.is_empty())
}

fn parse_time(s: Option<&String>) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s?, &time::format_description::well_known::Rfc3339).ok()
}

fn fmt_time(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn expires_within(t: Option<OffsetDateTime>, window: Duration) -> bool {
    t.is_none_or(|t| t - OffsetDateTime::now_utc() < window)
}

impl ManagedCerts {
    /// The chart's Secret and webhook configurations in `namespace`, with a serving
    /// certificate for `names`.
    pub fn chart(namespace: &str, names: Vec<String>) -> Self {
        ManagedCerts {
            namespace: namespace.to_string(),
            secret: offload_api::names::WEBHOOK_SECRET.to_string(),
            names,
            mutating: Some(offload_api::names::WEBHOOK_CONFIGURATION.to_string()),
            validating: Some(offload_api::names::WEBHOOK_CONFIGURATION.to_string()),
        }
    }

    /// Returns valid serving certificates, creating or renewing them in the Secret when needed.
    /// Safe for several replicas at once: the Secret is written with optimistic concurrency and
    /// a replica that loses the race reads the winner's certificates.
    pub async fn ensure(&self, client: &Client) -> Result<ServingCerts, TlsError> {
        self.ensure_with(client, false).await
    }

    /// Like [`ensure`](Self::ensure), but re-issues the serving certificate even if it is still
    /// valid (rotation on demand).
    pub async fn rotate(&self, client: &Client) -> Result<ServingCerts, TlsError> {
        self.ensure_with(client, true).await
    }

    async fn ensure_with(
        &self,
        client: &Client,
        force_serving: bool,
    ) -> Result<ServingCerts, TlsError> {
        let api: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        for _ in 0..5 {
            let existing = api
                .get_opt(&self.secret)
                .await
                .map_err(kerr("reading the webhook certificate Secret"))?;
            let (secret, changed) = self.renewed(existing.as_ref(), force_serving)?;
            if !changed {
                return serving_from(&secret).ok_or_else(|| self.incomplete());
            }
            let result = match &existing {
                None => api.create(&PostParams::default(), &secret).await,
                Some(_) => {
                    api.replace(&self.secret, &PostParams::default(), &secret)
                        .await
                }
            };
            match result {
                Ok(stored) => {
                    if let Some(certs) = serving_from(&stored) {
                        return Ok(certs);
                    }
                }
                // Another replica wrote first: read its certificates on the next round.
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(kerr("writing the webhook certificate Secret")(e)),
            }
        }
        let stored = api
            .get(&self.secret)
            .await
            .map_err(kerr("reading the webhook certificate Secret"))?;
        serving_from(&stored).ok_or_else(|| self.incomplete())
    }

    fn incomplete(&self) -> TlsError {
        TlsError::Incomplete(format!("{}/{}", self.namespace, self.secret))
    }

    /// The Secret as it should be, and whether that differs from `existing`.
    fn renewed(
        &self,
        existing: Option<&Secret>,
        force_serving: bool,
    ) -> Result<(Secret, bool), TlsError> {
        let data = existing.and_then(|s| s.data.clone()).unwrap_or_default();
        let annotations = existing
            .and_then(|s| s.metadata.annotations.clone())
            .unwrap_or_default();
        let ca_not_after = parse_time(annotations.get(CA_NOT_AFTER));
        let tls_not_after = parse_time(annotations.get(TLS_NOT_AFTER));
        let old_ca = text(&data, CA_CRT);

        let ca = match (old_ca.as_ref(), text(&data, CA_KEY), ca_not_after) {
            (Some(crt), Some(key), Some(na)) if !expires_within(Some(na), CA_RENEW_BEFORE) => {
                Some(CertAuthority::from_pem(crt, &key, na)?)
            }
            _ => None,
        };
        let ca_renewed = ca.is_none();
        let ca = match ca {
            Some(ca) => ca,
            None => CertAuthority::generate("offload-operator-webhook-ca", CA_VALIDITY)?,
        };
        let serving_ok = !force_serving
            && !ca_renewed
            && text(&data, TLS_CRT).is_some()
            && text(&data, TLS_KEY).is_some()
            && !expires_within(tls_not_after, SERVING_RENEW_BEFORE);
        if serving_ok && let Some(s) = existing {
            return Ok((s.clone(), false));
        }
        let serving: IssuedCert = ca.issue_server(&self.names, SERVING_VALIDITY)?;
        // During a CA rollover the API server must trust both CAs until every replica serves a
        // certificate from the new one.
        let bundle = match (ca_renewed, old_ca) {
            (true, Some(old)) => format!("{}{}", ca.cert.cert_pem, old),
            _ => ca.cert.cert_pem.clone(),
        };
        let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.secret.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: existing.and_then(|s| s.metadata.resource_version.clone()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_string(),
                    "offload-operator".to_string(),
                )])),
                annotations: Some(BTreeMap::from([
                    (CA_NOT_AFTER.to_string(), fmt_time(ca.cert.not_after)),
                    (TLS_NOT_AFTER.to_string(), fmt_time(serving.not_after)),
                ])),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(BTreeMap::from([
                (CA_CRT.to_string(), bytes(&ca.cert.cert_pem)),
                (CA_KEY.to_string(), bytes(&ca.cert.key_pem)),
                (TLS_CRT.to_string(), bytes(&serving.cert_pem)),
                (TLS_KEY.to_string(), bytes(&serving.key_pem)),
                (BUNDLE.to_string(), bytes(&bundle)),
            ])),
            ..Secret::default()
        };
        Ok((secret, true))
    }

    /// Patches the CA bundle into every webhook of the configured configurations that does not
    /// already carry it. A configuration that does not exist (yet) is skipped: the bundle
    /// watch ([`ManagedCerts::keep_bundle_published`]) injects it when it appears.
    pub async fn publish_bundle(&self, client: &Client, bundle_pem: &str) -> Result<(), TlsError> {
        if let Some(name) = &self.mutating {
            publish_to::<MutatingWebhookConfiguration>(client, name, bundle_pem).await?;
        }
        if let Some(name) = &self.validating {
            publish_to::<ValidatingWebhookConfiguration>(client, name, bundle_pem).await?;
        }
        Ok(())
    }

    /// Watches the two webhook configurations and publishes `bundle` again whenever one
    /// appears or loses it (a `helm upgrade` resets `caBundle` to the chart's empty value).
    /// Runs until dropped; failures are logged and retried on the next change.
    pub async fn keep_bundle_published(&self, client: &Client, bundle: impl Fn() -> String) {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let by_name = |name: &Option<String>| {
            name.as_ref()
                .map(|n| watcher::Config::default().fields(&format!("metadata.name={n}")))
        };
        fn changes<K: WebhookConfiguration>(
            client: &Client,
            cfg: watcher::Config,
        ) -> futures::stream::BoxStream<'static, Result<(), watcher::Error>> {
            watcher(Api::<K>::all(client.clone()), cfg)
                .default_backoff()
                .touched_objects()
                .map(|r| r.map(|_| ()))
                .boxed()
        }
        let mutating =
            by_name(&self.mutating).map(|cfg| changes::<MutatingWebhookConfiguration>(client, cfg));
        let validating = by_name(&self.validating)
            .map(|cfg| changes::<ValidatingWebhookConfiguration>(client, cfg));
        let mut changes = futures::stream::select_all(mutating.into_iter().chain(validating));
        while let Some(change) = changes.next().await {
            match change {
                Ok(()) => {
                    if let Err(e) = self.publish_bundle(client, &bundle()).await {
                        tracing::warn!(error = %e, "publishing the webhook CA bundle failed");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "watching the webhook configurations"),
            }
        }
    }
}

/// The two kinds of webhook configuration, as far as the CA bundle goes.
trait WebhookConfiguration:
    kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// Each webhook's current `caBundle`, in order.
    fn bundles(&self) -> Vec<Option<&ByteString>>;
}

/// The two configuration types differ only in their webhooks' type; both carry `clientConfig`.
macro_rules! webhook_configuration {
    ($($kind:ty),*) => {$(
        impl WebhookConfiguration for $kind {
            fn bundles(&self) -> Vec<Option<&ByteString>> {
                self.webhooks
                    .iter()
                    .flatten()
                    .map(|w| w.client_config.ca_bundle.as_ref())
                    .collect()
            }
        }
    )*};
}
webhook_configuration!(MutatingWebhookConfiguration, ValidatingWebhookConfiguration);

/// Patches `bundle_pem` into every webhook of configuration `name` that lacks it; nothing
/// when the configuration does not exist (yet).
async fn publish_to<K: WebhookConfiguration>(
    client: &Client,
    name: &str,
    bundle_pem: &str,
) -> Result<(), TlsError> {
    let api: Api<K> = Api::all(client.clone());
    let kind = K::kind(&());
    let Some(cfg) = api
        .get_opt(name)
        .await
        .map_err(kerr(format!("reading the {kind}")))?
    else {
        return Ok(());
    };
    if let Some(ops) = bundle_ops(&cfg.bundles(), bundle_pem) {
        api.patch(name, &PatchParams::default(), &Patch::<()>::Json(ops))
            .await
            .map_err(kerr(format!("patching the {kind}'s caBundle")))?;
    }
    Ok(())
}

/// JSON-patch operations that set `bundle` on every webhook whose `caBundle` differs; `None`
/// when all already carry it (or there are no webhooks).
fn bundle_ops(current: &[Option<&ByteString>], bundle_pem: &str) -> Option<json_patch::Patch> {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, PatchOperation};
    let ops: Vec<PatchOperation> = current
        .iter()
        .enumerate()
        .filter(|(_, have)| have.is_none_or(|b| b.0 != bundle_pem.as_bytes()))
        .map(|(i, _)| {
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens([
                    "webhooks".to_string(),
                    i.to_string(),
                    "clientConfig".to_string(),
                    "caBundle".to_string(),
                ]),
                // caBundle is a []byte: base64 in JSON.
                value: serde_json::Value::String(base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    bundle_pem,
                )),
            })
        })
        .collect();
    (!ops.is_empty()).then_some(json_patch::Patch(ops))
}

fn serving_from(secret: &Secret) -> Option<ServingCerts> {
    let data = secret.data.as_ref()?;
    Some(ServingCerts {
        cert_pem: text(data, TLS_CRT)?,
        key_pem: text(data, TLS_KEY)?,
        bundle_pem: text(data, BUNDLE).or_else(|| text(data, CA_CRT))?,
    })
}

/// Certificates issued by cert-manager (or anything else) into mounted files.
#[derive(Clone, Debug)]
pub struct FileCerts {
    /// Certificate path (`tls.crt`).
    pub cert: std::path::PathBuf,
    /// Key path (`tls.key`).
    pub key: std::path::PathBuf,
}

impl FileCerts {
    /// Reads the files.
    pub fn read(&self) -> Result<ServingCerts, TlsError> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).map_err(|source| TlsError::File {
                path: p.display().to_string(),
                source,
            })
        };
        Ok(ServingCerts {
            cert_pem: read(&self.cert)?,
            key_pem: read(&self.key)?,
            bundle_pem: String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_ops_touch_only_webhooks_without_the_bundle() {
        let have = ByteString(b"PEM".to_vec());
        let other = ByteString(b"OLD".to_vec());
        assert_eq!(bundle_ops(&[], "PEM"), None);
        assert_eq!(bundle_ops(&[Some(&have), Some(&have)], "PEM"), None);
        let ops = bundle_ops(&[Some(&have), None, Some(&other)], "PEM").unwrap();
        let paths: Vec<String> = ops
            .0
            .iter()
            .map(|op| match op {
                json_patch::PatchOperation::Add(add) => add.path.to_string(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            paths,
            [
                "/webhooks/1/clientConfig/caBundle",
                "/webhooks/2/clientConfig/caBundle"
            ]
        );
        let json = serde_json::to_value(&ops).unwrap();
        assert_eq!(json[0]["value"], "UEVN", "base64 of the PEM");
    }
}
