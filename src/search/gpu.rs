//! The GPU path: the planner links the scan, metric and filter fragments of
//! the query's configuration for the device, the launcher runs the scan
//! (contract in fragments/README.md), results come back in the CPU path's
//! format. Thin on purpose: what cannot run here (no GPU) stays small, and
//! `tests/search_gpu.rs` compares it with the CPU path on a GPU machine.
//!
//! [`GpuSearcher::upload`] puts base vectors on the device once
//! ([`GpuIndex`]); its searches move only the queries and the results.
//! [`GpuSearcher::search`] is the one-shot form (upload, search, drop).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gpu::launch::{ScanArgError, ScanContract};
use crate::gpu::{
    GpuBuffer, GpuContext, GpuError, GpuViewMut, KernelArgs, KernelResources, LaunchConfig,
    Launcher, MemoryPool, Transfer,
};
use crate::link::{LinkError, LinkKey, LinkRuntime, Linked, Planner};

use super::index::{GpuIndex, IndexShape};
use super::kernels::SearchKernels;
use super::knn::gpu::variant_by_env;
use super::knn::BeyondScan;
use super::plan::{PlanError, ScanPlan};
use super::splits::{
    fixed_splits, merge_splits, splits, splits_from_env, two_per_sm, SCAN_SPLITS_VAR,
    SPLITS_EXPECTED,
};
use super::{trace, Neighbors, SearchError, SearchParams, Vectors};

/// Threads per block of every scan kernel (`__launch_bounds__(128)`).
pub const SCAN_BLOCK: u32 = 128;

/// Most queries one scan launch takes: the kernel's `n_queries` parameter is
/// 32-bit, so a larger batch is split into several launches (never
/// truncated).
pub const MAX_QUERIES_PER_LAUNCH: usize = u32::MAX as usize;

/// `0..nq` as consecutive ranges of at most `max` queries (`max` ≥ 1; 0 is
/// taken as 1): the launches of a search over `nq` queries.
pub fn query_chunks(nq: usize, max: usize) -> impl Iterator<Item = Range<usize>> {
    let max = max.max(1);
    (0..nq.div_ceil(max)).map(move |i| i * max..nq.min((i + 1) * max))
}

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
    /// A launch argument the scan kernel cannot take (a count beyond its
    /// 32-bit parameters, `dim` not a multiple of the variant's veclen, a
    /// misaligned row); found before anything is uploaded or launched.
    #[error(transparent)]
    Scan(#[from] ScanArgError),
    /// An environment variable with a value it does not take.
    #[error("{variable} = `{value}`: expected {expected}")]
    Env {
        variable: &'static str,
        value: String,
        expected: &'static str,
    },
    /// The candidate kernel asked for (`FRAGLINK_KNN_VARIANT`,
    /// `GpuIndex::search_with_variant`) cannot serve the search.
    #[error("knn variant `{value}` (FRAGLINK_KNN_VARIANT or search_with_variant): {reason}")]
    KnnVariant { value: String, reason: String },
    /// A kernel left distances unwritten: the host set them to NaN before
    /// the launch ([`Transfer::fill_nan`]) and NaN came back, which no
    /// kernel writes. A launch the kernel refuses (its own contract check,
    /// fragments/README.md) writes nothing, and so does a block whose input
    /// the kernel before it left unwritten (knn_rerank after knn_tile,
    /// [`Transfer::fill_ones`]; knn_select after knn_dist); the host checks the same rules first, so
    /// this is a disagreement between the two, reported instead of
    /// returning what a pooled block held before.
    #[error("kernel `{entry}` left {unwritten} of its {outputs} distances unwritten: it, or the kernel whose output it reads, refused the launch (its own contract check, fragments/README.md)")]
    Unwritten {
        entry: String,
        unwritten: usize,
        outputs: usize,
    },
}

/// `distances` as downloaded from a buffer [`Transfer::fill_nan`] set
/// before `entry`'s launch: [`GpuSearchError::Unwritten`] where any is
/// still NaN.
pub(crate) fn check_written(entry: &str, distances: &[f32]) -> Result<(), GpuSearchError> {
    match distances.iter().filter(|d| d.is_nan()).count() {
        0 => Ok(()),
        unwritten => Err(GpuSearchError::Unwritten {
            entry: entry.to_owned(),
            unwritten,
            outputs: distances.len(),
        }),
    }
}

