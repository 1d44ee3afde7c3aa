//! Which tensor-core k-NN variant a search uses, if any: a small pure
//! function of the device arch, the workload and the catalog.
//!
//! Rules ([`choose`]), each a reason to keep the exact scan instead (`None`):
//! - the dtype's precision must exist for the device: f16 (f16 MMA) and
//!   i8/u8 (integer MMA) from sm_75, f32 (TF32) from sm_80, f32 through f16
//!   copies (f16copy, the default) from sm_75 — the variant's
//!   `min_arch`, and the fragment must be built for an arch that links there;
//! - `k` ≤ the largest capacity whose shared memory fits the device (1024 on
//!   an H100, 512 on an A100, 256 on sm_86); the smallest capacity ≥ k is
//!   used — beyond the scan's largest (256) a search it cannot serve (a
//!   larger k; special queries, or special rows it cannot take:
//!   [`super::special`]) goes to the two-pass select
//!   ([`super::select`]), or the CPU where that cannot serve it either;
//! - row ids are u32 (`n_rows < 2³² − 1`), `1 ≤ dim ≤ 2¹⁷` (knn_bounds.cuh),
//!   u8 `dim ≤ 32896` (the s32 accumulator stays exact, and the exact squared
//!   norm, carried as f32 bits, stays below the NaN bit patterns).
//!
//! Precision for f32, chosen by measurement (an H200, GPU.md at commit
//! 6f7ea6a, 1M x 128, k 10, every variant by name): f16copy (f16 copies of
//! the rows and queries, from sm_75: half the bytes a search reads and twice
//! TF32's MMA rate, for a margin of 2⁻¹⁰ per product) at every batch size:
//! its 16-query tiles searched 1.55x, 2.07x and 1.92x as fast as the best
//! 3xTF32 variant at 1, 100 and 10 000 queries, where plain TF32's best were
//! 1.22x, 1.22x and 1.2x. Where the rows or queries hold an element without a
//! finite f16, the search falls back to plain TF32 (sm_80;
//! [`choose_fallback`]). 3xTF32 (a margin about 10x narrower than TF32's at
//! dim 128, so fewer candidates reach the exact re-rank, at three MMAs per
//! product) only when named ([`choose_named`], e.g. by a benchmark). Only
//! k 10 was measured for every variant.
//!
//! Block shape (`qtile` queries × `rtile` rows per iteration, 4 warps): the
//! smallest capacity ≥ k among the variants whose shared memory fits the
//! device ([`KnnPlan::shared_bytes`] against the opt-in limit), among them
//! the shapes two blocks of which fit an SM where any do, then the
//! largest query tile that at least two tiles of queries fill (a 64-query
//! tile reads each row once per 64 queries, and its warps reuse each operand
//! fragment for two MMAs), else the smallest (for kernels staging f16: at
//! most 32 queries, filled four times: `pick`). Row chunks ([`chunks`]): query
//! tiles × chunks fill one wave of the device's resident blocks, so nq = 1
//! still spreads over every SM (the small-batch split), never chunks shorter
//! than one row iteration.

use crate::build::Arch;
use crate::fragment::FragmentInfo;
use crate::fragments;
use crate::link::prelink::PlanFamily;
use crate::link::Planner;

use super::super::plan::FILTERS;
use super::super::{DType, Metric};

/// Dot-product precision of a candidate kernel (the `precision` matrix key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    F16,
    Tf32,
    Tf32x3,
    Int,
    /// f32 rows whose f16 copies (made once, [`KnnRows`](super::gpu::KnnRows))
    /// the f16 MMA reads: half the bytes of the rows per search, with a
    /// margin about a quarter of TF32's; the exact fold still reads the f32
    /// rows.
    /// Needs every element of rows and queries finite with |v| ≤ 65504.
    F16Copy,
}

impl Precision {
    pub const ALL: [Precision; 5] = [
        Precision::F16,
        Precision::Tf32,
        Precision::Tf32x3,
        Precision::Int,
        Precision::F16Copy,
    ];

    /// The matrix value (`tf32x3`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F16 => "f16",
            Precision::Tf32 => "tf32",
            Precision::Tf32x3 => "tf32x3",
            Precision::Int => "int",
            Precision::F16Copy => "f16copy",
        }
    }

    /// knn_bounds.cuh's `precision_kind`.
    pub fn code(self) -> i32 {
        match self {
            Precision::F16 => 0,
            Precision::Tf32 => 1,
            Precision::Tf32x3 => 2,
            Precision::Int => 3,
            Precision::F16Copy => 4,
        }
    }

    /// The element type the MMAs read for rows of `dtype`: f16 for
    /// [`F16Copy`](Self::F16Copy) (the copies), else the rows' own.
    pub fn staged(self, dtype: DType) -> DType {
        match self {
            Precision::F16Copy => DType::F16,
            _ => dtype,
        }
    }

    /// The default precision of `dtype` (module docs): f32 reads the rows'
    /// f16 copies.
    pub fn default_for(dtype: DType) -> Precision {
        match dtype {
            DType::F32 => Precision::F16Copy,
            DType::F16 => Precision::F16,
            DType::I8 | DType::U8 => Precision::Int,
        }
    }
}

/// Which global → shared copies a candidate kernel holds (the `staging`
/// matrix key: knn_tile.cuh's `staging_kind`, 0 or 16; `_a16` in the name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Staging {
    /// Any dim and alignment: 16-byte, 4-byte or element copies, chosen by
    /// the kernel at run time.
    Any,
    /// Rows of whole 16-byte groups, 16-byte aligned, only: without the
    /// other two copy paths a variant links about 30% faster. The planner
    /// picks it wherever the rows allow (pool memory is 256-byte aligned).
    A16,
}

impl Staging {
    /// The fragment name's suffix (`_a16`).
    pub fn suffix(self) -> &'static str {
        match self {
            Staging::Any => "",
            Staging::A16 => "_a16",
        }
    }

    /// Whether this variant can stage rows of `dim` elements of `dtype`:
    /// whole copies of [`veclen`](Self::veclen) elements.
    pub fn serves(self, dtype: DType, dim: usize) -> bool {
        dim.is_multiple_of(self.veclen(dtype) as usize)
    }

    /// Elements per copy the launch guarantees (the host's alignment check:
    /// `ScanContract::veclen`): 16 bytes' worth for `A16`, else 1.
    pub fn veclen(self, dtype: DType) -> u32 {
        match self {
            Staging::Any => 1,
            Staging::A16 => (16 / dtype.size()) as u32,
        }
    }
}

