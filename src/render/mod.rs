//! Turns a [`Resolution`] into what reaches the training process: env vars, the framework's
//! config, and node affinity — and writes them into a pod template; and builds the objects a
//! TrainingJob's workload is made of ([`workload`]), which the controller creates and
//! `offload-operator explain` shows.
//!
//! Every function here is pure and idempotent: applying a rendering twice gives the same pod
//! template as applying it once, so the webhook is safe to re-invoke and the controller safe
//! to retry.

pub mod deepspeed;
pub mod megatron;
pub mod workload;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector, PodSpec,
    PodTemplateSpec, ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::decision::{FrameworkPlan, Resolution};
use offload_api::labels::class_requirements;
use offload_api::names;
use offload_api::v1alpha1::OffloadMode;

/// Name of the volume that carries the rendered framework config.
pub const CONFIG_VOLUME: &str = "offload-config";

/// Formats a ratio the way env vars and status show it (`1`, `0.9`).
pub fn format_ratio(ratio: f64) -> String {
    format!("{ratio}")
}

/// One-line summary of a resolution, for the `offload.dev/resolved` annotation and Events.
pub fn resolved_summary(res: &Resolution) -> String {
    format!(
        "mode={} overlap={} ratio={} pinMemory={} nodeClass={} profile={}",
        res.mode,
        res.overlap,
        format_ratio(res.ratio),
        res.pin_memory,
        res.node_class.map_or("none".to_string(), |c| c.to_string()),
        res.profile
    )
}

/// The env vars for a resolution. `config_file` is the path of the rendered framework config
/// inside the container, where one is mounted.
pub fn env_vars(res: &Resolution, config_file: Option<&str>) -> Vec<EnvVar> {
    let flag = |b: bool| if b { "1" } else { "0" };
    let mut out = vec![
        env(names::ENV_MODE, res.mode.env_value()),
        env(names::ENV_OVERLAP, flag(res.overlap)),
        env(names::ENV_RATIO, &format_ratio(res.ratio)),
        env(names::ENV_PIN_MEMORY, flag(res.pin_memory)),
        env(names::ENV_PROFILE, &res.profile),
    ];
    if let Some(path) = config_file {
        out.push(env(names::ENV_CONFIG_FILE, path));
    }
    if let FrameworkPlan::Fsdp(plan) = &res.framework {
        out.push(env(
            names::ENV_FSDP_OFFLOAD_PARAMS,
            if plan.offload_params { "true" } else { "false" },
        ));
        out.push(env(names::ENV_FSDP_VERSION, &plan.fsdp_version.to_string()));
    }
    if let FrameworkPlan::Megatron(plan) = &res.framework {
        out.push(env(
            names::ENV_MEGATRON_ARGS,
            &megatron::args_line(plan, res.pin_memory),
        ));
        out.push(env(
            names::ENV_NEMO_OVERRIDES,
            &megatron::nemo_overrides(plan, res.pin_memory).join(" "),
        ));
    }
    out
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

/// The node-selector requirements that pin pods to the resolution's node class and the
/// profile's node selector. Empty when neither applies.
pub fn node_requirements(res: &Resolution) -> Vec<NodeSelectorRequirement> {
    // A class pins the pods whatever the mode: a job that fits without offload only on one
    // class's GPUs is pinned there too.
    let mut reqs: Vec<NodeSelectorRequirement> = match res.node_class {
        None => Vec::new(),
        // Pinned through its DRA claims: the claims' selectors choose the class's GPUs; the
        // nodes whose two witnesses disagree stay out.
        Some(_) if res.gpu_claims.is_some() => {
            if res.exclude_nodes.is_empty() {
                Vec::new()
            } else {
                vec![NodeSelectorRequirement {
                    key: "kubernetes.io/hostname".to_string(),
                    operator: "NotIn".to_string(),
                    values: Some(res.exclude_nodes.clone()),
                }]
            }
        }
        Some(class) => class_requirements(class)
            .into_iter()
            .map(|(key, values)| NodeSelectorRequirement {
                key,
                operator: "In".to_string(),
                values: Some(values),
            })
            .collect(),
    };
    if let Some(sel) = &res.node_selector {
        reqs.extend(selector_requirements(sel));
    }
    reqs
}

fn selector_requirements(sel: &LabelSelector) -> Vec<NodeSelectorRequirement> {
    let mut reqs: Vec<NodeSelectorRequirement> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| NodeSelectorRequirement {
            key: k.clone(),
            operator: "In".to_string(),
            values: Some(vec![v.clone()]),
        })
        .collect();
    reqs.extend(
        sel.match_expressions
            .iter()
            .flatten()
            .map(|e| NodeSelectorRequirement {
                key: e.key.clone(),
                operator: e.operator.clone(),
                values: e.values.clone().filter(|v| !v.is_empty()),
            }),
    );
    reqs
}