/// Whether `e` says only that `k` is beyond every scan capacity (the
/// tensor-core path reaches further).
pub(super) fn beyond_scan(e: &GpuSearchError) -> bool {
    matches!(e, GpuSearchError::Plan(PlanError::KTooLarge { .. }))
}

impl GpuSearchError {
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, GpuSearchError::Gpu(GpuError::OutOfMemory { .. }))
    }

    /// A sticky driver error ([`GpuError::is_context_lost`]): no later
    /// search of this process can use the GPU.
    pub fn is_context_lost(&self) -> bool {
        matches!(self, GpuSearchError::Gpu(e) if e.is_context_lost())
    }
}

/// One GPU search's results and what it took.
#[derive(Debug)]
pub struct GpuSearch {
    pub neighbors: Neighbors,
    /// The exact scan's plan (validated for every search; it ran unless
    /// `knn` or `select` is set). `None` when `k` is beyond the scan's
    /// capacities (256) and another path served the search alone.
    pub plan: Option<ScanPlan>,
    /// The link of the kernel that ran: the scan, the tensor-core
    /// candidate kernel when `knn` is set, else the distance kernel when
    /// `select` is.
    pub linked: Linked,
    /// The tensor-core candidates + exact re-rank variant that served the
    /// search ([`crate::search::knn`]), `None` when another path did.
    pub knn: Option<crate::search::knn::KnnPlan>,
    /// The two-pass select that served a `k` beyond the scan where the
    /// tensor-core path could not ([`crate::search::knn::select`]); beside
    /// `knn`, the select that answered the special queries apart.
    pub select: Option<crate::search::knn::SelectPlan>,
    /// Rows the tensor-core bounds do not cover (a non-finite element, a
    /// huge norm; for cosine a tiny one) that the exact scan searched
    /// beside that path, as many as the filter allows
    /// ([`crate::search::knn::special`]); 0 on the other paths.
    pub special_rows: usize,
    /// Queries the tensor-core bounds do not cover (as for rows, or a zero
    /// query for cosine) that the scan, or beyond its capacities the
    /// two-pass select, answered apart while that path served the others;
    /// 0 elsewhere (a search of only such queries takes the scan or the
    /// select whole).
    pub special_queries: usize,
    /// [`GpuIndex::search`]: query upload, launches, result download.
    /// [`GpuSearcher::search`]: the base's upload as well.
    pub elapsed: Duration,
}

/// A device with its pool, transfer engine and loaded scan kernels. Cheap to
/// clone: clones share all of it (a [`GpuIndex`] keeps one).
#[derive(Clone)]
pub struct GpuSearcher {
    ctx: GpuContext,
    pool: MemoryPool,
    transfer: Arc<Transfer>,
    launchers: Arc<Mutex<HashMap<LinkKey, Arc<Launcher>>>>,
}

