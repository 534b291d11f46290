//! The pinned-memory step: the job's or profile's wish, turned off where the agent could not
//! pin host memory (unless the job insists).

use offload_api::text::bounded;
use offload_api::v1alpha1::{OffloadMode, OffloadProfileSpec, Switch};

use super::placement::ModeAndClass;
use super::request::JobRequest;
use super::settings::Source;

/// Pin host buffers or not, and why.
pub(super) fn decide(
    job: &JobRequest,
    profile: &OffloadProfileSpec,
    placement: &ModeAndClass,
) -> (bool, String) {
    if placement.mode == OffloadMode::Disabled {
        return (false, "off: offload is disabled".to_string());
    }
    let (wanted, source) = match job.offload.pin_memory {
        Switch::Enabled => (true, Source::Job),
        Switch::Disabled => (false, Source::Job),
        Switch::Auto => (profile.pin_memory, Source::Profile),
    };
    let unpinnable = placement.chosen.and_then(|c| {
        c.nodes.iter().find_map(|n| {
            n.parsed_report()
                .filter(|r| !r.selftest.pinned_memory)
                .map(|r| (n.name.as_str(), r.selftest.pinned_error.as_deref()))
        })
    });
    match (wanted, source, unpinnable) {
        (false, _, _) => (false, format!("off: set by {source}")),
        (true, Source::Profile, Some((node, err))) => (
            false,
            format!(
                "off: the agent could not allocate pinned memory on {node} ({}); pageable buffers are used",
                bounded(err.unwrap_or("no detail"))
            ),
        ),
        (true, Source::Job, Some((node, _))) => (
            true,
            format!(
                "on: set by the job, although the agent could not allocate pinned memory on {node}; pinned buffers count against the pod's memory limit, so raise it"
            ),
        ),
        (true, _, None) => (true, format!("on: set by {source}")),
    }
}
