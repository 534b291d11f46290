//! Job kinds whose pod templates the webhook writes the configuration into at creation.
//!
//! One trait over the kinds: where the pod templates are and how many pods the job runs. Each
//! kind is a few lines of paths, not a copy of the mutation logic.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use json_patch::jsonptr::{self, PointerBuf};
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, PodTemplateSpec};
use kube::core::GroupVersionKind;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::decision::Resolution;
use crate::render::{self, RenderOptions};
use offload_api::names;

/// A pod template could not be read or written back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {detail}")]
pub struct KindError {
    /// JSON pointer of the template.
    pub path: String,
    /// What is wrong.
    pub detail: String,
}

pub use crate::cluster::view::{ApiFeatures, TrainJobApi};
pub use offload_api::names::TRAINJOB_CRD;

/// A workload kind the webhook knows.
pub trait JobKind: Sync {
    /// `group/Kind`, for messages.
    fn name(&self) -> &'static str;
    /// Whether the request's kind is this one.
    fn matches(&self, gvk: &GroupVersionKind) -> bool;
    /// JSON pointers of the pod templates in an object of this kind.
    fn template_pointers(&self, obj: &Value) -> Vec<String>;
    /// JSON pointer of the field that suspends the job, if the kind has one.
    fn suspend_pointer(&self) -> Option<&'static str>;
    /// Pods the job runs at once (for the capacity check of the decision). A count field that
    /// is not a non-negative integer, or a total beyond `u32::MAX`, is an error, never a wrap.
    fn pods(&self, obj: &Value) -> Result<u32, KindError>;

    /// The JSON Patch operations that write the resolution into every pod template of `obj`
    /// (the object without its metadata: `spec` and `status`). Only what the configuration
    /// changes is written: a template field this build's Kubernetes types do not know (one
    /// added in a newer release) stays as the user wrote it.
    fn patch(
        &self,
        obj: &Value,
        res: &Resolution,
        _features: &ApiFeatures,
        opts: &RenderOptions,
    ) -> Result<Vec<PatchOperation>, KindError> {
        let mut ops = Vec::new();
        for path in self.template_pointers(obj) {
            ops.extend(template_patch(obj, &path, res, opts)?);
        }
        Ok(ops)
    }

