//! The one read of a ConfigMap a job references ([`crate::decision::referenced`] says what it
//! means): the controller's snapshot, the webhook (within its deadline) and `explain` against a
//! cluster all fetch it here.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use crate::decision::referenced::{Fetched, Reference};

/// The ConfigMap `r` names in `namespace`: found, or absent; an API error is the caller's.
pub async fn fetch(
    client: &Client,
    namespace: &str,
    r: &Reference,
) -> Result<Fetched, kube::Error> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(&r.name)
        .await?;
    Ok(cm.map_or(Fetched::Absent, |cm| Fetched::Found(Box::new(cm))))
}
