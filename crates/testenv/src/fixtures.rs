//! Recorded node reports (stand-ins for hardware that is not here) and an admission review.
//! `fixtures/README.md` says where each figure comes from.

use std::path::PathBuf;

/// Stand-in for a 1-GPU GH200 node (ATS, C2C on; 9 NUMA nodes in NUMA mode), assembled from
/// published GH200 figures: this project has no GH200.
pub const GH200_REFERENCE: &str = include_str!("../fixtures/node-report-gh200.json");
/// Reference reading of the GH200 node in NUMA mode with its memory model's witnesses (report
/// schema 3): not a measurement (see the fixtures' README).
pub const GH200_NUMA_REFERENCE: &str = include_str!("../fixtures/node-report-gh200-numa.json");
/// Reference reading of a GB200 compute node in CDMM mode (report schema 3): not a measurement
/// (see the fixtures' README).
pub const GB200_CDMM_REFERENCE: &str = include_str!("../fixtures/node-report-gb200-cdmm.json");
/// An H200 on an x86 PCIe Gen5 host (addressing mode none, C2C off), as read on the lent H200.
pub const H200_READING: &str = include_str!("../fixtures/node-report-h200.json");
/// Constructed report of an x86 PCIe GPU node with HMM where pinned allocation was refused, so
/// the pageable path was measured and overlap failed.
pub const HMM_UNPINNED: &str = include_str!("../fixtures/node-report-hmm-unpinned.json");
/// The AdmissionReview of one of `offload-bench scale`'s opted-in batch Jobs: the object as
/// kube-apiserver v1.36.3 holds it at admission (recorded), in the review's envelope.
pub const BATCH_JOB_REVIEW: &str = include_str!("../fixtures/admission-review-batch-job.json");

/// Path of a fixture file, e.g. for `offload-agent run --replay`.
pub fn path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(file)
}

/// The optimizer, offload and pinning flags of Megatron-core releases' argument parsers, by
/// version (read from `megatron/training/arguments.py` at each release tag; see the README).
pub const MEGATRON_OPTIMIZER_FLAGS: &str =
    include_str!("../fixtures/megatron-optimizer-flags.json");