    /// Whether the job was created suspended (e.g. by a queueing system).
    fn suspended(&self, obj: &Value) -> bool {
        self.suspend_pointer()
            .and_then(|p| obj.pointer(p))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The operations that write the resolution into the template at `path`: the template is read
/// into its Kubernetes type, configured, and the two typed forms are compared, so the patch
/// holds the configuration's changes and nothing of the reading's (a field the types drop is
/// not removed).
pub fn template_patch(
    obj: &Value,
    path: &str,
    res: &Resolution,
    opts: &RenderOptions,
) -> Result<Vec<PatchOperation>, KindError> {
    edit_template(obj, path, |template| {
        render::apply_to_pod_template(template, res, None, opts);
        // Its pods say they were configured (the operator watches them for out-of-memory).
        let labels = BTreeMap::from([(names::LABEL_CONFIGURED.to_string(), "true".to_string())]);
        add_metadata(template, &labels, &opts.pod_annotations);
    })
}

/// The operations that hold the pods of the template at `path` for their step's trace: `labels`
/// and `annotations` added to its metadata (the object's opt-in, so that each pod is decided as
/// it is created), nothing else changed.
pub fn hold_patch(
    obj: &Value,
    path: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<Vec<PatchOperation>, KindError> {
    edit_template(obj, path, |template| {
        add_metadata(template, labels, annotations);
    })
}

/// `labels` and `annotations` added to the template's metadata (over those of the same keys).
fn add_metadata(
    template: &mut PodTemplateSpec,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) {
    let metadata = template.metadata.get_or_insert_with(Default::default);
    if !labels.is_empty() {
        metadata
            .labels
            .get_or_insert_with(Default::default)
            .extend(labels.clone());
    }
    if !annotations.is_empty() {
        metadata
            .annotations
            .get_or_insert_with(Default::default)
            .extend(annotations.clone());
    }
}

/// The operations `edit` makes to the pod template at `path`: the template is read into its
/// Kubernetes type, edited, and the two typed forms are compared.
fn edit_template(
    obj: &Value,
    path: &str,
    edit: impl FnOnce(&mut PodTemplateSpec),
) -> Result<Vec<PatchOperation>, KindError> {
    let err = |detail: String| KindError {
        path: path.to_string(),
        detail,
    };
    let slot = obj.pointer(path).ok_or_else(|| err("missing".into()))?;
    let mut template =
        PodTemplateSpec::deserialize(slot).map_err(|e| err(format!("not a pod template: {e}")))?;
    let at = PointerBuf::parse(path).map_err(|e| err(format!("not a JSON pointer: {e}")))?;
    typed_patch(&at, &mut template, edit).map_err(|e| err(e.to_string()))
}

/// The operations that `configure` makes to `typed`, a value read from the document at `at`,
/// found by comparing its typed forms before and after: the configuration's changes and
/// nothing of the reading's (a field the types drop is not removed).
pub fn typed_patch<T: serde::Serialize>(
    at: &jsonptr::Pointer,
    typed: &mut T,
    configure: impl FnOnce(&mut T),
) -> Result<Vec<PatchOperation>, serde_json::Error> {
    let before = serde_json::to_value(&*typed)?;
    configure(typed);
    let after = serde_json::to_value(&*typed)?;
    Ok(under(at, json_patch::diff(&before, &after).0))
}

/// `ops`, made relative to the document's root instead of the value at `at`.
pub fn under(at: &jsonptr::Pointer, ops: Vec<PatchOperation>) -> Vec<PatchOperation> {
    let rebase = |p: &mut PointerBuf| *p = at.concat(p);
    ops.into_iter()
        .map(|mut op| {
            match &mut op {
                PatchOperation::Add(o) => rebase(&mut o.path),
                PatchOperation::Remove(o) => rebase(&mut o.path),
                PatchOperation::Replace(o) => rebase(&mut o.path),
                PatchOperation::Test(o) => rebase(&mut o.path),
                PatchOperation::Move(o) => {
                    rebase(&mut o.path);
                    rebase(&mut o.from);
                }
                PatchOperation::Copy(o) => {
                    rebase(&mut o.path);
                    rebase(&mut o.from);
                }
            }
            op
        })
        .collect()
}

/// The count at `pointer` (`default` when absent), or what is wrong with it.
fn count_at(obj: &Value, pointer: &str, default: u64) -> Result<u64, KindError> {
    match obj.pointer(pointer) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().ok_or_else(|| KindError {
            path: pointer.to_string(),
            detail: format!("{v} is not a non-negative integer"),
        }),
    }
}

fn too_many(path: &str) -> KindError {
    KindError {
        path: path.to_string(),
        detail: format!("asks for more than {} pods at once", u32::MAX),
    }
}

/// A pod total as the decision takes it: at least 1, at most `u32::MAX`.
fn pod_total(n: u64, path: &str) -> Result<u32, KindError> {
    u32::try_from(n)
        .map(|n| n.max(1))
        .map_err(|_| too_many(path))
}

/// batch/v1 Job: `spec.template`.
pub struct BatchJob;

impl JobKind for BatchJob {
    fn name(&self) -> &'static str {
        "batch/Job"
    }
    fn matches(&self, gvk: &GroupVersionKind) -> bool {
        gvk.group == "batch" && gvk.kind == "Job"
    }
    fn template_pointers(&self, _obj: &Value) -> Vec<String> {
        vec!["/spec/template".into()]
    }
    fn suspend_pointer(&self) -> Option<&'static str> {
        Some("/spec/suspend")
    }
    fn pods(&self, obj: &Value) -> Result<u32, KindError> {
        pod_total(count_at(obj, "/spec/parallelism", 1)?, "/spec/parallelism")
    }
}

/// JobSet: `spec.replicatedJobs[].template.spec.template`.
pub struct JobSet;

