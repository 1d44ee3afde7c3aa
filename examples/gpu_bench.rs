//! GPU benchmark of the execution contract's performance promises (HeliosDB
//! seed §1.2 and §10.2, issue 9 items 3 and 4), each figure beside its target.
//!
//! ```text
//! cargo build --release --example gpu_bench
//! target/release/examples/gpu_bench [--json OUT.json] [--quick]
//! ```
//!
//! Prints a table on stdout (progress goes to stderr) and, with `--json`,
//! writes `{"device", "driver", "context", "figures": [{"name", "value",
//! "unit", "target", "met", "note"}]}`. Without a usable CUDA GPU it prints
//! one line, `gpu_bench: no CUDA GPU: <reason>`, and exits with code 3.
//! Exit codes: 0 every section measured, 1 some section failed (its figure
//! has `value: null` and the error in `note`), 2 bad arguments, 3 no GPU.
//!
//! What is measured (medians over many repetitions after warm-ups; host
//! clock after a synchronisation unless a figure's note says CUDA events):
//!
//! * **Transfers**, 100 MB (10^8 bytes) each way: pinned through
//!   [`PinnedBuffer`] + [`Transfer::upload_async`] / `download_async` (wall
//!   time from issue to `PendingTransfer::wait`; event time in the note), and
//!   pageable (a plain `Vec`) through [`Transfer::upload`] / `download`.
//! * **Launch overhead** of one tiny linked scan kernel (1 block of 128
//!   threads over 128 rows × 4 dims, k = 1) through [`Launcher`] (event
//!   timing on, its default, and off) and through a raw `cuLaunchKernel` of
//!   the same cubin loaded separately: host time to issue one launch, and
//!   launch-to-completion (launch + stream synchronise).
//! * **Allocation**: a [`MemoryPool`] hit (alloc + drop back to the pool), a
//!   pool miss (pool that keeps nothing: `cuMemAllocAsync` + `cuMemFreeAsync`
//!   through cudarc), and a fresh `cuMemAlloc` + `cuMemFree`.
//! * **Routing**: `OpDesc::knn` + `AdaptiveCostModel::choose`, the call
//!   `search::route::Searcher::search` makes per search.
//! * **Graph replay vs direct launch** for 1…256 launches per call, with the
//!   [`DispatchRegistry`]'s decision for the same call beside the measured
//!   winner, and the crossover.
//! * **First call on a new configuration** in fresh processes (this binary
//!   re-executed with a hidden subcommand), for two configurations in turn:
//!   link + module load + first launch, cold (empty `FRAGLINK_CACHE_DIR`
//!   and empty `CUDA_CACHE_PATH`), from the disk cache (a second process on
//!   the same directories), over a warm CUDA compute cache with an empty
//!   fraglink cache, and prelinked: a separate fresh process (hidden
//!   subcommand `__prelink`) links both configurations ahead of time with
//!   [`prelink::prelink`] into an empty `FRAGLINK_CACHE_DIR` (its own empty
//!   `CUDA_CACHE_PATH`), timed apart from its process setup, then a
//!   first-call process over that directory and a new empty
//!   `CUDA_CACHE_PATH` must find every kernel on disk; cold again with
//!   quick links (`LinkRuntime::link_tiered`: no LTO, the optimised links
//!   in the background, timed to when both are done); cold again at
//!   nvJitLink's `-Ofc=min`. Process setup
//!   (driver, context, nvJitLink load) is reported apart. A prelink that
//!   reports a failed plan fails the section.
//! * **A routed first search** on a new configuration, in fresh processes
//!   (hidden subcommand `__routed-first`) over empty caches: the first
//!   `SearchIndex::search` of 2000 f32 queries (200 000 × 128, k 10) with
//!   `Searcher` on `auto` (the router adds the unlinked kernels' link to the
//!   GPU's estimate, answers on the CPU and links in the background) against
//!   the same search forced to the GPU (link, upload, search), interleaved;
//!   then each one's next search, once the background links are done.
//! * **The scan linked at `-O3`, at `-O1`** (`Planner::opt_level`: a link
//!   about 20% shorter, ptxas's share halved) **and quickly**
//!   (`LinkRuntime::link_quick`: the fragments' SASS without LTO, what a
//!   cold first call runs until its optimised link is done): what each
//!   costs the kernel. GPU time (CUDA events) of the same scan over
//!   262 144 × 128 f32 rows, two queries per SM, k 10, the kernels launched
//!   in turn; their results must be equal bit for bit.
//!
//! nvJitLink keeps linked cubins in the CUDA driver's compute cache
//! (`~/.nv/ComputeCache`, `CUDA_CACHE_PATH`) when a driver is present (seen
//! with nvJitLink 12.9 and driver 580 on an H100), and a link served from
//! there returns an empty info log: no ptxas resource usage to parse. So
//! that cold means cold and the benchmark does not depend on how fraglink
//! copes with that, it points `CUDA_CACHE_PATH` at a private empty
//! directory for itself and for each cold child, and reports the
//! warm-compute-cache case as its own figure.

use std::ffi::c_void;
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::{exit, Command};
use std::time::{Duration, Instant};

use fraglink::build::Arch;
use fraglink::cost::{AdaptiveCostModel, CostParams, GpuCostModel, GpuParams, OpDesc, Target};
use fraglink::gpu::{
    CapturedGraph, DispatchRegistry, DispatchStrategy, GpuBuffer, GpuContext, GpuError, KernelArgs,
    KernelCharacteristics, KernelResources, LaunchConfig, Launcher, MemoryPool, PinnedBuffer,
    PoolConfig, Transfer,
};
use fraglink::link::{prelink, LinkRuntime, Linked, Planner, RuntimeConfig, Source};
use fraglink::search::cpu::search_cpu;
use fraglink::search::data::synthetic;
use fraglink::search::gpu::SCAN_BLOCK;
use fraglink::search::route::{Device, Routed, Searcher};
use fraglink::search::{DType, Metric, SearchParams};
use serde_json::{json, Value};

const EXIT_FAILED: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_NO_GPU: i32 = 3;

/// Hidden subcommand: one fresh-process first call (see [`first_call_child`]).
const CHILD_COMMAND: &str = "__first-call";
/// Hidden subcommand: prelink configurations A and B ahead of time for the
/// architecture given as its argument (see [`prelink_child`]).
const PRELINK_COMMAND: &str = "__prelink";
/// Hidden subcommand: one fresh-process routed first search on the device
/// given as its argument, `auto` or `gpu` (see [`routed_first_child`]).
const ROUTED_COMMAND: &str = "__routed-first";
/// Prefix of a child's one result line on stdout.
const CHILD_MARK: &str = "GPU_BENCH_FIRST_CALL ";
/// Set to `1` for a first-call child that links through
/// `LinkRuntime::link_tiered` (mode `cold_quick`).
const TIERED_VAR: &str = "GPU_BENCH_TIERED";

/// The tiny scan every launch figure uses: f32 rows of 4 dims, u32 ids.
const TINY_ROWS: usize = 128;
const TINY_DIM: usize = 4;
const TINY_QUERIES: usize = 1;
const TINY_K: usize = 1;
/// Its fragments: the launch benchmarks' kernel and the first call's
/// configuration A; configuration B is a second, different configuration
/// (another scan variant, metric and filter) over the same buffers.
const CONFIG_A: [&str; 3] = ["scan_f32_u32_v4_k32", "metric_l2_f32", "filter_none_u32"];
const CONFIG_B: [&str; 3] = [
    "scan_f32_u32_v1_k128",
    "metric_cosine_f32",
    "filter_bitset_u32",
];

const TRANSFER_BYTES: usize = 100_000_000;
/// The opt-level comparison's rows, dims and k.
const OPT_ROWS: usize = 1 << 18;
const OPT_DIM: usize = 128;
const OPT_K: usize = 10;

const T_TRANSFER_MS: f64 = 5.0;
const T_PINNED_GBPS_MIN: f64 = 5.0;
const T_PAGEABLE_GBPS_MIN: f64 = 2.0;
const T_LAUNCH_MS: f64 = 0.1;
const T_POOL_MS: f64 = 0.01;
const T_NEW_ALLOC_MS: f64 = 5.0;
const T_ROUTE_MS: f64 = 0.001;
const T_FIRST_LINKED_MS: f64 = 50.0;
const T_FIRST_DISK_MS: f64 = 1.0;

const TARGET_PINNED_MS: &str = "< 5 ms for 100 MB (seed §1.2 memory transfer overhead)";
const TARGET_PINNED_GBPS: &str = "≥ 5 GB/s minimum, 10 GB/s target (seed §10.2, pinned)";
const TARGET_PAGEABLE_GBPS: &str = "≥ 2 GB/s minimum, 4 GB/s target (seed §10.2, pageable)";
const TARGET_PAGEABLE_MS: &str =
    "≤ 50 ms for 100 MB = 2 GB/s minimum, 25 ms = 4 GB/s target (seed §10.2, pageable)";
const TARGET_LAUNCH: &str = "< 0.1 ms (seed §1.2 kernel launch overhead)";
const TARGET_POOL: &str = "< 0.01 ms (seed §1.2 memory allocation, pooled)";
const TARGET_NEW_ALLOC: &str = "≤ 5 ms maximum, 1 ms typical (seed §10.1, new allocation)";
const TARGET_ROUTE: &str = "< 0.001 ms (seed §1.2 CPU fallback decision)";
const TARGET_FIRST_LINKED: &str =
    "≤ 50 ms (issue 9; cuVS: 235–500 ms per new configuration on an H100, cuVS PR #2099)";
const TARGET_FIRST_DISK: &str = "≤ 1 ms (issue 9, from the disk cache)";

// ---------------------------------------------------------------------------
// Raw driver calls
// ---------------------------------------------------------------------------

/// Every raw CUDA driver call of this benchmark, through cudarc's
/// `driver::sys` only (one place to adapt when cudarc changes). Nothing here
/// may run before `GpuContext::available()` succeeded: cudarc panics when the
/// driver library cannot be loaded, and the crate's probe is what makes sure
/// it can.
mod raw {
    use std::ffi::{c_void, CString};

    use cudarc::driver::sys;
    use fraglink::gpu::GpuContext;

    pub type DevicePtr = sys::CUdeviceptr;
    pub type Stream = sys::CUstream;