impl std::fmt::Debug for GpuSearcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSearcher")
            .field("device", &self.ctx.info())
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl GpuSearcher {
    /// A searcher whose memory pool is sized from the device's memory
    /// ([`crate::gpu::PoolConfig::for_device`]): a dataset of any size the
    /// card can hold stays on the GPU path.
    pub fn new(ctx: GpuContext) -> Result<Self, GpuError> {
        let pool = MemoryPool::cuda_for_device(&ctx)?;
        let transfer = Transfer::new(&ctx);
        Ok(GpuSearcher {
            ctx,
            pool,
            transfer: Arc::new(transfer),
            launchers: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The device memory every buffer of this searcher (and its indexes)
    /// comes from; its [`stats`](MemoryPool::stats) show what is resident.
    pub fn pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// The transfer engine; its [`stats`](Transfer::stats) count every byte
    /// moved between host and device.
    pub fn transfer(&self) -> &Transfer {
        &self.transfer
    }

    /// Uploads `base` once into the pool, in its own dtype: a
    /// [`GpuIndex`] whose searches move only queries and results. Shapes
    /// no scan can take (an integer dim beyond its exact range, a dim beyond
    /// the kernel's 32 bits) are refused before anything is allocated.
    pub fn upload(&self, base: &Vectors) -> Result<GpuIndex, GpuSearchError> {
        GpuIndex::upload(self, base)
    }

    /// The loaded kernel of `linked`, a scan or a tensor-core kernel
    /// (blocks of [`SCAN_BLOCK`] threads).
    pub(crate) fn launcher(&self, linked: &Linked) -> Result<Arc<Launcher>, GpuError> {
        self.launcher_for(linked, SCAN_BLOCK)
    }

    /// The loaded kernel of `linked`, launched with blocks of `block`
    /// threads (its launch bound), loaded once per link.
    pub(crate) fn launcher_for(
        &self,
        linked: &Linked,
        block: u32,
    ) -> Result<Arc<Launcher>, GpuError> {
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
                max_threads_per_block: Some(block),
            },
        )?);
        map.insert(linked.key, l.clone());
        Ok(l)
    }

    /// Exact k-NN of `queries` in `base` on the device: uploads `base`,
    /// searches, frees it. Every check is made before anything is uploaded,
    /// but for a named f16copy variant's element range, checked as the rows'
    /// f16 copies are made from `base` after the upload.
    /// To search one base more than once, [`upload`](Self::upload) it.
    pub fn search(
        &self,
        base: &Vectors,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<GpuSearch, GpuSearchError> {
        let started = Instant::now();
        let shape = IndexShape::of(base);
        // Every check before the upload. Whether a row is special for the
        // tensor-core bounds shows only once the index has the rows: such
        // rows add a scan of their own there, or (more of them than the
        // index copies aside) send the search to the scan or the select, or
        // it fails with the scan's error (and the router takes it to the CPU).
        let kernels = self.kernels_for(&shape, queries, params)?;
        if queries.rows() == 0 {
            // Nothing to launch: link and load what a search would, upload
            // nothing.
            let linked = self.load_search_kernels(&kernels, true)?;
            let (plan, knn, select) = match kernels {
                SearchKernels::Scan(p) => (Some(p), None, None),
                SearchKernels::TwoPass(BeyondScan::Knn(p)) => (None, Some(p), None),
                SearchKernels::TwoPass(BeyondScan::Select(p)) => (None, None, Some(p)),
            };
            return Ok(GpuSearch {
                neighbors: Neighbors {
                    nq: 0,
                    k: params.k,
                    ids: Vec::new(),
                    distances: Vec::new(),
                },
                plan,
                linked,
                knn,
                select,
                special_rows: 0,
                special_queries: 0,
                elapsed: started.elapsed(),
            });
        }
        let index = self.upload(base)?;
        let mut found =
            index.search_uploaded_from(queries, params, variant_by_env().as_deref(), Some(base))?;
        found.elapsed = started.elapsed();
        Ok(found)
    }

    /// The kernels a search of `queries` over rows of `shape` runs on this
    /// device ([`SearchKernels::decide`]; `FRAGLINK_KNN_VARIANT` names the
    /// candidate kernel); bad input is an error naming it.
    pub fn kernels_for(
        &self,
        shape: &IndexShape,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<SearchKernels, GpuSearchError> {
        self.kernels_for_rows(shape, queries, params, queries.rows())
    }

    /// [`kernels_for`](Self::kernels_for) a batch of `nq` of `queries`
    /// (the router's batches).
    pub(super) fn kernels_for_rows(
        &self,
        shape: &IndexShape,
        queries: &Vectors,
        params: &SearchParams,
        nq: usize,
    ) -> Result<SearchKernels, GpuSearchError> {
        let request = self.knn_request(shape, params, nq);
        SearchKernels::decide(
            &request,
            shape.plan(queries, params),
            variant_by_env().as_deref(),
        )
    }

    /// Whether every kernel of `kernels` is linked for this device already,
    /// in memory or in the disk cache ([`LinkRuntime::is_available`]): a
    /// search would not wait for a link. `false` when that cannot be told
    /// (the link runtime does not load: the search will say why).
    pub fn is_linked(&self, kernels: &SearchKernels) -> bool {
        let arch = self.ctx.arch();
        LinkRuntime::global().is_ok_and(|rt| {
            kernels
                .kernels()
                .iter()
                .all(|(p, _)| rt.is_available(p, arch).unwrap_or(false))
        })
    }

    /// Whether every kernel of `kernels` is linked
    /// ([`is_linked`](Self::is_linked)'s test) or can be linked quickly for
    /// this device ([`LinkRuntime::links_quickly`]): a search would wait at
    /// most about a millisecond per kernel, not for a full link, running
    /// slower kernels until the optimised ones are done.
    pub fn links_quickly(&self, kernels: &SearchKernels) -> bool {
        let arch = self.ctx.arch();
        LinkRuntime::global().is_ok_and(|rt| {
            kernels.kernels().iter().all(|(p, _)| {
                rt.is_available(p, arch).unwrap_or(false) || rt.links_quickly(p, arch)
            })
        })
    }

    /// Links `kernels` for this device (at the same time,
    /// [`LinkRuntime::link_all`]: the optimised kernels) and loads them;
    /// returns how long that took. A no-op, in microseconds, when they are
    /// loaded already. A warm-up: the searches after it run the kernels a
    /// benchmark should time.
    pub fn prepare(&self, kernels: &SearchKernels) -> Result<Duration, GpuSearchError> {
        let started = Instant::now();
        self.load_search_kernels(kernels, false)?;
        Ok(started.elapsed())
    }

    /// [`prepare`](Self::prepare) as a search's first call links
    /// ([`LinkRuntime::link_all_tiered`]): quick links, about a millisecond
    /// each, where the optimised kernels are neither in memory nor on disk,
    /// those linking in the background meanwhile (the router's way).
    pub fn prepare_tiered(&self, kernels: &SearchKernels) -> Result<Duration, GpuSearchError> {
        let started = Instant::now();
        self.load_search_kernels(kernels, true)?;
        Ok(started.elapsed())
    }

    /// [`load_kernels`](Self::load_kernels) of every kernel of `kernels`;
    /// the first one's link.
    fn load_search_kernels(
        &self,
        kernels: &SearchKernels,
        tiered: bool,
    ) -> Result<Linked, GpuSearchError> {
        let all = kernels.kernels();
        self.load_kernels(&all[0], &all[1..], tiered)
    }

    /// The tensor-core planner's view of a search of `params` by `nq`
    /// queries over rows of `shape` on this device.
    pub(super) fn knn_request<'a>(
        &self,
        shape: &IndexShape,
        params: &'a SearchParams,
        nq: usize,
    ) -> crate::search::knn::KnnRequest<'a> {
        crate::search::knn::KnnRequest {
            device: self.ctx.arch(),
            shared: crate::search::knn::plan::SharedMemory::of(self.ctx.limits()),
            dtype: shape.dtype,
            metric: params.metric,
            filter: params.filter.fragment_name(),
            n_rows: shape.rows,
            dim: shape.dim,
            nq,
            k: params.k,
        }
    }

    /// Links and loads kernels, each (planner, block size), for this
    /// device; returns the first one's link. `tiered`: as a search links
    /// ([`LinkRuntime::link_all_tiered`]), else the optimised kernels
    /// ([`LinkRuntime::link_all`]).
    pub(super) fn load_kernels(
        &self,
        first: &(Planner, u32),
        rest: &[(Planner, u32)],
        tiered: bool,
    ) -> Result<Linked, GpuSearchError> {
        // Linked at the same time where cold, loaded in order.
        let plans: Vec<&Planner> = std::iter::once(&first.0)
            .chain(rest.iter().map(|(p, _)| p))
            .collect();
        let rt = LinkRuntime::global()?;
        let linked = match tiered {
            true => rt.link_all_tiered(&plans, self.ctx.arch())?,
            false => rt.link_all(&plans, self.ctx.arch())?,
        };
        let blocks = std::iter::once(first.1).chain(rest.iter().map(|(_, b)| *b));
        for (l, block) in linked.iter().zip(blocks) {
            self.launcher_for(l, block)?;
        }
        Ok(linked
            .into_iter()
            .next()
            .expect("one link per plan, first included"))
    }

    /// The scan of `plan` over `nq` resident queries against `n_rows`
    /// resident rows of `dim` elements, as launches of at most
    /// [`MAX_QUERIES_PER_LAUNCH`] queries; downloads the `nq × k` results.
    /// Few queries split their rows over blocks ([`row_splits`]) and each
    /// query's splits are merged here. The caller has checked the counts
    /// against `plan`'s contract.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scan(
        &self,
        plan: &ScanPlan,
        launcher: &Launcher,
        data: &DeviceVectors,
        n_rows: usize,
        dim: usize,
        queries: &DeviceVectors,
        nq: usize,
        bits: Option<&crate::gpu::GpuBuffer<u32>>,
        k: usize,
    ) -> Result<Neighbors, GpuSearchError> {
        let contract = plan.contract();
        let t = &*self.transfer;
        // One wave of the scan's blocks where the driver says how many fit
        // (an H200 at 6f7ea6a ran one query over 2 blocks per SM, 8 warps of
        // 64: 30% of DRAM bandwidth, ncu), else two per SM.
        let wave = launcher
            .resident_blocks(SCAN_BLOCK, 0)
            .ok()
            .filter(|&b| b > 0)
            .map_or_else(|| two_per_sm(self.ctx.info().sm_count), |b| b as usize);
        let splits = row_splits(fixed_row_splits()?, nq, n_rows, k, wave);
        // At most 65535 splits of an nq × k the host holds anyway.
        let outputs = nq.saturating_mul(splits).saturating_mul(k);
        let mut d_dists = self.pool.alloc::<f32>(outputs)?;
        t.fill_nan(&mut d_dists)?;
        let wide_ids = plan.idx == "i64";
        let mut d_ids32 = if wide_ids {
            None
        } else {
            Some(self.pool.alloc::<u32>(outputs)?)
        };
        let mut d_ids64 = if wide_ids {
            Some(self.pool.alloc::<i64>(outputs)?)
        } else {
            None
        };
        trace::mark_device("buffers", t.stream());
        for chunk in query_chunks(nq, MAX_QUERIES_PER_LAUNCH) {
            let n = chunk.len();
            let s = contract.scalars(n_rows as u64, dim as u64, n as u64, k as u64)?;
            let grid = s.n_queries.min(i32::MAX as u32);
            // splits ≤ MAX_SPLITS (65535, grid.y's limit).
            let cfg = LaunchConfig::new((grid, splits as u32, 1), (SCAN_BLOCK, 1, 1));
            let mut args = KernelArgs::new();
            data.push_rows(&mut args, &contract, "dataset", 0..n_rows * dim)?;
            queries.push_rows(
                &mut args,
                &contract,
                "queries",
                chunk.start * dim..chunk.end * dim,
            )?;
            match bits {
                Some(b) => args.input(b)?.require_alignment(4, "filter_bits"),
                None => args.null_ptr(),
            };
            args.value(s.n_rows)
                .value(s.dim)
                .value(s.n_queries)
                .value(s.k);
            let out = chunk.start * splits * k..chunk.end * splits * k;
            match (&mut d_ids32, &mut d_ids64) {
                (Some(ids), _) => push_output(
                    &mut args,
                    &contract,
                    "out_ids",
                    ids.subview_mut(out.start, out.len())?,
                )?,
                (_, Some(ids)) => push_output(
                    &mut args,
                    &contract,
                    "out_ids",
                    ids.subview_mut(out.start, out.len())?,
                )?,
                _ => unreachable!("one id buffer exists"),
            };
            push_output(
                &mut args,
                &contract,
                "out_dists",
                d_dists.subview_mut(out.start, out.len())?,
            )?;
            // SAFETY: arguments in the order and types of the scan contract
            // (fragments/README.md), counts checked by `contract.scalars`;
            // sizes are checked against the kernel's parameter info and
            // pointer alignments against the real addresses by the launcher.
            unsafe { launcher.launch(&cfg, &mut args)? };
        }
        trace::mark_device("scan", t.stream());
        let mut distances = t.download_vec(&d_dists)?;
        trace::mark("wait for results");
        check_written(launcher.entry(), &distances)?;
        let mut ids = match (&d_ids32, &d_ids64) {
            (Some(ids), _) => widen_ids(t.download_vec(ids)?),
            (_, Some(ids)) => t.download_vec(ids)?,
            _ => unreachable!("one id buffer exists"),
        };
        trace::mark("download");
        if splits > 1 {
            // The scan's keys ascend (its metrics are distances).
            (ids, distances) = merge_splits(&ids, &distances, nq, splits, k, true);
        }
        Ok(Neighbors {
            nq,
            k,
            ids,
            distances,
        })
    }
}

