//! What a pod template asks for, read as Kubernetes quantities and as its namespace's
//! LimitRanges will leave it: its GPUs (device plugin and DRA claims), its memory limit, and the
//! training container with its memory request and CPU limit and request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use offload_api::names;
use offload_api::quantity::{self, MAX_GPUS};

use super::limits::NamespaceLimits;
use crate::decision::error::ResolveError;

/// GPUs and memory a pod template asks for, read as Kubernetes quantities.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodResources {
    /// `nvidia.com/gpu` over the containers (limits, else requests): 0 when none asks.
    pub gpus: u64,
    /// The sum of the containers' memory limits, when every container has one; or the training
    /// container's own limit, where that is lower.
    pub memory_limit: Option<u64>,
    /// The training container: the first that asks for GPUs (or for DRA claims), else the
    /// first. Its memory request is what the host memory the decision counts on is written to.
    pub training_container: Option<usize>,
    /// The training container's memory request as the user wrote it.
    pub training_memory_request: Option<u64>,
    /// Where `memory_limit` comes from a LimitRange of the namespace rather than the pod's own
    /// limits, that range and what it sets, in words.
    pub memory_limit_source: Option<String>,
    /// The training container's CPU limit (cores; its own, or its namespace's default), and
    /// the LimitRange it comes from where it is not its own.
    pub training_cpu_limit: Option<(f64, Option<String>)>,
    /// The training container's CPU request (cores).
    pub training_cpu_request: Option<f64>,
    /// The training container's memory limit (its own, or its namespace's default or max).
    pub training_memory_limit: Option<u64>,
    /// The pod's other containers (init containers too, but the start-up guard, which the
    /// operator writes) that do not set CPU and memory limits equal to their requests: each
    /// keeps the pod from being Guaranteed.
    pub not_guaranteed: Vec<String>,
    /// The CPU request (cores) the namespace's LimitRanges give a container that sets none.
    pub cpu_default_request: Option<f64>,
    /// The least memory request the namespace's LimitRanges take for the training container
    /// (their `min`, its limit over their `maxLimitRequestRatio`), and why.
    pub training_memory_floor: Option<(u64, String)>,
}

/// Whether a container sets CPU and memory limits, with requests equal to them (or none, which
/// Kubernetes then takes from the limits): what a Guaranteed pod needs of every container.
fn guaranteed_ready(c: &k8s_openapi::api::core::v1::Container) -> bool {
    let r = c.resources.as_ref();
    let read = |m: Option<&BTreeMap<String, Quantity>>, name: &str| {
        m.and_then(|m| m.get(name)).map(|q| match name {
            "cpu" => quantity::cpu_cores(q).ok(),
            #[allow(clippy::cast_precision_loss)]
            _ => quantity::bytes(q).ok().map(|b| b as f64),
        })
    };
    ["cpu", "memory"].into_iter().all(|name| {
        match (
            read(r.and_then(|r| r.limits.as_ref()), name),
            read(r.and_then(|r| r.requests.as_ref()), name),
        ) {
            (Some(Some(_)), None) => true,
            (Some(Some(limit)), Some(Some(request))) => (limit - request).abs() < 1e-9,
            _ => false,
        }
    })
}

/// The pod's containers other than the training one (and its init containers other than the
/// operator's guard) that keep it from being Guaranteed, by name.
fn not_guaranteed(spec: &PodSpec, training: Option<usize>) -> Vec<String> {
    let others = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != training)
        .map(|(_, c)| c);
    let inits = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.name != offload_api::names::GUARD_CONTAINER);
    others
        .chain(inits)
        .filter(|c| !guaranteed_ready(c))
        .map(|c| c.name.clone())
        .collect()
}

/// A container's memory limit once its namespace's LimitRanges applied (`own`: its own), and
/// where a range set or lowered it, which and how.
fn namespace_bound(own: Option<u64>, limits: &NamespaceLimits) -> (Option<u64>, Option<String>) {
    match own {
        Some(b) => match &limits.container_max {
            Some(max) if max.bytes < b => (
                Some(max.bytes),
                Some(format!(
                    "the container memory max of LimitRange {:?} in its namespace",
                    max.range
                )),
            ),
            _ => (Some(b), None),
        },
        None => match limits
            .default_limit
            .as_ref()
            .or(limits.container_max.as_ref())
        {
            Some(d) => (
                Some(d.bytes),
                Some(format!(
                    "the default memory limit of LimitRange {:?} in its namespace, which a container that sets none gets",
                    d.range
                )),
            ),
            None => (None, None),
        },
    }
}