    fn check(call: &str, rc: sys::CUresult) -> Result<(), String> {
        if rc == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{call} failed: {rc:?}"))
        }
    }

    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub fn driver_version() -> Result<i32, String> {
        let mut v = 0;
        // SAFETY: one valid out-pointer; callable before cuInit.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut v)
        })?;
        Ok(v)
    }

    /// Makes `ctx` current on this thread (raw calls need it).
    pub fn bind(ctx: &GpuContext) -> Result<(), String> {
        ctx.cuda()
            .bind_to_thread()
            .map_err(|e| format!("cuCtxSetCurrent failed: {e}"))
    }

    /// The handle of the stream the crate's launcher and transfers use.
    pub fn stream_of(ctx: &GpuContext) -> Stream {
        ctx.stream().cu_stream()
    }

    /// `cuStreamSynchronize`.
    pub fn sync(stream: Stream) -> Result<(), String> {
        // SAFETY: a live stream of the current context.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream)
        })
    }

    /// `cuMemAlloc`.
    pub fn alloc(bytes: usize) -> Result<DevicePtr, String> {
        let mut p: DevicePtr = 0;
        // SAFETY: one valid out-pointer; a context is current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut p, bytes) })?;
        Ok(p)
    }

    /// `cuMemFree` of a pointer from [`alloc`].
    pub fn free(p: DevicePtr) -> Result<(), String> {
        // SAFETY: `p` came from `alloc` and is freed once.
        check("cuMemFree", unsafe { sys::cuMemFree_v2(p) })
    }

    /// Synchronous `cuMemcpyHtoD` into device memory of at least `src.len()` bytes.
    pub fn upload(dst: DevicePtr, src: &[u8]) -> Result<(), String> {
        // SAFETY: `dst` holds at least `src.len()` bytes (callers allocate so).
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len())
        })
    }

    /// Synchronous `cuMemcpyDtoH` of `dst.len()` bytes.
    pub fn download(dst: &mut [u8], src: DevicePtr) -> Result<(), String> {
        // SAFETY: `src` holds at least `dst.len()` bytes.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len())
        })
    }

    /// A module loaded from a cubin and one entry point of it.
    pub struct Kernel {
        module: sys::CUmodule,
        function: sys::CUfunction,
    }

    impl Kernel {
        /// `cuModuleLoadData` + `cuModuleGetFunction`.
        pub fn load(cubin: &[u8], entry: &str) -> Result<Self, String> {
            // The driver reads the image in place: 8-byte alignment.
            let mut aligned = vec![0u64; cubin.len().div_ceil(8)];
            // SAFETY: `aligned` has room for `cubin.len()` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    cubin.as_ptr(),
                    aligned.as_mut_ptr() as *mut u8,
                    cubin.len(),
                )
            };
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: a complete cubin image; the driver copies it.
            check("cuModuleLoadData", unsafe {
                sys::cuModuleLoadData(&mut module, aligned.as_ptr() as *const c_void)
            })?;
            let name = CString::new(entry).map_err(|e| e.to_string())?;
            let mut function: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: `module` was just loaded; `name` is NUL-terminated.
            let rc = unsafe { sys::cuModuleGetFunction(&mut function, module, name.as_ptr()) };
            if let Err(e) = check("cuModuleGetFunction", rc) {
                // SAFETY: not used afterwards.
                let _ = unsafe { sys::cuModuleUnload(module) };
                return Err(e);
            }
            Ok(Kernel { module, function })
        }

        /// `cuLaunchKernel` on `stream`; `params` point at the arguments.
        ///
        /// # Safety
        /// The arguments must be the kernel's, in order, and stay valid
        /// until the launch has been issued.
        pub unsafe fn launch(
            &self,
            grid: u32,
            block: u32,
            stream: Stream,
            params: &mut [*mut c_void],
        ) -> Result<(), String> {
            check(
                "cuLaunchKernel",
                sys::cuLaunchKernel(
                    self.function,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            )
        }
    }

    impl Drop for Kernel {
        fn drop(&mut self) {
            // SAFETY: loaded in `load`, unloaded once (the owner keeps the
            // context current, as for every raw call).
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

// ---------------------------------------------------------------------------
// Figures and statistics
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Figure {
    name: String,
    value: Option<f64>,
    unit: &'static str,
    target: Option<String>,
    met: Option<bool>,
    note: String,
}

impl Figure {
    fn new(name: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Figure {
            name: name.into(),
            value: Some(value),
            unit,
            target: None,
            met: None,
            note: String::new(),
        }
    }

    /// The target's text and whether the value meets it.
    fn target(mut self, text: &str, met: bool) -> Self {
        self.target = Some(text.to_owned());
        self.met = Some(met);
        self
    }

    fn target_text(mut self, text: &str) -> Self {
        self.target = Some(text.to_owned());
        self
    }

    fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }

    fn unavailable(name: impl Into<String>, unit: &'static str, why: impl Into<String>) -> Self {
        Figure {
            name: name.into(),
            value: None,
            unit,
            target: None,
            met: None,
            note: why.into(),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": self.target,
            "met": self.met,
            "note": self.note,
        })
    }
}

/// Median, minimum and maximum of repeated measurements (seconds).
#[derive(Debug, Clone, Copy)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
    n: usize,
}

impl Stats {
    fn of(samples: &[f64]) -> Self {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stats {
            median,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            n,
        }
    }

    fn ms(&self) -> f64 {
        self.median * 1e3
    }

    /// "median of N (min …, max …)" in milliseconds.
    fn describe(&self) -> String {
        format!(
            "median of {} (min {}, max {})",
            self.n,
            fmt_ms(self.min * 1e3),
            fmt_ms(self.max * 1e3)
        )
    }
}

/// Runs `f` `warmup` times unrecorded, then `reps` times; `f` returns the
/// seconds one repetition measured.
fn sample(
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<f64, String>,
) -> Result<Stats, String> {
    for _ in 0..warmup {
        f()?;
    }
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        v.push(f()?);
    }
    Ok(Stats::of(&v))
}

fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() {
        format!("{ms}")
    } else if ms >= 100.0 {
        format!("{ms:.1} ms")
    } else if ms >= 1.0 {
        format!("{ms:.2} ms")
    } else if ms >= 1e-3 {
        format!("{:.2} µs", ms * 1e3)
    } else {
        format!("{:.1} ns", ms * 1e6)
    }
}

fn fmt_value(value: Option<f64>, unit: &str) -> String {
    match value {
        None => "n/a".into(),
        Some(v) if unit == "ms" => fmt_ms(v),
        Some(v) if unit == "GB/s" => format!("{v:.2} GB/s"),
        Some(v) if unit == "x" => format!("{v:.2}x"),
        Some(v) if unit == "s" => format!("{v:.3} s"),
        Some(v) => format!("{v} {unit}"),
    }
}

fn err<E: Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Repetition counts (`--quick` divides them).
#[derive(Debug, Clone, Copy)]
struct Reps {
    quick: bool,
}

impl Reps {
    fn n(&self, full: usize) -> usize {
        if self.quick {
            (full / 5).max(3)
        } else {
            full
        }
    }
}

// ---------------------------------------------------------------------------
// The tiny scan kernel
// ---------------------------------------------------------------------------

/// Deterministic pseudo-random floats in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The row nearest to query 0 in squared L2 (ties: smaller id), on the host.
fn nearest_l2(base: &[f32], query: &[f32]) -> u32 {
    let mut best = (f32::INFINITY, u32::MAX);
    for (i, row) in base.chunks_exact(TINY_DIM).enumerate() {
        let d: f32 = row.iter().zip(query).map(|(x, q)| (q - x) * (q - x)).sum();
        if d < best.0 {
            best = (d, i as u32);
        }
    }
    best.1
}

fn planner(config: &[&str; 3]) -> Result<Planner, String> {
    let mut p = Planner::new(config[0]);
    for name in config {
        p = p.add_named(name).map_err(|e| e.to_string())?;
    }
    Ok(p)
}

fn load_launcher(ctx: &GpuContext, linked: &Linked) -> Result<Launcher, String> {
    let m = &linked.kernel.metadata;
    Launcher::load(
        ctx,
        &linked.kernel.cubin,
        &linked.kernel.entry,
        KernelResources {
            registers: m.registers,
            static_shared_bytes: m.shared_bytes.unwrap_or(0),
            max_threads_per_block: Some(SCAN_BLOCK),
        },
    )
    .map_err(err("Launcher::load"))
}

/// Device inputs and outputs of the tiny scan, from the crate's pool.
struct TinyBuffers {
    host_base: Vec<f32>,
    host_query: Vec<f32>,
    base: GpuBuffer<f32>,
    queries: GpuBuffer<f32>,
    ids: GpuBuffer<u32>,
    dists: GpuBuffer<f32>,
}

impl TinyBuffers {
    fn new(pool: &MemoryPool, transfer: &Transfer) -> Result<Self, String> {
        let host_base = data(TINY_ROWS * TINY_DIM, 1);
        let host_query = data(TINY_QUERIES * TINY_DIM, 2);
        Ok(TinyBuffers {
            base: transfer
                .upload_new(pool, &host_base)
                .map_err(err("upload"))?,
            queries: transfer
                .upload_new(pool, &host_query)
                .map_err(err("upload"))?,
            ids: pool
                .alloc(TINY_QUERIES * TINY_K)
                .map_err(err("pool alloc"))?,
            dists: pool
                .alloc(TINY_QUERIES * TINY_K)
                .map_err(err("pool alloc"))?,
            host_base,
            host_query,
        })
    }

    /// The scan's arguments (fragments/README.md), built as a caller would
    /// for every launch.
    fn args(&mut self) -> Result<KernelArgs<'_>, GpuError> {
        let TinyBuffers {
            base,
            queries,
            ids,
            dists,
            ..
        } = self;
        let mut a = KernelArgs::new();
        a.input(&*base)?;
        a.input(&*queries)?;
        a.null_ptr()
            .value(TINY_ROWS as u64)
            .value(TINY_DIM as u32)
            .value(TINY_QUERIES as u32)
            .value(TINY_K as u32);
        a.output(&mut *ids)?;
        a.output(&mut *dists)?;
        Ok(a)
    }

    fn expected(&self) -> u32 {
        nearest_l2(&self.host_base, &self.host_query)
    }

    fn check(&self, transfer: &Transfer, what: &str) -> Result<(), String> {
        let ids = transfer.download_vec(&self.ids).map_err(err("download"))?;
        let want = self.expected();
        if ids.first() == Some(&want) {
            Ok(())
        } else {
            Err(format!(
                "{what}: the scan returned id {:?}, the host reference {want}",
                ids.first()
            ))
        }
    }
}

fn tiny_config() -> LaunchConfig {
    LaunchConfig::new((TINY_QUERIES as u32, 1, 1), (SCAN_BLOCK, 1, 1))
}

/// The same scan through raw `cuLaunchKernel`: its own module (loaded from
/// the same cubin) and its own buffers, so nothing of the crate is involved.
struct RawScan {
    kernel: raw::Kernel,
    stream: raw::Stream,
    base: raw::DevicePtr,
    queries: raw::DevicePtr,
    ids: raw::DevicePtr,
    dists: raw::DevicePtr,
    expected: u32,
}

impl RawScan {
    fn new(ctx: &GpuContext, linked: &Linked, tiny: &TinyBuffers) -> Result<Self, String> {
        raw::bind(ctx)?;
        let kernel = raw::Kernel::load(&linked.kernel.cubin, &linked.kernel.entry)?;
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let base_bytes = bytes(&tiny.host_base);
        let query_bytes = bytes(&tiny.host_query);
        let base = raw::alloc(base_bytes.len())?;
        let queries = raw::alloc(query_bytes.len())?;
        let ids = raw::alloc(4 * TINY_QUERIES * TINY_K)?;
        let dists = raw::alloc(4 * TINY_QUERIES * TINY_K)?;
        let s = RawScan {
            kernel,
            stream: raw::stream_of(ctx),
            base,
            queries,
            ids,
            dists,
            expected: tiny.expected(),
        };
        raw::upload(base, &base_bytes)?;
        raw::upload(queries, &query_bytes)?;
        Ok(s)
    }