/// Rows per part of the automatic row splits: at most `⌈n_rows / 512⌉`
/// splits, so that a split scans a few of the block's 128-row tiles.
pub const SPLIT_PART_ROWS: usize = 4 * SCAN_BLOCK as usize;

/// The row splits of a scan of `nq` queries over `n_rows` rows with `k`
/// results for a grid of about `wave` blocks (what the device holds of the
/// scan at once): `fixed` ([`SCAN_SPLITS_VAR`], [`fixed_row_splits`]) where
/// set, at most one per 128-row tile (a split scans every `splits`-th
/// tile, so more would scan nothing) and within the merge bound
/// ([`fixed_splits`]);
/// else [`splits`] over `⌈n_rows / SPLIT_PART_ROWS⌉` parts
/// ([`SPLIT_PART_ROWS`]). On an H100 holding 5 scan blocks per SM one query
/// over a million rows runs 660 blocks instead of one.
pub fn row_splits(fixed: Option<usize>, nq: usize, n_rows: usize, k: usize, wave: usize) -> usize {
    match fixed {
        Some(n) => fixed_splits(n, n_rows.div_ceil(SCAN_BLOCK as usize), k),
        None => splits(nq, n_rows.div_ceil(SPLIT_PART_ROWS), k, wave),
    }
}

