//! The tensor-core path of [`GpuIndex::search`](crate::search::GpuIndex):
//! the row norms the index keeps ([`KnnRows`], uploaded once with the
//! rows) and one search through the two kernels (fragments/README.md, "The
//! tensor-core k-NN kernels"): candidates per (query tile, row chunk), then
//! merge and exact re-rank per query. Results equal the scan's and the CPU
//! path's bit for bit. Rows the bounds do not cover are skipped here and
//! searched by the exact scan beside it ([`super::special`],
//! `KnnRows::rows_for`); queries the bounds do not cover never get here
//! (the index answers them apart: `GpuIndex::search`).

use std::sync::{Arc, Mutex};

use crate::gpu::launch::ScanContract;
use crate::gpu::{GpuBuffer, GpuError, KernelArgs, LaunchConfig, MemoryPool, Transfer};
use crate::link::{Linked, Planner};
use crate::search::gpu::{
    append_batch, check_written, push_output, widen_ids, DeviceVectors, GpuSearchError, GpuSearcher,
};
use crate::search::splits::merge_splits;
use crate::search::{trace, DType, Metric, Neighbors, Vectors};

use super::f16copy;
use super::norms::Norms;
use super::plan::{KnnPlan, Precision, KNN_BLOCK};
use super::special::SpecialRows;

/// Queries per launch pair: bounds the candidate buffers
/// (`batch × chunks × capacity × 12` bytes, about 19 MB at 4096 × 3 × 128).
pub const KNN_BATCH: usize = 4096;

/// Per-row values of the candidate kernel, resident beside the rows.
pub struct KnnRows {
    /// l2's aux0: |x|² (integers: the exact squared norm's u32 bits).
    sq: GpuBuffer<f32>,
    /// |x| (floats only): l2's aux1, inner product's aux0/aux1.
    norm: Option<GpuBuffer<f32>>,
    /// 1/|x| (floats only): cosine's aux0/aux1.
    inv: Option<GpuBuffer<f32>>,
    /// The rows special for some metric (knn_bounds.cuh): the candidate
    /// kernel skips them, the scan searches them over `copied`.
    special: SpecialRows,
    /// Those of them copied aside at upload ([`SpecialRows::copyable`],
    /// within [`MAX_SPECIAL_BYTES`](super::special::MAX_SPECIAL_BYTES)), and the copy; `None` without special
    /// rows, or where none fit or the device had no memory for them
    /// (searches they are special for then leave this path for the scan or
    /// the select).
    copied: Option<(SpecialRows, DeviceVectors)>,
    /// The rows' f16 copies for [`Precision::F16Copy`], made at upload
    /// ([`Self::copy_f16_at_upload`]) or else by the first search that asks
    /// ([`Self::f16_copy`]): `Some(None)` when some element has no finite
    /// f16 (the precision cannot serve these rows).
    f16: Mutex<Option<Option<Arc<DeviceVectors>>>>,
}

/// f32 elements converted per step when an index makes its f16 copy: bounds
/// the host memory it takes (64 MiB down, 32 MiB up).
const F16_COPY_STEP: usize = 1 << 24;

impl std::fmt::Debug for KnnRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnnRows")
            .field("special_rows", &self.special.ids().len())
            .field("copied", &self.copied.as_ref().map(|(c, _)| c.ids().len()))
            .finish_non_exhaustive()
    }
}

