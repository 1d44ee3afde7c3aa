//! The two-kernel GPU paths: the tensor-core candidates + exact re-rank
//! and the two-pass select. Which one a search takes (if either) is
//! [`SearchKernels::decide`](crate::search::kernels::SearchKernels::decide)'s
//! rule.

use crate::link::Planner;

use super::{KnnPlan, SelectPlan};

/// A two-kernel path: the tensor-core pair, or the two-pass select.
#[derive(Debug, Clone)]
pub enum BeyondScan {
    Knn(KnnPlan),
    Select(SelectPlan),
}

impl BeyondScan {
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
