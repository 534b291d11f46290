//! What the operator's reporter of PyTorch's figures writes at each training process's exit
//! (`src/render/memory_report.py`, where the profile's `reportAllocatorPeaks` asks for it), read
//! back from a termination message or a report file: the allocator's peaks and the median time
//! of the process's training iterations.

/// What each line of the operator's reporter of PyTorch's figures starts with: one line per
/// process, at its exit, `offload.dev/allocator rank=R allocated=BYTES reserved=BYTES`, then
/// `step_ms=MS steps=N` where the process timed at least one training iteration after its first.
pub const ALLOCATOR_MARK: &str = "offload.dev/allocator";

/// Longest training iteration a report may give, milliseconds (a day); a longer one is not read.
pub const MAX_STEP_MS: f64 = 86_400_000.0;

/// Whether `seconds` can be a training step's time: positive, finite, at most a day
/// ([`MAX_STEP_MS`]).
pub fn plausible_step(seconds: f64) -> bool {
    seconds.is_finite() && seconds > 0.0 && seconds * 1000.0 <= MAX_STEP_MS
}

/// Fewest iterations a process must have timed (after its first) for its step to be read: the
/// median of a few more is still warming up (an H100's 4B decoder stepped in 2.2–2.9 s over
/// three steps and 1.5 s over five).
pub const MIN_TIMED_STEPS: u32 = 5;

/// What the reporter's lines of one run say, over all its processes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocatorReport {
    /// The highest `torch.cuda.max_memory_allocated()`, bytes.
    pub allocated: u64,
    /// The highest `torch.cuda.max_memory_reserved()`, bytes.
    pub reserved: u64,
    /// The slowest process's median training iteration (the job steps at its slowest rank's
    /// pace), seconds; `None` where no process timed [`MIN_TIMED_STEPS`].
    pub step_seconds: Option<f64>,
}

/// The reporter's lines in `text` (a termination message, a report file), read together;
/// `None` where it holds none that read. A figure out of bounds drops its line (a step time
/// alone, or one timed over fewer than [`MIN_TIMED_STEPS`] iterations: the memory figures
/// stay).
pub fn allocator_report(text: &str) -> Option<AllocatorReport> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(ALLOCATOR_MARK))
        .filter_map(|rest| {
            let field = |name: &str| rest.split_whitespace().find_map(|w| w.strip_prefix(name));
            let bytes = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
            let timed = field("steps=").and_then(|v| v.parse::<u32>().ok());
            let step_ms = field("step_ms=")
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|ms| plausible_step(ms / 1000.0))
                .filter(|_| timed.is_some_and(|n| n >= MIN_TIMED_STEPS));
            Some(AllocatorReport {
                allocated: bytes("allocated=")?,
                reserved: bytes("reserved=").unwrap_or(0),
                step_seconds: step_ms.map(|ms| ms / 1000.0),
            })
        })
        .filter(|r| r.allocated > 0 && r.allocated < 1 << 50 && r.reserved < 1 << 50)
        .reduce(AllocatorReport::together)
}

impl AllocatorReport {
    /// Two processes' (or pods') reports as one job's: the highest memory figures, the slowest
    /// step.
    #[must_use]
    pub fn together(self, other: AllocatorReport) -> AllocatorReport {
        AllocatorReport {
            allocated: self.allocated.max(other.allocated),
            reserved: self.reserved.max(other.reserved),
            step_seconds: match (self.step_seconds, other.step_seconds) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
        }
    }
}
