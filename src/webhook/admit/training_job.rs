//! Validating and mutating TrainingJobs.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde_json::Value;

use super::{Review, Verdict, object, old_object, patch_response, with_warnings};
use crate::decision::{
    AdmittedRequest, Resolution, Unresolved, check_training_job, decide, opted_in,
};
use offload_api::names;
use offload_api::v1alpha1::TrainingJob;

/// The decision the controller will make for this job, from this review's view and config.
fn decided(tj: &TrainingJob, review: &Review) -> Result<Resolution, Unresolved> {
    decide(
        tj,
        Ok(review.config.as_ref()),
        review.model_config.as_ref().map(Option::as_ref),
        review.view,
    )
}

/// Validating TrainingJob: statically wrong requests are denied with what to change; problems
/// the cluster may fix later (no coherent node yet, not enough memory or GPUs yet, a profile
/// not created yet) are admitted with a warning, because the controller holds the job until
/// they are fixed. A job whose workload exists cannot change its offload configuration.
pub fn validate_training_job(req: &AdmissionRequest<DynamicObject>, review: &Review) -> Verdict {
    let tj: TrainingJob = match object(req, "TrainingJob") {
        Ok(t) => t,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    if req.operation == Operation::Update
        && let Some(old) = old_object::<TrainingJob>(req)
        && old
            .status
            .as_ref()
            .and_then(|s| s.workload.as_ref())
            .is_some()
    {
        let changed = [
            (old.spec.offload != tj.spec.offload, "spec.offload"),
            (old.spec.framework != tj.spec.framework, "spec.framework"),
            (old.spec.deepspeed != tj.spec.deepspeed, "spec.deepspeed"),
            (old.spec.template != tj.spec.template, "spec.template"),
            (old.spec.replicas != tj.spec.replicas, "spec.replicas"),
        ];
        // The operator's own re-decision after an out-of-memory: only the offload
        // configuration changes, and the job's status says its configuration ran out and is
        // being replaced.
        let only_offload = changed.iter().skip(1).all(|(c, _)| !*c);
        if only_offload && recovering(&old) {
            return match check_training_job(&tj) {
                Ok(()) => Verdict::allow(AdmissionResponse::from(req)),
                Err(e) => Verdict::deny(req, e.category(), format!("{e}")),
            };
        }
        if let Some((_, field)) = changed.iter().find(|(c, _)| *c) {
            return Verdict::deny(
                req,
                "RunningJobChanged",
                format!(
                    "{field} cannot change once the workload exists (a running job is never re-configured): delete and re-create the TrainingJob to change it"
                ),
            );
        }
        return Verdict::allow(AdmissionResponse::from(req));
    }
    if let Err(e) = check_training_job(&tj) {
        return Verdict::deny(req, e.category(), format!("{e}"));
    }
    if !opted_in(&tj) {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    match decided(&tj, review) {
        Ok(_) => Verdict::allow(AdmissionResponse::from(req)),
        Err(Unresolved::ProfileNotFound(missing)) => Verdict::allow(with_warnings(
            AdmissionResponse::from(req),
            vec![format!(
                "OffloadProfile {:?} does not exist yet: the job waits until it does",
                missing.name
            )],
        )),
        Err(e) if e.depends_on_cluster() => Verdict::allow(with_warnings(
            AdmissionResponse::from(req),
            vec![format!(
                "the job waits until the cluster can take it: {}",
                e.message()
            )],
        )),
        Err(e) => Verdict::deny(req, e.reason(), format!("spec: {}", e.message())),
    }
}

/// Whether `old` is being re-decided after running out of memory: `MemoryRecovery` is `True`
/// (`Redeciding`), and the last failure recorded is of the configuration its status still
/// holds (once the new decision is recorded, the recovery is over and the job is frozen again).
fn recovering(old: &TrainingJob) -> bool {
    let Some(status) = old.status.as_ref() else {
        return false;
    };
    let redeciding = status.conditions.iter().any(|c| {
        crate::controller::conditions::ConditionType::MemoryRecovery.is(c)
            && c.status == "True"
            && c.reason == names::REASON_REDECIDING
    });
    let ran_out = match (status.memory_failures.last(), status.offload.as_ref()) {
        (Some(f), Some(d)) => f.configuration == crate::decision::runs::evidence::configuration(d),
        _ => false,
    };
    redeciding && ran_out
}

/// Mutating TrainingJob at CREATE: resolve every `Auto` early so the stored object already
/// shows the decision. Unresolvable jobs are admitted unchanged (validation warns; the
/// controller records why).
pub fn mutate_training_job(req: &AdmissionRequest<DynamicObject>, review: &Review) -> Verdict {
    let allow = AdmissionResponse::from(req);
    if req.operation != Operation::Create {
        return Verdict::allow(allow);
    }
    let tj: TrainingJob = match object(req, "TrainingJob") {
        Ok(t) => t,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    if !opted_in(&tj) || tj.spec.offload.is_concrete() {
        return Verdict::allow(allow);
    }
    let Ok(res) = decided(&tj, review) else {
        return Verdict::allow(allow);
    };
    let Ok(original) = serde_json::to_value(&tj) else {
        return Verdict::allow(allow);
    };
    let mut mutated = original.clone();
    let record = AdmittedRequest {
        requested: tj.spec.offload.clone(),
        wrote: res.concrete_spec(),
    };
    let (Ok(concrete), Ok(requested)) = (serde_json::to_value(&record.wrote), record.annotation())
    else {
        return Verdict::allow(allow);
    };
    mutated["spec"]["offload"] = concrete;
    if let Some(meta) = mutated.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(
                names::ANNOTATION_REQUESTED.to_string(),
                Value::String(requested),
            );
        }
    }
    patch_response(req, &original, &mutated)
}