/// The node affinity for a resolution, or `None` when no node constraint applies.
pub fn node_affinity(res: &Resolution) -> Option<NodeAffinity> {
    let reqs = node_requirements(res);
    if reqs.is_empty() {
        return None;
    }
    Some(NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(reqs),
                match_fields: None,
            }],
        }),
        preferred_during_scheduling_ignored_during_execution: None,
    })
}

/// The reporter of PyTorch's memory figures (the profile's `reportAllocatorPeaks`), written
/// beside the rendered framework config as [`MEMORY_REPORT_FILE`]: at each process's exit it
/// appends [`ALLOCATOR_MARK`] lines to the termination log.
pub const MEMORY_REPORT: &str = include_str!("memory_report.py");
/// Its file name: Python imports it at start-up from a directory on `PYTHONPATH`.
pub const MEMORY_REPORT_FILE: &str = "sitecustomize.py";
pub use offload_api::observed::ALLOCATOR_MARK;

/// Where the rendered framework config is mounted into a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMount {
    /// ConfigMap holding the rendered file.
    pub config_map: String,
    /// Key (file name) in the ConfigMap.
    pub key: String,
    /// Directory the file appears in.
    pub mount_path: String,
}

impl ConfigMount {
    /// Full path of the file inside the container.
    pub fn file_path(&self) -> String {
        format!("{}/{}", self.mount_path.trim_end_matches('/'), self.key)
    }
}

/// What the operator writes beside the decision itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// The agent image that runs the start-up guard (`offload-agent verify`) as an init
    /// container; no guard when `None`.
    pub guard_image: Option<String>,
    /// Annotations the configured pods carry for the operator (another kind's step still to be
    /// traced: `offload.dev/sizer-step`).
    pub pod_annotations: std::collections::BTreeMap<String, String>,
}

/// Name of the start-up guard's init container.
pub const GUARD_CONTAINER: &str = offload_api::names::GUARD_CONTAINER;

/// The start-up guard's init container for a pod that asks for `gpus` GPUs: the same GPUs as the
/// pod (the kubelet hands an init container's devices on to the app containers), the expected
/// mode, class and pinning as arguments. `None` when there is nothing to guard.
///
/// Its cpu and memory requests (and its memory limit) are written only where the pod's own
/// containers request that resource (`requested`): a pod's request is the larger of its init
/// containers' and the sum of its containers', so the guard then changes nothing a scheduler or
/// a quota (Kueue's ClusterQueue) counts, and never adds a resource name a GPU-only quota does
/// not cover.
pub fn startup_guard_container(
    res: &Resolution,
    gpus: u64,
    requested: &std::collections::BTreeSet<String>,
    opts: &RenderOptions,
) -> Option<Container> {
    let image = opts.guard_image.as_ref()?;
    if !res.startup_guard
        || res.mode == OffloadMode::Disabled
        || (gpus == 0 && res.gpu_claim_entries.is_empty())
    {
        return None;
    }
    let cores = res.cpu_cores.map(cpu_quantity);
    let args = guard_args(res, cores.as_ref());
    let resources = guard_resources(res, gpus, requested, cores);
    Some(Container {
        name: GUARD_CONTAINER.to_string(),
        image: Some(image.clone()),
        args: Some(args),
        env: Some(vec![
            EnvVar {
                name: "NODE_NAME".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "spec.nodeName".into(),
                        api_version: None,
                    }),
                    ..EnvVarSource::default()
                }),
            },
            env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        ]),
        resources: Some(resources),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Container::default()
    })
}