/// Threads per block of both kernels.
pub const KNN_BLOCK: u32 = 128;
/// Largest `dim` the bounds admit (knn_bounds.cuh `dim_supported`).
pub const MAX_DIM: usize = 1 << 17;
/// Largest u8 `dim` on this path: dot products below 2³¹ fit the s32
/// accumulator (33025), and squared norms below 0x7F80_0000 (32896 · 255²)
/// never look like a NaN when carried as f32 bits in the aux array.
pub const MAX_DIM_U8: usize = 32896;
// The largest such dim: one more reaches the first NaN pattern.
const _: () = assert!(
    (MAX_DIM_U8 as u64) * 255 * 255 < 0x7F80_0000
        && (MAX_DIM_U8 as u64 + 1) * 255 * 255 >= 0x7F80_0000
);

/// The two kernels of one search and their shape.
#[derive(Debug, Clone)]
pub struct KnnPlan {
    pub tile: &'static FragmentInfo,
    pub rerank: &'static FragmentInfo,
    pub metric: &'static FragmentInfo,
    pub filter: &'static FragmentInfo,
    pub dtype: DType,
    pub precision: Precision,
    pub staging: Staging,
    pub qtile: u32,
    pub rtile: u32,
    pub capacity: u32,
}

impl KnnPlan {
    /// The candidate kernel's dynamic shared memory for a full query tile
    /// (knn_tile.cuh `tile_shape::dynamic_bytes`): per query a buffer of
    /// capacity + row tile (lo, hi, id) entries. The most a launch needs.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        tile_dynamic_bytes(self.qtile, self.rtile, self.capacity)
    }

    /// What a launch over a batch of `nq` queries passes: buffers for a
    /// whole query tile, or for the batch's queries where they are fewer
    /// (the kernel lays them out so): at nq 1 a 16-query tile needs 1.2
    /// instead of 18 KiB (capacity 32), so more blocks, and row chunks,
    /// share an SM.
    pub fn dynamic_shared_bytes_for(&self, nq: usize) -> u32 {
        let queries = nq.clamp(1, self.qtile as usize) as u32;
        tile_dynamic_bytes(queries, self.rtile, self.capacity)
    }

    /// The candidate kernel's shared memory, static + dynamic (an upper
    /// bound of the static part: tests/knn_link.rs checks it against the
    /// linked cubins).
    pub fn shared_bytes(&self) -> u32 {
        tile_static_bytes(
            self.staged_dtype().size() as u32,
            self.qtile,
            self.rtile,
            self.capacity,
        ) + self.dynamic_shared_bytes()
    }

    /// The element type the candidate kernel stages ([`Precision::staged`]).
    pub fn staged_dtype(&self) -> DType {
        self.precision.staged(self.dtype)
    }

    /// The candidate kernel: tile + metric + filter.
    pub fn tile_planner(&self) -> Planner {
        Planner::kept(&[self.tile, self.metric, self.filter])
    }

    /// The merge + re-rank kernel: rerank + metric.
    pub fn rerank_planner(&self) -> Planner {
        Planner::kept(&[self.rerank, self.metric])
    }

    /// [`Self::tile_planner`], built anew ([`Planner::of_fragments`]).
    fn fresh_tile_planner(&self) -> Planner {
        Planner::of_fragments(&[self.tile, self.metric, self.filter])
    }

    fn fresh_rerank_planner(&self) -> Planner {
        Planner::of_fragments(&[self.rerank, self.metric])
    }

    /// Both kernels in launch order, each with its block size.
    pub fn kernels(&self) -> [(Planner, u32); 2] {
        [
            (self.tile_planner(), KNN_BLOCK),
            (self.rerank_planner(), KNN_BLOCK),
        ]
    }

    /// Every fragment the two kernels link.
    pub fn fragment_names(&self) -> Vec<&'static str> {
        vec![
            self.tile.name,
            self.rerank.name,
            self.metric.name,
            self.filter.name,
        ]
    }

    /// Row chunks of a launch over `n_rows` rows for `nq` queries on a
    /// device that holds `resident` candidate blocks at once:
    /// `(n_chunks, chunk_rows)`.
    pub fn chunks(&self, n_rows: usize, nq: usize, resident: u32) -> (u32, u32) {
        chunks(n_rows, nq, self.qtile, self.rtile, resident)
    }
}

/// `(n_chunks, chunk_rows)` for a device that holds `resident` candidate
/// blocks at once (blocks per SM by the kernel's registers and shared
/// memory × SMs): as many chunks as keep query tiles × chunks within one
/// wave of `resident` blocks, where the rows allow; each chunk a whole number
/// of row tiles. Equal chunks in one wave end together: a second, partial
/// wave (528 blocks where 396 fit) would leave most SMs idle for a whole
/// block's time.
pub fn chunks(n_rows: usize, nq: usize, qtile: u32, row_tile: u32, resident: u32) -> (u32, u32) {
    let rt = row_tile.max(1) as usize;
    let tiles = nq.div_ceil(qtile.max(1) as usize).max(1);
    let max_chunks = n_rows.div_ceil(rt).max(1);
    // grid.y holds at most 65535 chunks.
    let want = (resident.max(1) as usize / tiles).clamp(1, max_chunks.min(65_535));
    // A chunk's rows are a u32 (the kernel's `chunk_rows`): near 2^32 rows
    // one chunk would wrap to 0, so it takes at most the largest whole
    // number of row tiles a u32 holds.
    let chunk_rows =
        (n_rows.div_ceil(want).div_ceil(rt).max(1) * rt).min(u32::MAX as usize / rt * rt);
    let n_chunks = n_rows.div_ceil(chunk_rows).max(1);
    (n_chunks as u32, chunk_rows as u32)
}

/// knn_tile's dynamic shared memory for a block shape (its
/// `tile_shape::dynamic_bytes`).
pub fn tile_dynamic_bytes(qtile: u32, rtile: u32, capacity: u32) -> u32 {
    qtile * (capacity + rtile) * 12
}

