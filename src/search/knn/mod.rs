//! Exact k-NN on the GPU from tensor-core candidates (issue 10): the
//! `knn_tile` and `knn_rerank` fragment families (fragments/knn_tile.cuh),
//! which variant a search uses ([`plan`]), the bounds they rely on
//! ([`bounds`], the Rust twin of fragments/knn_bounds.cuh) and the
//! per-vector norms the host computes for them ([`norms`]).

pub mod bounds;
pub mod gpu;
pub mod norms;
pub mod plan;

pub use plan::{choose, choose_named, choose_variant, KnnPlan, KnnRequest, Precision, KNN_FAMILY};