impl JobKind for JobSet {
    fn name(&self) -> &'static str {
        "jobset.x-k8s.io/JobSet"
    }
    fn matches(&self, gvk: &GroupVersionKind) -> bool {
        gvk.group == "jobset.x-k8s.io" && gvk.kind == "JobSet"
    }
    fn template_pointers(&self, obj: &Value) -> Vec<String> {
        let n = obj
            .pointer("/spec/replicatedJobs")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        (0..n)
            .map(|i| format!("/spec/replicatedJobs/{i}/template/spec/template"))
            .collect()
    }
    fn suspend_pointer(&self) -> Option<&'static str> {
        Some("/spec/suspend")
    }
    fn pods(&self, obj: &Value) -> Result<u32, KindError> {
        let path = "/spec/replicatedJobs";
        let Some(jobs) = obj.pointer(path).and_then(Value::as_array) else {
            return Ok(1);
        };
        let mut total: u64 = 0;
        for (i, job) in jobs.iter().enumerate() {
            let at = |field: &str| format!("{path}/{i}{field}");
            let replicas = count_at(job, "/replicas", 1).map_err(|e| KindError {
                path: at("/replicas"),
                ..e
            })?;
            let parallelism =
                count_at(job, "/template/spec/parallelism", 1).map_err(|e| KindError {
                    path: at("/template/spec/parallelism"),
                    ..e
                })?;
            total = replicas
                .checked_mul(parallelism)
                .and_then(|pods| total.checked_add(pods))
                .ok_or_else(|| too_many(path))?;
        }
        pod_total(total, path)
    }
}

/// Kubeflow PyTorchJob: `spec.pytorchReplicaSpecs.{Master,Worker}.template`.
pub struct PyTorchJob;

impl JobKind for PyTorchJob {
    fn name(&self) -> &'static str {
        "kubeflow.org/PyTorchJob"
    }
    fn matches(&self, gvk: &GroupVersionKind) -> bool {
        gvk.group == "kubeflow.org" && gvk.kind == "PyTorchJob"
    }
    fn template_pointers(&self, obj: &Value) -> Vec<String> {
        ["Master", "Worker"]
            .iter()
            .filter(|r| {
                obj.pointer(&format!("/spec/pytorchReplicaSpecs/{r}/template"))
                    .is_some()
            })
            .map(|r| format!("/spec/pytorchReplicaSpecs/{r}/template"))
            .collect()
    }
    fn suspend_pointer(&self) -> Option<&'static str> {
        Some("/spec/runPolicy/suspend")
    }
    fn pods(&self, obj: &Value) -> Result<u32, KindError> {
        let mut total: u64 = 0;
        for role in ["Master", "Worker"] {
            if obj
                .pointer(&format!("/spec/pytorchReplicaSpecs/{role}"))
                .is_none()
            {
                continue;
            }
            let path = format!("/spec/pytorchReplicaSpecs/{role}/replicas");
            total = total
                .checked_add(count_at(obj, &path, 1)?)
                .ok_or_else(|| too_many(&path))?;
        }
        pod_total(total, "/spec/pytorchReplicaSpecs")
    }
}

/// Kubeflow Trainer TrainJob. Its pod templates live in the (shared) training runtime, so the
/// configuration goes where the TrainJob API takes per-job settings: `spec.trainer.env` for the
/// env, and for the trainer's (`node`) pods' placement a `runtimePatches` entry of its own
/// manager (Trainer ≥ 2.2) or a `podTemplateOverrides` entry (Trainer 2.1).
pub struct TrainJob;

/// The replicated job of a training runtime that runs the trainer.
pub const TRAINJOB_TRAINER_JOB: &str = "node";

impl JobKind for TrainJob {
    fn name(&self) -> &'static str {
        "trainer.kubeflow.org/TrainJob"
    }
    fn matches(&self, gvk: &GroupVersionKind) -> bool {
        gvk.group == "trainer.kubeflow.org" && gvk.kind == "TrainJob"
    }
    fn template_pointers(&self, _obj: &Value) -> Vec<String> {
        Vec::new()
    }
    fn suspend_pointer(&self) -> Option<&'static str> {
        Some("/spec/suspend")
    }
    fn pods(&self, obj: &Value) -> Result<u32, KindError> {
        pod_total(
            count_at(obj, "/spec/trainer/numNodes", 1)?,
            "/spec/trainer/numNodes",
        )
    }

    fn patch(
        &self,
        obj: &Value,
        res: &Resolution,
        features: &ApiFeatures,
        // Runtime patches and overrides cannot add an init container to the runtime's pods:
        // TrainJobs run without the start-up guard.
        _opts: &RenderOptions,
    ) -> Result<Vec<PatchOperation>, KindError> {
        // The TrainJob is edited as JSON (no typed reading drops a field), then compared.
        let mut edited = obj.clone();
        trainjob_edit(&mut edited, res, features)?;
        Ok(json_patch::diff(obj, &edited).0)
    }
}

