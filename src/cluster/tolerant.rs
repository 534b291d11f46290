//! One object that cannot be read never stops a list or a watch of its kind.
//!
//! kube's `DeserializeGuard` buffers each object into a value tree before it tries the type, and
//! that buffering is bounded by serde_json's recursion limit (128 levels, counted from the list
//! response): one TrainingJob whose free-form pod template nests deeper — which the API server
//! stores, as its own limit is far higher — made every list of TrainingJobs fail, so the
//! controller saw none of them. [`Tolerant`] captures each object as raw JSON first (serde_json
//! skips a value without recursing), then reads the type from that text on its own; an object
//! that does not read becomes an [`InvalidObject`] with its name, and the others are read as
//! usual.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
pub use kube::core::error_boundary::InvalidObject;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// An object of kind `K`, or what is known of one that could not be read as `K`.
#[derive(Debug, Clone)]
pub struct Tolerant<K>(pub Result<K, InvalidObject>);

impl<K> Tolerant<K> {
    /// The object, when it was read.
    pub fn ok(&self) -> Option<&K> {
        self.0.as_ref().ok()
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Tolerant<K> {
    fn deserialize<D>(deserializer: D) -> Result<Self, D::Error>
    where
        D: serde::Deserializer<'de>,
    {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        Ok(Tolerant(read(raw.get())))
    }
}

/// Reads `value` as `T`; an error names the field it happened at, as the API server's schema
/// errors do (`spec.model.layers: invalid type: string "32", expected i64`).
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| at_path(e.path(), e.inner()))
}

/// [`from_value`] for JSON text.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| at_path(e.path(), e.inner()))
}

fn at_path(path: &serde_path_to_error::Path, e: &serde_json::Error) -> String {
    let path = path.to_string();
    if path.is_empty() || path == "." {
        e.to_string()
    } else {
        format!("{path}: {e}")
    }
}

/// Reads `text` as `K`, or as an [`InvalidObject`] naming what it can.
#[expect(
    clippy::result_large_err,
    reason = "the shape of `Tolerant`, which mirrors kube's guard"
)]
fn read<K: DeserializeOwned>(text: &str) -> Result<K, InvalidObject> {
    let first = match serde_json::from_str::<K>(text) {
        Ok(k) => return Ok(k),
        Err(e) => e,
    };
    // The API server's managed fields mirror every field set, free-form ones included, so an
    // object whose unknown fields nest deep (which `K` skips without recursing) carries
    // managed fields just as deep; nothing here reads them.
    if let Some(k) = without_managed_fields(text).and_then(|t| serde_json::from_str::<K>(&t).ok()) {
        return Ok(k);
    }
    let error = if first.to_string().contains("recursion limit exceeded") {
        format!(
            "the object is nested more than 128 levels deep, deeper than the operator reads ({first})"
        )
    } else {
        // Read again to name the field (only on this error path).
        from_str::<K>(text)
            .err()
            .unwrap_or_else(|| first.to_string())
    };
    // Only the metadata that names and tracks the object (managed fields are skipped with
    // everything else).
    let metadata = serde_json::from_str::<Named>(text)
        .map(|n| n.metadata.into())
        .unwrap_or_default();
    Err(InvalidObject { error, metadata })
}

/// `text` with `metadata.managedFields` removed; `None` when it has none or is not an object.
fn without_managed_fields(text: &str) -> Option<String> {
    let mut top: BTreeMap<String, Box<RawValue>> = serde_json::from_str(text).ok()?;
    let mut meta: BTreeMap<String, Box<RawValue>> =
        serde_json::from_str(top.get("metadata")?.get()).ok()?;
    meta.remove("managedFields")?;
    top.insert(
        "metadata".to_string(),
        serde_json::value::to_raw_value(&meta).ok()?,
    );
    serde_json::to_string(&top).ok()
}

#[derive(Deserialize)]
struct Named {
    #[serde(default)]
    metadata: NamedMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct NamedMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
}

impl From<NamedMeta> for ObjectMeta {
    fn from(m: NamedMeta) -> ObjectMeta {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            generation: m.generation,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            labels: m.labels,
            annotations: m.annotations,
            owner_references: m.owner_references,
            finalizers: m.finalizers,
            ..ObjectMeta::default()
        }
    }
}

impl<K: Resource> Resource for Tolerant<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.as_ref().map_or_else(|err| &err.metadata, K::meta)
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0
            .as_mut()
            .map_or_else(|err| &mut err.metadata, K::meta_mut)
    }
}

#[cfg(test)]
mod tests;