    /// One `cuLaunchKernel`, its parameter array built as a raw caller would.
    fn launch(&self) -> Result<(), String> {
        let (mut base, mut queries) = (self.base, self.queries);
        let mut bits: raw::DevicePtr = 0;
        let mut n_rows = TINY_ROWS as u64;
        let (mut dim, mut nq, mut k) = (TINY_DIM as u32, TINY_QUERIES as u32, TINY_K as u32);
        let (mut ids, mut dists) = (self.ids, self.dists);
        let mut params: [*mut c_void; 9] = [
            &mut base as *mut _ as *mut c_void,
            &mut queries as *mut _ as *mut c_void,
            &mut bits as *mut _ as *mut c_void,
            &mut n_rows as *mut _ as *mut c_void,
            &mut dim as *mut _ as *mut c_void,
            &mut nq as *mut _ as *mut c_void,
            &mut k as *mut _ as *mut c_void,
            &mut ids as *mut _ as *mut c_void,
            &mut dists as *mut _ as *mut c_void,
        ];
        // SAFETY: the scan's nine parameters in order (fragments/README.md),
        // device pointers to buffers of the sizes the launch reads/writes.
        unsafe {
            self.kernel
                .launch(TINY_QUERIES as u32, SCAN_BLOCK, self.stream, &mut params)
        }
    }

    fn sync(&self) -> Result<(), String> {
        raw::sync(self.stream)
    }

    fn check(&self) -> Result<(), String> {
        let mut b = [0u8; 4];
        raw::download(&mut b, self.ids)?;
        let got = u32::from_le_bytes(b);
        if got == self.expected {
            Ok(())
        } else {
            Err(format!(
                "raw launch: the scan returned id {got}, the host reference {}",
                self.expected
            ))
        }
    }
}

impl Drop for RawScan {
    fn drop(&mut self) {
        for p in [self.base, self.queries, self.ids, self.dists] {
            let _ = raw::free(p);
        }
    }
}

// ---------------------------------------------------------------------------
// Sections
// ---------------------------------------------------------------------------

struct Bench {
    ctx: GpuContext,
    pool: MemoryPool,
    transfer: Transfer,
    reps: Reps,
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

fn transfers(b: &Bench) -> Result<Vec<Figure>, String> {
    let n = TRANSFER_BYTES;
    let (warm, reps) = (3, b.reps.n(20));
    let mut dev = b.pool.alloc::<u8>(n).map_err(err("pool alloc"))?;
    let pattern = |i: usize| (i.wrapping_mul(2654435761) >> 13) as u8;
    // Upload staging is write-combined (the host only writes it), download
    // buffers plain pinned (the host reads them): PinnedBuffer's two kinds.
    let mut pinned = PinnedBuffer::<u8>::for_upload(&b.ctx, n).map_err(err("pinned alloc"))?;
    let mut landing = PinnedBuffer::<u8>::for_download(&b.ctx, n).map_err(err("pinned alloc"))?;
    for (i, x) in pinned
        .as_mut_slice()
        .map_err(err("pinned access"))?
        .iter_mut()
        .enumerate()
    {
        *x = pattern(i);
    }
    let mut figures = Vec::new();
    let t = &b.transfer;
    let mut pinned_fig = |name: &str, wall: Stats, event: Stats| {
        let ms = wall.ms();
        let rate = gbps(n, wall.median);
        let note = format!(
            "100 MB = 10^8 bytes, {}; host wall time from issue to PendingTransfer::wait, {}; CUDA-event time median {} = {:.2} GB/s",
            if name.contains("h2d") {
                "PinnedBuffer::for_upload (write-combined) -> GpuBuffer via Transfer::upload_async"
            } else {
                "GpuBuffer -> PinnedBuffer::for_download (plain pinned) via Transfer::download_async"
            },
            wall.describe(),
            fmt_ms(event.ms()),
            gbps(n, event.median)
        );
        figures.push(
            Figure::new(format!("{name}.ms"), ms, "ms")
                .target(TARGET_PINNED_MS, ms < T_TRANSFER_MS)
                .note(note.clone()),
        );
        figures.push(
            Figure::new(format!("{name}.gbps"), rate, "GB/s")
                .target(TARGET_PINNED_GBPS, rate >= T_PINNED_GBPS_MIN)
                .note(format!(
                    "10^9 bytes/s from the wall time; {}",
                    wall.describe()
                )),
        );
    };

    // Pinned host -> device.
    let mut events = Vec::new();
    let wall = sample(warm, reps, || {
        t.synchronize().map_err(err("sync"))?;
        let t0 = Instant::now();
        let p = t
            .upload_async(&pinned, &mut dev)
            .map_err(err("upload_async"))?;
        let ev = p.wait().map_err(err("wait"))?;
        let s = t0.elapsed().as_secs_f64();
        events.push(ev.as_secs_f64());
        Ok(s)
    })?;
    let ev = Stats::of(&events[warm.min(events.len())..]);
    pinned_fig("transfer.h2d.pinned", wall, ev);

    // Pinned device -> host.
    let mut events = Vec::new();
    let wall = sample(warm, reps, || {
        t.synchronize().map_err(err("sync"))?;
        let t0 = Instant::now();
        let p = t
            .download_async(&dev, &mut landing)
            .map_err(err("download_async"))?;
        let ev = p.wait().map_err(err("wait"))?;
        let s = t0.elapsed().as_secs_f64();
        events.push(ev.as_secs_f64());
        Ok(s)
    })?;
    let ev = Stats::of(&events[warm.min(events.len())..]);
    pinned_fig("transfer.d2h.pinned", wall, ev);
    {
        let host = landing.as_slice().map_err(err("pinned access"))?;
        let bad = [0, 1, n / 2, n - 1]
            .into_iter()
            .find(|&i| host[i] != pattern(i));
        if let Some(i) = bad {
            return Err(format!(
                "pinned round trip corrupted byte {i}: {} != {}",
                host[i],
                pattern(i)
            ));
        }
    }
    drop(pinned);
    drop(landing);

    // Pageable (a plain Vec, pre-faulted) both ways.
    let mut host: Vec<u8> = (0..n).map(pattern).collect();
    for (name, up) in [
        ("transfer.h2d.pageable", true),
        ("transfer.d2h.pageable", false),
    ] {
        let wall = sample(warm, reps, || {
            t.synchronize().map_err(err("sync"))?;
            let t0 = Instant::now();
            if up {
                t.upload(&host, &mut dev).map_err(err("upload"))?;
            } else {
                t.download(&dev, &mut host).map_err(err("download"))?;
            }
            Ok(t0.elapsed().as_secs_f64())
        })?;
        let (ms, rate) = (wall.ms(), gbps(n, wall.median));
        let api = if up {
            "Vec<u8> -> GpuBuffer via Transfer::upload"
        } else {
            "GpuBuffer -> Vec<u8> via Transfer::download"
        };
        figures.push(
            Figure::new(format!("{name}.ms"), ms, "ms")
                .target(TARGET_PAGEABLE_MS, rate >= T_PAGEABLE_GBPS_MIN)
                .note(format!(
                    "100 MB = 10^8 bytes, {api} (synchronous: copy + stream synchronise), host wall time, {}",
                    wall.describe()
                )),
        );
        figures.push(
            Figure::new(format!("{name}.gbps"), rate, "GB/s")
                .target(TARGET_PAGEABLE_GBPS, rate >= T_PAGEABLE_GBPS_MIN)
                .note(format!(
                    "10^9 bytes/s from the wall time; {}target 4 GB/s {}",
                    if rate >= T_PAGEABLE_GBPS_MIN {
                        "minimum met; "
                    } else {
                        ""
                    },
                    if rate >= 4.0 { "met" } else { "not met" }
                )),
        );
    }
    if host
        .iter()
        .step_by(4099)
        .enumerate()
        .any(|(j, &x)| x != pattern(j * 4099))
    {
        return Err("pageable round trip corrupted the data".into());
    }
    Ok(figures)
}

/// Links the tiny scan (configuration A) in this process, without a disk
/// cache, for the launch and dispatch sections.
fn link_tiny(ctx: &GpuContext) -> Result<Linked, String> {
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 8,
        disk: None,
    })
    .map_err(err("LinkRuntime::new"))?;
    planner(&CONFIG_A)?
        .link_with(&rt, ctx.arch())
        .map_err(err("link"))
}

fn launches(b: &Bench, linked: &Linked) -> Result<Vec<Figure>, String> {
    let launcher = load_launcher(&b.ctx, linked)?;
    let mut tiny = TinyBuffers::new(&b.pool, &b.transfer)?;
    let rawscan = RawScan::new(&b.ctx, linked, &tiny)?;
    let cfg = tiny_config();
    let ctx = &b.ctx;
    let (burst, reps) = (200usize, b.reps.n(30));
    let (single_warm, single_reps) = (20, b.reps.n(500));

    // Correctness first: one launch each way, checked against the host.
    {
        let mut a = tiny.args().map_err(err("args"))?;
        // SAFETY: the scan's arguments in order; buffers sized for the launch.
        unsafe { launcher.launch(&cfg, &mut a) }.map_err(err("launch"))?;
    }
    ctx.synchronize().map_err(err("sync"))?;
    tiny.check(&b.transfer, "Launcher")?;
    rawscan.launch()?;
    rawscan.sync()?;
    rawscan.check()?;

    let mut launch_once = |tiny: &mut TinyBuffers| -> Result<(), String> {
        let mut a = tiny.args().map_err(err("args"))?;
        // SAFETY: as above.
        unsafe { launcher.launch(&cfg, &mut a) }.map_err(err("launch"))
    };
    // Host cost per launch: a burst of launches issued back to back.
    let host_cost = |tiny: &mut TinyBuffers,
                     f: &mut dyn FnMut(&mut TinyBuffers) -> Result<(), String>|
     -> Result<Stats, String> {
        sample(3, reps, || {
            ctx.synchronize().map_err(err("sync"))?;
            let t0 = Instant::now();
            for _ in 0..burst {
                f(tiny)?;
            }
            let s = t0.elapsed().as_secs_f64() / burst as f64;
            ctx.synchronize().map_err(err("sync"))?;
            Ok(s)
        })
    };
    let mut raw_launch = |_: &mut TinyBuffers| rawscan.launch();

    launcher.set_timing(true);
    let host_timed = host_cost(&mut tiny, &mut launch_once)?;
    let gpu_time = launcher.stats_synchronized().map_err(err("stats"))?;
    launcher.set_timing(false);
    let host_untimed = host_cost(&mut tiny, &mut launch_once)?;
    let host_raw = host_cost(&mut tiny, &mut raw_launch)?;

    // Launch to completion: one launch, then synchronise.
    launcher.set_timing(true);
    let done_timed = sample(single_warm, single_reps, || {
        let t0 = Instant::now();
        launch_once(&mut tiny)?;
        ctx.synchronize().map_err(err("sync"))?;
        Ok(t0.elapsed().as_secs_f64())
    })?;
    launcher.set_timing(false);
    let done_untimed = sample(single_warm, single_reps, || {
        let t0 = Instant::now();
        launch_once(&mut tiny)?;
        ctx.synchronize().map_err(err("sync"))?;
        Ok(t0.elapsed().as_secs_f64())
    })?;
    let done_raw = sample(single_warm, single_reps, || {
        let t0 = Instant::now();
        rawscan.launch()?;
        rawscan.sync()?;
        Ok(t0.elapsed().as_secs_f64())
    })?;
    launcher.set_timing(true);
    tiny.check(&b.transfer, "Launcher after the timed launches")?;
    rawscan.check()?;

    let kernel = format!(
        "kernel {} ({} regs) on 1 block x {SCAN_BLOCK} threads, {TINY_ROWS} rows x {TINY_DIM} dims, k = {TINY_K}; GPU time per launch (Launcher's CUDA events) {}",
        linked.kernel.entry,
        linked.kernel.metadata.registers,
        gpu_time
            .mean_time()
            .map(|d| fmt_ms(d.as_secs_f64() * 1e3))
            .unwrap_or_else(|| "n/a".into())
    );
    let host_note = |how: &str, s: &Stats| {
        format!("{how}; host time to issue one launch: bursts of {burst} back-to-back launches, time / {burst}, {}; {kernel}", s.describe())
    };
    let done_note = |how: &str, s: &Stats| {
        format!(
            "{how}; one launch then stream synchronise, host wall time, {}; {kernel}",
            s.describe()
        )
    };
    let fig = |name: &str, s: &Stats, note: String| {
        Figure::new(name, s.ms(), "ms")
            .target(TARGET_LAUNCH, s.ms() < T_LAUNCH_MS)
            .note(note)
    };
    let over = |a: &Stats, r: &Stats| {
        format!(
            "; {} over raw cuLaunchKernel",
            fmt_ms((a.median - r.median) * 1e3)
        )
    };
    Ok(vec![
        fig(
            "launch.host.launcher",
            &host_timed,
            host_note(
                "Launcher::launch with its default per-launch event timing, KernelArgs built per launch",
                &host_timed,
            ) + &over(&host_timed, &host_raw),
        ),
        fig(
            "launch.host.launcher_untimed",
            &host_untimed,
            host_note(
                "Launcher::launch with set_timing(false), KernelArgs built per launch",
                &host_untimed,
            ) + &over(&host_untimed, &host_raw),
        ),
        fig(
            "launch.host.raw",
            &host_raw,
            host_note(
                "raw cuLaunchKernel (cudarc driver::sys) of the same cubin, own module and buffers",
                &host_raw,
            ),
        ),
        fig(
            "launch.complete.launcher",
            &done_timed,
            done_note(
                "Launcher::launch (event timing on) + GpuContext::synchronize",
                &done_timed,
            ) + &over(&done_timed, &done_raw),
        ),
        fig(
            "launch.complete.launcher_untimed",
            &done_untimed,
            done_note(
                "Launcher::launch (event timing off) + GpuContext::synchronize",
                &done_untimed,
            ) + &over(&done_untimed, &done_raw),
        ),
        fig(
            "launch.complete.raw",
            &done_raw,
            done_note(
                "raw cuLaunchKernel + cuStreamSynchronize on the same stream",
                &done_raw,
            ),
        ),
    ])
}

