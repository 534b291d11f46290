//! The overlap step: on only where every chosen node's self-test verified it at or above the
//! profile's minimum, unless the job or profile says otherwise.

use crate::index::NodeInfo;
use offload_api::report::OverlapVerdict;
use offload_api::v1alpha1::{OffloadMode, OffloadProfileSpec, OverlapSetting};

use crate::decision::ladder::placement::ModeAndClass;
use crate::decision::request::JobRequest;
use crate::decision::resolution::Why;
use crate::decision::settings::effective;
use offload_api::v1alpha1::ReasonCode;

/// The lowest measured efficiency among nodes, or what stops overlap being trusted.
#[derive(Clone, Default)]
pub(in crate::decision) struct Measured {
    pub(in crate::decision) lowest: Option<(String, f64)>,
    blocker: Option<String>,
}

impl Measured {
    fn describe(&self) -> String {
        match (&self.lowest, &self.blocker) {
            (Some((node, e)), _) => format!("lowest measured efficiency {e:.2} on {node}"),
            (None, Some(b)) => b.clone(),
            (None, None) => "no measurement".to_string(),
        }
    }

    fn of(nodes: &mut dyn Iterator<Item = &NodeInfo>) -> Measured {
        let mut out = Measured::default();
        for node in nodes {
            let efficiency = node.parsed_report().and_then(|r| r.selftest.efficiency);
            if node.parsed_report().is_none() {
                out.blocker
                    .get_or_insert_with(|| format!("node {} has no readable report", node.name));
            }
            if let Some(conflict) = node.overlap_conflict() {
                out.blocker
                    .get_or_insert_with(|| format!("node {}: {conflict}", node.name));
            }
            match node.overlap_verdict() {
                OverlapVerdict::Verified => {}
                OverlapVerdict::Failed => {
                    out.blocker.get_or_insert_with(|| match efficiency {
                        Some(e) => format!(
                            "the self-test failed on node {} (efficiency {e:.2})",
                            node.name
                        ),
                        None => format!("the self-test failed on node {}", node.name),
                    });
                }
                OverlapVerdict::Untested => {
                    out.blocker.get_or_insert_with(|| {
                        format!("node {} has not run the overlap self-test", node.name)
                    });
                }
            }
            if let Some(e) = efficiency
                && out.lowest.as_ref().is_none_or(|(_, low)| e < *low)
            {
                out.lowest = Some((node.name.clone(), e));
            }
        }
        out
    }
}

/// Overlap on or off, the lowest efficiency measured on the chosen nodes, and why.
pub(in crate::decision) fn resolve_overlap(
    job: &JobRequest,
    profile: &OffloadProfileSpec,
    placement: &ModeAndClass,
) -> (bool, Option<f64>, Why) {
    let (requested, source) = effective(job.offload.overlap, profile.overlap, OverlapSetting::Auto);
    let measured = placement
        .chosen
        .map(|c| (*c.fact(Measured::of)).clone())
        .unwrap_or_default();
    let efficiency = measured.lowest.as_ref().map(|(_, e)| *e);
    if placement.mode == OffloadMode::Disabled {
        return (
            false,
            efficiency,
            Why::new(ReasonCode::NothingOffloaded, "off: offload is disabled"),
        );
    }
    let (on, why) = match requested {
        OverlapSetting::Disabled => (
            false,
            Why::new(
                ReasonCode::OverlapRequested,
                format!("off: disabled by {source}"),
            ),
        ),
        OverlapSetting::Enabled => (
            true,
            Why::new(
                ReasonCode::OverlapRequested,
                format!("on: enabled by {source}; {}", measured.describe()),
            ),
        ),
        OverlapSetting::Auto => {
            let threshold = profile.min_overlap_efficiency;
            match (&measured.blocker, measured.lowest.as_ref()) {
                (Some(blocker), _) => (
                    false,
                    Why::new(ReasonCode::OverlapNotVerified, format!("off: {blocker}")),
                ),
                (None, Some((node, e))) if *e >= threshold => (
                    true,
                    Why::new(
                        ReasonCode::OverlapVerified,
                        format!(
                            "on: self-test verified overlap on every chosen node, lowest efficiency {e:.2} on {node} (minimum {threshold:.2})"
                        ),
                    ),
                ),
                (None, Some((node, e))) => (
                    false,
                    Why::new(
                        ReasonCode::OverlapBelowMinimum,
                        format!(
                            "off: self-test measured efficiency {e:.2} on {node}, below the profile's minimum {threshold:.2}"
                        ),
                    ),
                ),
                (None, None) => (
                    false,
                    Why::new(
                        ReasonCode::OverlapNotVerified,
                        "off: no chosen node has an overlap measurement",
                    ),
                ),
            }
        }
    };
    (on, efficiency, why)
}
