//! What each endpoint decides, one file per endpoint family: TrainingJobs ([`training_job`]),
//! OffloadProfiles ([`profile`]), Pods and other job kinds ([`workload`]). The envelope has
//! been parsed already; every answer here keeps the request uid, and a bad object gets
//! `allowed: false` with a message naming the field.

mod profile;
mod training_job;
mod workload;

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use serde_json::Value;

pub use crate::cluster::view::{AdmissionView, MemoryView, StoreView};
use crate::decision::{ModelConfigError, ModelShape, Resolution, UserConfig};

pub use profile::validate_profile;
pub use training_job::{mutate_training_job, validate_training_job};
pub use workload::{mutate_pod, mutate_workload};

/// What one review is decided against: the cluster view, and for a TrainingJob the DeepSpeed
/// config it references where it could be read for this request (so the webhook decides from
/// the same ZeRO stage the controller will).
pub struct Review<'a> {
    /// The cluster.
    pub view: &'a dyn AdmissionView,
    /// The TrainingJob's DeepSpeed config, when read.
    pub config: Option<UserConfig>,
    /// The model `config.json` the object references, as read (`Ok(None)`: none).
    pub model_config: Result<Option<ModelShape>, ModelConfigError>,
    /// Where a held pod's sizer stands (asked before the review).
    pub sizer: crate::webhook::sizer_wait::SizerState,
}

impl<'a> Review<'a> {
    /// A review against `view` with no config read.
    pub fn new(view: &'a dyn AdmissionView) -> Self {
        Review {
            view,
            config: None,
            model_config: Ok(None),
            sizer: Default::default(),
        }
    }
}

/// The outcome of one admission, with a fixed category for the denial metric and the
/// resolution written, where one was.
pub struct Verdict {
    /// The response to send.
    pub response: AdmissionResponse,
    /// Denial category, when denied.
    pub denied: Option<&'static str>,
    /// The configuration written into the object (Pods and other job kinds), for `explain`.
    pub resolution: Option<Resolution>,
    /// The sizer to start for the pods of the object admitted (a held job's step), before the
    /// answer is sent.
    pub start_sizer: Option<crate::webhook::sizer_wait::Start>,
}

impl Verdict {
    fn allow(response: AdmissionResponse) -> Self {
        Verdict {
            response,
            denied: None,
            resolution: None,
            start_sizer: None,
        }
    }

    fn deny(
        req: &AdmissionRequest<DynamicObject>,
        category: &'static str,
        message: impl ToString,
    ) -> Self {
        Verdict {
            response: AdmissionResponse::from(req).deny(message),
            denied: Some(category),
            resolution: None,
            start_sizer: None,
        }
    }

    /// A denial for a handler that failed in an unexpected way (a bug), keeping the uid.
    pub fn internal_error(req: &AdmissionRequest<DynamicObject>, what: &str) -> Self {
        Verdict::deny(
            req,
            "InternalError",
            format!(
                "the operator could not decide on this object (an internal error, please report it): {}",
                offload_api::text::bounded(what)
            ),
        )
    }

    fn with_resolution(mut self, res: Resolution) -> Self {
        self.resolution = Some(res);
        self
    }
}

fn with_warnings(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

/// Reads the request's object as `T`, or says which field is wrong.
fn object<T: serde::de::DeserializeOwned>(
    req: &AdmissionRequest<DynamicObject>,
    what: &str,
) -> Result<T, String> {
    let obj = req
        .object
        .as_ref()
        .ok_or_else(|| format!("the request carries no {what}"))?;
    let value = serde_json::to_value(obj).map_err(|e| format!("the {what} cannot be read: {e}"))?;
    crate::cluster::tolerant::from_value(value).map_err(|e| format!("the {what} is invalid: {e}"))
}

fn old_object<T: serde::de::DeserializeOwned>(req: &AdmissionRequest<DynamicObject>) -> Option<T> {
    let value = serde_json::to_value(req.old_object.as_ref()?).ok()?;
    serde_json::from_value(value).ok()
}

/// A response carrying the JSON patch from `original` to `mutated` (only the fields that
/// changed), or a plain allow when nothing changed.
fn patch_response(
    req: &AdmissionRequest<DynamicObject>,
    original: &Value,
    mutated: &Value,
) -> Verdict {
    patch_ops_response(req, json_patch::diff(original, mutated))
}

/// The answer that applies `patch` (an empty one allows the object unchanged).
fn patch_ops_response(req: &AdmissionRequest<DynamicObject>, patch: json_patch::Patch) -> Verdict {
    if patch.0.is_empty() {
        return Verdict::allow(AdmissionResponse::from(req));
    }
    match AdmissionResponse::from(req).with_patch(patch) {
        Ok(r) => Verdict::allow(r),
        Err(e) => Verdict::deny(
            req,
            "PatchError",
            format!("could not encode the patch: {e}"),
        ),
    }
}