impl KnnRows {
    /// Computes the norms of `base` on the host and uploads them; `None`
    /// for shapes no variant takes (no rows, ids beyond u32, `dim` outside
    /// the bounds' range), dtypes without a variant for `device` (f32
    /// before sm_80) and a device without room for the norms: their
    /// searches never leave the scan.
    pub fn upload(
        t: &Transfer,
        pool: &MemoryPool,
        base: &Vectors,
        device: crate::build::Arch,
    ) -> Result<Option<Self>, GpuError> {
        if !super::plan::takes_rows(device, base.dtype(), base.rows(), base.dim()) {
            return Ok(None);
        }
        let norms = Norms::of(base);
        let special = SpecialRows::of(&norms);
        let copyable = special.copyable(base.dim() * base.dtype().size());
        let copied = if copyable.ids().is_empty() {
            None
        } else {
            let ids: Vec<usize> = copyable.ids().iter().map(|&r| r as usize).collect();
            match crate::search::gpu::upload_vectors(t, pool, &base.gather_rows(&ids)) {
                Ok(copy) => Some((copyable, copy)),
                // The copy is an optimisation: without it those searches
                // take the scan, as they did before there was one.
                Err(GpuError::OutOfMemory { .. }) => None,
                Err(e) => return Err(e),
            }
        };
        let (sq, norm) = norms.aux(Metric::L2);
        // The norms too (4 to 12 bytes a row): rows that fit the device
        // without them keep the scan, not an index that fails to upload.
        let upload = || -> Result<_, GpuError> {
            let sq = t.upload_new(pool, &sq)?;
            let (norm, inv) = match &norms {
                Norms::Int(_) => (None, None),
                Norms::Float(_) => (
                    Some(t.upload_new(pool, &norm)?),
                    Some(t.upload_new(pool, &norms.aux(Metric::Cosine).0)?),
                ),
            };
            Ok((sq, norm, inv))
        };
        let (sq, norm, inv) = match upload() {
            Ok(u) => u,
            Err(GpuError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(KnnRows {
            sq,
            norm,
            inv,
            special,
            copied,
            f16: Mutex::new(None),
        }))
    }

    /// Device bytes held (the special rows' copy included, and the f16
    /// copies once made).
    pub fn device_bytes(&self) -> u64 {
        let n = self.sq.len() as u64 * 4;
        let special = self.copied.as_ref().map_or(0, |(_, v)| v.size_bytes());
        n * (1 + u64::from(self.norm.is_some()) + u64::from(self.inv.is_some()))
            + self.f16_copy_bytes()
            + special
    }

    /// Device bytes of the rows' f16 copies: 0 until made (at upload, or by
    /// the first search that asks: `f16_copy`).
    pub fn f16_copy_bytes(&self) -> u64 {
        match &*self.f16.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Some(v)) => match &**v {
                DeviceVectors::F16(b) => b.len() as u64 * 2,
                _ => 0,
            },
            _ => 0,
        }
    }

    /// At upload, where f32's default precision is f16copy and the device
    /// has its variants: the rows' f16 copies ([`Self::f16_copy`]) from
    /// `base`, the host rows just uploaded, so that no search reads the rows
    /// back to make them (the first search of an index uploaded on its own
    /// downloaded every row: 512 MB for 1M × 128) and the one-time upload
    /// holds the whole one-time cost. Out of device memory they are left to
    /// the first search that asks, as the special rows' copy is left out;
    /// with the tensor-core path off (`FRAGLINK_GPU_KNN`) none are made.
    pub(crate) fn copy_f16_at_upload(
        &self,
        t: &Transfer,
        pool: &MemoryPool,
        rows: &DeviceVectors,
        base: &Vectors,
        device: crate::build::Arch,
    ) -> Result<(), GpuError> {
        let Vectors::F32(m) = base else {
            return Ok(());
        };
        // Not where FRAGLINK_GPU_KNN turns the tensor-core path off (a bad
        // value is the search's error to report).
        if Precision::default_for(DType::F32) != Precision::F16Copy
            || !super::plan::links_at(device, DType::F32, Precision::F16Copy)
            || !enabled_by_env().unwrap_or(true)
        {
            return Ok(());
        }
        match self.f16_copy(t, pool, rows, base.dim(), Some(m.data())) {
            Ok(_) | Err(GpuError::OutOfMemory { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The f16 copies of the f32 `rows` ([`f16copy`]) for
    /// [`Precision::F16Copy`]: made on the first call (in steps of
    /// [`F16_COPY_STEP`] elements, each rounded on the host from `host`, the
    /// same rows where the caller still holds them, else read back from the
    /// device, and uploaded; half the rows' bytes stay resident beside
    /// them), then kept. The rows special for every metric are copied as
    /// zeros: the candidate kernel skips them. `None` when some other
    /// element has no finite f16, or the rows are not f32.
    pub(crate) fn f16_copy(
        &self,
        t: &Transfer,
        pool: &MemoryPool,
        rows: &DeviceVectors,
        dim: usize,
        host: Option<&[f32]>,
    ) -> Result<Option<Arc<DeviceVectors>>, GpuError> {
        let mut kept = self.f16.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(made) = kept.as_ref() {
            return Ok(made.clone());
        }
        let DeviceVectors::F32(src) = rows else {
            return Ok(None);
        };
        let host = host.filter(|h| h.len() == src.len());
        let mut copy = pool.alloc::<u16>(src.len())?;
        let mut fits = true;
        for at in (0..src.len()).step_by(F16_COPY_STEP) {
            let n = F16_COPY_STEP.min(src.len() - at);
            let read_back;
            let values = match host {
                Some(h) => &h[at..at + n],
                None => {
                    read_back = t.download_vec(src.subview(at, n)?)?;
                    &read_back[..]
                }
            };
            let skipped = zero_rows(values, at, dim, self.special.every_metric());
            let Some(bits) = f16copy::to_f16_bits(skipped.as_deref().unwrap_or(values)) else {
                fits = false;
                break;
            };
            t.upload(&bits, copy.subview_mut(at, n)?)?;
        }
        let made = fits.then(|| Arc::new(DeviceVectors::F16(copy)));
        *kept = Some(made.clone());
        Ok(made)
    }

    /// What a search by `metric` reads beside the rows: the
    /// `(row_aux0, row_aux1)` buffers, and the rows special for `metric`
    /// with their copy where there are any. `None` when the index did not
    /// copy all of those aside ([`MAX_SPECIAL_BYTES`](super::special::MAX_SPECIAL_BYTES)).
    pub(crate) fn rows_for(&self, metric: Metric) -> Option<RowsFor<'_>> {
        let n = self.special.count(metric);
        let special = match &self.copied {
            _ if n == 0 => None,
            Some((rows, copy)) if rows.count(metric) == n => Some((rows, copy)),
            _ => return None,
        };
        let aux = match (metric, &self.norm, &self.inv) {
            (_, None, _) | (_, _, None) => (&self.sq, &self.sq),
            (Metric::L2, Some(n), _) => (&self.sq, n),
            (Metric::InnerProduct, Some(n), _) => (n, n),
            (Metric::Cosine, _, Some(i)) => (i, i),
        };
        Some(RowsFor { aux, special })
    }
}

/// [`KnnRows::rows_for`] one metric.
pub(crate) struct RowsFor<'a> {
    /// The candidate kernel's `(row_aux0, row_aux1)`.
    pub aux: (&'a GpuBuffer<f32>, &'a GpuBuffer<f32>),
    /// The rows special for the metric and their copy, for the scan.
    pub special: Option<(&'a SpecialRows, &'a DeviceVectors)>,
}

/// `values`, elements `at..` of rows of `dim`, with the elements of `rows`
/// (ascending) set to zero; `None` when none of them falls in `values`.
fn zero_rows(
    values: &[f32],
    at: usize,
    dim: usize,
    rows: impl Iterator<Item = u32>,
) -> Option<Vec<f32>> {
    let end = at + values.len();
    let mut out: Option<Vec<f32>> = None;
    for r in rows {
        let (lo, hi) = (r as usize * dim, (r as usize + 1) * dim);
        if hi <= at {
            continue;
        }
        if lo >= end {
            break;
        }
        let v = out.get_or_insert_with(|| values.to_vec());
        v[lo.max(at) - at..hi.min(end) - at].fill(0.0);
    }
    out
}

/// One candidate list per (query, chunk) slot, in knn_tile's output format
/// (fragments/README.md): a count and up to `capacity` (lo, hi, id) entries.
/// knn_tile writes them, knn_rerank's merge level writes them per group, and
/// knn_rerank reads them.
struct Candidates {
    count: GpuBuffer<u32>,
    lo: GpuBuffer<f32>,
    hi: GpuBuffer<f32>,
    ids: GpuBuffer<u32>,
}

impl Candidates {
    fn alloc(pool: &MemoryPool, slots: usize, capacity: usize) -> Result<Self, GpuError> {
        Ok(Candidates {
            count: pool.alloc(slots)?,
            lo: pool.alloc(slots * capacity)?,
            hi: pool.alloc(slots * capacity)?,
            ids: pool.alloc(slots * capacity)?,
        })
    }

    /// The four as a kernel's outputs, in the contract's order.
    fn push_outputs<'b>(&'b mut self, a: &mut KernelArgs<'b>) -> Result<(), GpuError> {
        a.output(self.count.view_mut())?
            .output(self.lo.view_mut())?
            .output(self.hi.view_mut())?
            .output(self.ids.view_mut())?;
        Ok(())
    }
}