/// knn_tile's static shared memory for `elem_bytes`-byte elements: the copy
/// pipeline's stages (`tile_stages`) of query and row chunks, 64 bytes per row
/// (16-byte slabs as they are; 32-byte slabs padded to 48 bytes, so 96), 4
/// warps' 16 × 16 accumulators (also their compaction histograms), per query
/// a count, threshold, two norms and the shared bound (`shared_bound`).
pub fn tile_static_bytes(elem_bytes: u32, qtile: u32, rtile: u32, capacity: u32) -> u32 {
    let staged_row = if elem_bytes == 1 { 64 } else { 96 };
    tile_stages(qtile, capacity) * staged_row * (qtile + rtile) + 4 * 4 * 256 + 20 * qtile
}

/// Chunks knn_tile holds in shared memory at once (`tile_shape::STAGES`):
/// three; two for the 64-query tile (so two of its blocks fit an SM) and for
/// capacity 1024 (its 204 KiB of candidate buffers leave room for two within
/// an H100's 227 KiB per block).
pub fn tile_stages(qtile: u32, capacity: u32) -> u32 {
    if qtile >= 64 || capacity >= 1024 {
        2
    } else {
        3
    }
}

/// Chunks per block of the re-rank's merge level. A query whose candidates
/// span more chunks is re-ranked in two launches: blocks of this many chunks
/// each keep their exact best k (in parallel over the groups), then the host
/// merges the groups where their lists are short (`knn::gpu::merge_on_host`),
/// else one block per query does. One block walking every chunk (about 400 on
/// an H100 at nq = 1) would be a serial tail after a search spread over
/// every SM.
pub const MERGE_CHUNKS: u32 = 16;

/// `(groups, group_chunks)` of the re-rank for `n_chunks` chunks: with
/// `groups > 1` a merge launch over `groups` blocks per query of
/// `group_chunks` chunks comes first; with `groups == 1` one launch takes
/// every chunk.
pub fn merge_groups(n_chunks: u32) -> (u32, u32) {
    if n_chunks > MERGE_CHUNKS {
        (n_chunks.div_ceil(MERGE_CHUNKS), MERGE_CHUNKS)
    } else {
        (1, n_chunks.max(1))
    }
}

fn param_u32(f: &FragmentInfo, key: &str) -> Option<u32> {
    f.param(key)?.parse().ok()
}

/// The candidate kernels of `dtype` at `precision` that link for `device`.
fn tiles(
    device: Arch,
    dtype: DType,
    precision: Precision,
) -> impl Iterator<Item = &'static FragmentInfo> {
    fragments::catalog().iter().copied().filter(move |f| {
        f.family == "knn_tile"
            && f.param("dtype") == Some(dtype.name())
            && f.param("precision") == Some(precision.name())
            && f.links_for(device)
    })
}

/// Whether some variant of `dtype`, at any precision, links for `device`
/// (the index keeps row norms only then): f32 on sm_75 has the f16copy
/// variants only, which serve the searches that name them.
pub fn available(device: Arch, dtype: DType) -> bool {
    Precision::ALL
        .into_iter()
        .any(|p| links_at(device, dtype, p))
}

/// Whether some variant of `dtype` at `precision` links for `device`.
pub fn links_at(device: Arch, dtype: DType, precision: Precision) -> bool {
    tiles(device, dtype, precision).next().is_some()
}

/// Whether the tensor-core path can take rows of this shape at all: an
/// index keeps their norms ([`KnnRows`](super::gpu::KnnRows)) only then,
/// and only then do `FRAGLINK_GPU_KNN` and `FRAGLINK_KNN_VARIANT` count.
/// Ids within u32, `dim` within the bounds' range, a variant for the
/// device.
pub fn takes_rows(device: Arch, dtype: DType, n_rows: usize, dim: usize) -> bool {
    n_rows > 0
        && n_rows < u32::MAX as usize
        && dim > 0
        && dim <= MAX_DIM
        && available(device, dtype)
}

/// The device's shared memory, as the planner weighs variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedMemory {
    /// What one block may use, opt-in included
    /// (`DeviceLimits::shared_bytes_per_block_optin`).
    pub per_block: u32,
    /// What one SM holds for all its blocks (`shared_bytes_per_sm`).
    pub per_sm: u32,
}

impl SharedMemory {
    /// An H100 (227 KiB per block, 228 KiB per SM), for tests and examples
    /// that plan without a device.
    pub const H100: SharedMemory = SharedMemory {
        per_block: 227 * 1024,
        per_sm: 228 * 1024,
    };

    /// The figures of a device.
    pub fn of(limits: &crate::gpu::DeviceLimits) -> SharedMemory {
        SharedMemory {
            per_block: limits.shared_bytes_per_block_optin,
            per_sm: limits.shared_bytes_per_sm,
        }
    }
}

/// Shared memory the driver reserves per resident block (1 KiB from sm_80).
const RESERVED_SHARED_PER_BLOCK: u32 = 1024;

/// One search as the planner sees it.
#[derive(Debug, Clone, Copy)]
pub struct KnnRequest<'a> {
    pub device: Arch,
    pub shared: SharedMemory,
    pub dtype: DType,
    pub metric: Metric,
    /// `none` or `bitset`.
    pub filter: &'a str,
    pub n_rows: usize,
    pub dim: usize,
    pub nq: usize,
    pub k: usize,
}

/// The planner's variant for a search, or `None` when the exact scan must
/// serve it (module docs). Where f16copy is the default but no variant of it
/// serves the search, plain TF32's.
pub fn choose(r: &KnnRequest<'_>) -> Option<KnnPlan> {
    let Some(key) = ChoiceKey::of(r) else {
        return choose_uncached(r);
    };
    let mut guard = CHOSEN.lock().unwrap_or_else(|p| p.into_inner());
    let chosen = guard.get_or_insert_with(Default::default);
    if let Some(p) = chosen.get(&key) {
        return p.clone();
    }
    let p = choose_uncached(r);
    if chosen.len() >= CHOSEN_ENTRIES {
        chosen.clear();
    }
    chosen.insert(key, p.clone());
    p
}