/// The start-up guard's arguments: what the configuration counts on, for `verify` to check.
fn guard_args(res: &Resolution, cores: Option<&Quantity>) -> Vec<String> {
    let mut args = vec![
        "verify".to_string(),
        format!("--mode={}", res.mode.env_value()),
        format!("--pin-memory={}", if res.pin_memory { "1" } else { "0" }),
    ];
    if let Some(class) = res.node_class {
        args.push(format!("--node-class={}", class.to_string().to_lowercase()));
    }
    // The cores the decision counted on: the guard gets the same CPU limit as the training
    // container, so its own cgroup shows the quota (and, under a static CPU manager, the
    // cpuset) the training process will run under.
    if let Some(q) = cores {
        args.push(format!("--cpu-cores={}", q.0));
    }
    // Whole cores asked: the guard says whether the kubelet gave cores of the pod's own, on its
    // GPUs' socket.
    if res.whole_cores.is_some() {
        args.push("--whole-cores".to_string());
    }
    args
}

/// The start-up guard's resources: the pod's GPUs (by count, or its claims), the training
/// container's CPU limit where the decision counted on one, and memory where the namespace's
/// quota asks for it or the pod is to be Guaranteed.
fn guard_resources(
    res: &Resolution,
    gpus: u64,
    requested: &std::collections::BTreeSet<String>,
    cores: Option<Quantity>,
) -> ResourceRequirements {
    // Device-plugin GPUs by count; DRA GPUs by sharing the pod's claims.
    let gpu = if gpus > 0 {
        BTreeMap::from([(names::GPU_RESOURCE.to_string(), Quantity(gpus.to_string()))])
    } else {
        BTreeMap::new()
    };
    let claims = (!res.gpu_claim_entries.is_empty()).then(|| {
        res.gpu_claim_entries
            .iter()
            .map(|name| k8s_openapi::api::core::v1::ResourceClaim {
                name: name.clone(),
                request: None,
            })
            .collect()
    });
    let mut requests = gpu.clone();
    let mut limits = gpu;
    match cores {
        Some(q) => {
            requests.insert("cpu".into(), q.clone());
            limits.insert("cpu".into(), q);
        }
        None if requested.contains("cpu") => {
            requests.insert("cpu".into(), Quantity("50m".into()));
        }
        None => {}
    }
    if requested.contains("memory") || res.whole_cores.is_some() {
        // A Guaranteed pod's init containers set requests equal to limits too.
        let request = if res.whole_cores.is_some() {
            "256Mi"
        } else {
            "64Mi"
        };
        requests.insert("memory".into(), Quantity(request.into()));
        // The pin probe page-locks 64 MiB.
        limits.insert("memory".into(), Quantity("256Mi".into()));
    }
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(limits),
        claims,
    }
}

/// GPUs the pod's containers ask for explicitly (limits, else requests); 0 when none does or
/// the quantities do not read (the decision refuses those before anything is rendered).
pub fn explicit_gpus(spec: &PodSpec) -> u64 {
    crate::decision::PodResources::of(Some(spec)).map_or(0, |r| r.gpus)
}

/// CPU cores as a quantity: whole cores as a count, else millicores.
fn cpu_quantity(cores: f64) -> Quantity {
    if cores.fract() == 0.0 {
        Quantity(format!("{cores:.0}"))
    } else {
        Quantity(format!("{:.0}m", (cores * 1000.0).ceil()))
    }
}