fn allocation(b: &Bench) -> Result<Vec<Figure>, String> {
    let mut figures = Vec::new();
    let hit_pool = MemoryPool::cuda(&b.ctx, PoolConfig::default()).map_err(err("pool"))?;
    // A pool that keeps nothing idle: every request reaches the backend.
    let miss_pool = MemoryPool::cuda(
        &b.ctx,
        PoolConfig {
            max_pool_bytes: 0,
            ..PoolConfig::default()
        },
    )
    .map_err(err("pool"))?;
    let reps = b.reps.n(30);
    for (label, bytes) in [
        ("4KiB", 4usize << 10),
        ("1MiB", 1 << 20),
        ("64MiB", 64 << 20),
    ] {
        // Pool hit: the class is idle after the first round.
        let iters = 1000;
        drop(hit_pool.alloc::<u8>(bytes).map_err(err("pool alloc"))?);
        let before = hit_pool.stats();
        let hit = sample(3, reps, || {
            let t0 = Instant::now();
            for _ in 0..iters {
                let buf = hit_pool.alloc::<u8>(bytes).map_err(err("pool alloc"))?;
                std::hint::black_box(&buf);
                drop(buf);
            }
            Ok(t0.elapsed().as_secs_f64() / iters as f64)
        })?;
        let after = hit_pool.stats();
        let hits = after.pool_hits - before.pool_hits;
        let misses = after.pool_misses - before.pool_misses;
        figures.push(
            Figure::new(format!("alloc.pool_hit.{label}"), hit.ms(), "ms")
                .target(TARGET_POOL, hit.ms() < T_POOL_MS)
                .note(format!(
                    "MemoryPool::alloc::<u8>({bytes}) served from an idle block + drop back to the pool (no driver call); loops of {iters}, time / {iters}, {}; {hits} hits, {misses} misses while timing",
                    hit.describe()
                )),
        );

        // Pool miss: backend allocation and free through cudarc.
        let iters = 50;
        let miss = sample(3, reps, || {
            b.ctx.synchronize().map_err(err("sync"))?;
            let t0 = Instant::now();
            for _ in 0..iters {
                let buf = miss_pool.alloc::<u8>(bytes).map_err(err("pool alloc"))?;
                std::hint::black_box(&buf);
                drop(buf);
            }
            Ok(t0.elapsed().as_secs_f64() / iters as f64)
        })?;
        figures.push(
            Figure::new(format!("alloc.pool_miss.{label}"), miss.ms(), "ms")
                .target(TARGET_NEW_ALLOC, miss.ms() <= T_NEW_ALLOC_MS)
                .note(format!(
                    "MemoryPool with max_pool_bytes 0: every alloc is a miss (CudaStream::alloc = cuMemAllocAsync where the device has memory pools) and every drop frees (cuMemFreeAsync, stream-ordered, not waited for); loops of {iters}, {}",
                    miss.describe()
                )),
        );

        // Fresh cuMemAlloc + cuMemFree.
        raw::bind(&b.ctx)?;
        let fresh = sample(3, reps, || {
            let t0 = Instant::now();
            for _ in 0..iters {
                let p = raw::alloc(bytes)?;
                raw::free(p)?;
            }
            Ok(t0.elapsed().as_secs_f64() / iters as f64)
        })?;
        figures.push(
            Figure::new(format!("alloc.fresh.{label}"), fresh.ms(), "ms")
                .target(TARGET_NEW_ALLOC, fresh.ms() <= T_NEW_ALLOC_MS)
                .note(format!(
                    "raw cuMemAlloc({bytes}) + cuMemFree pair (cuMemFree synchronises); loops of {iters}, {}; pool hit is {:.0}x faster",
                    fresh.describe(),
                    fresh.median / hit.median.max(1e-12)
                )),
        );
    }
    Ok(figures)
}

fn routing(b: &Bench) -> Result<Vec<Figure>, String> {
    let model = AdaptiveCostModel::new(CostParams::default().with_gpu(GpuParams::default()));
    // The calibration (10-20 ms, once per process) happens here, not below.
    let cpu = model.cpu_throughput();
    let shapes = [(10_000usize, 10usize), (100_000, 100), (1_000_000, 1000)];
    for dtype in DType::ALL {
        for (n, nq) in shapes {
            let op = OpDesc::knn(n, 128, nq, 10, dtype, false);
            for i in 0..20u64 {
                let t = Duration::from_micros(100 + i);
                model.learn(&op, Target::Gpu, t);
                model.learn(&op, Target::Cpu, t * 3);
            }
        }
    }
    let iters = 100_000;
    let reps = b.reps.n(15);
    let mut last = None;
    let s = sample(2, reps, || {
        let t0 = Instant::now();
        for i in 0..iters {
            let nq = std::hint::black_box(100 + (i & 1));
            let op = OpDesc::knn(100_000, 128, nq, 10, DType::F32, false);
            last = Some(std::hint::black_box(model.choose(std::hint::black_box(&op))).target);
        }
        Ok(t0.elapsed().as_secs_f64() / iters as f64)
    })?;
    Ok(vec![Figure::new("route.decision", s.ms(), "ms")
        .target(TARGET_ROUTE, s.ms() < T_ROUTE_MS)
        .note(format!(
            "OpDesc::knn(100000 x 128, 100 queries, k 10, f32) + AdaptiveCostModel::choose (GPU available, learned statistics present), as search::route::Searcher::search does per call; loops of {iters}, {}; chose {:?}; calibrated CPU throughput {:.1} Gflop/s; the GPU probe and reason formatting are not part of it, nor what the router adds for a search the GPU wins: one lookup of the configuration in the searcher's ready set, and once per configuration and batch size the linked check (route/linked_check in BENCHMARKS.md, about 14 us on a 2-core VM)",
            s.describe(),
            last,
            cpu / 1e9
        ))])
}

fn dispatch(b: &Bench, linked: &Linked) -> Result<(Vec<Figure>, Vec<String>), String> {
    let launcher = load_launcher(&b.ctx, linked)?;
    launcher.set_timing(false);
    let mut tiny = TinyBuffers::new(&b.pool, &b.transfer)?;
    let cfg = tiny_config();
    let ctx = &b.ctx;
    let stream = ctx.stream().clone();
    let registry = DispatchRegistry::with_builtin();
    let family = "gpu_bench_tiny_scan";
    let reps = b.reps.n(50);
    let mut figures = Vec::new();
    let mut lines = vec![format!(
        "{:>6} {:>12} {:>12} {:>8} {:>9} {:>12}  registry (work = launches x {TINY_ROWS} rows x {TINY_QUERIES} query)",
        "batch", "direct", "graph", "winner", "speedup", "capture"
    )];
    let mut rows = Vec::new();
    for batch in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
        registry.register(
            family,
            KernelCharacteristics {
                dispatches_per_call: batch,
                reduction_only: false,
                min_useful_work: 0,
                hint: None,
            },
        );
        let work = u64::from(batch) * (TINY_ROWS * TINY_QUERIES) as u64;
        let decision = registry.decide(family, work);

        let t0 = Instant::now();
        // SAFETY: only launches are recorded, every buffer exists already
        // and outlives the replays; no other thread uses the context.
        let graph = unsafe {
            CapturedGraph::capture(&stream, |s| {
                for _ in 0..batch {
                    let mut a = tiny.args()?;
                    launcher.launch_on(s, &cfg, &mut a)?;
                }
                Ok(())
            })
        }
        .map_err(err("capture"))?;
        let capture_s = t0.elapsed().as_secs_f64();

        let direct_once = |tiny: &mut TinyBuffers| -> Result<f64, String> {
            let t0 = Instant::now();
            for _ in 0..batch {
                let mut a = tiny.args().map_err(err("args"))?;
                // SAFETY: the scan's arguments in order.
                unsafe { launcher.launch(&cfg, &mut a) }.map_err(err("launch"))?;
            }
            ctx.synchronize().map_err(err("sync"))?;
            Ok(t0.elapsed().as_secs_f64())
        };
        let graph_once = || -> Result<f64, String> {
            let t0 = Instant::now();
            // SAFETY: the captured buffers are alive and unmoved.
            unsafe { graph.replay() }.map_err(err("replay"))?;
            ctx.synchronize().map_err(err("sync"))?;
            Ok(t0.elapsed().as_secs_f64())
        };
        // Interleaved so that drift affects both alike.
        let (mut d, mut g) = (Vec::new(), Vec::new());
        for i in 0..(reps + 5) {
            let ds = direct_once(&mut tiny)?;
            let gs = graph_once()?;
            if i >= 5 {
                d.push(ds);
                g.push(gs);
            }
        }
        let (d, g) = (Stats::of(&d), Stats::of(&g));
        tiny.check(&b.transfer, "graph replay")?;
        let graph_wins = g.median < d.median;
        let winner = if graph_wins { "graph" } else { "direct" };
        let agrees = (decision.strategy == DispatchStrategy::GraphCapture) == graph_wins;
        let saved = d.median - g.median;
        let breakeven = if saved > 0.0 {
            format!(
                "capture + instantiate {} pays off after {:.0} replays",
                fmt_ms(capture_s * 1e3),
                (capture_s / saved).ceil()
            )
        } else {
            format!(
                "capture + instantiate {} never pays off",
                fmt_ms(capture_s * 1e3)
            )
        };
        let note = format!(
            "{batch} launches of the tiny scan + GpuContext::synchronize; direct = Launcher::launch x {batch} (event timing off), graph = CapturedGraph::replay of the same {batch} launches; interleaved, host wall time; direct {}, graph {}; measured winner {winner}; DispatchRegistry::decide says {} ({}){}; {breakeven}",
            d.describe(),
            g.describe(),
            decision.strategy,
            decision.reason,
            if agrees { "" } else { " — disagrees with the measurement" },
        );
        figures.push(
            Figure::new(format!("dispatch.b{batch}.direct"), d.ms(), "ms").note(note.clone()),
        );
        figures.push(Figure::new(format!("dispatch.b{batch}.graph"), g.ms(), "ms").note(note));
        lines.push(format!(
            "{batch:>6} {:>12} {:>12} {winner:>8} {:>8.2}x {:>12}  {}{}",
            fmt_ms(d.ms()),
            fmt_ms(g.ms()),
            d.median / g.median,
            fmt_ms(capture_s * 1e3),
            decision.strategy,
            if agrees { "" } else { " (disagrees)" }
        ));
        rows.push((batch, graph_wins, decision.strategy));
    }
    // Crossover: the smallest batch from which graph replay wins at every
    // larger batch of the sweep.
    let crossover = (0..rows.len())
        .find(|&i| rows[i..].iter().all(|r| r.1))
        .map(|i| rows[i].0);
    let registry_graph_from = rows
        .iter()
        .find(|r| r.2 == DispatchStrategy::GraphCapture)
        .map(|r| r.0);
    let summary = format!(
        "smallest batch of the sweep 1..256 from which graph replay beats direct launches at every larger batch; winners per batch: {}; the registry (default policy: ≥ {} launches and work ≥ {}) picks graph from {}",
        rows.iter()
            .map(|r| format!("{}:{}", r.0, if r.1 { "graph" } else { "direct" }))
            .collect::<Vec<_>>()
            .join(" "),
        registry.policy().min_graph_dispatches,
        registry.policy().default_min_useful_work,
        registry_graph_from
            .map(|b| format!("batch {b}"))
            .unwrap_or_else(|| "no batch of this sweep (too little work per call)".into())
    );
    figures.push(match crossover {
        Some(c) => Figure::new("dispatch.crossover", f64::from(c), "launches").note(summary),
        None => Figure::unavailable(
            "dispatch.crossover",
            "launches",
            format!("direct launches win at the largest batch; {summary}"),
        ),
    });
    Ok((figures, lines))
}