/// The launch-invariant arguments of one search.
pub(crate) struct KnnSearch<'a> {
    pub(crate) gpu: &'a GpuSearcher,
    pub(crate) plan: &'a KnnPlan,
    pub(crate) data: &'a DeviceVectors,
    /// For an f16copy plan: the rows' f16 copies ([`KnnRows::f16_copy`])
    /// and the queries' (their f16 bits, uploaded per batch).
    pub(crate) staged: Option<(&'a DeviceVectors, &'a [u16])>,
    pub(crate) rows: (&'a GpuBuffer<f32>, &'a GpuBuffer<f32>),
    pub(crate) n_rows: usize,
    pub(crate) dim: usize,
    pub(crate) bits: Option<&'a GpuBuffer<u32>>,
    pub(crate) k: usize,
}

impl KnnSearch<'_> {
    /// knn_rerank's arguments up to `group_chunks`: the rows, `nb` queries
    /// and the candidates of `n_chunks` slots per query; the caller adds the
    /// outputs of its level.
    fn rerank_args<'b>(
        &'b self,
        queries: &'b DeviceVectors,
        nb: usize,
        contract: &ScanContract,
        cand: &'b Candidates,
        [n_chunks, group_chunks]: [u32; 2],
    ) -> Result<KernelArgs<'b>, GpuSearchError> {
        let mut a = KernelArgs::new();
        self.data
            .push_rows(&mut a, contract, "dataset", 0..self.n_rows * self.dim)?;
        queries.push_rows(&mut a, contract, "queries", 0..nb * self.dim)?;
        a.input(&cand.count)?
            .input(&cand.lo)?
            .input(&cand.hi)?
            .input(&cand.ids)?;
        a.value(self.dim as u32)
            .value(nb as u32)
            .value(n_chunks)
            .value(self.k as u32)
            .value(group_chunks);
        Ok(a)
    }

    /// Exact k-NN of `queries` (none special: the caller checked `qnorms`),
    /// in batches of [`KNN_BATCH`]. Returns the results and the candidate
    /// kernel's link.
    pub(crate) fn run(
        &self,
        queries: &Vectors,
        qnorms: &Norms,
        metric: Metric,
    ) -> Result<(Neighbors, Linked), GpuSearchError> {
        let arch = self.gpu.context().arch();
        let (tile_link, rerank_link) = Planner::link_pair_tiered_for(
            &self.plan.tile_planner(),
            &self.plan.rerank_planner(),
            arch,
        )?;
        let tile = self.gpu.launcher(&tile_link)?;
        let rerank = self.gpu.launcher(&rerank_link)?;
        let (t, pool) = (self.gpu.transfer(), self.gpu.pool());
        let nq = queries.rows();
        let (qa0, qa1) = qnorms.aux(metric);
        // An `A16` variant copies what its MMAs read in 16-byte groups: the
        // launcher checks those pointers for that alignment (the kernel
        // refuses otherwise: its counts stay all ones and the search fails
        // with GpuSearchError::Unwritten). An
        // f16copy variant reads the copies (`stage`); its f32 rows and
        // queries feed only the exact fold.
        let copies = self.plan.precision == Precision::F16Copy;
        let stage = ScanContract {
            elem_bytes: self.plan.staged_dtype().size() as u32,
            veclen: self.plan.staging.veclen(self.plan.staged_dtype()),
            id_bytes: 4,
            capacity: self.plan.capacity,
        };
        let contract = ScanContract {
            elem_bytes: self.plan.dtype.size() as u32,
            veclen: if copies { 1 } else { stage.veclen },
            ..stage
        };
        let staged = match (copies, self.staged) {
            (false, _) => None,
            (true, Some(s)) => Some(s),
            (true, None) => {
                return Err(GpuSearchError::KnnVariant {
                    value: self.plan.tile.name.to_owned(),
                    reason: "the rows' f16 copies are missing".into(),
                })
            }
        };
        let cap = self.plan.capacity as usize;
        let (k, dim) = (self.k, self.dim);
        let share_bound = shared_bound_by_env()?;
        let prefetch = prefetch_by_env()?;
        let mut out = Neighbors {
            nq,
            k,
            ids: Vec::with_capacity(nq * k),
            distances: Vec::with_capacity(nq * k),
        };
        for b0 in (0..nq).step_by(KNN_BATCH) {
            let b1 = (b0 + KNN_BATCH).min(nq);
            let nb = b1 - b0;
            trace::mark("plan");
            let part = queries.slice_rows(b0, b1);
            let d_q = crate::search::gpu::upload_queries(t, pool, &part)?;
            let d_q16 = match staged {
                Some((_, q16)) => Some(DeviceVectors::F16(
                    t.upload_new_queued(pool, &q16[b0 * dim..b1 * dim])?,
                )),
                None => None,
            };
            // Both query norms in one upload. The batch's uploads are queued,
            // not waited for: the launches after them read them in stream
            // order.
            let d_qaux = t.upload_new_queued(pool, &[&qa0[b0..b1], &qa1[b0..b1]].concat())?;
            let (d_qa0, d_qa1) = d_qaux.view().split_at(nb)?;
            trace::mark_device("upload queries", t.stream());
            // One wave of candidate blocks (KnnPlan::chunks), with the
            // batch's candidate buffers (fewer than a tile's at small nq).
            let dynamic = self.plan.dynamic_shared_bytes_for(nb);
            let resident = tile.resident_blocks(KNN_BLOCK, dynamic)?;
            let (n_chunks, chunk_rows) = self.plan.chunks(self.n_rows, nb, resident);
            let mut cand = Candidates::alloc(pool, nb * n_chunks as usize, cap)?;
            // Pooled memory holds a former owner's bytes: should the tile
            // kernel refuse its launch contract and write nothing, the
            // counts stay all ones, the re-rank's blocks write nothing and
            // the final distances stay NaN (GpuSearchError::Unwritten),
            // instead of the re-rank reading stale ids (out of bounds, or
            // plausible wrong neighbours).
            t.fill_ones(&mut cand.count)?;
            // Each query's bound its chunks share (knn_tile.cuh
            // `shared_bound`), then each (query, chunk)'s certificate for the
            // union bound (knn_tile.cuh `union_of`): all ones, no bound yet.
            let mut bounds = if share_bound {
                let mut b = pool.alloc::<u32>(nb + nb * n_chunks as usize)?;
                t.fill_ones(&mut b)?;
                Some(b)
            } else {
                None
            };
            trace::mark_device("buffers", t.stream());
            {
                let tiles = nb.div_ceil(self.plan.qtile as usize) as u32;
                let cfg = LaunchConfig::new((tiles, n_chunks, 1), (KNN_BLOCK, 1, 1))
                    .with_dynamic_shared(dynamic);
                let mut a = KernelArgs::new();
                self.data
                    .push_rows(&mut a, &contract, "dataset", 0..self.n_rows * dim)?;
                d_q.push_rows(&mut a, &contract, "queries", 0..nb * dim)?;
                match (staged, &d_q16) {
                    (Some((rows16, _)), Some(q16)) => {
                        rows16.push_rows(&mut a, &stage, "stage_dataset", 0..self.n_rows * dim)?;
                        q16.push_rows(&mut a, &stage, "stage_queries", 0..nb * dim)?;
                    }
                    _ => {
                        a.null_ptr().null_ptr();
                    }
                }
                match self.bits {
                    Some(b) => a.input(b)?.require_alignment(4, "filter_bits"),
                    None => a.null_ptr(),
                };
                a.input(self.rows.0)?.input(self.rows.1)?;
                a.input(d_qa0)?.input(d_qa1)?;
                a.value(self.n_rows as u32)
                    .value(dim as u32)
                    .value(nb as u32)
                    .value(k as u32)
                    .value(chunk_rows);
                cand.push_outputs(&mut a)?;
                match &mut bounds {
                    Some(b) => a.output(b.view_mut())?,
                    None => a.null_ptr(),
                };
                a.value(prefetch);
                // SAFETY: arguments in the order and types of knn_tile's
                // contract (fragments/README.md); counts fit their u32
                // parameters (n_rows < 2^32 - 1 and dim ≤ 2^17 by the plan,
                // nb ≤ KNN_BATCH, k ≤ capacity); the outputs hold
                // nb × n_chunks (× capacity) elements, the bounds nb + nb ×
                // n_chunks (the certificates behind the bounds); sizes
                // and alignments are checked by the launcher.
                unsafe { tile.launch(&cfg, &mut a)? };
            }
            trace::mark_device("candidates", t.stream());
            let (groups, group_chunks) = super::plan::merge_groups(n_chunks);
            // The host merges the groups where their lists are short (a few
            // microseconds, no serial one-block launch); many queries' long
            // lists keep the final launch (downloads and a host merge that
            // grow with batch x groups x k).
            let host_merge = groups > 1 && nb * groups as usize * k <= HOST_MERGE_MAX_ENTRIES;
            // Merge level: each group's exact best k, in knn_tile's format.
            let merged = if groups > 1 {
                let mut merged = Candidates::alloc(pool, nb * groups as usize, cap)?;
                if host_merge {
                    // A merge launch that writes nothing (refused, or over
                    // unwritten candidate counts) leaves these NaN, which the
                    // host reports (GpuSearchError::Unwritten). The ids too
                    // are set: the download takes whole slots, of which the
                    // launch writes the first k (no copy of bytes no one
                    // wrote, which compute-sanitizer's initcheck may report).
                    t.fill_nan(&mut merged.lo)?;
                    t.fill_ones(&mut merged.ids)?;
                } else {
                    // As the tile's counts: a merge launch that writes
                    // nothing stops the final level.
                    t.fill_ones(&mut merged.count)?;
                }
                let cfg = LaunchConfig::new((nb as u32, groups, 1), (KNN_BLOCK, 1, 1));
                let mut a =
                    self.rerank_args(&d_q, nb, &contract, &cand, [n_chunks, group_chunks])?;
                merged.push_outputs(&mut a)?;
                a.null_ptr().null_ptr();
                // SAFETY: knn_rerank's contract, merge level: the candidate
                // buffers knn_tile just filled (nb × n_chunks slots); the
                // merged buffers hold nb × groups slots of `cap`; groups ×
                // group_chunks ≥ n_chunks (merge_groups); same stream.
                unsafe { rerank.launch(&cfg, &mut a)? };
                drop(a);
                trace::mark_device("merge", t.stream());
                Some(merged)
            } else {
                None
            };
            if let (true, Some(m)) = (host_merge, &merged) {
                let lo = t.download_vec(&m.lo)?;
                trace::mark("wait for results");
                let ids = t.download_vec(&m.ids)?;
                trace::mark("download");
                let (ids, dists) =
                    merge_on_host(rerank.entry(), &lo, &ids, nb, groups as usize, cap, k)?;
                trace::mark("merge groups");
                out.ids.extend(ids);
                out.distances.extend(dists);
                continue;
            }
            let (last, chunks) = match &merged {
                Some(m) => (m, groups),
                None => (&cand, n_chunks),
            };
            let mut o_ids = pool.alloc::<u32>(nb * k)?;
            let mut o_dists = pool.alloc::<f32>(nb * k)?;
            t.fill_nan(&mut o_dists)?;
            trace::mark_device("buffers", t.stream());
            let cfg = LaunchConfig::new((nb as u32, 1, 1), (KNN_BLOCK, 1, 1));
            let mut a = self.rerank_args(&d_q, nb, &contract, last, [chunks, chunks])?;
            a.null_ptr().null_ptr().null_ptr().null_ptr();
            push_output(&mut a, &contract, "out_ids", o_ids.view_mut())?;
            push_output(&mut a, &contract, "out_dists", o_dists.view_mut())?;
            // SAFETY: knn_rerank's contract, final level over `chunks` slots
            // per query: knn_tile's, or the merge level's launched just before
            // on the same stream (its buffers live until the download).
            unsafe { rerank.launch(&cfg, &mut a)? };
            drop(a);
            trace::mark_device("re-rank", t.stream());
            append_batch(t, rerank.entry(), &o_ids, &o_dists, &mut out)?;
        }
        Ok((out, tile_link))
    }
}

