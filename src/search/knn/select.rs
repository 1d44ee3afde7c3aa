//! The two-pass select: exact GPU k-NN for a `k` beyond the candidate
//! kernels' capacities, or a search their bounds cannot take (special
//! queries, special rows beyond what the index copies aside, or more of
//! them allowed than the scan's capacities: [`super::special`]) with `k`
//! beyond the scan's (fragments/knn_select.cuh).
//!
//! Per batch of queries, `knn_dist` (× metric × filter) writes the exact
//! distance matrix (the in-order fold of the scan and the CPU path) and
//! `knn_select` finds each query's k smallest (distance, id) keys with a
//! radix select over the matrix row and sorts them. Results equal the CPU
//! path's bit for bit, special values included.
//!
//! Rules ([`choose_select`], `None` sends the search to the CPU):
//! - ids are u32 and so is the matrix's row stride (`n_rows ≤ 2³² − 4`),
//!   and `k` fits a u32;
//! - the select sorts the winners in slices of at most `sort_slots` keys of
//!   8 bytes, a power of two, in shared memory: up to 16384 on an A100 or
//!   H100, 8192 on sm_86/sm_89 (99 KiB), 4096 on sm_75 (64 KiB). A larger
//!   `min(k, n_rows)` takes several slices ([`slices`]), each five passes
//!   over the query's matrix row (nine where many equal distances make the
//!   cut), so at most [`MAX_SLICES`]: k up to 1 048 576 on an H100;
//! - both fragments, the metric and the filter link for the device.
//!
//! The matrix and results of one batch are at most [`MATRIX_BYTES`]; a
//! batch holds `MATRIX_BYTES / (4 · n_rows + 8 · k)` queries (at least one).

use crate::fragment::FragmentInfo;
use crate::fragments;
use crate::gpu::launch::ScanContract;
use crate::gpu::{GpuBuffer, KernelArgs, LaunchConfig};
use crate::link::prelink::PlanFamily;
use crate::link::{Linked, Planner};
use crate::search::gpu::{append_batch, push_output, DeviceVectors, GpuSearchError, GpuSearcher};
use crate::search::plan::FILTERS;
use crate::search::{DType, Metric, Neighbors, Vectors};

use super::plan::{KnnRequest, SharedMemory};

/// Threads per block of `knn_dist` (FRAGLINK_DIST_BLOCK).
pub const DIST_BLOCK: u32 = 256;
/// Queries × rows of one `knn_dist` block (knn_select.cuh `DQ`, `DR`).
pub const DIST_TILE: (u32, u32) = (32, 64);
/// Threads per block of `knn_select` (FRAGLINK_SELECT_BLOCK).
pub const SELECT_BLOCK: u32 = 256;
/// An upper bound of `knn_select`'s static shared memory (a 256-bin
/// histogram per warp and four words: 8 208 bytes).
pub const SELECT_STATIC_BYTES: u32 = 8448;
/// Device memory of one batch, its distance matrix and its results: 512 MiB
/// (133 queries of 1M rows at k = 2000).
pub const MATRIX_BYTES: usize = 512 << 20;
/// The most slices a search may take. Each reads the query's matrix row
/// five times (nine with many ties at its cut), so the work grows with
/// `k · n_rows`: 64 slices of 16384 keys read a 1M-row row 320 times
/// (1.3 GB per query), where the CPU path sorts once.
pub const MAX_SLICES: usize = 64;
/// Queries per `knn_dist` launch: grid.y holds 65535 query tiles.
const MAX_BATCH: usize = 65_535 * DIST_TILE.0 as usize;

/// The two kernels of one large-k search.
#[derive(Debug, Clone)]
pub struct SelectPlan {
    pub dist: &'static FragmentInfo,
    pub select: &'static FragmentInfo,
    pub metric: &'static FragmentInfo,
    pub filter: &'static FragmentInfo,
    pub dtype: DType,
    /// Keys the select sorts per slice: `min(k, n_rows)` rounded up to a
    /// power of two, at most what the device's shared memory holds.
    pub sort_slots: u32,
}