// ---------------------------------------------------------------------------
// First call in a fresh process
// ---------------------------------------------------------------------------

/// The hidden subcommand: in this fresh process, create the context and the
/// link runtime (process setup), then for configurations A and B: link
/// (disk cache per `FRAGLINK_CACHE_DIR`), load, and launch once to
/// completion, each timed. Prints one `CHILD_MARK` JSON line.
fn first_call_child() -> i32 {
    let started = Instant::now();
    if let Err(e) = GpuContext::available() {
        println!("gpu_bench: no CUDA GPU: {}", reason(&e));
        return EXIT_NO_GPU;
    }
    let probe_ms = started.elapsed().as_secs_f64() * 1e3;
    child_result(first_call_inner(probe_ms))
}

/// Prints a child's one `CHILD_MARK` JSON line (its result, or
/// `{"error": ...}`) and returns its exit code.
fn child_result(r: Result<Value, String>) -> i32 {
    match r {
        Ok(v) => {
            println!("{CHILD_MARK}{v}");
            0
        }
        Err(e) => {
            println!("{CHILD_MARK}{}", json!({ "error": e }));
            EXIT_FAILED
        }
    }
}

/// The hidden prelink subcommand: in this fresh process, open the link
/// runtime and its disk cache (`FRAGLINK_CACHE_DIR`; process setup, timed
/// apart), then prelink configurations A and B for the architecture given
/// as the argument (the parent's device: prelinking needs nvJitLink, no
/// GPU). Prints one `CHILD_MARK` JSON line; a failed plan is an error.
fn prelink_child(arch: Option<&str>) -> i32 {
    child_result(prelink_inner(arch))
}

fn prelink_inner(arch: Option<&str>) -> Result<Value, String> {
    let arch = arch.ok_or_else(|| format!("{PRELINK_COMMAND} needs an architecture"))?;
    let arch = Arch::parse(arch, PRELINK_COMMAND).map_err(|e| e.to_string())?;
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let plans = [planner(&CONFIG_A)?, planner(&CONFIG_B)?];
    // Process setup: nvJitLink load and the disk cache's settings and
    // directory, so that the prelink's time is linking and storing only.
    let t = Instant::now();
    let rt = LinkRuntime::global().map_err(err("LinkRuntime::global"))?;
    let disk = rt.try_disk().map_err(err("disk cache"))?;
    let runtime_ms = ms(t);
    // A disabled cache (FRAGLINK_CACHE_DISABLE, an unsafe directory) is
    // `Some` too: prelinking into it would keep nothing.
    let keeps = ": prelinking would keep nothing for the first-call process";
    let disk_dir = match disk {
        Some(d) if d.is_enabled() => d.dir().display().to_string(),
        Some(d) => {
            return Err(format!(
                "the disk cache is disabled ({}){keeps}",
                d.warning().unwrap_or("FRAGLINK_CACHE_DISABLE")
            ))
        }
        None => return Err(format!("no disk cache (no cache directory){keeps}")),
    };
    // 0: one thread per core, at most one per plan (as `fraglink prelink`).
    let t = Instant::now();
    let report = prelink::prelink(&plans, arch, 0).map_err(err("prelink"))?;
    let prelink_ms = ms(t);
    if !report.failed.is_empty() {
        let each: Vec<String> = report
            .failed
            .iter()
            .map(|f| {
                format!(
                    "{} [{}] for {}: {}",
                    f.entry,
                    f.fragments.join(" + "),
                    f.arch,
                    f.error
                )
            })
            .collect();
        return Err(format!(
            "prelink failed for {} of {} plans: {}",
            report.failed.len(),
            plans.len(),
            each.join("; ")
        ));
    }
    Ok(json!({
        "arch": arch.to_string(),
        "runtime_ms": runtime_ms,
        "prelink_ms": prelink_ms,
        "elapsed_ms": report.elapsed.as_secs_f64() * 1e3,
        "plans": plans.len(),
        "linked": report.linked,
        "from_disk": report.from_disk,
        "from_memory": report.from_memory,
        "failed": report.failed.len(),
        "disk_dir": disk_dir,
    }))
}

fn first_call_inner(probe_ms: f64) -> Result<Value, String> {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let ctx = GpuContext::default().map_err(err("GpuContext::default"))?;
    let context_ms = ms(t);
    let t = Instant::now();
    let rt = LinkRuntime::global().map_err(err("LinkRuntime::global"))?;
    let runtime_ms = ms(t);
    let disk_dir = rt.disk().map(|d| d.dir().display().to_string());
    let pool = MemoryPool::cuda(&ctx, PoolConfig::default()).map_err(err("pool"))?;
    let transfer = Transfer::new(&ctx);
    let tiered = std::env::var(TIERED_VAR).as_deref() == Ok("1");
    let tiered_from = Instant::now();
    let mut configs = Vec::new();
    for (label, config) in [("A", &CONFIG_A), ("B", &CONFIG_B)] {
        let plan = planner(config)?;
        let t = Instant::now();
        let linked = if tiered {
            rt.link_tiered(&plan, ctx.arch())
        } else {
            plan.link_with(rt, ctx.arch())
        }
        .map_err(err("link"))?;
        let link_ms = ms(t);
        let t = Instant::now();
        let launcher = load_launcher(&ctx, &linked)?;
        let load_ms = ms(t);
        // Inputs exist before a real first call: not timed as part of it.
        let t = Instant::now();
        let mut tiny = TinyBuffers::new(&pool, &transfer)?;
        ctx.synchronize().map_err(err("sync"))?;
        let prep_ms = ms(t);
        let t = Instant::now();
        {
            let mut a = tiny.args().map_err(err("args"))?;
            // SAFETY: the scan's arguments in order (both configurations
            // share the scan contract; the bitset filter takes null = all).
            unsafe { launcher.launch(&tiny_config(), &mut a) }.map_err(err("launch"))?;
        }
        ctx.synchronize().map_err(err("sync"))?;
        let launch_ms = ms(t);
        // Configuration B ranks by cosine: check A only against the L2
        // reference, B for a valid id.
        let ids = transfer.download_vec(&tiny.ids).map_err(err("download"))?;
        let ok = if label == "A" {
            ids.first() == Some(&tiny.expected())
        } else {
            ids.first().is_some_and(|&i| (i as usize) < TINY_ROWS)
        };
        configs.push(json!({
            "config": label,
            "fragments": config,
            "source": match linked.source {
                Source::Linked if linked.kernel.quick => "quick",
                Source::Linked => "linked",
                Source::Memory => "memory",
                Source::Disk => "disk",
            },
            "link_ms": link_ms,
            "nvjitlink_ms": linked.kernel.metadata.link_ms,
            "load_ms": load_ms,
            "first_launch_ms": launch_ms,
            "total_ms": link_ms + load_ms + launch_ms,
            "prep_ms": prep_ms,
            "result_ok": ok,
        }));
    }
    // Tiered: how long after the first quick link both optimised links
    // were done (they ran while the process loaded and launched).
    let upgraded_ms = if tiered {
        let failed = rt.wait_for_upgrades();
        if failed > 0 {
            return Err(format!(
                "{failed} optimised link(s) failed in the background"
            ));
        }
        Some(ms(tiered_from))
    } else {
        None
    };
    Ok(json!({
        "probe_ms": probe_ms,
        "context_ms": context_ms,
        "runtime_ms": runtime_ms,
        "disk_dir": disk_dir,
        "configs": configs,
        "upgraded_ms": upgraded_ms,
    }))
}

// ---------------------------------------------------------------------------
// A routed first search in a fresh process
// ---------------------------------------------------------------------------

/// The routed first search's data: the GPU wins it once its kernels are
/// linked (the base's upload included), and half a second of link is more
/// than the CPU needs for it.
const ROUTED_ROWS: usize = 200_000;
const ROUTED_DIM: usize = 128;
const ROUTED_QUERIES: usize = 2000;
const ROUTED_K: usize = 10;

/// The hidden subcommand: in this fresh process, a `Searcher` on `device`
/// (`auto` or `gpu`) searches a new index twice: the first search timed as
/// a caller sees it (link, upload, search, whatever the router chose), then,
/// once no background link is running, the next. Both must equal the CPU
/// path. Prints one `CHILD_MARK` JSON line.
fn routed_first_child(device: Option<&str>) -> i32 {
    if let Err(e) = GpuContext::available() {
        println!("gpu_bench: no CUDA GPU: {}", reason(&e));
        return EXIT_NO_GPU;
    }
    child_result(routed_first_inner(device))
}