/// The most merged entries (`batch × groups × k`) the host merges itself
/// ([`merge_on_host`]); beyond, a final re-rank launch merges them on the
/// GPU. At nq 1 an H100/H200 search has about 33 groups (330 entries at
/// k 10); the bound keeps the host's downloads (`× capacity / k`) and merge
/// within some tens of microseconds.
pub const HOST_MERGE_MAX_ENTRIES: usize = 16_384;

/// The final level of a re-rank whose merge level ran (`groups > 1`) and
/// whose lists are short ([`HOST_MERGE_MAX_ENTRIES`]): each
/// query's best `k` of its `groups` lists, from the merge level's outputs
/// (`lo`, `ids`: `nb × groups` slots of `cap`, each slot's first `k`
/// written, sorted, padded with (+inf, all ones)), merged on the host in
/// the kernels' key order ([`merge_splits`]). This was a second re-rank
/// launch of one block per query: a serial tail after a search spread over
/// every SM (on an H200 at nq 1, commit 6f7ea6a: 86 µs of one block, and
/// a launch, for 33 lists of 10), where the host merges such lists in a few
/// microseconds. The results are that launch's, bit for bit: the merge
/// level's keys are exact, so the launch only merged them. A slot left NaN
/// (the merge level wrote nothing) is [`GpuSearchError::Unwritten`].
/// Public so that tests/knn_emulated.rs can hold it to that launch's
/// output under emulation.
pub fn merge_on_host(
    entry: &str,
    lo: &[f32],
    ids: &[u32],
    nb: usize,
    groups: usize,
    cap: usize,
    k: usize,
) -> Result<(Vec<i64>, Vec<f32>), GpuSearchError> {
    debug_assert!(k <= cap && lo.len() == nb * groups * cap && ids.len() == lo.len());
    // Each slot's written first k.
    fn firsts<T: Copy>(v: &[T], cap: usize, k: usize) -> Vec<T> {
        v.chunks(cap).flat_map(|slot| &slot[..k]).copied().collect()
    }
    let dists = firsts(lo, cap, k);
    check_written(entry, &dists)?;
    let ids = widen_ids(firsts(ids, cap, k));
    Ok(merge_splits(&ids, &dists, nb, groups, k, true))
}

