//! IVF-Flat: approximate k-NN over inverted lists, the index family cuVS built
//! JIT-LTO for.
//!
//! - [`kmeans`]: seeded k-means (k-means++ seeding, Lloyd iterations whose
//!   assignments are exact nearest-centroid searches by [`search_cpu`]).
//! - [`layout`]: cuVS's interleaved list layout (groups of 32 rows,
//!   interleaved by `veclen` elements) that a warp reads coalesced.
//! - [`build`]: the index ([`IvfIndex`]) from base vectors.
//! - [`scan`]: the multithreaded CPU search; [`reference`](mod@reference): its
//!   scalar oracle.
//! - [`file`](mod@file): the versioned, checksummed index file.
//!
//! # The search, defined (CPU and GPU alike)
//!
//! For a query `q` (widened to f32 for the coarse step) and `nprobe`
//! (clamped to `1..=nlist`):
//!
//! 1. **Probed lists**: the `nprobe` smallest keys `(d_c, list)` where `d_c` is
//!    the index metric's f32 in-order fold ([`distance`]) of `q` against the
//!    f32 centroid, a NaN `d_c` counting as `+inf`; ties go to the smaller list.
//!    This is exactly [`search_cpu`] with the centroids as the base (and the
//!    GPU's brute-force scan over them); [`coarse`] computes it with the
//!    scan's 32-lane folds.
//! 2. **Rows scanned**: every row of every probed list allowed by the filter
//!    (a bitset over the dataset ids). Padding rows of a 32-row group are never
//!    candidates.
//! 3. **Distance**: the brute-force scan's distance of the pair, by the same
//!    fold ([`distance`]: elements in dimension order, f32 fma for f32/f16, exact
//!    wrapping integer accumulators for i8/u8, finalised once), NaN → `+inf`.
//!    The interleaved layout changes where elements live, never the order they
//!    fold in.
//! 4. **Result**: the `k` smallest keys `(distance, id)` (IEEE comparison,
//!    ties to the smaller dataset id), ascending, padded with id `-1` and
//!    `+inf` when fewer than `k` rows were scanned. The post-process
//!    ([`PostProcess::Sqrt`] for l2sqrt) maps the selected distances afterwards;
//!    it never changes which rows are selected or their order.
//!
//! So with `nprobe = nlist` the result is the brute-force result bit for bit
//! ([`search_reference`](super::search_reference)), and for any `nprobe` it is the
//! brute-force result restricted to the probed rows.
//!
//! [`search_cpu`]: super::search_cpu
//! [`distance`]: super::distance

pub mod build;
pub mod coarse;
pub mod file;
pub mod gpu;
pub mod kmeans;
mod lanes;
pub mod layout;
pub mod reference;
pub mod scan;
mod topk;

use std::fmt;
use std::str::FromStr;

pub use build::{build_index, IvfBuildParams, IvfIndex, ListStore};
pub use coarse::probe_lists;
pub use file::{index_from_bytes, read_index, write_index, IndexFileError};
pub use layout::{default_veclen, veclen_for, GROUP};
pub use reference::search_ivf_reference;
pub use scan::{search_ivf, IvfSearchParams};

use super::{DType, Metric, SearchError};

/// `nprobe` when none is given: enough lists for a recall around 0.9 on
/// clustered data with `nlist ≈ √n`–`4√n`, cheap enough to stay far from a
/// full scan (see BENCHMARKS.md, IVF-Flat).
pub const DEFAULT_NPROBE: usize = 16;

/// What is done to the selected distances (cuVS's `post_process` fragment):
/// `l2sqrt` is the l2 metric with [`PostProcess::Sqrt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PostProcess {
    #[default]
    Identity,
    /// `sqrt` of the squared l2 distance (correctly rounded; `+inf` stays `+inf`).
    Sqrt,
}

impl PostProcess {
    /// The `post_process` value of the fragment matrices.
    pub fn fragment_name(self) -> &'static str {
        match self {
            PostProcess::Identity => "identity",
            PostProcess::Sqrt => "sqrt",
        }
    }

    /// Applies the post-process to one selected distance.
    #[inline]
    pub fn apply(self, d: f32) -> f32 {
        match self {
            PostProcess::Identity => d,
            PostProcess::Sqrt => d.sqrt(),
        }
    }
}

/// A metric as the command line and the index file name it: the fold metric
/// plus its post-process (`l2 | l2sqrt | ip | cosine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MetricSpec {
    pub metric: Metric,
    pub post: PostProcess,
}

impl MetricSpec {
    pub const fn plain(metric: Metric) -> Self {
        MetricSpec {
            metric,
            post: PostProcess::Identity,
        }
    }
}

impl fmt::Display for MetricSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.metric, self.post) {
            (Metric::L2, PostProcess::Sqrt) => f.write_str("l2sqrt"),
            (Metric::InnerProduct, _) => f.write_str("ip"),
            (m, _) => write!(f, "{m}"),
        }
    }
}

impl FromStr for MetricSpec {
    type Err = SearchError;
    /// `l2`, `l2sqrt`, `ip` / `inner_product`, `cosine` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("l2sqrt") {
            return Ok(MetricSpec {
                metric: Metric::L2,
                post: PostProcess::Sqrt,
            });
        }
        s.parse::<Metric>()
            .map(MetricSpec::plain)
            .map_err(|_| SearchError::UnknownMetric {
                name: s.to_string(),
                expected: "l2, l2sqrt, ip, inner_product or cosine",
            })
    }
}

/// Why an IVF index could not be built or searched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IvfError {
    #[error("nlist must be at least 1 (got {nlist})")]
    NlistZero { nlist: usize },
    #[error(
        "nlist {nlist} exceeds the {n} base rows: every list needs a centroid drawn from the data"
    )]
    NlistTooLarge { nlist: usize, n: usize },
    #[error("the base has no rows or dimension 0 ({rows} × {dim})")]
    EmptyBase { rows: usize, dim: usize },
    #[error("veclen {veclen} {}", if layout::veclen_allowed(*.veclen) {
        format!("does not divide dim {}", .dim)
    } else {
        "is not 1, 2, 4, 8 or 16".to_string()
    })]
    BadVeclen { veclen: usize, dim: usize },
    #[error("the scan entry reads veclen {entry} lists, the index stores veclen {index}")]
    VeclenMismatch { entry: usize, index: usize },
    #[error("nprobe must be at least 1 (got {nprobe})")]
    NprobeZero { nprobe: usize },
    #[error("the index holds {index} vectors but the queries are {queries}")]
    DTypeMismatch { index: DType, queries: DType },
    #[error(transparent)]
    Search(#[from] SearchError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_spec_round_trips() {
        for s in ["l2", "l2sqrt", "ip", "cosine"] {
            let m: MetricSpec = s.parse().unwrap();
            assert_eq!(m.to_string(), s);
        }
        assert_eq!(
            "inner_product".parse::<MetricSpec>().unwrap().metric,
            Metric::InnerProduct
        );
        assert!("l1".parse::<MetricSpec>().is_err());
        assert_eq!(PostProcess::Sqrt.apply(4.0), 2.0);
        assert_eq!(PostProcess::Sqrt.apply(f32::INFINITY), f32::INFINITY);
    }
}
