//! Kubeconfigs of the local cluster, built with kube's own `Kubeconfig` type.

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

/// A kubeconfig for one user authenticated by a client certificate.
pub fn client_kubeconfig(
    server: &str,
    ca_pem: &str,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Kubeconfig {
    use base64::Engine as _;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let name = "devcluster".to_string();
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.clone(),
            cluster: Some(Cluster {
                server: Some(server.to_string()),
                certificate_authority_data: Some(b64(ca_pem)),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.to_string(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(b64(cert_pem)),
                client_key_data: Some(secrecy::SecretString::from(b64(key_pem))),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: name.clone(),
            context: Some(Context {
                cluster: name.clone(),
                user: Some(user.to_string()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(name),
        kind: Some("Config".to_string()),
        api_version: Some("v1".to_string()),
        ..Kubeconfig::default()
    }
}