fn routed_first_inner(device: Option<&str>) -> Result<Value, String> {
    let device: Device = device
        .ok_or_else(|| format!("{ROUTED_COMMAND} needs a device: auto or gpu"))?
        .parse()?;
    let (base, queries) = synthetic(ROUTED_ROWS, ROUTED_DIM, ROUTED_QUERIES, DType::F32, 31);
    let params = SearchParams::new(ROUTED_K, Metric::L2);
    let searcher = Searcher::new(device).map_err(err("Searcher::new"))?;
    let index = searcher.index(&base);
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let first = index
        .search(&queries, &params)
        .map_err(err("first search"))?;
    let first_ms = ms(t);
    let t = Instant::now();
    while !searcher.linking().is_empty() {
        if t.elapsed() > Duration::from_secs(300) {
            return Err("the background link still runs after 300 s".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // And the optimised links that replace quick ones.
    let rt = LinkRuntime::global().map_err(err("LinkRuntime::global"))?;
    if rt.wait_for_upgrades() > 0 {
        return Err("an optimised link failed in the background".into());
    }
    let wait_ms = ms(t);
    let t = Instant::now();
    let second = index
        .search(&queries, &params)
        .map_err(err("second search"))?;
    let second_ms = ms(t);
    let want = search_cpu(&base, &queries, &params).map_err(err("CPU reference"))?;
    let run = |r: &Routed, wall_ms: f64| {
        json!({
            "ms": wall_ms,
            "target": r.target.to_string(),
            "reason": r.reason,
            "link_ms": r.link_seconds * 1e3,
            "upload_ms": r.upload_seconds * 1e3,
            "search_ms": r.seconds * 1e3,
            "kernel": r.gpu_kernel,
        })
    };
    Ok(json!({
        "first": run(&first, first_ms),
        "wait_ms": wait_ms,
        "second": run(&second, second_ms),
        "result_ok": first.neighbors.bitwise_eq(&want) && second.neighbors.bitwise_eq(&want),
    }))
}

/// The routed first search on `auto` against `gpu`, each in fresh
/// processes over empty caches, interleaved.
fn routed_first(b: &Bench) -> Result<Vec<Figure>, String> {
    let rounds = if b.reps.quick { 1 } else { 3 };
    let devices = ["auto", "gpu"];
    let mut runs: [Vec<Value>; 2] = Default::default();
    for _ in 0..rounds {
        for (i, device) in devices.into_iter().enumerate() {
            let fraglink_cache = temp_dir("gpu_bench_fraglink_cache")?;
            let cuda_cache = temp_dir("gpu_bench_cuda_cache")?;
            runs[i].push(run_subcommand(
                &ChildEnv {
                    mode: device,
                    fraglink_cache: fraglink_cache.path(),
                    cuda_cache: cuda_cache.path(),
                },
                &[ROUTED_COMMAND, device],
                "routed first search",
            )?);
        }
    }
    if !runs.iter().flatten().all(|r| r["result_ok"] == true) {
        return Err("a routed search's results differ from the CPU path's".into());
    }
    let col = |runs: &[Value], search: &str, key: &str| -> Stats {
        let v: Vec<f64> = runs
            .iter()
            .filter_map(|r| r[search][key].as_f64())
            .map(|ms| ms / 1e3)
            .collect();
        Stats::of(&v)
    };
    // Distinct "target: reason" texts of one search over the rounds.
    let routes = |runs: &[Value], search: &str| -> String {
        // The estimates in a reason differ per process: its kind (the text
        // before the first `:`) and the target, counted.
        let mut seen: Vec<String> = runs
            .iter()
            .map(|r| {
                let reason = r[search]["reason"].as_str().unwrap_or("?");
                format!(
                    "{}: {}",
                    r[search]["target"].as_str().unwrap_or("?"),
                    reason.split(':').next().unwrap_or(reason)
                )
            })
            .collect();
        seen.sort();
        let mut counted: Vec<(String, usize)> = Vec::new();
        for s in seen {
            match counted.last_mut() {
                Some((last, n)) if *last == s => *n += 1,
                _ => counted.push((s, 1)),
            }
        }
        counted
            .iter()
            .map(|(s, n)| format!("{n}× {s}"))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let data = format!(
        "{ROUTED_ROWS} × {ROUTED_DIM} f32 base, {ROUTED_QUERIES} queries, k {ROUTED_K}, l2, fresh process and empty caches each"
    );
    let mut figures = Vec::new();
    let mut first = [0.0; 2];
    for (i, device) in devices.into_iter().enumerate() {
        let wall = col(&runs[i], "first", "ms");
        first[i] = wall.ms();
        figures.push(
            Figure::new(format!("routed_first.{device}.first"), wall.ms(), "ms").note(format!(
                "first SearchIndex::search on --device {device} as the caller waits for it: {}; {data}; of it: link {}, upload {}, search {} (medians); routes: {}",
                wall.describe(),
                fmt_ms(col(&runs[i], "first", "link_ms").ms()),
                fmt_ms(col(&runs[i], "first", "upload_ms").ms()),
                fmt_ms(col(&runs[i], "first", "search_ms").ms()),
                routes(&runs[i], "first"),
            )),
        );
        let next = col(&runs[i], "second", "ms");
        figures.push(
            Figure::new(format!("routed_first.{device}.second"), next.ms(), "ms").note(format!(
                "the next search of the same index, after any background link finished (waited {}, median): {}; routes: {}",
                fmt_ms(Stats::of(&runs[i].iter().filter_map(|r| r["wait_ms"].as_f64()).map(|m| m / 1e3).collect::<Vec<_>>()).ms()),
                next.describe(),
                routes(&runs[i], "second"),
            )),
        );
    }
    figures.push(
        Figure::new("routed_first.auto_over_gpu", first[0] / first[1], "x")
            .target_text("< 1: on auto, a cold configuration's first search returns sooner than forced to the GPU")
            .note("routed_first.auto.first / routed_first.gpu.first (medians, interleaved rounds)"),
    );
    Ok(figures)
}

/// Environment of one child: the fraglink disk cache directory
/// and the CUDA driver's compute cache directory (`CUDA_CACHE_PATH`), which
/// nvJitLink also uses when a driver is present: a hit there skips the link
/// and returns an empty info log.
struct ChildEnv<'a> {
    mode: &'static str,
    fraglink_cache: &'a std::path::Path,
    cuda_cache: &'a std::path::Path,
}

/// Runs a first-call child and returns its JSON.
fn run_child(env: &ChildEnv<'_>) -> Result<Value, String> {
    run_subcommand(env, &[CHILD_COMMAND], "first-call")
}

/// Runs this binary with the hidden subcommand `args` (`what` names it in
/// errors) in `env`, and returns its `CHILD_MARK` JSON.
fn run_subcommand(env: &ChildEnv<'_>, args: &[&str], what: &str) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(err("current_exe"))?;
    let mut command = Command::new(exe);
    command
        .args(args)
        .env("FRAGLINK_CACHE_DIR", env.fraglink_cache)
        .env("CUDA_CACHE_PATH", env.cuda_cache)
        .env_remove("FRAGLINK_CACHE_DISABLE")
        .env_remove("CUDA_CACHE_DISABLE")
        .env(
            "FRAGLINK_FAST_COMPILE",
            if env.mode == "cold_fast" { "min" } else { "0" },
        )
        .env(TIERED_VAR, if env.mode == "cold_quick" { "1" } else { "0" });
    // First calls link as each mode says (quick links only where the mode
    // is cold_quick); a routed search links as the library does by default.
    match env.mode {
        "cold_quick" => command.env("FRAGLINK_QUICK_LINK", "1"),
        "auto" | "gpu" => command.env_remove("FRAGLINK_QUICK_LINK"),
        _ => command.env("FRAGLINK_QUICK_LINK", "0"),
    };
    let out = command
        .output()
        .map_err(|e| format!("spawning the {what} child: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stdout.lines().find_map(|l| l.strip_prefix(CHILD_MARK));
    match line {
        Some(l) => {
            let v: Value = serde_json::from_str(l).map_err(err("child output"))?;
            match v.get("error").and_then(Value::as_str) {
                Some(e) => Err(format!(
                    "{} {what} child: {e}{}",
                    env.mode,
                    if stderr.trim().is_empty() {
                        String::new()
                    } else {
                        format!(" (stderr: {})", stderr.trim())
                    }
                )),
                None => Ok(v),
            }
        }
        None => Err(format!(
            "{} {what} child exited with {} without a result; stdout: {} stderr: {}",
            env.mode,
            out.status,
            stdout.trim(),
            stderr.trim()
        )),
    }
}

fn temp_dir(prefix: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(err("temp dir"))
}

/// The scan (configuration A) linked at -O3, at -O1 and quickly (no LTO,
/// [`LinkRuntime::link_quick`]), launched in turn over the same rows: each
/// one's GPU time per launch (CUDA events), its link time and registers;
/// the results must be equal bit for bit.
fn opt_levels(b: &Bench) -> Result<Vec<Figure>, String> {
    let nq = 2 * b.ctx.info().sm_count as usize;
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 8,
        disk: None,
    })
    .map_err(err("LinkRuntime::new"))?;
    let base = b
        .transfer
        .upload_new(&b.pool, &data(OPT_ROWS * OPT_DIM, 3))
        .map_err(err("upload"))?;
    let queries = b
        .transfer
        .upload_new(&b.pool, &data(nq * OPT_DIM, 4))
        .map_err(err("upload"))?;
    let arch = b.ctx.arch();
    let mut sides: Vec<(&str, String, Linked)> = Vec::new();
    for level in [3u8, 1] {
        let linked = planner(&CONFIG_A)?
            .opt_level(level)
            .link_with(&rt, arch)
            .map_err(err("link"))?;
        sides.push(("linked at", format!("O{level}"), linked));
    }
    let quick = rt
        .link_quick(&planner(&CONFIG_A)?, arch)
        .map_err(err("quick link"))?
        .ok_or_else(|| {
            format!("no quick link for {arch}: the build holds no SASS for it (FRAGLINK_ARCHS)")
        })?;
    sides.push(("quickly linked (no LTO),", "quick".into(), quick));
    let mut kernels = Vec::new();
    for (how, label, linked) in sides {
        let launcher = load_launcher(&b.ctx, &linked)?;
        launcher.set_timing(true);
        let ids = b.pool.alloc::<u32>(nq * OPT_K).map_err(err("pool alloc"))?;
        let dists = b.pool.alloc::<f32>(nq * OPT_K).map_err(err("pool alloc"))?;
        kernels.push((how, label, linked, launcher, ids, dists, Vec::new()));
    }
    let cfg = LaunchConfig::new((nq as u32, 1, 1), (SCAN_BLOCK, 1, 1));
    let (warm, reps) = (2, b.reps.n(15));
    for round in 0..warm + reps {
        for (_, _, _, launcher, ids, dists, times) in kernels.iter_mut() {
            let mut a = KernelArgs::new();
            a.input(&base).map_err(err("args"))?;
            a.input(&queries).map_err(err("args"))?;
            a.null_ptr()
                .value(OPT_ROWS as u64)
                .value(OPT_DIM as u32)
                .value(nq as u32)
                .value(OPT_K as u32);
            a.output(&mut *ids).map_err(err("args"))?;
            a.output(&mut *dists).map_err(err("args"))?;
            // SAFETY: the scan's nine parameters in order (fragments/README.md):
            // OPT_ROWS x OPT_DIM rows, nq queries, no filter, k ≤ 32, outputs
            // of nq x k; one block per query.
            unsafe { launcher.launch(&cfg, &mut a) }.map_err(err("launch"))?;
            drop(a);
            let st = launcher.stats_synchronized().map_err(err("stats"))?;
            let t = st.last_time.ok_or("no CUDA event time for the launch")?;
            if round >= warm {
                times.push(t.as_secs_f64());
            }
        }
    }
    let result = |ids: &GpuBuffer<u32>, dists: &GpuBuffer<f32>| -> Result<_, String> {
        let ids = b.transfer.download_vec(ids).map_err(err("download"))?;
        let dists = b.transfer.download_vec(dists).map_err(err("download"))?;
        Ok((ids, dists.iter().map(|d| d.to_bits()).collect::<Vec<_>>()))
    };
    let reference = result(&kernels[0].4, &kernels[0].5)?;
    for (how, label, _, _, ids, dists, _) in &kernels[1..] {
        if result(ids, dists)? != reference {
            return Err(format!(
                "the scan {how} {label} returned other results than at -O3"
            ));
        }
    }
    let bytes = (nq * OPT_ROWS * OPT_DIM * 4) as f64;
    let base_ms = Stats::of(&kernels[0].6).ms();
    Ok(kernels
        .iter()
        .map(|(how, label, linked, _, _, _, times)| {
            let st = Stats::of(times);
            let m = &linked.kernel.metadata;
            Figure::new(format!("scan_opt.{label}.gpu"), st.ms(), "ms").note(format!(
                "{} {how} {label}: link {} (nvJitLink, this host), {} registers, {} B stack; GPU \
                 time per launch (CUDA events) over {OPT_ROWS} x {OPT_DIM} f32 rows, {nq} \
                 queries (one block each), k {OPT_K}: {}, {:.0} GB/s of rows read; {:.3}x the \
                 -O3 kernel's time; interleaved with the other sides, results equal bit for bit",
                m.entry,
                fmt_ms(m.link_ms),
                m.registers,
                m.stack_bytes,
                st.describe(),
                bytes / st.median / 1e9,
                st.ms() / base_ms
            ))
        })
        .collect())
}

fn first_call(b: &Bench) -> Result<Vec<Figure>, String> {
    let rounds = if b.reps.quick { 1 } else { 3 };
    let mut cold = Vec::new();
    let mut cold_fast = Vec::new();
    let mut cold_quick = Vec::new();
    let mut disk = Vec::new();
    let mut compute_cache: Vec<Result<Value, String>> = Vec::new();
    let mut prelinks = Vec::new();
    let mut prelinked = Vec::new();
    let arch = b.ctx.arch().to_string();
    for _ in 0..rounds {
        let fraglink_cache = temp_dir("gpu_bench_fraglink_cache")?;
        let cuda_cache = temp_dir("gpu_bench_cuda_cache")?;
        // Cold: both caches empty, so nvJitLink links for real.
        cold.push(run_child(&ChildEnv {
            mode: "cold",
            fraglink_cache: fraglink_cache.path(),
            cuda_cache: cuda_cache.path(),
        })?);
        // Cold again at nvJitLink's -Ofc=min (FRAGLINK_FAST_COMPILE), over
        // caches of its own: the shorter link's first call.
        let fast_cache = temp_dir("gpu_bench_fraglink_cache")?;
        let fast_cuda = temp_dir("gpu_bench_cuda_cache")?;
        cold_fast.push(run_child(&ChildEnv {
            mode: "cold_fast",
            fraglink_cache: fast_cache.path(),
            cuda_cache: fast_cuda.path(),
        })?);
        // Cold again with quick links (LinkRuntime::link_tiered), over
        // caches of its own.
        let quick_cache = temp_dir("gpu_bench_fraglink_cache")?;
        let quick_cuda = temp_dir("gpu_bench_cuda_cache")?;
        cold_quick.push(run_child(&ChildEnv {
            mode: "cold_quick",
            fraglink_cache: quick_cache.path(),
            cuda_cache: quick_cuda.path(),
        })?);
        // Disk: the cold run's fraglink cache; nvJitLink is not called.
        disk.push(run_child(&ChildEnv {
            mode: "disk",
            fraglink_cache: fraglink_cache.path(),
            cuda_cache: cuda_cache.path(),
        })?);
        // An empty fraglink cache over the cold run's (warm) CUDA compute
        // cache: what a process sees that links a configuration another
        // process on the machine linked before, without sharing its
        // FRAGLINK_CACHE_DIR.
        let fresh = temp_dir("gpu_bench_fraglink_cache")?;
        compute_cache.push(run_child(&ChildEnv {
            mode: "compute-cache",
            fraglink_cache: fresh.path(),
            cuda_cache: cuda_cache.path(),
        }));
        // Prelinked: a separate fresh process links both configurations
        // ahead of time into an empty fraglink cache (over its own empty
        // compute cache), then a first-call process over that directory and
        // a new empty compute cache, so that nvJitLink's cache cannot help:
        // every kernel must come from the disk cache.
        let prelinked_cache = temp_dir("gpu_bench_fraglink_cache")?;
        let prelink_cuda = temp_dir("gpu_bench_cuda_cache")?;
        let t = Instant::now();
        let mut report = run_subcommand(
            &ChildEnv {
                mode: "prelinked",
                fraglink_cache: prelinked_cache.path(),
                cuda_cache: prelink_cuda.path(),
            },
            &[PRELINK_COMMAND, &arch],
            "prelink",
        )?;
        report["process_ms"] = json!(t.elapsed().as_secs_f64() * 1e3);
        prelinks.push(report);
        let first_cuda = temp_dir("gpu_bench_cuda_cache")?;
        prelinked.push(run_child(&ChildEnv {
            mode: "prelinked",
            fraglink_cache: prelinked_cache.path(),
            cuda_cache: first_cuda.path(),
        })?);
    }
    // Seconds (the children report milliseconds; `Stats` holds seconds).
    let get = |runs: &[Value], config: usize, key: &str| -> Vec<f64> {
        runs.iter()
            .filter_map(|r| r["configs"][config][key].as_f64())
            .map(|ms| ms / 1e3)
            .collect()
    };
    let sources = |runs: &[Value], config: usize| -> Vec<String> {
        runs.iter()
            .map(|r| {
                r["configs"][config]["source"]
                    .as_str()
                    .unwrap_or("?")
                    .to_owned()
            })
            .collect()
    };
    let all_ok = |runs: &[Value]| {
        runs.iter()
            .all(|r| (0..2).all(|c| r["configs"][c]["result_ok"].as_bool() == Some(true)))
    };
    if ![&cold, &cold_fast, &cold_quick, &disk, &prelinked]
        .into_iter()
        .all(|runs| all_ok(runs))
    {
        return Err("a first-call child's scan result failed its check".into());
    }
    let mut figures = Vec::new();
    for (mode, runs, expect, target, limit) in [
        (
            "cold",
            &cold,
            "linked",
            TARGET_FIRST_LINKED,
            T_FIRST_LINKED_MS,
        ),
        (
            "cold_fast",
            &cold_fast,
            "linked",
            TARGET_FIRST_LINKED,
            T_FIRST_LINKED_MS,
        ),
        (
            "cold_quick",
            &cold_quick,
            "quick",
            TARGET_FIRST_LINKED,
            T_FIRST_LINKED_MS,
        ),
        ("disk", &disk, "disk", TARGET_FIRST_DISK, T_FIRST_DISK_MS),
        (
            "prelinked",
            &prelinked,
            "disk",
            TARGET_FIRST_DISK,
            T_FIRST_DISK_MS,
        ),
    ] {
        for (config, which) in [(0usize, "first"), (1, "second")] {
            let src = sources(runs, config);
            let wrong = src.iter().any(|s| s != expect);
            let med = |key: &str| Stats::of(&get(runs, config, key)).ms();
            let total = med("total_ms");
            let frags = (if config == 0 { CONFIG_A } else { CONFIG_B }).join(" + ");
            let caches = match mode {
                "cold" => "empty FRAGLINK_CACHE_DIR and empty CUDA_CACHE_PATH (the driver compute cache nvJitLink also uses)",
                "cold_fast" => "as first_call.cold (empty caches of its own), linked with FRAGLINK_FAST_COMPILE=min (nvJitLink -Ofc=min: a shorter link of slower code; the kernels' speed is the peers' fraglink/fast-link side)",
                "cold_quick" => "as first_call.cold (empty caches of its own), linked through LinkRuntime::link_tiered: a quick link of the fragments' SASS without LTO, the optimised link started in the background (first_call.cold_quick.upgraded; the quick kernel's speed is scan_opt.quick.gpu)",
                "prelinked" => "a FRAGLINK_CACHE_DIR filled ahead of time by a separate prelink process (first_call.prelinked.prelink_seconds) and a new empty CUDA_CACHE_PATH",
                _ => "the cold run's FRAGLINK_CACHE_DIR",
            };
            let mut note = format!(
                "{which} new configuration in a fresh process ({frags}): link {} (of which nvJitLink {}), module load {}, first launch to completion {}; median of {} fresh processes; {caches}; link sources {:?}",
                fmt_ms(med("link_ms")),
                if expect == "linked" || expect == "quick" {
                    fmt_ms(med("nvjitlink_ms"))
                } else {
                    "none".into()
                },
                fmt_ms(med("load_ms")),
                fmt_ms(med("first_launch_ms")),
                runs.len(),
                src
            );
            if config == 0 {
                note.push_str(
                    "; process setup (driver, context, nvJitLink load) is separate: first_call.process_setup",
                );
            } else {
                note.push_str("; the process had already linked one configuration");
            }
            let name = if config == 0 {
                format!("first_call.{mode}.total")
            } else {
                format!("first_call.{mode}.second_config.total")
            };
            let mut fig = Figure::new(name, total, "ms");
            if wrong {
                note.push_str(&format!(
                    "; WARNING: expected every link to come from `{expect}`, so `met` is left null"
                ));
                fig = fig.target_text(target);
            } else {
                fig = fig.target(target, total <= limit);
            }
            figures.push(fig.note(note));
            if config == 0 {
                for (key, label, what) in [
                    ("link_ms", "link", "Planner::link_with (memory miss, disk cache lookup, then when cold nvJitLink + cubin check + disk cache write)"),
                    ("load_ms", "load", "Launcher::load (cubin check, cuModuleLoadData, cuModuleGetFunction, attributes)"),
                    ("first_launch_ms", "first_launch", "Launcher::launch + GpuContext::synchronize"),
                ] {
                    let s = Stats::of(&get(runs, config, key));
                    figures.push(
                        Figure::new(format!("first_call.{mode}.{label}"), s.ms(), "ms").note(
                            format!("component of first_call.{mode}.total: {what}; {}", s.describe()),
                        ),
                    );
                }
            }
        }
    }

    // Tiered: when the optimised links had replaced both quick ones.
    let upgraded: Vec<f64> = cold_quick
        .iter()
        .filter_map(|r| r["upgraded_ms"].as_f64())
        .map(|ms| ms / 1e3)
        .collect();
    let up = Stats::of(&upgraded);
    figures.push(
        Figure::new("first_call.cold_quick.upgraded", up.ms(), "ms").note(format!(
            "first_call.cold_quick's process: from its first link call until both optimised links (started in the background by the quick links, run while the process loaded and launched the quick kernels) were in memory and on disk; {}",
            up.describe()
        )),
    );

    // The warm compute cache case.
    let ok: Vec<Value> = compute_cache
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned())
        .collect();
    let failure = compute_cache.iter().find_map(|r| r.as_ref().err().cloned());
    match failure {
        None if all_ok(&ok) => {
            let total = Stats::of(&get(&ok, 0, "total_ms")).ms();
            figures.push(
                Figure::new("first_call.compute_cache.total", total, "ms")
                    .target_text(TARGET_FIRST_LINKED)
                    .note(format!(
                        "first configuration in a fresh process with an empty FRAGLINK_CACHE_DIR over the CUDA compute cache (CUDA_CACHE_PATH) the cold run filled: nvJitLink answers from that cache instead of linking (and returns an empty info log); link {}, load {}, first launch {}; link sources {:?}; median of {} fresh processes",
                        fmt_ms(Stats::of(&get(&ok, 0, "link_ms")).ms()),
                        fmt_ms(Stats::of(&get(&ok, 0, "load_ms")).ms()),
                        fmt_ms(Stats::of(&get(&ok, 0, "first_launch_ms")).ms()),
                        sources(&ok, 0),
                        ok.len()
                    )),
            );
        }
        other => figures.push(
            Figure::unavailable(
                "first_call.compute_cache.total",
                "ms",
                format!(
                    "FAILED: a fresh process with an empty FRAGLINK_CACHE_DIR over the CUDA compute cache (CUDA_CACHE_PATH) the cold run filled could not link: {}. nvJitLink serves a repeated link from the driver's compute cache when a driver is present and then returns an empty info log (no driver, as in CI: no cache); a fraglink that needs ptxas output in that log fails here. This benchmark gives itself and its cold runs private, empty CUDA_CACHE_PATH directories",
                    other.unwrap_or_else(|| "a scan result failed its check".into())
                ),
            )
            .target_text(TARGET_FIRST_LINKED),
        ),
    }

    let setup: Vec<f64> = cold
        .iter()
        .chain(&disk)
        .filter_map(|r| {
            Some(
                (r["probe_ms"].as_f64()? + r["context_ms"].as_f64()? + r["runtime_ms"].as_f64()?)
                    / 1e3,
            )
        })
        .collect();
    let part = |key: &str| {
        let v: Vec<f64> = cold
            .iter()
            .chain(&disk)
            .filter_map(|r| r[key].as_f64())
            .collect();
        fmt_ms(Stats::of(&v).median)
    };
    figures.push(
        Figure::new("first_call.process_setup", Stats::of(&setup).ms(), "ms").note(format!(
            "once per process, before any configuration: driver probe + cuInit {}, primary context + stream {}, link runtime (nvJitLink load, disk cache open) {}; median of {} processes",
            part("probe_ms"),
            part("context_ms"),
            part("runtime_ms"),
            setup.len()
        )),
    );
    figures.push(prelink_figure(&prelinks, &arch));
    Ok(figures)
}

/// `first_call.prelinked.prelink_seconds` from the prelink children's
/// reports (each already checked to have no failed plan).
fn prelink_figure(prelinks: &[Value], arch: &str) -> Figure {
    let seconds = |key: &str| -> Stats {
        Stats::of(
            &prelinks
                .iter()
                .filter_map(|r| r[key].as_f64())
                .map(|ms| ms / 1e3)
                .collect::<Vec<_>>(),
        )
    };
    let time = seconds("prelink_ms");
    let counts: Vec<String> = prelinks
        .iter()
        .map(|r| {
            format!(
                "{} linked, {} from disk, {} from memory, {} failed",
                r["linked"], r["from_disk"], r["from_memory"], r["failed"]
            )
        })
        .collect();
    let mut note = format!(
        "ahead-of-time prelink::prelink of both configurations ({} and {}) for {arch} (parallelism 0: one thread per core, at most one per plan) in a separate fresh process over an empty FRAGLINK_CACHE_DIR and its own empty CUDA_CACHE_PATH: linking and storing in the disk cache, {} (PrelinkReport.elapsed {}); that process's setup apart: link runtime (nvJitLink load, disk cache open) {}, the whole process from spawn to exit {}; reports {counts:?}; the first call over the result is first_call.prelinked.total",
        CONFIG_A.join(" + "),
        CONFIG_B.join(" + "),
        time.describe(),
        fmt_ms(seconds("elapsed_ms").ms()),
        fmt_ms(seconds("runtime_ms").ms()),
        fmt_ms(seconds("process_ms").ms()),
    );
    if !prelinks
        .iter()
        .all(|r| r["linked"].as_u64().is_some() && r["linked"] == r["plans"])
    {
        note.push_str(
            "; WARNING: expected nvJitLink to link every plan into the empty cache, so this is not the time of linking both",
        );
    }
    Figure::new("first_call.prelinked.prelink_seconds", time.median, "s").note(note)
}

// ---------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------

fn reason(e: &GpuError) -> String {
    match e {
        GpuError::DeviceNotAvailable { reason } => reason.clone(),
        other => other.to_string(),
    }
}

fn no_gpu(e: &GpuError) -> i32 {
    println!("gpu_bench: no CUDA GPU: {}", reason(e));
    EXIT_NO_GPU
}

/// The NVIDIA kernel module's version from `/proc/driver/nvidia/version`
/// (e.g. `580.159.04`), when the file is there.
fn kernel_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().next()?;
    line.split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.split('.').count() >= 2
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_owned)
}