/// Writes the resolution into a TrainJob's trainer env and its trainer pods' node affinity.
fn trainjob_edit(
    obj: &mut Value,
    res: &Resolution,
    features: &ApiFeatures,
) -> Result<(), KindError> {
    let err = |path: &str, detail: &str| KindError {
        path: path.into(),
        detail: detail.into(),
    };
    let spec = obj
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| err("/spec", "missing"))?;
    trainer_env(spec, res)?;
    // Placement of the trainer's pods.
    let reqs = render::node_requirements(res);
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": requirements_json(&reqs)}]
    }}});
    trainer_affinity(spec, features.trainjob, &reqs, affinity)
}

/// The trainer container's env: operator-owned names replaced, the user's kept.
fn trainer_env(
    spec: &mut serde_json::Map<String, Value>,
    res: &Resolution,
) -> Result<(), KindError> {
    let err = |path: &str, detail: &str| KindError {
        path: path.into(),
        detail: detail.into(),
    };
    let trainer = spec.entry("trainer").or_insert_with(|| json!({}));
    let trainer = trainer
        .as_object_mut()
        .ok_or_else(|| err("/spec/trainer", "not an object"))?;
    let env = trainer.entry("env").or_insert_with(|| json!([]));
    let env = env
        .as_array_mut()
        .ok_or_else(|| err("/spec/trainer/env", "not a list"))?;
    env.retain(|e| {
        e.get("name")
            .and_then(Value::as_str)
            .is_none_or(|n| !names::OPERATOR_ENV.contains(&n))
    });
    for var in render::env_vars(res, None) {
        env.push(serde_json::to_value(var).map_err(|e| err("/spec/trainer/env", &e.to_string()))?);
    }
    Ok(())
}

/// The trainer pods' node affinity, written where the installed TrainJob API takes it: a
/// runtime patch of the operator's own (Trainer 2.2 and later), else a pod template override
/// (2.1); refused where neither exists and there is a placement to write.
fn trainer_affinity(
    spec: &mut serde_json::Map<String, Value>,
    api: TrainJobApi,
    reqs: &[NodeSelectorRequirement],
    affinity: Value,
) -> Result<(), KindError> {
    let err = |path: &str, detail: &str| KindError {
        path: path.into(),
        detail: detail.into(),
    };
    match api {
        TrainJobApi::RuntimePatches => {
            let patches = spec.entry("runtimePatches").or_insert_with(|| json!([]));
            let patches = patches
                .as_array_mut()
                .ok_or_else(|| err("/spec/runtimePatches", "not a list"))?;
            patches.retain(|p| {
                p.get("manager").and_then(Value::as_str) != Some(TRAINJOB_PATCH_MANAGER)
            });
            if !reqs.is_empty() {
                patches.push(json!({
                    "manager": TRAINJOB_PATCH_MANAGER,
                    "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                        "name": TRAINJOB_TRAINER_JOB,
                        "template": {"spec": {"template": {"spec": {"affinity": affinity}}}}
                    }]}}}
                }));
            }
        }
        TrainJobApi::Unsupported => {
            if !reqs.is_empty() {
                return Err(err(
                    "/spec",
                    "the installed TrainJob CRD has neither spec.runtimePatches (Kubeflow \
                     Trainer 2.2 and later) nor spec.podTemplateOverrides (2.1), so the \
                     trainer pods' node affinity cannot be written; upgrade Kubeflow Trainer",
                ));
            }
        }
        TrainJobApi::PodTemplateOverrides => {
            let overrides = spec
                .entry("podTemplateOverrides")
                .or_insert_with(|| json!([]));
            let overrides = overrides
                .as_array_mut()
                .ok_or_else(|| err("/spec/podTemplateOverrides", "not a list"))?;
            overrides.retain(|o| {
                o.pointer("/metadata/annotations/offload.dev~1managed")
                    .is_none()
            });
            if !reqs.is_empty() {
                overrides.push(json!({
                    "targetJobs": [{"name": TRAINJOB_TRAINER_JOB}],
                    "metadata": {"annotations": {"offload.dev/managed": "true"}},
                    "spec": {"affinity": affinity}
                }));
            }
        }
    }
    Ok(())
}