/// Writes a resolution into a pod template: env on every container (operator-owned names
/// replaced, the user's own env untouched), the config volume and mounts, node affinity ANDed
/// into every required term the user already has, and the start-up guard.
pub fn apply_to_pod_template(
    template: &mut PodTemplateSpec,
    res: &Resolution,
    config: Option<&ConfigMount>,
    opts: &RenderOptions,
) {
    let spec = template.spec.get_or_insert_with(PodSpec::default);
    apply_to_pod_spec(spec, res, config, opts);
}

/// The resource names the pod's containers request (a limit alone is a request too), with
/// memory where the decision raises the training container's request.
fn requested_names(spec: &PodSpec, res: &Resolution) -> std::collections::BTreeSet<String> {
    let mut names: std::collections::BTreeSet<String> = spec
        .containers
        .iter()
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| {
            r.requests
                .iter()
                .chain(r.limits.iter())
                .flat_map(|m| m.keys())
        })
        .cloned()
        .collect();
    if res.memory_request.is_some() {
        names.insert("memory".into());
    }
    names
}

/// The start-up guard, first among the init containers so it runs before anything of the
/// user's (none where the decision needs no check).
fn place_guard(spec: &mut PodSpec, res: &Resolution, opts: &RenderOptions) {
    if let Some(inits) = spec.init_containers.as_mut() {
        inits.retain(|c| c.name != GUARD_CONTAINER);
    }
    if let Some(guard) =
        startup_guard_container(res, explicit_gpus(spec), &requested_names(spec, res), opts)
    {
        spec.init_containers
            .get_or_insert_with(Vec::new)
            .insert(0, guard);
    }
    if spec.init_containers.as_ref().is_some_and(Vec::is_empty) {
        spec.init_containers = None;
    }
}

/// One container's env: the operator's variables replaced, the reporter's directory on
/// PYTHONPATH, and the training container's thread count.
fn write_env(
    container: &mut Container,
    i: usize,
    res: &Resolution,
    config: Option<&ConfigMount>,
    vars: &[EnvVar],
) {
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|e| !names::OPERATOR_ENV.contains(&e.name.as_str()));
    // The reporter's directory on PYTHONPATH, where the container sets none of its own
    // (one equal to the directory is the operator's, from an earlier render).
    let reporter = config
        .filter(|_| res.report_allocator_peaks)
        .map(|c| c.mount_path.as_str());
    if let Some(dir) = reporter {
        env.retain(|e| !(e.name == "PYTHONPATH" && e.value.as_deref() == Some(dir)));
    }
    env.extend(vars.iter().cloned());
    if let Some(dir) = reporter
        && !env.iter().any(|e| e.name == "PYTHONPATH")
    {
        env.push(self::env("PYTHONPATH", dir));
    }
    // The training process's threads fit its CPU quota, where the user set none: an
    // OpenMP optimizer (DeepSpeed's CPU Adam) would start one per visible core.
    // Nor where the container takes env from a ConfigMap or Secret the webhook cannot
    // read: its own env would win over a value set there.
    if let Some(threads) = res.cpu_threads
        && res.training_container.unwrap_or(0) == i
        && !env.iter().any(|e| e.name == names::ENV_OMP_THREADS)
        && container.env_from.as_ref().is_none_or(Vec::is_empty)
    {
        env.push(self::env(names::ENV_OMP_THREADS, &threads.to_string()));
    }
}