fn choose_uncached(r: &KnnRequest<'_>) -> Option<KnnPlan> {
    plan_at(r, None).or_else(|| choose_fallback(r))
}

/// [`choose`]'s answers, which depend on the request and the embedded
/// catalog only. A search asks once per batch, and assembling the
/// candidates looks each variant's re-rank, metric and filter fragments up
/// by name: about 15 µs per call (f32, sm_90, nq 1, k 10, on this crate's
/// 2-core CI machine; `choose` then took 0.1 µs), beside a small search's
/// few hundred µs on the GPU. Bounded: cleared when full.
static CHOSEN: std::sync::Mutex<Option<std::collections::HashMap<ChoiceKey, Option<KnnPlan>>>> =
    std::sync::Mutex::new(None);

/// Most requests [`CHOSEN`] keeps.
const CHOSEN_ENTRIES: usize = 256;

/// A [`KnnRequest`] with its filter name interned (the two the catalog
/// has; any other is not memoized).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ChoiceKey {
    device: Arch,
    shared: (u32, u32),
    dtype: DType,
    metric: Metric,
    filter: &'static str,
    n_rows: usize,
    dim: usize,
    nq: usize,
    k: usize,
}

impl ChoiceKey {
    fn of(r: &KnnRequest<'_>) -> Option<ChoiceKey> {
        let filter = match r.filter {
            "none" => "none",
            "bitset" => "bitset",
            _ => return None,
        };
        Some(ChoiceKey {
            device: r.device,
            shared: (r.shared.per_block, r.shared.per_sm),
            dtype: r.dtype,
            metric: r.metric,
            filter,
            n_rows: r.n_rows,
            dim: r.dim,
            nq: r.nq,
            k: r.k,
        })
    }
}

/// The picked plan among those serving `r` at `precision` (default: the
/// dtype's for `r.nq`).
fn plan_at(r: &KnnRequest<'_>, precision: Option<Precision>) -> Option<KnnPlan> {
    candidates(r, precision).and_then(|c| pick(&c, r.nq, r.shared.per_sm))
}

/// The plan when the default precision cannot serve `r`: for f32 rows that
/// f16copy cannot take (no variant, or elements without a finite f16, which
/// the search finds when it makes the copies), plain TF32's; `None` else.
pub fn choose_fallback(r: &KnnRequest<'_>) -> Option<KnnPlan> {
    if Precision::default_for(r.dtype) != Precision::F16Copy {
        return None;
    }
    plan_at(r, Some(Precision::Tf32))
}

/// The variant for a search with a candidate kernel perhaps named (a
/// benchmark comparing variants: `FRAGLINK_KNN_VARIANT`): without a name,
/// [`choose`]; with one, `None` where no variant serves the search at the
/// named variant's precision (the dtype's default where the name is no
/// candidate kernel of this dtype: shape, k or device outside the kernels'
/// range, so the scan serves it, named variant or not), else
/// [`choose_variant`], an error saying why the named one cannot serve it.
pub fn choose_named(r: &KnnRequest<'_>, variant: Option<&str>) -> Result<Option<KnnPlan>, String> {
    let Some(name) = variant else {
        return Ok(choose(r));
    };
    let precision = fragments::find(name)
        .filter(|f| f.family == "knn_tile" && f.param("dtype") == Some(r.dtype.name()))
        .and_then(precision_of);
    if candidates(r, precision).is_none() {
        return Ok(None);
    }
    choose_variant(r, name).map(Some)
}

/// A candidate kernel's precision (its `precision` key).
fn precision_of(f: &FragmentInfo) -> Option<Precision> {
    let p = f.param("precision")?;
    Precision::ALL.into_iter().find(|x| x.name() == p)
}

/// `name` for the search `r` (the default precision set aside), or why it
/// cannot serve it.
pub fn choose_variant(r: &KnnRequest<'_>, name: &str) -> Result<KnnPlan, String> {
    let f = fragments::find(name)
        .filter(|f| f.family == "knn_tile")
        .ok_or_else(|| format!("`{name}` is not a knn_tile fragment of this build"))?;
    let precision = precision_of(f).ok_or_else(|| format!("`{name}` has no precision"))?;
    if f.param("dtype") != Some(r.dtype.name()) {
        return Err(format!(
            "`{name}` is a kernel for {} rows, these are {}",
            f.param("dtype").unwrap_or("other"),
            r.dtype.name()
        ));
    }
    let c = candidates(r, Some(precision)).ok_or_else(|| {
        format!(
            "no {} variant serves this search ({} rows, dim {}, k {}, sm_{})",
            r.dtype.name(),
            r.n_rows,
            r.dim,
            r.k,
            r.device.number
        )
    })?;
    c.into_iter().find(|p| p.tile.name == name).ok_or_else(|| {
        format!(
            "`{name}` does not serve this search: {} rows of dim {}, k {}, on sm_{} with {} bytes \
                 of shared memory per block (dtype, capacity ≥ k, arch and shared memory must fit, \
                 and an `_a16` variant needs what it stages to be whole 16-byte groups: rows, or \
                 for f16copy their f16 copies, dim a multiple of 8)",
            r.n_rows, r.dim, r.k, r.device.number, r.shared.per_block
        )
    })
}

/// The plans that can serve `r` at `precision` (default: the dtype's), or
/// `None` when the search is outside the kernels' range.
fn candidates(r: &KnnRequest<'_>, precision: Option<Precision>) -> Option<Vec<KnnPlan>> {
    let (dtype, dim, k) = (r.dtype, r.dim, r.k);
    let precision = precision.unwrap_or(Precision::default_for(dtype));
    if k == 0 || r.n_rows == 0 || r.n_rows >= u32::MAX as usize || dim == 0 || dim > MAX_DIM {
        return None;
    }
    if dtype == DType::U8 && dim > MAX_DIM_U8 {
        return None;
    }
    let plans: Vec<KnnPlan> = tiles(r.device, dtype, precision)
        .filter_map(|t| assemble(t, r.metric, r.filter))
        .filter(|p| {
            p.capacity as usize >= k
                && p.shared_bytes() <= r.shared.per_block
                && p.staging.serves(precision.staged(dtype), dim)
        })
        .collect();
    (!plans.is_empty()).then_some(plans)
}

