//! What a job's own failures teach: its GPU and host figures raised past each configuration
//! that ran out of memory.

/// Multipliers on the estimates, from configurations of the job that ran out of memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Corrections {
    /// On every GPU figure.
    pub gpu: f64,
    /// On every host figure.
    pub host: f64,
}

impl Default for Corrections {
    fn default() -> Self {
        Corrections {
            gpu: 1.0,
            host: 1.0,
        }
    }
}

/// Margin over what a failed configuration had when its estimate is raised past it (the VPA
/// bumps host memory by 20 % after an OOM; a GPU figure is known more closely).
pub const GPU_FAILURE_MARGIN: f64 = 1.05;

/// Host: at least this much more after an out-of-memory kill (as the VPA's bump).
pub const HOST_FAILURE_MARGIN: f64 = 1.2;

/// Host: and at least this many bytes more (the VPA's 100 MiB).
pub const HOST_FAILURE_MIN_BYTES: f64 = 100.0 * 1024.0 * 1024.0;

impl Corrections {
    /// From the failures, oldest first: each failed configuration needed more than it had, so
    /// the figures are raised until its estimate is past that (by the margin). Each recorded
    /// estimate was made with the corrections of the failures before it, so they compound.
    ///
    /// A GPU failure with the allocator's figures is raised to what it needed (allocated plus
    /// asked) by the margin; without them, to the GPU it had. A host failure is raised as the
    /// VPA raises a request after an OOM kill, `max(+20 %, +100 MiB)` over what the pod had
    /// (its limit, else its estimate), and never past the node's share it had (the bump that
    /// would not fit anywhere teaches nothing).
    pub fn from_failures(failures: &[offload_api::v1alpha1::MemoryFailure]) -> Corrections {
        use offload_api::v1alpha1::MemoryKind;
        let mut c = Corrections::default();
        #[allow(clippy::cast_precision_loss)]
        let bytes = |v: Option<i64>| v.filter(|b| *b > 0).map(|b| b as f64);
        for f in failures {
            // Not sized when it failed (a job without hints on its offload ladder): there is
            // no estimate to raise; the ladder, or the size its runs show, moves on.
            let Some(estimate) = bytes(f.estimate_bytes) else {
                continue;
            };
            let budget = bytes(f.budget_bytes);
            let factor = match f.kind {
                MemoryKind::Gpu => {
                    let needed = bytes(f.needed_bytes).or(budget).unwrap_or(estimate);
                    (needed / estimate).max(1.0) * GPU_FAILURE_MARGIN
                }
                MemoryKind::Host => {
                    let limit = bytes(f.limit_bytes);
                    let had = limit.unwrap_or(estimate);
                    let mut target = (had * HOST_FAILURE_MARGIN).max(had + HOST_FAILURE_MIN_BYTES);
                    if limit.is_none()
                        && let Some(share) = budget
                    {
                        target = target.min(share.max(estimate));
                    }
                    (target / estimate).max(1.0)
                }
            };
            match f.kind {
                MemoryKind::Gpu => c.gpu = (c.gpu * factor).min(1e3),
                MemoryKind::Host => c.host = (c.host * factor).min(1e3),
            }
        }
        c
    }
}