/// [`apply_to_pod_template`] on a bare pod spec (for Pods).
pub fn apply_to_pod_spec(
    spec: &mut PodSpec,
    res: &Resolution,
    config: Option<&ConfigMount>,
    opts: &RenderOptions,
) {
    place_guard(spec, res, opts);
    let file = config.map(ConfigMount::file_path);
    let vars = env_vars(res, file.as_deref());
    for (i, container) in spec.containers.iter_mut().enumerate() {
        write_env(container, i, res, config, &vars);
        if let Some(cfg) = config {
            let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
            mounts.retain(|m| m.name != CONFIG_VOLUME);
            mounts.push(VolumeMount {
                name: CONFIG_VOLUME.to_string(),
                mount_path: cfg.mount_path.clone(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
        }
    }
    if let Some(cfg) = config {
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        volumes.retain(|v| v.name != CONFIG_VOLUME);
        volumes.push(Volume {
            name: CONFIG_VOLUME.to_string(),
            config_map: Some(ConfigMapVolumeSource {
                name: cfg.config_map.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    merge_affinity(spec, &node_requirements(res));
    raise_memory_request(spec, res);
    give_whole_cores(spec, res);
    // A training process that dies of CUDA out-of-memory leaves its last log lines as its
    // termination message, which is how the operator tells (and recovers from) it.
    if let Some(c) = res
        .training_container
        .and_then(|i| spec.containers.get_mut(i))
        && c.termination_message_policy.is_none()
    {
        c.termination_message_policy = Some("FallbackToLogsOnError".into());
    }
}

/// Writes the host memory the decision counts on as the training container's memory request,
/// where the user's is lower or absent; a user's request is never lowered and no limit is
/// added. Written in MiB (`117000Mi`), the unit kubectl shows.
fn raise_memory_request(spec: &mut PodSpec, res: &Resolution) {
    let Some(r) = res.memory_request else {
        return;
    };
    let Some(container) = spec.containers.get_mut(r.container) else {
        return;
    };
    let resources = container
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    let current = requests
        .get("memory")
        .and_then(|q| offload_api::quantity::bytes(q).ok());
    if current.is_none_or(|c| c < r.bytes) {
        requests.insert("memory".into(), Quantity(format!("{}Mi", r.bytes >> 20)));
    }
}

/// Where the decision asks for whole cores near the GPU: the training container's CPU and
/// memory requests equal to its limits, so the pod is Guaranteed. The user's memory limit is
/// kept as written (and becomes the request); without one, the decision's figure is both.
fn give_whole_cores(spec: &mut PodSpec, res: &Resolution) {
    let Some(w) = res.whole_cores else {
        return;
    };
    let Some(container) = spec.containers.get_mut(w.container) else {
        return;
    };
    let resources = container
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    let limits = resources.limits.get_or_insert_with(BTreeMap::new);
    let cores = Quantity(w.cores.to_string());
    limits.insert("cpu".into(), cores.clone());
    let memory = limits
        .get("memory")
        .cloned()
        .unwrap_or_else(|| Quantity(memory_quantity(w.memory_bytes)));
    limits.insert("memory".into(), memory.clone());
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    requests.insert("cpu".into(), cores);
    requests.insert("memory".into(), memory);
}

/// Bytes as a quantity: in MiB where whole (`117000Mi`), else in bytes.
fn memory_quantity(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}Mi", bytes >> 20)
    } else {
        bytes.to_string()
    }
}

/// ANDs `reqs` into every required node-selector term of the pod (adding one term when there is
/// none). Requirements already present are not added twice. A term of the user's with neither
/// expressions nor fields matches no node (as kube-scheduler reads it) and is left so: adding
/// the class's requirements to it would widen the template instead of narrowing it.
fn merge_affinity(spec: &mut PodSpec, reqs: &[NodeSelectorRequirement]) {
    if reqs.is_empty() {
        return;
    }
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let required = node
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: Vec::new(),
        });
    let created = required.node_selector_terms.is_empty();
    if created {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        let matches_nothing = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
            && term.match_fields.as_ref().is_none_or(Vec::is_empty);
        if matches_nothing && !created {
            continue;
        }
        let exprs = term.match_expressions.get_or_insert_with(Vec::new);
        for req in reqs {
            if !exprs.contains(req) {
                exprs.push(req.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests;
