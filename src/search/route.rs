//! Routing a search to the GPU or the CPU: the cost model decides per call
//! and says why; `Device::Cpu` / `Device::Gpu` override it. A GPU failure
//! (out of memory after halving the batch, or anything else) falls back to
//! the CPU path, which gives the same results.

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use crate::cost::{
    run_with_fallback, AdaptiveCostModel, BatchPolicy, CostParams, GpuCostModel, GpuParams, OpDesc,
    RecoverableError, Target,
};
use crate::gpu::GpuContext;

use super::gpu::{GpuSearchError, GpuSearcher};
use super::{cpu::search_cpu, validate, Neighbors, SearchError, SearchParams, Vectors};

/// Where searches may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The cost model decides.
    Auto,
    Cpu,
    Gpu,
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            other => Err(format!(
                "unknown device `{other}` (expected auto, cpu or gpu)"
            )),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("--device gpu was asked for, but no GPU can be used: {reason}")]
    GpuUnavailable { reason: String },
    #[error(transparent)]
    Search(#[from] SearchError),
}

impl RecoverableError for GpuSearchError {
    fn is_out_of_memory(&self) -> bool {
        GpuSearchError::is_out_of_memory(self)
    }
}

/// A search's result and how it was obtained.
#[derive(Debug)]
pub struct Routed {
    pub neighbors: Neighbors,
    pub target: Target,
    /// Why this target (the cost model's reason, an override, or a fallback).
    pub reason: String,
    pub fell_back: bool,
    /// Wall time of the search itself.
    pub seconds: f64,
}

/// Searches on the best target.
pub struct Searcher {
    device: Device,
    model: AdaptiveCostModel,
    gpu: Option<GpuSearcher>,
}

impl Searcher {
    /// Probes the GPU (never panics without a driver). Asking for
    /// `Device::Gpu` without one is an error.
    pub fn new(device: Device) -> Result<Self, RouteError> {
        let probe = match device {
            Device::Cpu => Err("the CPU was asked for".to_string()),
            _ => GpuContext::default()
                .and_then(GpuSearcher::new)
                .map_err(|e| e.to_string()),
        };
        let (gpu, params) = match probe {
            Ok(g) => (
                Some(g),
                CostParams::default().with_gpu(GpuParams::default()),
            ),
            Err(reason) if device == Device::Gpu => {
                return Err(RouteError::GpuUnavailable { reason })
            }
            Err(reason) => (None, CostParams::default().without_gpu(reason)),
        };
        let params = CostParams {
            force: match device {
                Device::Cpu => Some(Target::Cpu),
                Device::Gpu => Some(Target::Gpu),
                Device::Auto => None,
            },
            ..params
        };
        Ok(Searcher {
            device,
            model: AdaptiveCostModel::new(params),
            gpu,
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn gpu(&self) -> Option<&GpuSearcher> {
        self.gpu.as_ref()
    }

    pub fn model(&self) -> &AdaptiveCostModel {
        &self.model
    }

    /// Exact k-NN of `queries` in `base`, on the target the model picks.
    pub fn search(
        &self,
        base: &Vectors,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<Routed, RouteError> {
        validate(base, queries, params)?;
        let op = OpDesc::knn(
            base.rows(),
            base.dim(),
            queries.rows(),
            params.k,
            base.dtype(),
            false,
        );
        let choice = self.model.choose(&op);
        let started = Instant::now();
        let nq = queries.rows();
        let result = run_with_fallback(
            choice.target,
            &choice.reason,
            BatchPolicy::new(nq.max(1), 1),
            |batch| self.gpu_batched(base, queries, params, batch),
            || search_cpu(base, queries, params),
        );
        let seconds = started.elapsed().as_secs_f64();
        self.model
            .learn(&op, result.target_used, result.final_elapsed());
        Ok(Routed {
            neighbors: result.value?,
            target: result.target_used,
            reason: result.reason,
            fell_back: result.fell_back,
            seconds,
        })
    }

    /// The GPU path over query batches of `batch` rows.
    fn gpu_batched(
        &self,
        base: &Vectors,
        queries: &Vectors,
        params: &SearchParams,
        batch: usize,
    ) -> Result<Result<Neighbors, SearchError>, GpuSearchError> {
        let gpu = self.gpu.as_ref().ok_or_else(|| {
            GpuSearchError::Gpu(crate::gpu::GpuError::DeviceNotAvailable {
                reason: "no GPU searcher".into(),
            })
        })?;
        let nq = queries.rows();
        if batch >= nq {
            return Ok(Ok(gpu.search(base, queries, params)?.neighbors));
        }
        let mut out = Neighbors {
            nq,
            k: params.k,
            ids: Vec::with_capacity(nq * params.k),
            distances: Vec::with_capacity(nq * params.k),
        };
        let mut start = 0;
        while start < nq {
            let end = (start + batch).min(nq);
            let part = queries.slice_rows(start, end);
            let r = gpu.search(base, &part, params)?.neighbors;
            out.ids.extend(r.ids);
            out.distances.extend(r.distances);
            start = end;
        }
        Ok(Ok(out))
    }
}

impl Vectors {
    /// Rows `start..end` as new vectors (query batches).
    pub fn slice_rows(&self, start: usize, end: usize) -> Vectors {
        fn cut<T: Clone>(m: &super::Matrix<T>, start: usize, end: usize) -> super::Matrix<T> {
            let d = m.dim();
            super::Matrix::new(m.data()[start * d..end * d].to_vec(), end - start, d)
                .expect("a row range of a valid matrix is valid")
        }
        match self {
            Vectors::F32(m) => Vectors::F32(cut(m, start, end)),
            Vectors::F16(m) => Vectors::F16(cut(m, start, end)),
            Vectors::I8(m) => Vectors::I8(cut(m, start, end)),
            Vectors::U8(m) => Vectors::U8(cut(m, start, end)),
        }
    }
}