/// The smallest capacity, `A16` staging where it serves; among those the
/// shapes two blocks of which fit an SM's `sm_shared` bytes, where any do
/// (one block of 4 warps per SM leaves it idle while it waits on memory);
/// then the largest query tile that `nq` fills twice, else the smallest
/// tile. Kernels staging f16 (f16 rows, f16copy) take at most 32-query tiles,
/// and only those `nq` fills four times: on an H200 (GPU.md, commit 6f7ea6a,
/// 1M x 128, k 10) 16-query tiles were 1.1x as fast as 32-query ones at 100
/// queries, and 32-query tiles 1.2x as fast as 64-query ones at 10 000.
fn pick(c: &[KnnPlan], nq: usize, sm_shared: u32) -> Option<KnnPlan> {
    let capacity = c.iter().map(|p| p.capacity).min()?;
    let staging = if c.iter().any(|p| p.staging == Staging::A16) {
        Staging::A16
    } else {
        Staging::Any
    };
    let same: Vec<&KnnPlan> = c
        .iter()
        .filter(|p| p.capacity == capacity && p.staging == staging)
        .collect();
    let two_fit = |p: &&KnnPlan| 2 * (p.shared_bytes() + RESERVED_SHARED_PER_BLOCK) <= sm_shared;
    let same: Vec<&KnnPlan> = if same.iter().any(two_fit) {
        same.into_iter().filter(two_fit).collect()
    } else {
        same
    };
    let (fill, max_qtile) = match same.first().map(|p| p.staged_dtype()) {
        Some(DType::F16) => (4, 32),
        _ => (2, u32::MAX),
    };
    same.iter()
        .filter(|p| p.qtile <= max_qtile && nq >= fill * p.qtile as usize)
        .max_by_key(|p| (p.qtile, p.rtile))
        .or_else(|| same.iter().min_by_key(|p| (p.qtile, p.rtile)))
        .map(|p| (*p).clone())
}

/// The plan of candidate kernel `tile` with `metric` and `filter`: its
/// re-rank, metric and filter fragments from the catalog (`None` when one
/// is missing or the tile lacks a key).
fn assemble(tile: &'static FragmentInfo, metric: Metric, filter: &str) -> Option<KnnPlan> {
    let dtype = tile.param("dtype")?.parse::<DType>().ok()?;
    let precision = precision_of(tile)?;
    let staging = match tile.param("staging")? {
        "0" => Staging::Any,
        "16" => Staging::A16,
        _ => return None,
    };
    let (qtile, rtile, capacity) = (
        param_u32(tile, "qtile")?,
        param_u32(tile, "rtile")?,
        param_u32(tile, "capacity")?,
    );
    Some(KnnPlan {
        tile,
        rerank: fragments::find(&format!("knn_rerank_{}_k{capacity}", dtype.name()))?,
        metric: fragments::find(&format!(
            "metric_{}_{}",
            metric.fragment_name(),
            dtype.name()
        ))?,
        filter: fragments::find(&format!("filter_{filter}_u32"))?,
        dtype,
        precision,
        staging,
        qtile,
        rtile,
        capacity,
    })
}

/// Every plan [`choose`] can produce, over every device of the build's
/// archs: each knn_tile variant with each metric and filter.
pub fn all_plans() -> Vec<KnnPlan> {
    let mut out = Vec::new();
    for tile in fragments::catalog().iter().copied() {
        if tile.family != "knn_tile" {
            continue;
        }
        for metric in Metric::ALL {
            for filter in FILTERS {
                out.extend(assemble(tile, metric, filter));
            }
        }
    }
    out
}

/// The tensor-core k-NN family, for prelinking (`fraglink prelink --family knn`):
/// both kernels of every plan.
pub const KNN_FAMILY: PlanFamily = PlanFamily::new(
    "knn",
    "tensor-core k-NN: candidate kernel (knn_tile x metric x filter) and its merge + exact re-rank (knn_rerank x metric)",
    || {
        let mut v: Vec<Planner> = Vec::new();
        for p in all_plans() {
            v.push(p.fresh_tile_planner());
            v.push(p.fresh_rerank_planner());
        }
        // A re-rank plan serves every tile variant of its dtype and capacity.
        let mut seen = std::collections::HashSet::new();
        v.retain(|p| {
            let names: Vec<&str> = p.static_fragments().iter().map(|f| f.name).collect();
            seen.insert(names.join("+"))
        });
        v
    },
);

#[cfg(test)]
mod tests {
    use super::*;

    const SM75: Arch = Arch::sm(75);
    const SM80: Arch = Arch::sm(80);
    const SM90: Arch = Arch::sm(90);

