//! Exact k-NN on the GPU from tensor-core candidates (issue 10): the
//! `knn_tile` and `knn_rerank` fragment families (fragments/knn_tile.cuh),
//! which variant a search uses ([`plan`]), the bounds they rely on
//! ([`bounds`], the Rust twin of fragments/knn_bounds.cuh) and the
//! per-vector norms the host computes for them ([`norms`]), the f16
//! copies of f32 vectors the f16copy precision reads ([`f16copy`]), the
//! rows the bounds do not cover and the exact scan takes instead
//! ([`special`]); and the
//! two-pass select of a `k` beyond their capacities ([`select`]: the
//! `knn_dist` and `knn_select` families, fragments/knn_select.cuh), and
//! which of the two serves a search beyond the scan ([`beyond`]).

pub mod beyond;
pub mod bounds;
pub mod f16copy;
pub mod gpu;
pub mod norms;
pub mod plan;
pub mod select;
pub mod special;

pub use beyond::BeyondScan;
pub use plan::{
    choose, choose_fallback, choose_named, choose_variant, KnnPlan, KnnRequest, Precision, Staging,
    KNN_FAMILY,
};
pub use select::{choose_select, SelectPlan, SELECT_FAMILY};