struct Options {
    json: Option<PathBuf>,
    quick: bool,
}

const USAGE: &str = "usage: gpu_bench [--json OUT.json] [--quick]";

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        json: None,
        quick: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => {
                let p = it.next().ok_or("--json needs a file name")?;
                o.json = Some(PathBuf::from(p));
            }
            "--quick" => o.quick = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                exit(0)
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(o)
}

/// Runs one section; a failure or panic becomes a figure with the error.
fn section<T>(
    name: &str,
    failed: &mut bool,
    errors: &mut Vec<Figure>,
    f: impl FnOnce() -> Result<T, String>,
) -> Option<T> {
    eprintln!("gpu_bench: {name} …");
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(format!(
            "panicked: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    };
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("gpu_bench: {name} failed: {e}");
            *failed = true;
            errors.push(Figure::unavailable(
                format!("{name}.error"),
                "",
                format!("section failed: {e}"),
            ));
            None
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some(CHILD_COMMAND) => exit(first_call_child()),
        Some(PRELINK_COMMAND) => exit(prelink_child(args.get(1).map(String::as_str))),
        Some(ROUTED_COMMAND) => exit(routed_first_child(args.get(1).map(String::as_str))),
        _ => {}
    }
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu_bench: {e}\n{USAGE}");
            exit(EXIT_USAGE)
        }
    };
    // A private, empty CUDA compute cache for this process (and, explicitly,
    // for each first-call child): nvJitLink answers repeated links from it
    // with an empty info log, which fraglink cannot parse (see
    // first_call.compute_cache). Set before the first driver call.
    let cuda_cache = match temp_dir("gpu_bench_cuda_cache") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            exit(EXIT_FAILED)
        }
    };
    std::env::set_var("CUDA_CACHE_PATH", cuda_cache.path());
    let code = run(&opts);
    drop(cuda_cache);
    exit(code)
}