impl SelectPlan {
    /// The distance kernel: knn_dist + metric + filter.
    pub fn dist_planner(&self) -> Planner {
        Planner::new(self.dist.name)
            .add_fragment(self.dist)
            .add_fragment(self.metric)
            .add_fragment(self.filter)
    }

    /// The select kernel, linked alone.
    pub fn select_planner(&self) -> Planner {
        Planner::new(self.select.name).add_fragment(self.select)
    }

    /// Both kernels in launch order, each with its block size.
    pub fn kernels(&self) -> [(Planner, u32); 2] {
        [
            (self.dist_planner(), DIST_BLOCK),
            (self.select_planner(), SELECT_BLOCK),
        ]
    }

    /// Every fragment the two kernels link.
    pub fn fragment_names(&self) -> Vec<&'static str> {
        vec![
            self.dist.name,
            self.select.name,
            self.metric.name,
            self.filter.name,
        ]
    }

    /// The select's dynamic shared memory: 8 bytes per sorted key.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        self.sort_slots * 8
    }

    /// Queries per batch of `k` over `n_rows` rows: a distance matrix row
    /// (4 bytes a row, [`row_stride`] rows) and the results (8 bytes a
    /// neighbour) of each query within [`MATRIX_BYTES`], at least one query.
    pub fn batch(n_rows: usize, k: usize) -> usize {
        let per_query = 4 * row_stride(n_rows.max(1)) + 8 * k;
        (MATRIX_BYTES / per_query).clamp(1, MAX_BATCH)
    }
}

/// The distance matrix's row stride: `n_rows` rounded up to whole 16-byte
/// vectors, which the select loads.
pub fn row_stride(n_rows: usize) -> usize {
    n_rows.next_multiple_of(4)
}

/// Keys the select sorts per slice for `k` over `n_rows` rows on a device
/// with `shared`: `min(k, n_rows)` rounded up to a power of two, at most the
/// largest power of two whose keys fit a block beside the static shared
/// memory ([`SELECT_STATIC_BYTES`]). `None` where not even one key fits.
pub fn sort_slots(k: usize, n_rows: usize, shared: SharedMemory) -> Option<u32> {
    let room = u64::from(shared.per_block).checked_sub(u64::from(SELECT_STATIC_BYTES))? / 8;
    if room == 0 {
        return None;
    }
    let most = 1u64 << room.ilog2();
    let want = (k.min(n_rows).max(1) as u64).next_power_of_two();
    u32::try_from(want.min(most)).ok()
}

/// Slices of the select for `k` over `n_rows` rows with `sort_slots` keys
/// each (knn_select.cuh: five passes over a query's matrix row per slice,
/// nine with many ties at its cut; a slice past the filter's allowed rows
/// ends the query).
pub fn slices(k: usize, n_rows: usize, sort_slots: u32) -> usize {
    k.min(n_rows).div_ceil(sort_slots.max(1) as usize)
}

/// The two-pass plan for `r`, or `None` where it cannot serve it (module
/// docs). `nq` does not matter.
pub fn choose_select(r: &KnnRequest<'_>) -> Option<SelectPlan> {
    // The row stride is a u32 parameter too.
    if r.k == 0 || u32::try_from(r.k).is_err() || r.n_rows == 0 {
        return None;
    }
    if row_stride(r.n_rows) > u32::MAX as usize {
        return None;
    }
    if r.dim == 0 || u32::try_from(r.dim).is_err() {
        return None;
    }
    let sort_slots = sort_slots(r.k, r.n_rows, r.shared)?;
    if slices(r.k, r.n_rows, sort_slots) > MAX_SLICES {
        return None;
    }
    let plan = assemble(r.dtype, r.metric, r.filter, sort_slots)?;
    let links = [plan.dist, plan.select, plan.metric, plan.filter]
        .iter()
        .all(|f| f.links_for(r.device));
    links.then_some(plan)
}

fn assemble(dtype: DType, metric: Metric, filter: &str, sort_slots: u32) -> Option<SelectPlan> {
    Some(SelectPlan {
        dist: fragments::find(&format!("knn_dist_{}", dtype.name()))?,
        select: fragments::find(&format!("knn_select_b{SELECT_BLOCK}"))?,
        metric: fragments::find(&format!(
            "metric_{}_{}",
            metric.fragment_name(),
            dtype.name()
        ))?,
        filter: fragments::find(&format!("filter_{filter}_u32"))?,
        dtype,
        sort_slots,
    })
}

