//! Which kernels a search runs on a device, decided from the base's shape
//! and the search's parameters before a row or query is looked at. One rule
//! for the router (is this configuration linked yet? [`Searcher`]), the
//! CLI's plan line and [`GpuSearcher::search`] (its checks before the
//! upload, and what it loads for a search without queries). There a bad
//! `FRAGLINK_GPU_KNN` or `FRAGLINK_KNN_VARIANT` is an error even where
//! special rows or queries would have sent the index to the scan.
//!
//! The order is the index's ([`GpuIndex::search`]): the tensor-core path
//! where `FRAGLINK_GPU_KNN` allows it and a variant serves the search
//! (`FRAGLINK_KNN_VARIANT` names one), else the scan, else, beyond the
//! scan's capacities, the two-pass select. A resident index, which knows the
//! rows and queries, may still leave the tensor-core path for the scan or
//! the select (only special queries; special rows it did not copy aside, or
//! more of them allowed than the scan's 256 with `k` beyond it), or add to it (special rows: the candidate kernel's bitset
//! variant and the scan over those rows; special queries among others: the
//! scan or the select for them); such a search links those kernels itself.
//!
//! [`Searcher`]: super::route::Searcher
//! [`GpuSearcher::search`]: super::gpu::GpuSearcher::search
//! [`GpuIndex::search`]: super::index::GpuIndex::search

use crate::link::Planner;

use super::gpu::{beyond_scan, GpuSearchError, SCAN_BLOCK};
use super::knn::gpu::enabled_by_env;
use super::knn::plan::takes_rows;
use super::knn::{choose_named, choose_select, BeyondScan, KnnRequest};
use super::plan::ScanPlan;

/// The kernels one search runs.
#[derive(Debug, Clone)]
pub enum SearchKernels {
    /// The exact scan (one kernel).
    Scan(ScanPlan),
    /// The tensor-core candidates + exact re-rank, or the two-pass select.
    TwoPass(BeyondScan),
}

impl SearchKernels {
    /// The kernels of the search `r`, given its scan plan (`scan`: bad
    /// input is that planner's to name, and is returned as it is) and the
    /// tensor-core variant named, if any (an error naming it where it cannot
    /// serve the search). The tensor-core path is tried for a search with
    /// queries, and for any search beyond the scan; a `k` beyond every path
    /// is the scan planner's error.
    pub fn decide(
        r: &KnnRequest<'_>,
        scan: Result<ScanPlan, GpuSearchError>,
        variant: Option<&str>,
    ) -> Result<Self, GpuSearchError> {
        let scan = match scan {
            Err(e) if !beyond_scan(&e) => return Err(e),
            other => other,
        };
        // As the index: only rows the tensor-core path takes at all make
        // the two variables count (a bad value is an error only there).
        if (r.nq > 0 || scan.is_err())
            && takes_rows(r.device, r.dtype, r.n_rows, r.dim)
            && enabled_by_env()?
        {
            let named = choose_named(r, variant).map_err(|reason| GpuSearchError::KnnVariant {
                value: variant.unwrap_or_default().to_owned(),
                reason,
            })?;
            if let Some(p) = named {
                return Ok(SearchKernels::TwoPass(BeyondScan::Knn(p)));
            }
        }
        match scan {
            Ok(p) => Ok(SearchKernels::Scan(p)),
            Err(e) => match choose_select(r) {
                Some(p) => Ok(SearchKernels::TwoPass(BeyondScan::Select(p))),
                None => Err(e),
            },
        }
    }

    /// Every kernel in launch order, each with its block size.
    pub fn kernels(&self) -> Vec<(Planner, u32)> {
        match self {
            SearchKernels::Scan(p) => vec![(p.planner(), SCAN_BLOCK)],
            SearchKernels::TwoPass(b) => b.kernels().into(),
        }
    }

    /// Every fragment the kernels link, the first kernel's first.
    pub fn fragment_names(&self) -> Vec<&'static str> {
        match self {
            SearchKernels::Scan(p) => p.fragment_names(),
            SearchKernels::TwoPass(b) => b.fragment_names(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::Arch;
    use crate::search::knn::plan::SharedMemory;
    use crate::search::plan::plan;
    use crate::search::{DType, Metric};

    fn request(dtype: DType, dim: usize, nq: usize, k: usize) -> KnnRequest<'static> {
        KnnRequest {
            device: Arch::sm(90),
            shared: SharedMemory::H100,
            dtype,
            metric: Metric::L2,
            filter: "none",
            n_rows: 100_000,
            dim,
            nq,
            k,
        }
    }

    fn decide(r: &KnnRequest<'_>, variant: Option<&str>) -> Result<SearchKernels, GpuSearchError> {
        let scan = plan(r.dtype, r.metric, r.filter, r.n_rows, r.dim, r.k).map_err(Into::into);
        SearchKernels::decide(r, scan, variant)
    }

    fn first(k: &SearchKernels) -> &'static str {
        k.fragment_names()[0]
    }

    #[test]
    fn the_index_order_tensor_cores_then_scan_then_select() {
        // Queries and a tensor-core shape: the candidate pair.
        let knn = decide(&request(DType::F32, 128, 100, 10), None).unwrap();
        assert!(first(&knn).starts_with("knn_tile_f32_"), "{knn:?}");
        assert_eq!(knn.kernels().len(), 2);
        assert_eq!(knn.fragment_names().len(), 4);
        // No queries: the scan, as a search without queries loads it.
        let scan = decide(&request(DType::F32, 128, 0, 10), None).unwrap();
        assert!(first(&scan).starts_with("scan_f32_"), "{scan:?}");
        assert_eq!(scan.kernels().len(), 1);
        assert_eq!(scan.kernels()[0].1, SCAN_BLOCK);
        // Beyond the scan without queries: still a two-kernel path.
        let beyond = decide(&request(DType::F32, 128, 0, 1000), None).unwrap();
        assert!(matches!(beyond, SearchKernels::TwoPass(_)), "{beyond:?}");
    }

    #[test]
    fn bad_input_and_bad_names_are_errors_naming_them() {
        // The scan planner's error for bad input comes back as it is,
        // before any other path is asked.
        let bad = Err(crate::search::SearchError::InvalidK { k: 0 }.into());
        let e = SearchKernels::decide(&request(DType::F32, 128, 10, 0), bad, None).unwrap_err();
        assert!(
            matches!(
                e,
                GpuSearchError::Search(crate::search::SearchError::InvalidK { k: 0 })
            ),
            "{e}"
        );
        let e = decide(&request(DType::F32, 128, 10, 10), Some("knn_tile_nope")).unwrap_err();
        assert!(
            matches!(&e, GpuSearchError::KnnVariant { value, .. } if value == "knn_tile_nope"),
            "{e}"
        );
    }
}