fn run(opts: &Options) -> i32 {
    if let Err(e) = GpuContext::available() {
        return no_gpu(&e);
    }
    let ctx = match GpuContext::default() {
        Ok(c) => c,
        Err(e) => return no_gpu(&e),
    };
    let driver = raw::driver_version().unwrap_or(0);
    let module_version = kernel_module_version();
    let driver_text = format!(
        "CUDA {}.{} driver API (cuDriverGetVersion {driver}){}",
        driver / 1000,
        (driver % 1000) / 10,
        module_version
            .as_deref()
            .map(|v| format!(", kernel module {v}"))
            .unwrap_or_default()
    );
    let info = ctx.info().clone();
    let pool = match MemoryPool::cuda(&ctx, PoolConfig::default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("gpu_bench: memory pool: {e}");
            return EXIT_FAILED;
        }
    };
    let bench = Bench {
        transfer: Transfer::new(&ctx),
        ctx,
        pool,
        reps: Reps { quick: opts.quick },
    };
    eprintln!(
        "gpu_bench: {} ({}, {} SMs), {driver_text}",
        info.name,
        info.arch(),
        info.sm_count
    );

    let mut failed = false;
    let mut figures: Vec<Figure> = Vec::new();
    let mut errors = Vec::new();
    let mut sweep = Vec::new();
    if let Some(f) = section("transfer", &mut failed, &mut errors, || transfers(&bench)) {
        figures.extend(f);
    }
    let linked = section("link", &mut failed, &mut errors, || link_tiny(&bench.ctx));
    if let Some(linked) = &linked {
        if let Some(f) = section("launch", &mut failed, &mut errors, || {
            launches(&bench, linked)
        }) {
            figures.extend(f);
        }
    }
    if let Some(f) = section("alloc", &mut failed, &mut errors, || allocation(&bench)) {
        figures.extend(f);
    }
    if let Some(f) = section("route", &mut failed, &mut errors, || routing(&bench)) {
        figures.extend(f);
    }
    if let Some(linked) = &linked {
        if let Some((f, lines)) = section("dispatch", &mut failed, &mut errors, || {
            dispatch(&bench, linked)
        }) {
            figures.extend(f);
            sweep = lines;
        }
    }
    if let Some(f) = section("first_call", &mut failed, &mut errors, || {
        first_call(&bench)
    }) {
        figures.extend(f);
    }
    if let Some(f) = section("scan_opt", &mut failed, &mut errors, || opt_levels(&bench)) {
        figures.extend(f);
    }
    if let Some(f) = section("routed_first", &mut failed, &mut errors, || {
        routed_first(&bench)
    }) {
        figures.extend(f);
    }
    figures.extend(errors);

    // Human-readable report.
    println!(
        "gpu_bench: {} ({}, {} SMs, {:.1} GiB), {driver_text}{}",
        info.name,
        info.arch(),
        info.sm_count,
        info.total_memory as f64 / (1u64 << 30) as f64,
        if opts.quick { " [--quick]" } else { "" }
    );
    if !sweep.is_empty() {
        println!("\ngraph replay vs direct launch (medians, launch + synchronise):");
        for l in &sweep {
            println!("  {l}");
        }
    }
    println!("\n{:<38} {:>12}  {:<4} target", "figure", "measured", "met");
    for f in &figures {
        if f.name.starts_with("dispatch.b") {
            continue; // in the sweep table above
        }
        println!(
            "{:<38} {:>12}  {:<4} {}",
            f.name,
            fmt_value(f.value, f.unit),
            match f.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            },
            f.target.as_deref().unwrap_or("")
        );
    }
    println!("\nnotes:");
    for f in &figures {
        if !f.note.is_empty() && !f.name.starts_with("dispatch.b") {
            println!("  {}: {}", f.name, f.note);
        }
    }

    if let Some(path) = &opts.json {
        let doc = json!({
            "device": info.name,
            "driver": driver_text,
            "context": {
                "arch": info.arch().to_string(),
                "compute_capability": [info.compute_capability.0, info.compute_capability.1],
                "sm_count": info.sm_count,
                "total_memory_bytes": info.total_memory,
                "cuda_driver_version": driver,
                "kernel_module_version": module_version,
                "fraglink_version": env!("CARGO_PKG_VERSION"),
                "fragments_nvrtc": fraglink::fragments::BUILD_NVRTC_VERSION,
                "cuda_module_loading": std::env::var("CUDA_MODULE_LOADING").ok(),
                "cuda_cache_path": "a private empty temp dir per process (see first_call.compute_cache)",
                "quick": opts.quick,
            },
            "figures": figures.iter().map(Figure::to_json).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("gpu_bench: cannot write {}: {e}", path.display());
            return EXIT_FAILED;
        }
        eprintln!("gpu_bench: wrote {}", path.display());
    }
    if failed {
        EXIT_FAILED
    } else {
        0
    }
}