/// The large-k select family, for prelinking (`fraglink prelink --family
/// select`): each dtype's distance kernel with each metric and filter, and
/// the select kernel.
pub const SELECT_FAMILY: PlanFamily = PlanFamily::new(
    "select",
    "two-pass large-k select: exact distance matrix (knn_dist x metric x filter) and radix select (knn_select)",
    || {
        let mut v = Vec::new();
        for dtype in DType::ALL {
            for metric in Metric::ALL {
                for filter in FILTERS {
                    if let Some(p) = assemble(dtype, metric, filter, 1) {
                        v.push(p.dist_planner());
                    }
                }
            }
        }
        if let Some(p) = assemble(DType::F32, Metric::L2, "none", 1) {
            v.push(p.select_planner());
        }
        v
    },
);

/// The launch-invariant arguments of one large-k search.
pub(crate) struct SelectSearch<'a> {
    pub(crate) gpu: &'a GpuSearcher,
    pub(crate) plan: &'a SelectPlan,
    pub(crate) data: &'a DeviceVectors,
    pub(crate) n_rows: usize,
    pub(crate) dim: usize,
    pub(crate) bits: Option<&'a GpuBuffer<u32>>,
    pub(crate) k: usize,
}

impl SelectSearch<'_> {
    /// Exact k-NN of `queries` in batches of [`SelectPlan::batch`]. Returns
    /// the results and the distance kernel's link.
    pub(crate) fn run(&self, queries: &Vectors) -> Result<(Neighbors, Linked), GpuSearchError> {
        let arch = self.gpu.context().arch();
        let (dist_link, select_link) = Planner::link_pair_tiered_for(
            &self.plan.dist_planner(),
            &self.plan.select_planner(),
            arch,
        )?;
        let dist = self.gpu.launcher_for(&dist_link, DIST_BLOCK)?;
        let select = self.gpu.launcher_for(&select_link, SELECT_BLOCK)?;
        let (t, pool) = (self.gpu.transfer(), self.gpu.pool());
        let (n_rows, dim, k, nq) = (self.n_rows, self.dim, self.k, queries.rows());
        let contract = ScanContract {
            elem_bytes: self.plan.dtype.size() as u32,
            veclen: 1,
            id_bytes: 4,
            capacity: u32::try_from(k).unwrap_or(u32::MAX),
        };
        // Every count below fits its u32 parameter: choose_select checked
        // n_rows, k and dim, and a batch is at most MAX_BATCH queries.
        let batch = SelectPlan::batch(n_rows, k);
        let ld = row_stride(n_rows);
        let mut out = Neighbors {
            nq,
            k,
            ids: Vec::with_capacity(nq * k),
            distances: Vec::with_capacity(nq * k),
        };
        for b0 in (0..nq).step_by(batch) {
            let b1 = (b0 + batch).min(nq);
            let nb = b1 - b0;
            let d_q = crate::search::gpu::upload_queries(t, pool, &queries.slice_rows(b0, b1))?;
            let mut matrix = pool.alloc::<f32>(nb * ld)?;
            let query_tiles = nb.div_ceil(DIST_TILE.0 as usize);
            // knn_dist counts the row tiles it wrote per query tile; the
            // select skips a query whose matrix row is not whole (leaving
            // its distances NaN, reported below) instead of ranking what
            // the pooled block held before.
            let mut tiles_done = pool.alloc::<u32>(query_tiles)?;
            t.zero(&mut tiles_done)?;
            {
                let grid = (
                    n_rows.div_ceil(DIST_TILE.1 as usize) as u32,
                    query_tiles as u32,
                    1,
                );
                let cfg = LaunchConfig::new(grid, (DIST_BLOCK, 1, 1));
                let mut a = KernelArgs::new();
                self.data
                    .push_rows(&mut a, &contract, "dataset", 0..n_rows * dim)?;
                d_q.push_rows(&mut a, &contract, "queries", 0..nb * dim)?;
                match self.bits {
                    Some(b) => a.input(b)?.require_alignment(4, "filter_bits"),
                    None => a.null_ptr(),
                };
                a.value(n_rows as u32)
                    .value(dim as u32)
                    .value(nb as u32)
                    .value(ld as u32);
                a.output(matrix.view_mut())?.require_alignment(16, "dists");
                a.output(tiles_done.view_mut())?
                    .require_alignment(4, "tiles_done");
                // SAFETY: knn_dist's contract (fragments/README.md): the rows,
                // nb queries, the filter words or null, counts that fit u32,
                // a matrix of nb rows of ld ≥ n_rows, a zeroed count per
                // query tile; grid.x covers every row tile and grid.y every
                // query tile (nb ≤ 65535 tiles).
                unsafe { dist.launch(&cfg, &mut a)? };
            }
            let mut o_ids = pool.alloc::<u32>(nb * k)?;
            let mut o_dists = pool.alloc::<f32>(nb * k)?;
            t.fill_nan(&mut o_dists)?;
            {
                let cfg = LaunchConfig::new((nb as u32, 1, 1), (SELECT_BLOCK, 1, 1))
                    .with_dynamic_shared(self.plan.dynamic_shared_bytes());
                let mut a = KernelArgs::new();
                a.input(&matrix)?.require_alignment(16, "dists");
                a.input(&tiles_done)?.require_alignment(4, "tiles_done");
                a.value(n_rows as u32)
                    .value(ld as u32)
                    .value(nb as u32)
                    .value(k as u32)
                    .value(self.plan.sort_slots);
                push_output(&mut a, &contract, "out_ids", o_ids.view_mut())?;
                push_output(&mut a, &contract, "out_dists", o_dists.view_mut())?;
                // SAFETY: knn_select's contract: the matrix and the tile
                // counts knn_dist filled on the same stream (16-byte aligned,
                // rows ld apart, ld a multiple of 4), sort_slots a power of two with 8 bytes each
                // of dynamic shared memory, outputs of nb × k.
                unsafe { select.launch(&cfg, &mut a)? };
            }
            append_batch(t, select.entry(), &o_ids, &o_dists, &mut out)?;
        }
        Ok((out, dist_link))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::Arch;

    fn req(device: Arch, shared: SharedMemory, k: usize, n_rows: usize) -> KnnRequest<'static> {
        KnnRequest {
            device,
            shared,
            dtype: DType::F32,
            metric: Metric::L2,
            filter: "none",
            n_rows,
            dim: 64,
            nq: 10,
            k,
        }
    }

    const A100: SharedMemory = SharedMemory {
        per_block: 163 * 1024,
        per_sm: 164 * 1024,
    };
    const SM86: SharedMemory = SharedMemory {
        per_block: 99 * 1024,
        per_sm: 100 * 1024,
    };
    const SM75: SharedMemory = SharedMemory {
        per_block: 64 * 1024,
        per_sm: 64 * 1024,
    };

    #[test]
    fn the_sort_takes_what_fits_in_shared_memory_and_larger_k_takes_slices() {
        let n = 1_000_000;
        for (device, shared, max_slots) in [
            (Arch::sm(90), SharedMemory::H100, 16384u32),
            (Arch::sm(80), A100, 16384),
            (Arch::sm(86), SM86, 8192),
            (Arch::sm(75), SM75, 4096),
        ] {
            let p = choose_select(&req(device, shared, max_slots as usize, n)).unwrap();
            assert_eq!(p.sort_slots, max_slots);
            assert!(p.dynamic_shared_bytes() + SELECT_STATIC_BYTES <= shared.per_block);
            assert_eq!(slices(max_slots as usize, n, p.sort_slots), 1);
            // Beyond the sort: the same slots, several slices.
            for k in [
                max_slots as usize + 1,
                100_000,
                MAX_SLICES * max_slots as usize,
            ] {
                let p = choose_select(&req(device, shared, k, n)).unwrap();
                assert_eq!(p.sort_slots, max_slots, "{k}");
                assert_eq!(
                    slices(k, n, p.sort_slots),
                    k.min(n).div_ceil(max_slots as usize)
                );
            }
            // Beyond MAX_SLICES slices: the CPU path.
            let over = MAX_SLICES * max_slots as usize + 1;
            assert!(choose_select(&req(device, shared, over, 1 << 28)).is_none());
            assert!(choose_select(&req(device, shared, 1 << 31, 1 << 28)).is_none());
        }
        assert_eq!(slices(16385, 1 << 20, 16384), 2);
        // Beyond n_rows only n_rows keys are sorted: any k serves a small base.
        let p = choose_select(&req(Arch::sm(75), SM75, 1 << 30, 3000)).unwrap();
        assert_eq!(p.sort_slots, 4096);
        assert_eq!(slices(1 << 30, 3000, p.sort_slots), 1);
        assert_eq!(sort_slots(1, 1, SM75), Some(1));
        assert_eq!(sort_slots(1025, 5000, SM75), Some(2048));
        // A block without room for one key beside the static shared memory.
        let tiny = SharedMemory {
            per_block: SELECT_STATIC_BYTES + 7,
            per_sm: 64 * 1024,
        };
        assert_eq!(sort_slots(10, 10, tiny), None);
        assert!(choose_select(&req(Arch::sm(75), tiny, 10, 100)).is_none());
        let one = SharedMemory {
            per_block: SELECT_STATIC_BYTES + 8,
            ..tiny
        };
        assert_eq!(sort_slots(10, 10, one), Some(1));
    }

    #[test]
    fn shapes_outside_u32_ids_or_counts_are_not_served() {
        let h = SharedMemory::H100;
        let sm90 = Arch::sm(90);
        assert!(choose_select(&req(sm90, h, 0, 10)).is_none());
        assert!(choose_select(&req(sm90, h, 10, 0)).is_none());
        // The row stride, n_rows rounded up to a multiple of 4, is a u32.
        assert!(choose_select(&req(sm90, h, 10, u32::MAX as usize - 2)).is_none());
        assert!(choose_select(&req(sm90, h, 10, u32::MAX as usize - 3)).is_some());
        assert_eq!(row_stride(5), 8);
        assert_eq!(row_stride(8), 8);
        let zero_dim = KnnRequest {
            dim: 0,
            ..req(sm90, h, 10, 10)
        };
        assert!(choose_select(&zero_dim).is_none());
    }

    #[test]
    fn batches_bound_the_matrix_and_the_results() {
        assert_eq!(SelectPlan::batch(1_000_000, 2000), 133);
        assert_eq!(SelectPlan::batch(1, 1), MAX_BATCH);
        assert_eq!(SelectPlan::batch(u32::MAX as usize - 3, 5000), 1);
        // A small base with a huge k: the results bound the batch.
        assert_eq!(SelectPlan::batch(3000, 1_000_000), 67);
        for n in [1, 1000, 1_000_000, 100_000_000] {
            for k in [1, 2000, 1 << 20] {
                let b = SelectPlan::batch(n, k);
                assert!(
                    b == 1 || b * (4 * row_stride(n) + 8 * k) <= MATRIX_BYTES,
                    "{n} {k}"
                );
            }
        }
    }

    #[test]
    fn every_dtype_metric_and_filter_has_its_kernels_and_the_family_holds_them() {
        let mut reached = Vec::new();
        for dtype in DType::ALL {
            for metric in Metric::ALL {
                for filter in FILTERS {
                    let r = KnnRequest {
                        dtype,
                        metric,
                        filter,
                        ..req(Arch::sm(90), SharedMemory::H100, 5000, 100_000)
                    };
                    let p = choose_select(&r).unwrap();
                    assert_eq!(p.dist.param("dtype"), Some(dtype.name()));
                    assert_eq!(p.dist_planner().fragment_names().len(), 3);
                    assert_eq!(
                        p.select_planner().fragment_names(),
                        vec![p.select.name.to_string()]
                    );
                    reached.push(p.dist_planner());
                    reached.push(p.select_planner());
                }
            }
        }
        // The select kernel is one plan, whatever the search.
        let mut seen = std::collections::HashSet::new();
        reached.retain(|p| seen.insert(p.fragment_names().join("+")));
        SELECT_FAMILY.check_against(reached).unwrap();
    }
}