/// The row splits [`SCAN_SPLITS_VAR`] fixes, `None` where it is unset or
/// `auto`; any other value is an error naming the variable.
pub fn fixed_row_splits() -> Result<Option<usize>, GpuSearchError> {
    splits_from_env(SCAN_SPLITS_VAR).map_err(|value| GpuSearchError::Env {
        variable: SCAN_SPLITS_VAR,
        value,
        expected: SPLITS_EXPECTED,
    })
}

/// Downloads one batch's results (u32 ids, distances) and appends them to
/// `out` (the ids widened by [`widen_ids`]).
pub(crate) fn append_batch(
    t: &Transfer,
    entry: &str,
    ids: &GpuBuffer<u32>,
    dists: &GpuBuffer<f32>,
    out: &mut Neighbors,
) -> Result<(), GpuSearchError> {
    let distances = t.download_vec(dists)?;
    trace::mark("wait for results");
    check_written(entry, &distances)?;
    out.ids.extend(widen_ids(t.download_vec(ids)?));
    trace::mark("download");
    out.distances.extend(distances);
    Ok(())
}

/// u32 result ids as the API's i64, the u32 padding id (all ones) as
/// [`Neighbors::PAD_ID`].
pub(crate) fn widen_ids(ids: Vec<u32>) -> Vec<i64> {
    ids.into_iter()
        .map(|i| {
            if i == u32::MAX {
                Neighbors::PAD_ID
            } else {
                i as i64
            }
        })
        .collect()
}

