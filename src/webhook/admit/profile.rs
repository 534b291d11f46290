//! Validating OffloadProfiles.

use kube::core::admission::{AdmissionRequest, AdmissionResponse};
use kube::core::{DynamicObject, Selector, SelectorExt};

use super::{Review, Verdict, object, with_warnings};
use offload_api::v1alpha1::{ModeSetting, NodeClass, OffloadProfile};

/// Validating OffloadProfile: a selector that is not a valid selector is denied; one that
/// matches no reported node is admitted with a warning.
pub fn validate_profile(req: &AdmissionRequest<DynamicObject>, review: &Review) -> Verdict {
    let profile: OffloadProfile = match object(req, "OffloadProfile") {
        Ok(p) => p,
        Err(msg) => return Verdict::deny(req, "InvalidObject", msg),
    };
    let mut warnings = Vec::new();
    if let Some(sel) = &profile.spec.node_selector {
        if let Err(e) = offload_api::validation::label_selector(sel) {
            return Verdict::deny(
                req,
                "InvalidSelector",
                format!("spec.nodeSelector is not a valid label selector: {e}"),
            );
        }
        let selector = match Selector::try_from(sel.clone()) {
            Ok(s) => s,
            Err(e) => {
                return Verdict::deny(
                    req,
                    "InvalidSelector",
                    format!("spec.nodeSelector is not a valid label selector: {e}"),
                );
            }
        };
        let nodes = review.view.nodes();
        if !nodes.candidates().any(|n| selector.matches(&n.labels)) {
            warnings.push(format!(
                "spec.nodeSelector matches none of the {} GPU node(s) reported by offload-agent: jobs using this profile will wait",
                nodes.candidates().count()
            ));
        }
    }
    if profile.spec.mode == ModeSetting::CpuCopy
        && profile.spec.node_class_order.first() == Some(&NodeClass::Coherent)
        && !profile.spec.allow_cpu_copy_on_coherent_nodes
    {
        warnings.push("mode CPUCopy never uses coherent nodes unless allowCPUCopyOnCoherentNodes is set; nodeClassOrder's first entry has no effect".to_string());
    }
    Verdict::allow(with_warnings(AdmissionResponse::from(req), warnings))
}
