//! The GPU path: the planner links the scan, metric and filter fragments of
//! the query's configuration for the device, the launcher runs the scan
//! (contract in fragments/README.md), results come back in the CPU path's
//! format. Thin on purpose: what cannot run here (no GPU) stays small, and
//! `tests/search_gpu.rs` compares it with the CPU path on a GPU machine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gpu::{
    GpuContext, GpuError, KernelArgs, KernelResources, LaunchConfig, Launcher, MemoryPool,
    PoolConfig, Transfer,
};
use crate::link::{LinkError, LinkKey, Linked};

use super::plan::{plan, PlanError, ScanPlan};
use super::{validate, Filter, Neighbors, SearchError, SearchParams, Vectors};

/// Threads per block of every scan kernel (`__launch_bounds__(128)`).
pub const SCAN_BLOCK: u32 = 128;

#[derive(Debug, thiserror::Error)]
pub enum GpuSearchError {
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

impl GpuSearchError {
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, GpuSearchError::Gpu(GpuError::OutOfMemory { .. }))
    }
}

/// One GPU search's results and what it took.
#[derive(Debug)]
pub struct GpuSearch {
    pub neighbors: Neighbors,
    pub plan: ScanPlan,
    pub linked: Linked,
    /// Upload, launch, download.
    pub elapsed: Duration,
}

/// A device with its pool, transfer engine and loaded scan kernels.
pub struct GpuSearcher {
    ctx: GpuContext,
    pool: MemoryPool,
    transfer: Transfer,
    launchers: Mutex<HashMap<LinkKey, Arc<Launcher>>>,
}

impl GpuSearcher {
    pub fn new(ctx: GpuContext) -> Result<Self, GpuError> {
        let pool = MemoryPool::cuda(&ctx, PoolConfig::default())?;
        let transfer = Transfer::new(&ctx);
        Ok(GpuSearcher {
            ctx,
            pool,
            transfer,
            launchers: Mutex::new(HashMap::new()),
        })
    }

    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    fn launcher(&self, linked: &Linked) -> Result<Arc<Launcher>, GpuError> {
        let mut map = self.launchers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = map.get(&linked.key) {
            return Ok(l.clone());
        }
        let m = &linked.kernel.metadata;
        let l = Arc::new(Launcher::load(
            &self.ctx,
            &linked.kernel.cubin,
            &linked.kernel.entry,
            KernelResources {
                registers: m.registers,
                static_shared_bytes: m.shared_bytes.unwrap_or(0),
                max_threads_per_block: Some(SCAN_BLOCK),
            },
        )?);
        map.insert(linked.key, l.clone());
        Ok(l)
    }

    /// Exact k-NN of `queries` in `base` on the device.
    pub fn search(
        &self,
        base: &Vectors,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<GpuSearch, GpuSearchError> {
        validate(base, queries, params)?;
        let started = Instant::now();
        let p = plan(
            base.dtype(),
            params.metric,
            params.filter.fragment_name(),
            base.rows(),
            base.dim(),
            params.k,
        )?;
        let linked = p.planner().link_for(self.ctx.arch())?;
        let launcher = self.launcher(&linked)?;
        let (nq, k) = (queries.rows(), params.k);
        let mut neighbors = Neighbors {
            nq,
            k,
            ids: Vec::new(),
            distances: Vec::new(),
        };
        if nq == 0 {
            return Ok(GpuSearch {
                neighbors,
                plan: p,
                linked,
                elapsed: started.elapsed(),
            });
        }
        let t = &self.transfer;
        let d_base = upload_vectors(t, &self.pool, base)?;
        let d_queries = upload_vectors(t, &self.pool, queries)?;
        let d_bits = match &params.filter {
            Filter::None => None,
            Filter::Bitset(b) => Some(t.upload_new(&self.pool, &b.words)?),
        };
        let mut d_dists = self.pool.alloc::<f32>(nq * k)?;
        let grid = nq.min(i32::MAX as usize) as u32;
        let cfg = LaunchConfig::new((grid, 1, 1), (SCAN_BLOCK, 1, 1));
        let wide_ids = p.idx == "i64";
        let mut d_ids32 = if wide_ids {
            None
        } else {
            Some(self.pool.alloc::<u32>(nq * k)?)
        };
        let mut d_ids64 = if wide_ids {
            Some(self.pool.alloc::<i64>(nq * k)?)
        } else {
            None
        };
        {
            let mut args = KernelArgs::new();
            d_base.push(&mut args)?;
            d_queries.push(&mut args)?;
            match &d_bits {
                Some(b) => args.input(b)?,
                None => args.null_ptr(),
            };
            args.value(base.rows() as u64)
                .value(base.dim() as u32)
                .value(nq as u32)
                .value(k as u32);
            match (&mut d_ids32, &mut d_ids64) {
                (Some(ids), _) => args.output(ids)?,
                (_, Some(ids)) => args.output(ids)?,
                _ => unreachable!("one id buffer exists"),
            };
            args.output(&mut d_dists)?;
            // SAFETY: arguments in the order and types of the scan contract
            // (fragments/README.md); sizes are checked against the kernel's
            // parameter info by the launcher.
            unsafe { launcher.launch(&cfg, &mut args)? };
        }
        neighbors.distances = t.download_vec(&d_dists)?;
        neighbors.ids = match (&d_ids32, &d_ids64) {
            (Some(ids), _) => t
                .download_vec(ids)?
                .into_iter()
                .map(|i| {
                    if i == u32::MAX {
                        Neighbors::PAD_ID
                    } else {
                        i as i64
                    }
                })
                .collect(),
            (_, Some(ids)) => t.download_vec(ids)?,
            _ => unreachable!("one id buffer exists"),
        };
        Ok(GpuSearch {
            neighbors,
            plan: p,
            linked,
            elapsed: started.elapsed(),
        })
    }
}

/// Device copies of a [`Vectors`], typed by its dtype (f16 travels as its
/// bits: the kernel reads `__half`, which is 16 plain bits).
enum DeviceVectors {
    F32(crate::gpu::GpuBuffer<f32>),
    F16(crate::gpu::GpuBuffer<u16>),
    I8(crate::gpu::GpuBuffer<i8>),
    U8(crate::gpu::GpuBuffer<u8>),
}

impl DeviceVectors {
    fn push<'a>(&'a self, args: &mut KernelArgs<'a>) -> Result<(), GpuError> {
        match self {
            DeviceVectors::F32(b) => args.input(b)?,
            DeviceVectors::F16(b) => args.input(b)?,
            DeviceVectors::I8(b) => args.input(b)?,
            DeviceVectors::U8(b) => args.input(b)?,
        };
        Ok(())
    }
}

fn upload_vectors(t: &Transfer, pool: &MemoryPool, v: &Vectors) -> Result<DeviceVectors, GpuError> {
    Ok(match v {
        Vectors::F32(m) => DeviceVectors::F32(t.upload_new(pool, m.data())?),
        Vectors::F16(m) => {
            let bits: Vec<u16> = m.data().iter().map(|h| h.to_bits()).collect();
            DeviceVectors::F16(t.upload_new(pool, &bits)?)
        }
        Vectors::I8(m) => DeviceVectors::I8(t.upload_new(pool, m.data())?),
        Vectors::U8(m) => DeviceVectors::U8(t.upload_new(pool, m.data())?),
    })
}
