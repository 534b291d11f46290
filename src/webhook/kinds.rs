//! Job kinds whose pod templates the webhook writes the configuration into at creation.
//!
//! One trait over the kinds: where the pod templates are and how many pods the job runs. Each
//! kind is a few lines of paths, not a copy of the mutation logic.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, PodTemplateSpec};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::decision::Resolution;
use crate::names;
use crate::render;

/// A pod template could not be read or written back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {detail}")]
pub struct KindError {
    /// JSON pointer of the template.
    pub path: String,
    /// What is wrong.
    pub detail: String,
}

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
    /// Pods the job runs at once (for the capacity check of the decision).
    fn pods(&self, obj: &Value) -> u32;

    /// Writes the resolution into every pod template.
    fn apply(&self, obj: &mut Value, res: &Resolution) -> Result<(), KindError> {
        for path in self.template_pointers(obj) {
            apply_template(obj, &path, res)?;
        }
        Ok(())
    }

    /// Whether the job was created suspended (e.g. by a queueing system).
    fn suspended(&self, obj: &Value) -> bool {
        self.suspend_pointer()
            .and_then(|p| obj.pointer(p))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// Reads the template at `path`, applies the resolution, writes it back.
pub fn apply_template(obj: &mut Value, path: &str, res: &Resolution) -> Result<(), KindError> {
    let err = |detail: String| KindError {
        path: path.to_string(),
        detail,
    };
    let slot = obj.pointer_mut(path).ok_or_else(|| err("missing".into()))?;
    let mut template: PodTemplateSpec = serde_json::from_value(slot.clone())
        .map_err(|e| err(format!("not a pod template: {e}")))?;
    render::apply_to_pod_template(&mut template, res, None);
    *slot = serde_json::to_value(&template).map_err(|e| err(e.to_string()))?;
    Ok(())
}

fn int_at(obj: &Value, pointer: &str, default: u64) -> u64 {
    obj.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or(default)
}

fn clamp_pods(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX).max(1)
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
    fn pods(&self, obj: &Value) -> u32 {
        clamp_pods(int_at(obj, "/spec/parallelism", 1))
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
    fn pods(&self, obj: &Value) -> u32 {
        let jobs = obj
            .pointer("/spec/replicatedJobs")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        clamp_pods(
            jobs.iter()
                .map(|j| int_at(j, "/replicas", 1) * int_at(j, "/template/spec/parallelism", 1))
                .sum(),
        )
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
    fn pods(&self, obj: &Value) -> u32 {
        clamp_pods(
            ["Master", "Worker"]
                .iter()
                .filter(|r| {
                    obj.pointer(&format!("/spec/pytorchReplicaSpecs/{r}"))
                        .is_some()
                })
                .map(|r| int_at(obj, &format!("/spec/pytorchReplicaSpecs/{r}/replicas"), 1))
                .sum(),
        )
    }
}

/// Kubeflow Trainer TrainJob. Its pod templates live in the (shared) training runtime, so the
/// configuration goes where the TrainJob API takes per-job settings: `spec.trainer.env` for the
/// env and a `podTemplateOverrides` entry for the trainer's (`node`) pods' placement.
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
    fn pods(&self, obj: &Value) -> u32 {
        clamp_pods(int_at(obj, "/spec/trainer/numNodes", 1))
    }

    fn apply(&self, obj: &mut Value, res: &Resolution) -> Result<(), KindError> {
        let err = |path: &str, detail: &str| KindError {
            path: path.into(),
            detail: detail.into(),
        };
        let spec = obj
            .get_mut("spec")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| err("/spec", "missing"))?;
        // Env of the trainer container: operator-owned names replaced, the user's kept.
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
            env.push(
                serde_json::to_value(var).map_err(|e| err("/spec/trainer/env", &e.to_string()))?,
            );
        }
        // Placement of the trainer's pods.
        let reqs = render::node_requirements(res);
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
                "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": requirements_json(&reqs)}]
                }}}}
            }));
        }
        Ok(())
    }
}

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
        assert_eq!(BatchJob.pods(&job), 3);
        assert!(BatchJob.suspended(&job));
        let js = json!({"spec": {"replicatedJobs": [{"replicas": 2, "template": {"spec": {"parallelism": 4}}}, {}]}});
        assert_eq!(JobSet.template_pointers(&js).len(), 2);
        assert_eq!(JobSet.pods(&js), 9);
        assert!(!JobSet.suspended(&js));
        let pt = json!({"spec": {"runPolicy": {"suspend": true}, "pytorchReplicaSpecs": {"Worker": {"replicas": 3, "template": {}}}}});
        assert_eq!(
            PyTorchJob.template_pointers(&pt),
            ["/spec/pytorchReplicaSpecs/Worker/template"]
        );
        assert_eq!(PyTorchJob.pods(&pt), 3);
        assert!(PyTorchJob.suspended(&pt));
        let tj = json!({"spec": {"trainer": {"numNodes": 4}}});
        assert_eq!(TrainJob.pods(&tj), 4);
        assert!(TrainJob.template_pointers(&tj).is_empty());
        assert_eq!(TrainJob.suspend_pointer(), Some("/spec/suspend"));
    }
}
