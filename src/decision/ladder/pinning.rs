//! The pinned-memory step: the job's or profile's wish, turned off where the agent could not
//! pin host memory (unless the job insists).

use offload_api::text::bounded;
use offload_api::v1alpha1::{OffloadMode, OffloadProfileSpec, Switch};

use crate::decision::ladder::placement::ModeAndClass;
use crate::decision::request::JobRequest;
use crate::decision::resolution::Why;
use crate::decision::settings::Source;
use offload_api::v1alpha1::ReasonCode;

/// Pin host buffers or not, and why.
pub(in crate::decision) fn resolve_pinning(
    job: &JobRequest,
    profile: &OffloadProfileSpec,
    placement: &ModeAndClass,
) -> (bool, Why) {
    if placement.mode == OffloadMode::Disabled {
        return (
            false,
            Why::new(ReasonCode::NothingOffloaded, "off: offload is disabled"),
        );
    }
    let (wanted, source) = match job.offload.pin_memory {
        Switch::Enabled => (true, Source::Job),
        Switch::Disabled => (false, Source::Job),
        Switch::Auto => (profile.pin_memory, Source::Profile),
    };
    // The first chosen node whose agent could not pin memory (a fact of the class's nodes).
    let unpinnable_fact = placement.chosen.map(|c| {
        c.fact(|nodes| {
            for n in nodes {
                if let Some(r) = n.parsed_report().filter(|r| !r.selftest.pinned_memory) {
                    return Unpinnable(Some((n.name.clone(), r.selftest.pinned_error.clone())));
                }
            }
            Unpinnable(None)
        })
    });
    let unpinnable = unpinnable_fact
        .as_ref()
        .and_then(|u| u.0.as_ref())
        .map(|(node, err)| (node.as_str(), err.as_deref()));
    match (wanted, source, unpinnable) {
        (false, _, _) => (
            false,
            Why::new(
                ReasonCode::PinMemoryRequested,
                format!("off: set by {source}"),
            ),
        ),
        (true, Source::Profile, Some((node, err))) => (
            false,
            Why::summed(
                ReasonCode::PinnedMemoryUnavailable,
                format!(
                    "off: the agent could not allocate pinned memory on {node}; pageable buffers are used"
                ),
                format!(
                    "off: the agent could not allocate pinned memory on {node} ({}); pageable buffers are used",
                    bounded(err.unwrap_or("no detail"))
                ),
            ),
        ),
        (true, Source::Job, Some((node, _))) => (
            true,
            Why::new(
                ReasonCode::PinnedMemoryUnavailable,
                format!(
                    "on: set by the job, although the agent could not allocate pinned memory on {node}; pinned buffers count against the pod's memory limit, so raise it"
                ),
            ),
        ),
        (true, _, None) => (
            true,
            Why::new(
                ReasonCode::PinMemoryRequested,
                format!("on: set by {source}"),
            ),
        ),
    }
}

/// The first node of a class (by name) whose agent could not allocate pinned memory, and why.
struct Unpinnable(Option<(String, Option<String>)>);