    fn req(
        device: Arch,
        dtype: DType,
        n_rows: usize,
        dim: usize,
        nq: usize,
        k: usize,
    ) -> KnnRequest<'static> {
        KnnRequest {
            device,
            shared: SharedMemory::H100,
            dtype,
            metric: Metric::L2,
            filter: "none",
            n_rows,
            dim,
            nq,
            k,
        }
    }

    fn pick(a: Arch, d: DType, nq: usize, k: usize) -> Option<KnnPlan> {
        choose(&req(a, d, 1_000_000, 128, nq, k))
    }

    fn pick_shape(d: DType, n_rows: usize, dim: usize) -> Option<KnnPlan> {
        choose(&req(SM90, d, n_rows, dim, 1, 1))
    }

    /// The memoized answer is the one computed afresh, for every request
    /// shape (kept or not), asked twice; a filter outside the catalog's two
    /// is answered without the memo.
    #[test]
    fn memoized_choices_equal_fresh_ones() {
        let name = |p: Option<KnnPlan>| p.map(|p| (p.tile.name, p.rerank.name, p.filter.name));
        for d in [DType::F32, DType::F16, DType::I8, DType::U8] {
            for (nq, k, dim) in [(1, 10, 128), (100, 100, 96), (10_000, 300, 128), (5, 0, 8)] {
                for filter in ["none", "bitset", "other"] {
                    let r = KnnRequest {
                        filter,
                        ..req(SM90, d, 50_000, dim, nq, k)
                    };
                    let fresh = name(choose_uncached(&r));
                    assert_eq!(name(choose(&r)), fresh, "{r:?}");
                    assert_eq!(name(choose(&r)), fresh, "{r:?}");
                }
            }
        }
    }

    /// Kept planners are the fresh ones (entry, fragments, options), for
    /// every plan of a few dtypes, asked twice.
    #[test]
    fn kept_planners_equal_fresh_ones() {
        let shape = |p: &Planner| {
            let names: Vec<&str> = p.static_fragments().iter().map(|f| f.name).collect();
            (p.entries().to_vec(), names, p.options(SM90).to_args())
        };
        for plan in all_plans().into_iter().step_by(7) {
            for _ in 0..2 {
                assert_eq!(
                    shape(&plan.tile_planner()),
                    shape(&plan.fresh_tile_planner())
                );
                assert_eq!(
                    shape(&plan.rerank_planner()),
                    shape(&plan.fresh_rerank_planner())
                );
            }
        }
    }

    #[test]
    fn precision_follows_dtype_and_arch() {
        // f32 on sm_75: the f16copy variants only (TF32 needs sm_80).
        assert!(available(SM75, DType::F32) && available(SM80, DType::F32));
        assert!(available(SM75, DType::F16) && available(SM75, DType::U8));
        assert_eq!(
            pick(SM75, DType::F32, 1, 10).unwrap().precision,
            Precision::F16Copy
        );
        let r = req(SM75, DType::F32, 1_000_000, 128, 1, 10);
        let named = |n: &str| choose_named(&r, Some(n));
        let h = named("knn_tile_f32_f16copy_q16_r64_k32_a16")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.precision, h.staged_dtype()),
            (Precision::F16Copy, DType::F16)
        );
        // A TF32 variant named on sm_75 leaves the search to the scan, as
        // before; an f16 variant named for f32 rows is an error naming it.
        assert!(named("knn_tile_f32_tf32x3_q16_r64_k32_a16")
            .unwrap()
            .is_none());
        let e = choose_named(
            &req(SM80, DType::F32, 1_000_000, 128, 1, 10),
            Some("knn_tile_f16_f16_q16_r64_k32_a16"),
        )
        .unwrap_err();
        assert!(e.contains("knn_tile_f16_f16_q16_r64_k32_a16"), "{e}");
        // f16copy stages f16: `_a16` needs dim a multiple of 8, not 4.
        let r36 = req(SM90, DType::F32, 1_000_000, 36, 1, 10);
        let e = choose_variant(&r36, "knn_tile_f32_f16copy_q16_r64_k32_a16").unwrap_err();
        assert!(e.contains("multiple of 8"), "{e}");
        assert!(choose_variant(&r36, "knn_tile_f32_tf32x3_q16_r64_k32_a16").is_ok());
        // f32 by default: f16copy at every batch size (sm_75 too), plain
        // TF32 where f16copy cannot take the data.
        for device in [SM75, SM80, SM90] {
            for nq in [1, 16, 10_000] {
                let p = pick(device, DType::F32, nq, 10).unwrap();
                assert_eq!(p.precision, Precision::F16Copy, "{device:?} nq {nq}");
            }
        }
        let p = pick(SM80, DType::F32, 1, 10).unwrap();
        assert_eq!(p.tile.name, "knn_tile_f32_f16copy_q16_r64_k32_a16");
        let p = pick(SM90, DType::F32, 100, 10).unwrap();
        assert_eq!(p.tile.name, "knn_tile_f32_f16copy_q16_r64_k32_a16");
        let r100 = req(SM90, DType::F32, 1_000_000, 128, 100, 10);
        let t = choose_fallback(&r100).unwrap();
        assert_eq!(t.tile.name, "knn_tile_f32_tf32_q32_r64_k32_a16");
        assert!(choose_fallback(&req(SM75, DType::F32, 1_000_000, 128, 100, 10)).is_none());
        let t = choose_fallback(&req(SM90, DType::F32, 1_000_000, 128, 1, 10)).unwrap();
        assert_eq!(t.tile.name, "knn_tile_f32_tf32_q16_r64_k32_a16");
        assert!(choose_fallback(&req(SM90, DType::F16, 1_000_000, 128, 100, 10)).is_none());
        assert_eq!(
            pick(SM75, DType::F16, 1, 10).unwrap().precision,
            Precision::F16
        );
        assert_eq!(
            pick(SM90, DType::I8, 1, 10).unwrap().precision,
            Precision::Int
        );
        // A named variant: plain TF32, with cosine and a filter.
        let t = choose_variant(
            &KnnRequest {
                metric: Metric::Cosine,
                filter: "bitset",
                ..req(SM90, DType::F32, 10, 8, 1, 1)
            },
            "knn_tile_f32_tf32_q16_r64_k32",
        )
        .unwrap();
        assert_eq!(t.precision, Precision::Tf32);
        assert_eq!(t.filter.name, "filter_bitset_u32");
        assert_eq!(t.metric.name, "metric_cosine_f32");
    }

    #[test]
    fn rows_of_16_byte_groups_take_the_a16_staging() {
        // (dtype, dim): whole 16-byte groups or not.
        for (d, aligned, other) in [
            (DType::F32, 128, 126),
            (DType::F16, 96, 100),
            (DType::I8, 48, 36),
            (DType::U8, 16, 1),
        ] {
            let at = |dim: usize| choose(&req(SM90, d, 1000, dim, 1, 10)).unwrap();
            let (a, o) = (at(aligned), at(other));
            assert_eq!(
                (a.staging, o.staging),
                (Staging::A16, Staging::Any),
                "{d:?}"
            );
            assert!(a.tile.name.ends_with("_a16") && !o.tile.name.ends_with("_a16"));
            assert_eq!(a.staging.veclen(d) as usize * d.size(), 16);
            assert_eq!(o.staging.veclen(d), 1);
            // Same shape and capacity otherwise.
            assert_eq!((a.qtile, a.capacity), (o.qtile, o.capacity), "{d:?}");
            // By name: the any variant serves aligned rows too; the a16
            // variant only them.
            let any_name = o.tile.name;
            assert_eq!(
                choose_variant(&req(SM90, d, 1000, aligned, 1, 10), any_name)
                    .unwrap()
                    .staging,
                Staging::Any
            );
            let e = choose_variant(&req(SM90, d, 1000, other, 1, 10), a.tile.name).unwrap_err();
            assert!(e.contains("16-byte groups"), "{e}");
        }
    }

    #[test]
    fn a_named_variant_serves_only_where_it_applies() {
        let r = req(SM90, DType::F32, 1000, 64, 1, 10);
        let named = |name: &'static str, r: KnnRequest<'static>| choose_variant(&r, name);
        let p = named("knn_tile_f32_tf32x3_q64_r64_k32", r).unwrap();
        assert_eq!((p.qtile, p.rtile, p.capacity), (64, 64, 32));
        for (name, r, why) in [
            (
                "knn_tile_f16_f16_q16_r64_k32",
                r,
                "for f16 rows, these are f32",
            ),
            (
                "knn_tile_f32_tf32x3_q64_r64_k32",
                KnnRequest { k: 33, ..r },
                "does not serve",
            ),
            (
                "knn_tile_f32_tf32x3_q16_r64_k32",
                KnnRequest { device: SM75, ..r },
                "no f32",
            ),
            ("scan_f32_u32_v4_k32", r, "not a knn_tile"),
            ("knn_tile_nope", r, "not a knn_tile"),
        ] {
            let e = named(name, r).unwrap_err();
            assert!(e.contains(why), "{name}: {e}");
            // A search never takes a variant that cannot serve it: an error
            // where the kernels serve the search at all, else the scan.
            let with = choose_named(&r, Some(name));
            assert!(with.as_ref().map_or(true, |p| p.is_none()), "{name}");
            assert_eq!(with.is_ok(), r.device == SM75, "{name}: {with:?}");
        }
        assert_eq!(
            choose_named(&r, None).unwrap().map(|p| p.tile.name),
            choose(&r).map(|p| p.tile.name)
        );
        let small = KnnRequest {
            shared: SharedMemory {
                per_block: 64 * 1024,
                per_sm: 64 * 1024,
            },
            ..r
        };
        let e = named("knn_tile_f32_tf32x3_q64_r64_k32", small).unwrap_err();
        assert!(e.contains("65536 bytes of shared memory"), "{e}");
    }

    #[test]
    fn capacity_tile_and_limits() {
        let shape = |p: KnnPlan| (p.qtile, p.rtile, p.capacity);
        // Large batches: the 64-query tile; 100 queries fill two 32-query
        // tiles.
        assert_eq!(
            shape(pick(SM90, DType::I8, 10_000, 10).unwrap()),
            (64, 64, 32)
        );
        assert_eq!(shape(pick(SM90, DType::I8, 127, 10).unwrap()), (32, 64, 32));
        assert_eq!(shape(pick(SM90, DType::I8, 10, 10).unwrap()), (16, 64, 32));
        // Kernels staging f16 (f16 rows, f32 through f16copy): at most the
        // 32-query tile, where the queries fill it four times.
        for d in [DType::F16, DType::F32] {
            assert_eq!(shape(pick(SM90, d, 10_000, 10).unwrap()), (32, 64, 32));
            assert_eq!(shape(pick(SM90, d, 128, 10).unwrap()), (32, 64, 32));
            assert_eq!(shape(pick(SM90, d, 127, 10).unwrap()), (16, 64, 32));
            assert_eq!(shape(pick(SM90, d, 100, 10).unwrap()), (16, 64, 32));
        }
        let p = pick(SM90, DType::F16, 10_000, 10).unwrap();
        assert_eq!(p.rerank.name, "knn_rerank_f16_k32");
        assert_eq!(
            shape(pick(SM90, DType::F16, 10_000, 100).unwrap()),
            (32, 64, 128)
        );
        assert_eq!(
            shape(pick(SM90, DType::F16, 10, 100).unwrap()),
            (16, 64, 128)
        );
        let p = pick(SM90, DType::F16, 10_000, 256).unwrap();
        assert_eq!(
            (shape(p.clone()), p.rerank.name),
            ((16, 64, 256), "knn_rerank_f16_k256")
        );
        // Beyond 256: the 16-query tile at capacity 512, then 1024 (one
        // block per SM, two pipeline stages), then nothing.
        let p = pick(SM90, DType::F16, 10_000, 257).unwrap();
        assert_eq!(
            (shape(p.clone()), p.rerank.name),
            ((16, 64, 512), "knn_rerank_f16_k512")
        );
        let p = pick(SM90, DType::F32, 10_000, 1024).unwrap();
        assert_eq!(
            (shape(p.clone()), p.rerank.name),
            ((16, 64, 1024), "knn_rerank_f32_k1024")
        );
        assert!(p.shared_bytes() <= SharedMemory::H100.per_block);
        // A batch smaller than a tile launches with its queries' buffers only.
        assert_eq!(p.dynamic_shared_bytes(), 16 * (1024 + 64) * 12);
        assert_eq!(p.dynamic_shared_bytes_for(1), (1024 + 64) * 12);
        assert_eq!(p.dynamic_shared_bytes_for(0), (1024 + 64) * 12);
        assert_eq!(p.dynamic_shared_bytes_for(5), 5 * (1024 + 64) * 12);
        assert_eq!(p.dynamic_shared_bytes_for(16), p.dynamic_shared_bytes());
        assert_eq!(p.dynamic_shared_bytes_for(1000), p.dynamic_shared_bytes());
        assert!(
            pick(SM90, DType::F16, 10, 1025).is_none(),
            "k > 1024: the CPU"
        );
        assert!(pick(SM90, DType::F16, 10, 0).is_none());
        assert!(pick_shape(DType::U8, 10, 32897).is_none());
        assert!(pick_shape(DType::U8, 10, 32896).is_some());
        assert!(pick_shape(DType::I8, u32::MAX as usize, 8).is_none());
        assert!(pick_shape(DType::I8, 10, 0).is_none());
        assert!(pick_shape(DType::I8, 0, 8).is_none());
        assert!(pick_shape(DType::F32, 10, MAX_DIM + 1).is_none());
    }

    #[test]
    fn variants_fit_the_shared_memory_of_the_device() {
        // sm_75 (Turing): 64 KiB per block with opt-in and per SM. Only the
        // variants that fit a block are picked: the 16-query tile up to
        // capacity 128.
        let on = |per_block: u32, per_sm: u32, nq, k| {
            choose(&KnnRequest {
                shared: SharedMemory { per_block, per_sm },
                ..req(SM75, DType::F16, 1_000_000, 128, nq, k)
            })
        };
        let kib = |n: u32| n * 1024;
        let p = on(kib(64), kib(64), 10_000, 10).unwrap();
        assert_eq!((p.qtile, p.capacity), (16, 32));
        let p = on(kib(64), kib(64), 10_000, 100).unwrap();
        assert_eq!((p.qtile, p.capacity), (16, 128));
        assert!(p.shared_bytes() <= kib(64));
        assert!(on(kib(64), kib(64), 1, 200).is_none());
        // sm_86 (99 KiB per block, 100 per SM): the 32-query tile fits a
        // block but only one per SM; the 16-query tile fits two.
        let p = on(kib(99), kib(100), 10_000, 10).unwrap();
        assert_eq!((p.qtile, p.capacity), (16, 32));
        assert_eq!(on(kib(99), kib(100), 1, 200).unwrap().capacity, 256);
        assert!(on(kib(99), kib(100), 1, 300).is_none());
        // A100: capacity 512 fits a block, 1024 does not.
        assert_eq!(on(kib(163), kib(164), 1, 300).unwrap().capacity, 512);
        assert!(on(kib(163), kib(164), 1, 600).is_none());
        assert_eq!(on(kib(227), kib(228), 1, 600).unwrap().capacity, 1024);
        // A100 (163 KiB per block, 164 per SM): q64 fits one block per SM,
        // q32 two.
        assert_eq!(on(kib(163), kib(164), 10_000, 10).unwrap().qtile, 32);
        // H100: q64 would fit two per SM, but f16 staging takes at most 32
        // (pick); i8 rows take q64.
        assert_eq!(on(kib(227), kib(228), 10_000, 10).unwrap().qtile, 32);
        let i8_on_h100 = choose(&KnnRequest {
            dtype: DType::I8,
            ..req(SM90, DType::F16, 1_000_000, 128, 10_000, 10)
        });
        assert_eq!(i8_on_h100.unwrap().qtile, 64);
        // Without opt-in (48 KiB) the smallest variant still fits.
        let p = choose(&KnnRequest {
            shared: SharedMemory {
                per_block: 48 * 1024,
                per_sm: 228 * 1024,
            },
            ..req(SM90, DType::F32, 1_000_000, 128, 10_000, 10)
        })
        .unwrap();
        assert_eq!((p.qtile, p.capacity), (16, 32));
        // Every variant fits an H100 (static ≤ 48 KiB, the rest dynamic).
        for p in all_plans() {
            assert!(
                p.shared_bytes() <= SharedMemory::H100.per_block,
                "{}",
                p.tile.name
            );
            assert!(
                tile_static_bytes(p.dtype.size() as u32, p.qtile, p.rtile, p.capacity) <= 48 * 1024,
                "{}",
                p.tile.name
            );
        }
    }

    #[test]
    fn small_batches_split_rows_over_the_sms() {
        // nq = 1, 396 resident blocks (3 per SM on 132 SMs): 396 chunks of
        // 2 526 rows → rounded to 2 560, 391 chunks, one wave.
        let (n, rows) = chunks(1_000_000, 1, 16, 64, 396);
        assert_eq!(rows % 64, 0);
        assert!(n as usize * rows as usize >= 1_000_000);
        assert!((380..=396).contains(&n), "{n}");
        // 7 query tiles: at most 396 blocks, never a partial second wave.
        let (n7, _) = chunks(1_000_000, 100, 16, 64, 396);
        assert!(7 * n7 <= 396 && 7 * (n7 + 1) > 396, "{n7}");
        // Many queries: one chunk.
        assert_eq!(
            chunks(1_000_000, 10_000, 16, 64, 396),
            (1, 1_000_000u32.div_ceil(64) * 64)
        );
        // Tiny bases: never a chunk shorter than a row tile.
        assert_eq!(chunks(10, 1, 16, 64, 396), (1, 64));
        assert_eq!(chunks(0, 1, 16, 64, 396), (1, 64));
        // A huge device never asks for more chunks than grid.y holds.
        assert!(chunks(1 << 31, 1, 16, 64, 1 << 24).0 <= 65_535);
        // Near 2^32 rows one chunk would not fit the kernel's u32: two.
        let n = u32::MAX as usize - 10;
        let (c, rows) = chunks(n, 10_000, 16, 64, 396);
        assert!(rows > 0 && rows % 64 == 0, "{rows}");
        assert_eq!(c, 2);
        assert!(c as usize * rows as usize >= n);
    }

    #[test]
    fn many_chunks_are_merged_in_groups_that_cover_them() {
        assert_eq!(merge_groups(1), (1, 1));
        assert_eq!(merge_groups(MERGE_CHUNKS), (1, MERGE_CHUNKS));
        assert_eq!(merge_groups(MERGE_CHUNKS + 1), (2, MERGE_CHUNKS));
        for n in [17, 75, 528, 65_535] {
            let (g, c) = merge_groups(n);
            assert!(g * c >= n && (g - 1) * c < n, "{n}: {g} x {c}");
        }
    }

    #[test]
    fn the_enumerator_is_exactly_what_choose_reaches() {
        let named: Vec<&str> = fragments::catalog()
            .iter()
            .filter(|t| t.family == "knn_tile")
            .map(|t| t.name)
            .collect();
        let mut reached = Vec::new();
        for a in [SM75, SM80, SM90] {
            for d in DType::ALL {
                for m in Metric::ALL {
                    for f in FILTERS {
                        for (nq, dim) in [(1, 64), (100, 63), (1000, 64), (1000, 63)] {
                            for k in [1, 32, 100, 200, 300, 1000] {
                                let r = KnnRequest {
                                    metric: m,
                                    filter: f,
                                    ..req(a, d, 1000, dim, nq, k)
                                };
                                // The planner's pick, then every variant by name.
                                let by_name =
                                    named.iter().filter_map(|t| choose_variant(&r, t).ok());
                                for x in choose(&r).into_iter().chain(by_name) {
                                    reached.push(x.tile_planner());
                                    reached.push(x.rerank_planner());
                                }
                            }
                        }
                    }
                }
            }
        }
        KNN_FAMILY.check_against(reached).unwrap();
    }
}