/// Device copies of a [`Vectors`], typed by its dtype (f16 travels as its
/// bits: the kernel reads `__half`, which is 16 plain bits).
pub(crate) enum DeviceVectors {
    F32(crate::gpu::GpuBuffer<f32>),
    F16(crate::gpu::GpuBuffer<u16>),
    I8(crate::gpu::GpuBuffer<i8>),
    U8(crate::gpu::GpuBuffer<u8>),
}

impl DeviceVectors {
    /// Bytes on the device.
    pub(crate) fn size_bytes(&self) -> u64 {
        match self {
            DeviceVectors::F32(b) => b.len() as u64 * 4,
            DeviceVectors::F16(b) => b.len() as u64 * 2,
            DeviceVectors::I8(b) => b.len() as u64,
            DeviceVectors::U8(b) => b.len() as u64,
        }
    }

    /// Elements `elems` of the buffer as the scan's pointer argument
    /// `name`, its alignment checked (typed) from the offset here and from
    /// the real address by the launcher.
    pub(crate) fn push_rows<'a>(
        &'a self,
        args: &mut KernelArgs<'a>,
        contract: &ScanContract,
        name: &'static str,
        elems: Range<usize>,
    ) -> Result<(), GpuSearchError> {
        fn push<'a, T: cudarc::driver::DeviceRepr>(
            b: &'a crate::gpu::GpuBuffer<T>,
            args: &mut KernelArgs<'a>,
            contract: &ScanContract,
            name: &'static str,
            elems: Range<usize>,
        ) -> Result<(), GpuSearchError> {
            let view = b.subview(elems.start, elems.len())?;
            contract.check_offset(name, (view.offset() * std::mem::size_of::<T>()) as u64)?;
            args.input(view)?
                .require_alignment(contract.vector_align(), name);
            Ok(())
        }
        match self {
            DeviceVectors::F32(b) => push(b, args, contract, name, elems),
            DeviceVectors::F16(b) => push(b, args, contract, name, elems),
            DeviceVectors::I8(b) => push(b, args, contract, name, elems),
            DeviceVectors::U8(b) => push(b, args, contract, name, elems),
        }
    }
}