/// The GPUs one container asks for (its limit, else its request).
fn container_gpus(
    c: &k8s_openapi::api::core::v1::Container,
    limits: Option<&BTreeMap<String, Quantity>>,
    requests: Option<&BTreeMap<String, Quantity>>,
) -> Result<u64, ResolveError> {
    let Some(q) = limits
        .and_then(|l| l.get(names::GPU_RESOURCE))
        .or_else(|| requests.and_then(|r| r.get(names::GPU_RESOURCE)))
    else {
        return Ok(0);
    };
    quantity::device_count(q).map_err(|e| ResolveError::InvalidResources {
        detail: format!(
            "container {:?} resources {}: {e}",
            c.name,
            names::GPU_RESOURCE
        ),
    })
}

impl PodResources {
    /// Reads a pod spec. A quantity that is not one, a fraction of a GPU, or a count no machine
    /// has is an error naming the container; sums are checked.
    pub fn of(spec: Option<&PodSpec>) -> Result<PodResources, ResolveError> {
        PodResources::within(spec, &NamespaceLimits::default())
    }

    /// [`PodResources::of`] as the pod will be created in a namespace with `limits`: a
    /// container without a memory limit gets the default (else the max), and no limit is
    /// above the max.
    pub fn within(
        spec: Option<&PodSpec>,
        limits: &NamespaceLimits,
    ) -> Result<PodResources, ResolveError> {
        let Some(spec) = spec else {
            return Ok(PodResources::default());
        };
        let mut from_range: Option<String> = None;
        let mut gpus: u64 = 0;
        let mut memory: Option<u64> = Some(0);
        let training = training_container(spec);
        let mut training_request = None;
        let mut training_limit = None;
        let (mut cpu_limit, mut cpu_request) = (None, None);
        let ns_limits = limits;
        for (i, c) in spec.containers.iter().enumerate() {
            let resources = c.resources.as_ref();
            let limits = resources.and_then(|r| r.limits.as_ref());
            let requests = resources.and_then(|r| r.requests.as_ref());
            let bad = |what: &str, e: quantity::QuantityError| ResolveError::InvalidResources {
                detail: format!("container {:?} {what}: {e}", c.name),
            };
            gpus = gpus
                .checked_add(container_gpus(c, limits, requests)?)
                .filter(|t| *t <= MAX_GPUS)
                .ok_or_else(|| ResolveError::InvalidResources {
                    detail: format!(
                        "the pod's containers ask for more than {MAX_GPUS} {} in all, more than any node has",
                        names::GPU_RESOURCE
                    ),
                })?;
            let own = limits
                .and_then(|l| l.get("memory"))
                .map(|q| quantity::bytes(q).map_err(|e| bad("limits.memory", e)))
                .transpose()?;
            let (limit, source) = namespace_bound(own, ns_limits);
            if Some(i) == training && source.is_some() {
                from_range = source;
            }
            memory = match (memory, limit) {
                (Some(total), Some(b)) => Some(total.saturating_add(b)),
                _ => None,
            };
            if Some(i) == training {
                (cpu_limit, cpu_request, training_request) =
                    training_reads(c, limits, requests, ns_limits)?;
                training_limit = limit;
            }
        }
        let mut pod_limit = memory.filter(|_| !spec.containers.is_empty());
        if let Some(max) = &ns_limits.pod_max
            && pod_limit.is_none_or(|p| p > max.bytes)
        {
            pod_limit = Some(max.bytes);
            from_range = Some(format!(
                "the pod memory max of LimitRange {:?} in its namespace",
                max.range
            ));
        }
        Ok(PodResources {
            gpus,
            memory_limit: match (pod_limit, training_limit) {
                (Some(p), Some(t)) => Some(p.min(t)),
                (p, t) => p.or(t),
            },
            training_container: training,
            training_memory_request: training_request,
            memory_limit_source: from_range,
            training_cpu_limit: cpu_limit,
            training_cpu_request: cpu_request,
            training_memory_limit: training_limit,
            not_guaranteed: not_guaranteed(spec, training),
            cpu_default_request: ns_limits.cpu_default_request.as_ref().map(|d| d.0),
            training_memory_floor: training.and_then(|_| ns_limits.request_floor(training_limit)),
        })
    }