/// The error of an f16copy `plan` over `what` (rows or queries) with an
/// element that has no finite f16.
pub(crate) fn f16copy_refused(plan: &KnnPlan, what: &str) -> GpuSearchError {
    GpuSearchError::KnnVariant {
        value: plan.tile.name.to_owned(),
        reason: format!(
            "an f16copy variant needs every element of {what} finite with |v| <= {}",
            f16copy::F16_COPY_MAX
        ),
    }
}

/// `FRAGLINK_GPU_KNN`: whether the tensor-core path may serve searches
/// (default on; `0`/`false`/`no`/`off` leave every search to the exact scan,
/// e.g. to compare the two). Any other value is an error naming it.
pub fn enabled_by_env() -> Result<bool, GpuSearchError> {
    switch_by_env("FRAGLINK_GPU_KNN")
}

/// `FRAGLINK_KNN_SHARED_BOUND`: whether the row chunks of one query share
/// a bound (knn_tile.cuh `shared_bound`; default on). Off passes the
/// candidate kernel a null pointer, every chunk on its own as before the
/// bound, for benchmarks to compare (`gpu_peers.py`'s `fraglink/no-bound`);
/// the results are the same either way. Any other value is an error naming
/// it.
pub fn shared_bound_by_env() -> Result<bool, GpuSearchError> {
    switch_by_env("FRAGLINK_KNN_SHARED_BOUND")
}