/// An output window of the scan as pointer argument `name` (`out_ids` or
/// `out_dists`), alignment checked like [`DeviceVectors::push_rows`].
pub(crate) fn push_output<'a, T: cudarc::driver::DeviceRepr>(
    args: &mut KernelArgs<'a>,
    contract: &ScanContract,
    name: &'static str,
    view: GpuViewMut<'a, T>,
) -> Result<(), GpuSearchError> {
    contract.check_offset(name, (view.offset() * std::mem::size_of::<T>()) as u64)?;
    args.output(view)?
        .require_alignment(std::mem::size_of::<T>() as u64, name);
    Ok(())
}

/// A device copy of `v` in its own dtype (f16 as its bits, read in place:
/// no host-side conversion copy), waited for.
pub(crate) fn upload_vectors(
    t: &Transfer,
    pool: &MemoryPool,
    v: &Vectors,
) -> Result<DeviceVectors, GpuError> {
    upload_vectors_as(t, pool, v, false)
}

/// [`upload_vectors`] queued ([`Transfer::upload_queued`]): a search's
/// queries, which only kernels queued after the copy read.
pub(crate) fn upload_queries(
    t: &Transfer,
    pool: &MemoryPool,
    v: &Vectors,
) -> Result<DeviceVectors, GpuError> {
    upload_vectors_as(t, pool, v, true)
}