/// The manager of the operator's `runtimePatches` entry on a TrainJob.
pub const TRAINJOB_PATCH_MANAGER: &str = "offload.dev/operator";

fn requirements_json(reqs: &[NodeSelectorRequirement]) -> Value {
    serde_json::to_value(reqs).unwrap_or_else(|_| json!([]))
}

/// Every kind the webhook mutates besides Pods and TrainingJobs.
pub static KINDS: [&dyn JobKind; 4] = [&BatchJob, &JobSet, &PyTorchJob, &TrainJob];

/// The kind of a request, if the webhook knows it.
pub fn kind_for(gvk: &GroupVersionKind) -> Option<&'static dyn JobKind> {
    KINDS.iter().copied().find(|k| k.matches(gvk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_knows_its_templates_pods_and_suspend_field() {
        let job = json!({"spec": {"parallelism": 3, "suspend": true, "template": {}}});
        assert_eq!(BatchJob.template_pointers(&job), ["/spec/template"]);
        assert_eq!(BatchJob.pods(&job), Ok(3));
        assert!(BatchJob.suspended(&job));
        let js = json!({"spec": {"replicatedJobs": [{"replicas": 2, "template": {"spec": {"parallelism": 4}}}, {}]}});
        assert_eq!(JobSet.template_pointers(&js).len(), 2);
        assert_eq!(JobSet.pods(&js), Ok(9));
        assert!(!JobSet.suspended(&js));
        let pt = json!({"spec": {"runPolicy": {"suspend": true}, "pytorchReplicaSpecs": {"Worker": {"replicas": 3, "template": {}}}}});
        assert_eq!(
            PyTorchJob.template_pointers(&pt),
            ["/spec/pytorchReplicaSpecs/Worker/template"]
        );
        assert_eq!(PyTorchJob.pods(&pt), Ok(3));
        assert!(PyTorchJob.suspended(&pt));
        let tj = json!({"spec": {"trainer": {"numNodes": 4}}});
        assert_eq!(TrainJob.pods(&tj), Ok(4));
        assert!(TrainJob.template_pointers(&tj).is_empty());
        assert_eq!(TrainJob.suspend_pointer(), Some("/spec/suspend"));
    }

    /// Sizes that JobSet's own schema allows, and sizes beyond any integer type, are refused
    /// with the field named; nothing overflows (it panicked in debug builds and wrapped in
    /// release builds).
    #[test]
    fn crafted_sizes_are_errors_not_overflows() {
        let max = i64::from(i32::MAX);
        let huge_jobset = json!({"spec": {"replicatedJobs": [
            {"replicas": 5, "template": {"spec": {"parallelism": max}}},
            {"replicas": max, "template": {"spec": {"parallelism": max}}},
        ]}});
        let err = JobSet.pods(&huge_jobset).unwrap_err();
        assert!(
            err.to_string().contains("more than 4294967295 pods"),
            "{err}"
        );
        let overflow = json!({"spec": {"replicatedJobs": [
            {"replicas": u64::MAX, "template": {"spec": {"parallelism": u64::MAX}}},
        ]}});
        assert!(JobSet.pods(&overflow).is_err());
        let pt = json!({"spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": u64::MAX}, "Worker": {"replicas": u64::MAX}}}});
        assert!(PyTorchJob.pods(&pt).is_err());
        for bad in [json!(-1), json!(1.5), json!("3"), json!(1e30)] {
            let job = json!({"spec": {"parallelism": bad}});
            let err = BatchJob.pods(&job).unwrap_err();
            assert_eq!(err.path, "/spec/parallelism");
            assert!(
                err.to_string().contains("not a non-negative integer"),
                "{err}"
            );
        }
        let js = json!({"spec": {"replicatedJobs": [{"replicas": "two"}]}});
        assert_eq!(
            JobSet.pods(&js).unwrap_err().path,
            "/spec/replicatedJobs/0/replicas"
        );
        assert_eq!(
            TrainJob
                .pods(&json!({"spec": {"trainer": {"numNodes": u64::MAX}}}))
                .unwrap_err()
                .path,
            "/spec/trainer/numNodes"
        );
    }
}
