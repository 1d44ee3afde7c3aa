//! The run-time side: plan a link of embedded (and run-time) fragments, link
//! with nvJitLink, check the cubin, read its resource usage, and cache the
//! result in memory (single flight per key) and on disk.
//!
//! ```no_run
//! use fraglink::fragments::{F32, L2, NoneFilter, U32, FilterFragment, MetricFragment, ScanFragment};
//! use fraglink::link::Planner;
//! use fraglink::build::Arch;
//! let linked = Planner::new("scan_f32_u32_v4_k128")
//!     .add::<ScanFragment<F32, U32, 4, 128>>()
//!     .add::<MetricFragment<L2, F32>>()
//!     .add::<FilterFragment<NoneFilter, U32>>()
//!     .link_for(Arch::sm(90))?;
//! println!("{} registers, {:?}", linked.kernel.metadata.registers, linked.source);
//! // One link for several kernels of the same fragments:
//! let both = Planner::new("scan_f32_u32_v4_k128")
//!     .with_entry("scan_f32_u32_v4_k128")
//!     .add::<ScanFragment<F32, U32, 4, 128>>()
//!     .add::<MetricFragment<L2, F32>>()
//!     .add::<FilterFragment<NoneFilter, U32>>()
//!     .link_for(Arch::sm(90))?;
//! assert_eq!(both.kernel.kernels.len(), 1, "entries are deduplicated");
//! # Ok::<(), fraglink::link::LinkError>(())
//! ```

pub mod cache;
pub mod check;
pub mod demangle;
pub mod disk;
pub mod key;
pub mod linker;
pub(crate) mod memo;
pub mod metadata;
pub mod planner;
pub mod prelink;
pub mod profile;
pub mod runtime;
pub mod tiered;

use std::sync::Arc;

pub use cache::{CacheStats, Source};
pub use key::LinkKey;
pub use linker::{FastCompile, LinkOptions, Linker};
pub use metadata::KernelMetadata;
pub use planner::{PlanSettings, Planner};
pub use runtime::{DiskPayload, LinkRuntime, Linked, LinkedKernel, RuntimeConfig};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(transparent)]
    Sys(#[from] crate::sys::SysError),
    #[error("CUDA headers for run-time NVRTC (cuda_fp16.h, CCCL) not found; set CUDA_HOME to a CUDA toolkit. Tried: {tried}")]
    HeadersNotFound { tried: String },
    #[error("unknown fragment `{name}`; nearest: {}", nearest.join(", "))]
    UnknownFragment { name: String, nearest: Vec<String> },
    #[error("nvJitLink {nvjitlink} cannot link LTO-IR from NVRTC {nvrtc}: it needs the same major version and an equal or newer minor; set FRAGLINK_NVJITLINK_PATH to a matching libnvJitLink")]
    VersionMismatch { nvjitlink: String, nvrtc: String },
    #[error("fragment `{fragment}` holds LTO-IR for {built}, none of which links for {arch}")]
    ArchNotCovered {
        fragment: String,
        arch: String,
        built: String,
    },
    #[error("plan for entry `{entry}` has no fragments")]
    EmptyPlan { entry: String },
    #[error("fragment `{name}` is in the plan twice; add each fragment once")]
    DuplicateFragment { name: String },
    #[error("the plan names no entry: give the kernel(s) to link (Planner::new, Planner::with_entry, Planner::kernel; `--entry` in the CLI)")]
    NoEntry,
    #[error("entry {entry:?} is not a symbol name (empty, or with whitespace)")]
    EmptyEntry { entry: String },
    #[error("entry `{entry}` is in none of the fragments ({fragments}) as built for {target}; nearest kernels: {}", if nearest.is_empty() { "none".to_string() } else { nearest.join(", ") })]
    UnknownEntry {
        entry: String,
        target: String,
        fragments: String,
        nearest: Vec<String>,
    },
    #[error("entry {entry} is not in fragment `{fragment}`'s {chosen} LTO-IR, which is what links for {target}, but is in its {present_in} IR: a `#if __CUDA_ARCH__` guard removed it. Build the IR it needs (e.g. FRAGLINK_ARCHS / Builder::archs with compute_80) or link for an arch that has it")]
    EntryGuarded {
        entry: String,
        fragment: String,
        target: String,
        chosen: String,
        present_in: String,
    },
    #[error("{symbol} is defined by both fragment `{first}` and fragment `{second}`: one link can hold one definition (make it `inline`/`static`, or link only one of them)")]
    DuplicateDefinition {
        symbol: String,
        first: String,
        second: String,
    },
    #[error("fragment `{fragment}` has no name expression `{expression}`; recorded: {}", if known.is_empty() { "none (give the family a Family::name_expression)".to_string() } else { known.join(", ") })]
    UnknownExpression {
        fragment: String,
        expression: String,
        known: Vec<String>,
    },
    #[error("linked cubin for `{entry}` failed its check: {source}")]
    Cubin {
        entry: String,
        source: metadata::CubinError,
    },
    #[error(transparent)]
    Metadata(#[from] metadata::MetadataError),
    #[error("no GPU to link for: {reason}; pass an explicit architecture (e.g. sm_90)")]
    NoDevice { reason: String },
    #[error("disk cache: {0}")]
    Disk(#[from] disk::DiskCacheError),
    /// An environment variable the link runtime consulted has a value it
    /// cannot use (the disk cache's own variables give
    /// [`Disk`](Self::Disk)([`InvalidEnv`](disk::DiskCacheError::InvalidEnv))).
    #[error("invalid value {value:?} for {var}: {reason}")]
    InvalidEnv {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// A link started in the background ended without a result (it
    /// panicked); its quick link serves meanwhile.
    #[error("the optimised link of `{entry}` for {arch} ended without a result: {reason}")]
    Background {
        entry: String,
        arch: String,
        reason: String,
    },
    #[error(transparent)]
    Shared(Arc<LinkError>),
}

impl LinkError {
    /// Unwraps an error shared by the waiters of one failed link.
    pub fn from_shared(e: Arc<LinkError>) -> LinkError {
        Arc::try_unwrap(e).unwrap_or_else(LinkError::Shared)
    }

    /// The innermost error (through `Shared`).
    pub fn root(&self) -> &LinkError {
        match self {
            LinkError::Shared(e) => e.root(),
            e => e,
        }
    }
}