fn upload_vectors_as(
    t: &Transfer,
    pool: &MemoryPool,
    v: &Vectors,
    queued: bool,
) -> Result<DeviceVectors, GpuError> {
    use half::slice::HalfFloatSliceExt;
    fn up<T: cudarc::driver::DeviceRepr>(
        t: &Transfer,
        pool: &MemoryPool,
        src: &[T],
        queued: bool,
    ) -> Result<GpuBuffer<T>, GpuError> {
        if queued {
            t.upload_new_queued(pool, src)
        } else {
            t.upload_new(pool, src)
        }
    }
    Ok(match v {
        Vectors::F32(m) => DeviceVectors::F32(up(t, pool, m.data(), queued)?),
        Vectors::F16(m) => DeviceVectors::F16(up(t, pool, m.data().reinterpret_cast(), queued)?),
        Vectors::I8(m) => DeviceVectors::I8(up(t, pool, m.data(), queued)?),
        Vectors::U8(m) => DeviceVectors::U8(up(t, pool, m.data(), queued)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::plan::plan;
    use crate::search::{DType, Metric};

    #[test]
    fn nan_left_in_the_distances_names_the_kernel_that_refused() {
        let inf = f32::INFINITY;
        // Results and padding (±inf), -0 included: written.
        check_written("scan_f32_u32_v4_k32", &[0.5, -0.0, inf, -inf]).unwrap();
        check_written("scan_f32_u32_v4_k32", &[]).unwrap();
        let e = check_written("knn_rerank_f32_k32", &[1.0, f32::NAN, f32::NAN]).unwrap_err();
        assert!(matches!(
            e,
            GpuSearchError::Unwritten {
                unwritten: 2,
                outputs: 3,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "kernel `knn_rerank_f32_k32` left 2 of its 3 distances unwritten: it, or the kernel \
             whose output it reads, refused the launch (its own contract check, \
             fragments/README.md)"
        );
        // The all-ones bits `Transfer::fill_nan` sets are a NaN.
        assert!(f32::from_bits(u32::MAX).is_nan());
    }

    #[test]
    fn few_queries_split_their_rows_over_the_sms() {
        // H100: 132 SMs holding 5 scan blocks each, 660 blocks wanted.
        let wave = 5 * 132;
        assert_eq!(row_splits(None, 1, 1_000_000, 10, wave), 660);
        assert_eq!(row_splits(None, 100, 1_000_000, 10, wave), 7);
        assert_eq!(row_splits(None, 660, 1_000_000, 10, wave), 1);
        // At most one split per 512 rows; the host merge's bound.
        assert_eq!(row_splits(None, 1, 1000, 10, wave), 2);
        assert_eq!(row_splits(None, 1, 512, 10, wave), 1);
        assert_eq!(row_splits(None, 1, 0, 10, wave), 1);
        assert_eq!(row_splits(None, 1, 1_000_000, 256, wave), 128);
        // A fixed count, at most one split per 128-row tile and within the
        // merge bound.
        assert_eq!(row_splits(Some(1), 1, 1_000_000, 10, wave), 1);
        assert_eq!(row_splits(Some(7), 10_000, 1_000_000, 10, wave), 7);
        assert_eq!(row_splits(Some(7), 1, 5, 10, wave), 1);
        assert_eq!(row_splits(Some(7), 1, 129, 10, wave), 2);
        assert_eq!(row_splits(Some(7), 1, 6 * 128, 10, wave), 6);
        assert_eq!(row_splits(Some(7), 1, 0, 10, wave), 1);
        assert_eq!(row_splits(Some(65_535), 1, 1_000_000, 256, wave), 128);
        let e = GpuSearchError::Env {
            variable: SCAN_SPLITS_VAR,
            value: "many".into(),
            expected: SPLITS_EXPECTED,
        };
        assert_eq!(
            e.to_string(),
            "FRAGLINK_SCAN_SPLITS = `many`: expected `auto` or a whole number from 1 to 65535"
        );
    }

    #[test]
    fn queries_beyond_u32_are_split_into_launches_not_truncated() {
        assert_eq!(MAX_QUERIES_PER_LAUNCH as u64, u64::from(u32::MAX));
        let chunks: Vec<_> = query_chunks(10, 4).collect();
        assert_eq!(chunks, vec![0..4, 4..8, 8..10]);
        assert_eq!(query_chunks(0, 4).count(), 0);
        assert_eq!(query_chunks(4, 4).collect::<Vec<_>>(), vec![0..4]);
        assert_eq!(query_chunks(3, 0).count(), 3);
        // 2^32 + 5 queries: two launches, each within the kernel's u32, and
        // together exactly the queries (a cast would have launched 5).
        let nq = (1usize << 32) + 5;
        let chunks: Vec<_> = query_chunks(nq, MAX_QUERIES_PER_LAUNCH).collect();
        assert_eq!(chunks, vec![0..u32::MAX as usize, u32::MAX as usize..nq]);
        let p = plan(DType::F32, Metric::L2, "none", 1000, 128, 10).unwrap();
        for c in &chunks {
            let s = p.contract().scalars(1000, 128, c.len() as u64, 10).unwrap();
            assert_eq!(s.n_queries as usize, c.len());
        }
    }

    #[test]
    fn counts_the_kernel_cannot_take_are_typed_errors_naming_them() {
        let p = plan(DType::U8, Metric::L2, "none", 1000, 16, 10).unwrap();
        let c = p.contract();
        let dim = u32::MAX as u64 + 1;
        let e: GpuSearchError = c.scalars(1000, dim, 1, 10).unwrap_err().into();
        match &e {
            GpuSearchError::Scan(ScanArgError::TooLarge {
                argument, value, ..
            }) => {
                assert_eq!((*argument, *value), ("dim", dim));
            }
            other => panic!("expected a typed dim error, got {other:?}"),
        }
        assert!(e.to_string().contains("`dim` = 4294967296"), "{e}");
        assert!(!e.is_out_of_memory());
        let e: GpuSearchError = c
            .scalars(1000, 16, u32::MAX as u64 + 1, 10)
            .unwrap_err()
            .into();
        assert!(e.to_string().contains("`n_queries`"), "{e}");
    }
}