    /// [`PodResources::of`] with the GPUs the pod's DRA claims request (templates looked up
    /// in `namespace` through `view`), and those claims (entry → template).
    pub fn with_claims(
        spec: Option<&PodSpec>,
        namespace: &str,
        view: &dyn crate::decision::ClusterView,
    ) -> Result<(PodResources, Option<crate::dra::claims::ClaimPinning>), ResolveError> {
        let mut resources = PodResources::within(spec, &view.namespace_limits(namespace))?;
        let (Some(spec), Some(dra)) = (spec, view.dra()) else {
            return Ok((resources, None));
        };
        if spec.resource_claims.as_ref().is_none_or(Vec::is_empty) {
            return Ok((resources, None));
        }
        let claimed = crate::dra::claims::claimed_gpus(
            spec,
            &|name| view.claim_template(namespace, name),
            &dra,
        )
        .map_err(ResolveError::Claims)?;
        resources.gpus = resources
            .gpus
            .checked_add(claimed.gpus)
            .filter(|n| *n <= MAX_GPUS)
            .ok_or_else(|| ResolveError::InvalidResources {
                detail: format!(
                    "more than {MAX_GPUS} GPUs a pod, device plugin and claims together"
                ),
            })?;
        let pinning = if claimed.claims.is_empty() {
            None
        } else {
            Some(crate::dra::claims::ClaimPinning {
                dra,
                claims: claimed.claims,
            })
        };
        Ok((resources, pinning))
    }

    /// The training container of a pod spec: the first that asks for a GPU (by the device
    /// plugin or a claim), else the first.
    pub fn training_container_of(spec: &PodSpec) -> Option<usize> {
        training_container(spec)
    }

    /// GPUs per pod for the decision: at least 1.
    pub fn gpus_per_pod(&self) -> u32 {
        u32::try_from(self.gpus.max(1)).unwrap_or(u32::MAX)
    }
}

/// The training container: the first that asks for a GPU (by the device plugin or a claim),
/// else the first.
fn training_container(spec: &PodSpec) -> Option<usize> {
    spec.containers
        .iter()
        .position(|c| {
            let r = c.resources.as_ref();
            r.and_then(|r| r.limits.as_ref())
                .is_some_and(|l| l.contains_key(names::GPU_RESOURCE))
                || r.and_then(|r| r.requests.as_ref())
                    .is_some_and(|l| l.contains_key(names::GPU_RESOURCE))
                || r.and_then(|r| r.claims.as_ref())
                    .is_some_and(|c| !c.is_empty())
        })
        .or((!spec.containers.is_empty()).then_some(0))
}

/// The training container's CPU limit (its own, else the namespace's default, with the range
/// that set it), its CPU request and its memory request.
#[allow(clippy::type_complexity)]
fn training_reads(
    c: &k8s_openapi::api::core::v1::Container,
    limits: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    requests: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    ns_limits: &NamespaceLimits,
) -> Result<(Option<(f64, Option<String>)>, Option<f64>, Option<u64>), ResolveError> {
    let bad = |what: &str, e: quantity::QuantityError| ResolveError::InvalidResources {
        detail: format!("container {:?} {what}: {e}", c.name),
    };
    let cpu =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
         what: &str| {
            m.and_then(|m| m.get("cpu"))
                .map(|q| quantity::cpu_cores(q).map_err(|e| bad(what, e)))
                .transpose()
        };
    let cpu_limit = match cpu(limits, "limits.cpu")? {
        // A limit of 0 sets no CFS quota (the kubelet writes none), and the LimitRanger gives
        // no default where a limit is written: the container has the node's cores.
        Some(c) if c <= 0.0 => None,
        Some(c) => Some((c, None)),
        None => ns_limits
            .cpu_default_limit
            .as_ref()
            .map(|(c, range)| (*c, Some(range.clone()))),
    };
    let cpu_request = cpu(requests, "requests.cpu")?;
    let memory_request = requests
        .and_then(|r| r.get("memory"))
        .map(|q| quantity::bytes(q).map_err(|e| bad("requests.memory", e)))
        .transpose()?;
    Ok((cpu_limit, cpu_request, memory_request))
}