/// The variable that sets knn_tile's L2 prefetch lead.
pub const PREFETCH_VAR: &str = "FRAGLINK_KNN_PREFETCH";

/// [`PREFETCH_VAR`]'s default: chunks (64 bytes of each of a row tile's
/// rows, 4 KiB at RT 64) a candidate block asks L2 for ahead of its copies,
/// 16 KiB a block; at the seven blocks an H100/H200 SM holds at nq 1,
/// about 15 MB of the 50 MB L2 in all. Not measured on a GPU yet
/// (`benches/scripts/gpu_peers.py`'s `fraglink/no-prefetch` side is the
/// comparison).
pub const DEFAULT_PREFETCH: u32 = 4;

/// The most chunks [`PREFETCH_VAR`] takes: 64 × 4 KiB a block is already
/// more than an SM's blocks could keep in L2.
pub const MAX_PREFETCH: u32 = 64;

/// What [`PREFETCH_VAR`] takes.
pub const PREFETCH_EXPECTED: &str = "a whole number of chunks from 0 (off) to 64";

/// [`PREFETCH_VAR`]'s value: unset or empty is [`DEFAULT_PREFETCH`]; a
/// whole number up to [`MAX_PREFETCH`] is that lead (0: no prefetch);
/// anything else is an error naming the variable.
pub fn prefetch_by_env() -> Result<u32, GpuSearchError> {
    let Some(value) = crate::switch::env_value(PREFETCH_VAR) else {
        return Ok(DEFAULT_PREFETCH);
    };
    parse_prefetch(&value).ok_or(GpuSearchError::Env {
        variable: PREFETCH_VAR,
        value,
        expected: PREFETCH_EXPECTED,
    })
}

