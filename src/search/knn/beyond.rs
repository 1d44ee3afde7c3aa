//! The GPU path of a search whose `k` is beyond the scan's capacities,
//! decided before the rows and queries are looked at: the tensor-core
//! path where it is enabled and a variant fits ([`tensor_cores`]), else the
//! two-pass select, else none (the CPU path). One rule for
//! [`GpuSearcher::search`](crate::search::gpu::GpuSearcher::search) and the
//! CLI's plan line (which asks [`tensor_cores`] first for any `k`, as the
//! index does);
//! a resident index also knows the rows and may still leave the tensor-core
//! path for the select (a special row or query).

use crate::link::Planner;
use crate::search::gpu::GpuSearchError;

use super::{choose, choose_select, KnnPlan, KnnRequest, SelectPlan};

/// Which two-kernel path serves a search beyond the scan.
#[derive(Debug, Clone)]
pub enum BeyondScan {
    Knn(KnnPlan),
    Select(SelectPlan),
}

/// The tensor-core plan for `r` where `FRAGLINK_GPU_KNN` allows that path
/// and a variant of the device fits.
pub fn tensor_cores(r: &KnnRequest<'_>) -> Result<Option<KnnPlan>, GpuSearchError> {
    Ok(if super::gpu::enabled_by_env()? {
        choose(r)
    } else {
        None
    })
}

impl BeyondScan {
    /// The path for `r`: [`tensor_cores`] first, then the select; `None`
    /// where neither serves it.
    pub fn plan(r: &KnnRequest<'_>) -> Result<Option<Self>, GpuSearchError> {
        Ok(match tensor_cores(r)? {
            Some(p) => Some(BeyondScan::Knn(p)),
            None => choose_select(r).map(BeyondScan::Select),
        })
    }

    /// Both kernels in launch order, each with its block size.
    pub fn kernels(&self) -> [(Planner, u32); 2] {
        match self {
            BeyondScan::Knn(p) => p.kernels(),
            BeyondScan::Select(p) => p.kernels(),
        }
    }

    /// Every fragment the two kernels link, the first kernel's first.
    pub fn fragment_names(&self) -> Vec<&'static str> {
        match self {
            BeyondScan::Knn(p) => p.fragment_names(),
            BeyondScan::Select(p) => p.fragment_names(),
        }
    }
}
