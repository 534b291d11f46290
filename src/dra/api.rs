//! The parts of Dynamic Resource Allocation's `resource.k8s.io/v1` objects the operator reads,
//! typed here rather than taken from `k8s-openapi` (whose build carries the API of the oldest
//! supported cluster, 1.33, which serves DRA only as beta). Every field is optional or
//! defaulted and unknown fields are kept or ignored, so a newer API server's objects still
//! read; a slice or template that does not deserialize at all is carried as an error and
//! skipped by the caches.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A ResourceSlice: devices a DRA driver publishes for a node (or a set of nodes).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "resource.k8s.io",
    version = "v1",
    kind = "ResourceSlice",
    plural = "resourceslices",
    derive = "PartialEq",
    derive = "Default",
    doc = "Devices a DRA driver publishes (resource.k8s.io/v1), the fields the operator reads."
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    /// The driver that publishes the devices (`gpu.nvidia.com`).
    #[serde(default)]
    pub driver: String,
    /// The node whose devices these are; absent for slices of several nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The pool the slice belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<ResourcePool>,
    /// The devices.
    #[serde(default)]
    pub devices: Vec<Device>,
}

/// A ResourceSlice's pool: a driver's slices of one pool at one generation describe it whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    /// Name of the pool (usually the node's).
    #[serde(default)]
    pub name: String,
    /// Generation: slices of an older generation are being replaced.
    #[serde(default)]
    pub generation: i64,
    /// How many slices make up the pool at this generation.
    #[serde(default)]
    pub resource_slice_count: i64,
}

/// One device of a slice.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Name, unique in its pool (`gpu-0`).
    #[serde(default)]
    pub name: String,
    /// Attributes by name: unqualified names are the driver's own (`addressingMode`), others
    /// are `domain/name`.
    #[serde(default)]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Capacities by name (`memory`).
    #[serde(default)]
    pub capacity: BTreeMap<String, DeviceCapacity>,
}

/// One attribute value: exactly one of the fields is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceAttribute {
    /// A string value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// An integer value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    /// A boolean value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// A semantic version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// One capacity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeviceCapacity {
    /// The amount.
    pub value: Quantity,
}

/// A ResourceClaimTemplate: what each pod's claim made from it asks for. The claim's spec is
/// kept as JSON: the operator reads its device requests and writes a copy of it whole, with
/// a selector added, so nothing the user wrote is lost.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "resource.k8s.io",
    version = "v1",
    kind = "ResourceClaimTemplate",
    plural = "resourceclaimtemplates",
    derive = "PartialEq",
    derive = "Default",
    namespaced,
    doc = "A template of DRA claims (resource.k8s.io/v1), the fields the operator reads."
)]
pub struct ResourceClaimTemplateSpec {
    /// Metadata of the claims made from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The claims' spec (`devices.requests`, `constraints`, `config`).
    #[serde(default)]
    pub spec: Value,
}