/// A prefetch lead as [`prefetch_by_env`] reads it; `None`: refused.
fn parse_prefetch(value: &str) -> Option<u32> {
    match value.trim() {
        "" => Some(DEFAULT_PREFETCH),
        v => v.parse::<u32>().ok().filter(|&n| n <= MAX_PREFETCH),
    }
}

/// A switch that is on unless `var` says otherwise
/// ([`crate::switch::parse_switch`]); a value it does not take is an error
/// naming `var` and the value.
fn switch_by_env(var: &'static str) -> Result<bool, GpuSearchError> {
    crate::switch::switch_by_env(var, true).map_err(|value| GpuSearchError::Env {
        variable: var,
        value,
        expected: crate::switch::SWITCH_EXPECTED,
    })
}

/// `FRAGLINK_KNN_VARIANT`: a knn_tile fragment every tensor-core search
/// must use instead of the planner's pick (benchmarks comparing tile
/// shapes and precisions); a search it cannot serve is an error naming it.
/// Unset or empty: the planner decides. A value that is not Unicode names
/// no variant (lossily converted), so it is that error, not unset.
pub fn variant_by_env() -> Option<String> {
    crate::switch::env_value("FRAGLINK_KNN_VARIANT")
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_lead_is_a_bounded_whole_number() {
        assert_eq!(parse_prefetch(""), Some(DEFAULT_PREFETCH));
        assert_eq!(parse_prefetch(" 0 "), Some(0));
        assert_eq!(parse_prefetch("8"), Some(8));
        assert_eq!(parse_prefetch("64"), Some(MAX_PREFETCH));
        for bad in ["65", "-1", "on", "4.0", "4294967296"] {
            assert_eq!(parse_prefetch(bad), None, "{bad}");
        }
        let e = GpuSearchError::Env {
            variable: PREFETCH_VAR,
            value: "lots".into(),
            expected: PREFETCH_EXPECTED,
        };
        assert_eq!(
            e.to_string(),
            "FRAGLINK_KNN_PREFETCH = `lots`: expected a whole number of chunks from 0 (off) to 64"
        );
    }

    /// The merge level's outputs as the kernel leaves them: per (query,
    /// group) slot of `cap`, the first `k` written (sorted keys, padding
    /// last), the rest stale; merged on the host they equal the best `k`
    /// of all real entries in key order (distance, then id), and a slot the
    /// kernel left NaN is an error naming the entry.
    #[test]
    fn groups_merge_on_the_host_as_the_final_launch_did() {
        let (nb, groups, cap, k) = (3usize, 4usize, 8usize, 5usize);
        let mut lo = vec![f32::NAN; nb * groups * cap];
        let mut ids = vec![0xDEAD_BEEFu32; lo.len()];
        let mut all: Vec<Vec<(f32, u32)>> = vec![Vec::new(); nb];
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for (q, all_of_q) in all.iter_mut().enumerate() {
            for g in 0..groups {
                // Query 2's group 3 has fewer real rows than k (padding);
                // distances repeat across groups (ties broken by id), with
                // -0 beside +0.
                let real = if q == 2 && g == 3 { 2 } else { k };
                let mut keys: Vec<(f32, u32)> = (0..real)
                    .map(|_| {
                        let d = [-0.0, 0.0, 1.5, 2.0, f32::INFINITY][next() as usize % 5];
                        (d, next() % 1000 + (g as u32) * 1000)
                    })
                    .collect();
                keys.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
                all_of_q.extend(&keys);
                let slot = (q * groups + g) * cap;
                for j in 0..k {
                    let (d, id) = keys.get(j).copied().unwrap_or((f32::INFINITY, u32::MAX));
                    lo[slot + j] = d;
                    ids[slot + j] = id;
                }
            }
        }
        let (got_ids, got_d) =
            merge_on_host("knn_rerank_f32_k32", &lo, &ids, nb, groups, cap, k).unwrap();
        for q in 0..nb {
            let mut want = all[q].clone();
            // The kernels' order: -0 as +0, then the id.
            want.sort_by(|a, b| {
                (a.0 + 0.0)
                    .partial_cmp(&(b.0 + 0.0))
                    .unwrap()
                    .then(a.1.cmp(&b.1))
            });
            for j in 0..k {
                assert_eq!(
                    got_ids[q * k + j],
                    i64::from(want[j].1),
                    "query {q} rank {j}"
                );
                assert_eq!(
                    got_d[q * k + j].to_bits(),
                    want[j].0.to_bits(),
                    "query {q} rank {j}"
                );
            }
        }
        // A slot the merge level never wrote.
        lo[(groups + 1) * cap + 3] = f32::NAN;
        match merge_on_host("knn_rerank_f32_k32", &lo, &ids, nb, groups, cap, k) {
            Err(GpuSearchError::Unwritten {
                entry,
                unwritten,
                outputs,
            }) => {
                assert_eq!(
                    (entry.as_str(), unwritten, outputs),
                    ("knn_rerank_f32_k32", 1, nb * groups * k)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// Rows of 3 cut into steps of 4 elements: a special row's elements are
    /// zeroed in every step it crosses, and steps without one are left alone.
    #[test]
    fn special_rows_are_zeroed_across_copy_steps() {
        let all: Vec<f32> = (1..=18).map(|v| v as f32).collect();
        let special = [1u32, 4];
        let mut joined = Vec::new();
        let mut untouched = 0;
        for at in (0..all.len()).step_by(4) {
            let part = &all[at..(at + 4).min(all.len())];
            match zero_rows(part, at, 3, special.iter().copied()) {
                Some(v) => joined.extend(v),
                None => {
                    untouched += 1;
                    joined.extend_from_slice(part);
                }
            }
        }
        let want: Vec<f32> = all
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if special.contains(&(i as u32 / 3)) {
                    0.0
                } else {
                    v
                }
            })
            .collect();
        assert_eq!(joined, want);
        // Steps 8..12 (rows 2 and 3) and 16..18 (row 5) hold no special row.
        assert_eq!(untouched, 2);
    }
}
