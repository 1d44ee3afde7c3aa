//! Kernel launch from a linked cubin.
//!
//! [`Launcher::load`] checks the image on the CPU ([`check_cubin`]: a CUDA
//! ELF whose symbol table has the entry as a kernel), loads it with
//! `cuModuleLoadData` (cudarc's `result::module::load_data`; cudarc's own
//! `CudaContext::load_module` needs its `nvrtc` feature, which fraglink does
//! not enable) and resolves the entry with `cuModuleGetFunction`. The
//! driver's view of the kernel (`cuFuncGetAttribute`: registers, static
//! shared memory, the launch-bound thread limit; `cuFuncGetParamInfo`: the
//! parameter sizes) is merged with the resources the linker reported.
//!
//! Every launch is validated first ([`LaunchConfig::validate`], pure and
//! CPU-tested: dimensions, launch bounds, registers per block at the
//! hardware's allocation granularity, shared memory) and its arguments are
//! compared with the kernel's parameter sizes. [`KernelArgs`] takes device
//! data as [`GpuView`]/[`GpuViewMut`] and passes the pointers the way
//! cudarc's launch builder does (`DevicePtr::device_ptr` /
//! `DevicePtrMut::device_ptr_mut`, whose guards record the read/write events
//! after `cuLaunchKernel` where the context tracks them: buffers used on
//! several streams stay ordered once [`GpuContext::new_stream`] has turned
//! tracking on; on the context's one stream it is off, its order suffices).
//!
//! A pointer argument may carry an alignment requirement
//! ([`KernelArgs::require_alignment`]); the launcher checks the real device
//! address before `cuLaunchKernel` and names the argument when it fails —
//! a misaligned vector load would raise a sticky fault that ends the CUDA
//! context. [`ScanContract`] is the scan kernel's launch contract on the
//! host (32-bit counts converted without truncation, `dim % veclen`, `k`,
//! pointer alignments), with [`ScanArgError`] naming the argument; the
//! kernel enforces the same rules itself and writes nothing when they fail
//! (fragments/scan.cuh, `launch_ok`).

use std::collections::VecDeque;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUevent_flags, CUfunction_attribute, CUstreamCaptureStatus,
};
use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DeviceRepr,
};

use super::context::DeviceLimits;
use super::memory::{GpuView, GpuViewMut};
use super::transfer::DeviceInput;
use super::{driver_error, GpuContext, GpuError, GpuResult};
use crate::link::metadata::{self, CubinError};

/// ELF `e_machine` of CUDA device code (one definition, in the metadata reader).
pub use crate::link::metadata::EM_CUDA;

/// Registers are allocated to a warp in units of this many (every
/// architecture from sm_50 to sm_120).
pub const REGISTER_ALLOCATION_UNIT: u32 = 256;

/// What a kernel needs per thread and block, as the linker (nvJitLink
/// `-verbose`) or the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelResources {
    /// 32-bit registers per thread (0 = unknown, not checked).
    pub registers: u32,
    /// Static `__shared__` bytes per block.
    pub static_shared_bytes: u32,
    /// `__launch_bounds__` thread limit, if the kernel has one.
    pub max_threads_per_block: Option<u32>,
}

/// Registers one block of `threads` threads occupies when each thread uses
/// `registers`: whole warps, each allocated in units of
/// [`REGISTER_ALLOCATION_UNIT`].
pub fn registers_per_block(registers: u32, threads: u64, warp_size: u32) -> u64 {
    let warp = u64::from(warp_size.max(1));
    let per_warp =
        (u64::from(registers) * warp).next_multiple_of(u64::from(REGISTER_ALLOCATION_UNIT));
    threads.div_ceil(warp) * per_warp
}

impl KernelResources {
    /// The largest block (a multiple of the warp size) this kernel can be
    /// launched with on a device with `limits`.
    pub fn max_block_threads(&self, limits: &DeviceLimits) -> u32 {
        let warp = limits.warp_size.max(1);
        let mut t = limits.max_threads_per_block.min(limits.max_block_dim.0);
        if let Some(m) = self.max_threads_per_block.filter(|&m| m > 0) {
            t = t.min(m);
        }
        t -= t % warp;
        while t > 0
            && registers_per_block(self.registers, u64::from(t), warp)
                > u64::from(limits.registers_per_block)
        {
            t -= warp;
        }
        t
    }
}

/// Grid and block dimensions plus dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks `(x, y, z)`.
    pub grid: (u32, u32, u32),
    /// Threads per block `(x, y, z)`.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub dynamic_shared_bytes: u32,
}

impl From<LaunchConfig> for cudarc::driver::LaunchConfig {
    fn from(c: LaunchConfig) -> Self {
        cudarc::driver::LaunchConfig {
            grid_dim: c.grid,
            block_dim: c.block,
            shared_mem_bytes: c.dynamic_shared_bytes,
        }
    }
}

fn ceil_div_u32(what: &str, n: u64, d: u32) -> GpuResult<u32> {
    if d == 0 {
        return Err(GpuError::invalid_config(format!(
            "{what}: block dimension 0"
        )));
    }
    u32::try_from(n.div_ceil(u64::from(d))).map_err(|_| {
        GpuError::invalid_config(format!(
            "{what}: {n} items in blocks of {d} need more than 2^32 blocks"
        ))
    })
}

impl LaunchConfig {
    /// `grid × block` threads, no dynamic shared memory.
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> Self {
        LaunchConfig {
            grid,
            block,
            dynamic_shared_bytes: 0,
        }
    }

    /// One-dimensional: `ceil(work_items / block)` blocks of `block`
    /// threads. Zero work is refused (skip the launch instead).
    pub fn linear(work_items: u64, block: u32) -> GpuResult<Self> {
        if work_items == 0 {
            return Err(GpuError::invalid_config(
                "no work items: skip the launch instead of launching an empty grid",
            ));
        }
        let blocks = ceil_div_u32("1-D launch", work_items, block)?;
        Ok(Self::new((blocks, 1, 1), (block, 1, 1)))
    }

    /// Two-dimensional: a `width × height` domain in `block.0 × block.1`
    /// tiles.
    pub fn grid_2d(width: u32, height: u32, block: (u32, u32)) -> GpuResult<Self> {
        if width == 0 || height == 0 {
            return Err(GpuError::invalid_config(format!(
                "empty {width}×{height} domain: skip the launch"
            )));
        }
        let gx = ceil_div_u32("2-D launch", u64::from(width), block.0)?;
        let gy = ceil_div_u32("2-D launch", u64::from(height), block.1)?;
        Ok(Self::new((gx, gy, 1), (block.0, block.1, 1)))
    }

    /// [`Self::linear`] checked against the kernel's resources on a device
    /// with the default CUDA 12 limits ([`DeviceLimits::default`]).
    pub fn for_kernel(resources: &KernelResources, work_items: u64, block: u32) -> GpuResult<Self> {
        Self::for_kernel_on(&DeviceLimits::default(), resources, work_items, block)
    }

    /// [`Self::linear`] checked against the kernel's resources and `limits`.
    pub fn for_kernel_on(
        limits: &DeviceLimits,
        resources: &KernelResources,
        work_items: u64,
        block: u32,
    ) -> GpuResult<Self> {
        let cfg = Self::linear(work_items, block)?;
        cfg.validate(resources, limits)?;
        Ok(cfg)
    }

    pub fn with_dynamic_shared(mut self, bytes: u32) -> Self {
        self.dynamic_shared_bytes = bytes;
        self
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        u64::from(self.block.0) * u64::from(self.block.1) * u64::from(self.block.2)
    }

    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        u64::from(self.grid.0) * u64::from(self.grid.1) * u64::from(self.grid.2)
    }

    /// Whether a kernel with `resources` can be launched like this on a
    /// device with `limits`; [`GpuError::InvalidConfig`] says why not.
    pub fn validate(&self, resources: &KernelResources, limits: &DeviceLimits) -> GpuResult<()> {
        let bad = |reason: String| Err(GpuError::InvalidConfig { reason });
        let (g, b) = (self.grid, self.block);
        if [g.0, g.1, g.2].contains(&0) {
            return bad(format!(
                "grid {g:?} has a zero dimension: skip the launch when there is no work"
            ));
        }
        if [b.0, b.1, b.2].contains(&0) {
            return bad(format!("block {b:?} has a zero dimension"));
        }
        let (mb, mg) = (limits.max_block_dim, limits.max_grid_dim);
        if b.0 > mb.0 || b.1 > mb.1 || b.2 > mb.2 {
            return bad(format!(
                "block {b:?} exceeds the device's block limits {mb:?}"
            ));
        }
        if g.0 > mg.0 || g.1 > mg.1 || g.2 > mg.2 {
            return bad(format!(
                "grid {g:?} exceeds the device's grid limits {mg:?}"
            ));
        }
        let threads = self.threads_per_block();
        if threads > u64::from(limits.max_threads_per_block) {
            return bad(format!(
                "{threads} threads per block exceed the device's {}",
                limits.max_threads_per_block
            ));
        }
        if let Some(m) = resources.max_threads_per_block.filter(|&m| m > 0) {
            if threads > u64::from(m) {
                return bad(format!(
                    "{threads} threads per block exceed the kernel's launch bound of {m}"
                ));
            }
        }
        if resources.registers > 255 {
            return bad(format!(
                "{} registers per thread: no architecture allows more than 255",
                resources.registers
            ));
        }
        let regs = registers_per_block(resources.registers, threads, limits.warp_size);
        if regs > u64::from(limits.registers_per_block) {
            return bad(format!(
                "a block of {threads} threads × {} registers occupies {regs} registers (whole warps, \
                 {REGISTER_ALLOCATION_UNIT}-register units), more than the {} per block; use at most {} threads",
                resources.registers,
                limits.registers_per_block,
                resources.max_block_threads(limits)
            ));
        }
        if resources.static_shared_bytes > limits.shared_bytes_per_block {
            return bad(format!(
                "{} bytes of static shared memory exceed the {} a kernel may declare",
                resources.static_shared_bytes, limits.shared_bytes_per_block
            ));
        }
        let shared =
            u64::from(resources.static_shared_bytes) + u64::from(self.dynamic_shared_bytes);
        let most = limits
            .shared_bytes_per_block_optin
            .max(limits.shared_bytes_per_block);
        if shared > u64::from(most) {
            return bad(format!(
                "{} static + {} dynamic bytes of shared memory exceed the {most} bytes per block \
                 this device allows (with opt-in)",
                resources.static_shared_bytes, self.dynamic_shared_bytes,
            ));
        }
        Ok(())
    }

    /// Whether this launch's shared memory exceeds the default per-block
    /// limit, so the kernel must opt in first
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`; [`Launcher`]
    /// does it).
    pub fn needs_shared_opt_in(&self, resources: &KernelResources, limits: &DeviceLimits) -> bool {
        u64::from(resources.static_shared_bytes) + u64::from(self.dynamic_shared_bytes)
            > u64::from(limits.shared_bytes_per_block)
    }
}

/// Launch statistics of one [`Launcher`]. Times come from a pair of CUDA
/// events around each launch while [`Launcher::set_timing`] is on, and are
/// collected once the launch finished.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelStats {
    /// Launches issued.
    pub launches: u64,
    /// Launches whose time has been collected.
    pub timed_launches: u64,
    /// Sum of the collected times.
    pub total_time: Duration,
    /// The most recently collected time.
    pub last_time: Option<Duration>,
}

impl KernelStats {
    /// Mean of the collected times.
    pub fn mean_time(&self) -> Option<Duration> {
        (self.timed_launches > 0).then(|| self.total_time / self.timed_launches as u32)
    }
}

enum Slot {
    Value(usize),
    Read(usize),
    Write(usize),
}

/// Arguments of one launch, in the kernel's parameter order.
///
/// Scalars are copied in; device data is borrowed for `'a` as views, so the
/// buffers outlive the call that launches them (and the pool reuses them only
/// after that, in stream order).
#[derive(Default)]
pub struct KernelArgs<'a> {
    order: Vec<Slot>,
    values: Vec<(Box<[u128]>, usize)>,
    reads: Vec<CudaView<'a, u8>>,
    writes: Vec<CudaViewMut<'a, u8>>,
    /// `(argument index, alignment in bytes, name)`: device addresses the
    /// launcher checks before launching ([`Self::require_alignment`]).
    alignments: Vec<(usize, u64, String)>,
}

impl std::fmt::Debug for KernelArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs")
            .field("sizes", &self.sizes())
            .finish()
    }
}

impl<'a> KernelArgs<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Byte size of each argument as the kernel receives it.
    pub fn sizes(&self) -> Vec<usize> {
        let ptr = std::mem::size_of::<CUdeviceptr>();
        self.order
            .iter()
            .map(|s| match s {
                Slot::Value(i) => self.values[*i].1,
                Slot::Read(_) | Slot::Write(_) => ptr,
            })
            .collect()
    }

    /// A scalar (or `#[repr(C)]` struct) passed by value.
    pub fn value<T: DeviceRepr + Copy>(&mut self, value: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let mut storage = vec![0u128; size.div_ceil(16).max(1)].into_boxed_slice();
        // SAFETY: `storage` has at least `size` bytes; `T` is plain data.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &value as *const T as *const u8,
                storage.as_mut_ptr() as *mut u8,
                size,
            )
        };
        self.order.push(Slot::Value(self.values.len()));
        self.values.push((storage, size));
        self
    }

    /// A null device pointer (e.g. an optional filter bitset left out).
    pub fn null_ptr(&mut self) -> &mut Self {
        self.value::<CUdeviceptr>(0)
    }

    /// Device data the kernel reads.
    pub fn input<T: DeviceRepr + 'a>(
        &mut self,
        view: impl Into<GpuView<'a, T>>,
    ) -> GpuResult<&mut Self> {
        let view = view.into();
        let bytes = view.len() * std::mem::size_of::<T>();
        let cuda = view.as_cuda()?;
        // SAFETY: reinterpreting device bytes as bytes for pointer passing.
        let raw = unsafe { cuda.transmute::<u8>(bytes) }.ok_or(GpuError::InvalidAccess {
            offset: view.offset(),
            len: view.len(),
            size: view.buffer().len(),
        })?;
        self.order.push(Slot::Read(self.reads.len()));
        self.reads.push(raw);
        Ok(self)
    }

    /// Data that must already be on the device; host data is refused with
    /// [`GpuError::ImplicitTransfer`] naming `what`.
    pub fn device_input<T: DeviceRepr + 'a>(
        &mut self,
        input: DeviceInput<'a, T>,
        what: &str,
    ) -> GpuResult<&mut Self> {
        let view = input.require_device(what)?;
        self.input(view)
    }

    /// Requires the device address of the last pointer argument to be a
    /// multiple of `align` bytes (a power of two); the launcher checks the
    /// real address before `cuLaunchKernel` and refuses the launch with an
    /// error naming `name`. A kernel doing vector loads needs this: a
    /// misaligned load is a sticky fault that ends the whole CUDA context.
    /// Ignored (and refused at launch) when the last argument is not a
    /// device pointer.
    pub fn require_alignment(&mut self, align: u64, name: &str) -> &mut Self {
        if let Some(index) = self.order.len().checked_sub(1) {
            self.alignments.push((index, align, name.to_owned()));
        }
        self
    }

    /// Device data the kernel writes (or reads and writes).
    pub fn output<T: DeviceRepr + 'a>(
        &mut self,
        view: impl Into<GpuViewMut<'a, T>>,
    ) -> GpuResult<&mut Self> {
        // The bytes directly: cudarc's `CudaViewMut::transmute_mut` borrows
        // the typed view it is called on, which would not live for `'a`.
        let raw = view.into().into_cuda_bytes_mut()?;
        self.order.push(Slot::Write(self.writes.len()));
        self.writes.push(raw);
        Ok(self)
    }
}

/// Compares the arguments' sizes with the kernel's parameter sizes.
pub fn check_arguments(entry: &str, params: &[usize], args: &[usize]) -> GpuResult<()> {
    if params.len() != args.len() {
        return Err(GpuError::invalid_config(format!(
            "`{entry}` takes {} parameters, {} arguments were given",
            params.len(),
            args.len()
        )));
    }
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        if p != a {
            return Err(GpuError::invalid_config(format!(
                "argument {i} of `{entry}` is {a} bytes, the kernel's parameter {i} is {p} bytes"
            )));
        }
    }
    Ok(())
}

/// Checks that argument `index` (`name`) of `entry`, at device address
/// `address`, is aligned to `align` bytes (a power of two).
pub fn check_alignment(
    entry: &str,
    index: usize,
    name: &str,
    address: u64,
    align: u64,
) -> GpuResult<()> {
    if !align.is_power_of_two() {
        return Err(GpuError::invalid_config(format!(
            "argument {index} `{name}` of `{entry}`: required alignment {align} is not a power of two"
        )));
    }
    if !address.is_multiple_of(align) {
        return Err(GpuError::invalid_config(format!(
            "argument {index} `{name}` of `{entry}`: device address {address:#x} is not aligned \
             to {align} bytes (the kernel's vector loads would fault)"
        )));
    }
    Ok(())
}

/// Names of the scan kernel's parameters, in order (fragments/README.md).
pub const SCAN_PARAMS: [&str; 9] = [
    "dataset",
    "queries",
    "filter_bits",
    "n_rows",
    "dim",
    "n_queries",
    "k",
    "out_ids",
    "out_dists",
];

/// The scan kernel refuses `n_rows` from here on (fragments/scan.cuh,
/// `kMaxRows`).
pub const SCAN_MAX_ROWS: u64 = 1 << 63;

/// A scan launch argument that breaks the scan kernel's launch contract
/// (fragments/README.md, "Preconditions"), found on the host before the
/// launch. Each names the argument and the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanArgError {
    /// A count that does not fit the kernel's 32-bit parameter.
    #[error("scan argument `{argument}` = {value} exceeds the kernel's 32-bit parameter (at most {max})")]
    TooLarge {
        argument: &'static str,
        value: u64,
        max: u64,
    },
    /// `dim` is not a multiple of the variant's vector width.
    #[error("scan argument `dim` = {dim} is not a multiple of the kernel's veclen {veclen} (pick a veclen-1 variant or pad the rows)")]
    DimNotMultipleOfVeclen { dim: u64, veclen: u32 },
    /// `k` outside `1..=capacity`.
    #[error("scan argument `k` = {k} is outside 1..={capacity}, the kernel's top-k capacity")]
    K { k: u64, capacity: u32 },
    /// More rows than u32 ids can name (0xFFFFFFFF is the padding id).
    #[error(
        "scan argument `n_rows` = {n_rows} needs i64 ids: u32 ids name at most 4294967294 rows"
    )]
    RowsNeedWideIds { n_rows: u64 },
    /// At least [`SCAN_MAX_ROWS`] rows.
    #[error("scan argument `n_rows` = {n_rows} is beyond the kernel's limit of 2^63 - 1 = 9223372036854775807 rows")]
    TooManyRows { n_rows: u64 },
    /// A pointer argument not aligned as the kernel reads it.
    #[error("scan argument `{argument}` at byte offset {offset} is not aligned to {align} bytes")]
    Misaligned {
        argument: &'static str,
        offset: u64,
        align: u64,
    },
}

impl ScanArgError {
    /// The parameter (one of [`SCAN_PARAMS`]) the error is about.
    pub fn argument(&self) -> &'static str {
        match self {
            ScanArgError::TooLarge { argument, .. } | ScanArgError::Misaligned { argument, .. } => {
                argument
            }
            ScanArgError::DimNotMultipleOfVeclen { .. } => "dim",
            ScanArgError::K { .. } => "k",
            ScanArgError::RowsNeedWideIds { .. } | ScanArgError::TooManyRows { .. } => "n_rows",
        }
    }
}

impl From<ScanArgError> for GpuError {
    fn from(e: ScanArgError) -> Self {
        GpuError::InvalidConfig {
            reason: e.to_string(),
        }
    }
}

/// The scalar arguments of one scan launch, converted to the kernel's
/// parameter types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanScalars {
    pub n_rows: u64,
    pub dim: u32,
    pub n_queries: u32,
    pub k: u32,
}

/// What one scan variant (`scan_{dtype}_{idx}_v{veclen}_k{capacity}`)
/// requires of its launch. The kernel checks the same rules itself and
/// writes nothing when they fail (fragments/scan.cuh, `launch_ok`); this is
/// the host-side half that says which argument is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanContract {
    /// Bytes per element: 4 (f32), 2 (f16), 1 (i8, u8).
    pub elem_bytes: u32,
    /// Elements per vector load (a power of two).
    pub veclen: u32,
    /// Bytes per id: 4 (u32) or 8 (i64).
    pub id_bytes: u32,
    /// Top-k capacity.
    pub capacity: u32,
}

impl ScanContract {
    /// Alignment `dataset` and `queries` need: one vector load.
    pub fn vector_align(&self) -> u64 {
        u64::from(self.elem_bytes.max(1)) * u64::from(self.veclen.max(1))
    }

    /// Required alignment of each pointer parameter, by name.
    pub fn pointer_alignments(&self) -> [(&'static str, u64); 5] {
        [
            ("dataset", self.vector_align()),
            ("queries", self.vector_align()),
            ("filter_bits", 4),
            ("out_ids", u64::from(self.id_bytes.max(1))),
            ("out_dists", 4),
        ]
    }

    /// Checks the counts of one launch and converts them to the kernel's
    /// parameter types (nothing is truncated: a value that does not fit is
    /// an error naming it).
    pub fn scalars(
        &self,
        n_rows: u64,
        dim: u64,
        n_queries: u64,
        k: u64,
    ) -> Result<ScanScalars, ScanArgError> {
        let to_u32 = |argument: &'static str, value: u64| {
            u32::try_from(value).map_err(|_| ScanArgError::TooLarge {
                argument,
                value,
                max: u64::from(u32::MAX),
            })
        };
        let dim32 = to_u32("dim", dim)?;
        let n_queries = to_u32("n_queries", n_queries)?;
        if k == 0 || k > u64::from(self.capacity) {
            return Err(ScanArgError::K {
                k,
                capacity: self.capacity,
            });
        }
        let veclen = self.veclen.max(1);
        if !dim.is_multiple_of(u64::from(veclen)) {
            return Err(ScanArgError::DimNotMultipleOfVeclen { dim, veclen });
        }
        if self.id_bytes == 4 && n_rows >= u64::from(u32::MAX) {
            return Err(ScanArgError::RowsNeedWideIds { n_rows });
        }
        // The kernel steps a split's tiles by splits x 128 rows, which must
        // not wrap around: it refuses 2^63 rows and more.
        if n_rows >= SCAN_MAX_ROWS {
            return Err(ScanArgError::TooManyRows { n_rows });
        }
        Ok(ScanScalars {
            n_rows,
            dim: dim32,
            n_queries,
            k: k as u32,
        })
    }

    /// Checks that pointer parameter `argument` starting `offset` bytes
    /// into a device allocation (allocations are at least 256-byte aligned)
    /// is aligned as the kernel reads it. A name outside
    /// [`Self::pointer_alignments`] is another kernel's rows (`data` of the
    /// IVF scan, `stage_dataset` and `stage_queries` of an f16copy tile),
    /// which the kernel reads with the same vector loads as `dataset`.
    pub fn check_offset(&self, argument: &'static str, offset: u64) -> Result<(), ScanArgError> {
        let align = self
            .pointer_alignments()
            .iter()
            .find(|(name, _)| *name == argument)
            .map_or(self.vector_align(), |&(_, a)| a);
        if !offset.is_multiple_of(align) {
            return Err(ScanArgError::Misaligned {
                argument,
                offset,
                align,
            });
        }
        Ok(())
    }
}

/// Checks that `image` is a cubin whose symbol table holds `entry` as a
/// kernel: the crate's one ELF check ([`metadata::check_cubin`]: a 64-bit
/// little-endian ELF for machine 190 with `entry` among its function
/// symbols), plus that `entry` is a `__global__` function and not a device
/// function, which the driver would resolve and then fail to launch.
pub fn check_cubin(image: &[u8], entry: &str) -> GpuResult<()> {
    let bad = |reason: String| Err(GpuError::InvalidConfig { reason });
    if entry.is_empty() || entry.contains('\0') {
        return bad(format!("invalid kernel entry name {entry:?}"));
    }
    let info = match metadata::check_cubin(image, entry) {
        Ok(info) => info,
        Err(e @ (CubinError::NotElf { .. } | CubinError::TooShort { .. })) => {
            return bad(format!(
                "not a cubin: {e} (a PTX or LTO-IR image must be linked first)"
            ))
        }
        Err(e) => return bad(format!("not a cubin for `{entry}`: {e}")),
    };
    if !info.entry_is_kernel {
        return bad(format!(
            "`{entry}` is a device function of the cubin, not a kernel"
        ));
    }
    Ok(())
}

struct TimingState {
    stats: KernelStats,
    pending: VecDeque<(CudaEvent, CudaEvent)>,
}

/// Most launches whose timing events are kept before the oldest are dropped
/// untimed.
const MAX_PENDING_TIMINGS: usize = 4096;

/// A loaded cubin's entry point, ready to launch.
pub struct Launcher {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: sys::CUmodule,
    function: sys::CUfunction,
    entry: String,
    resources: KernelResources,
    params: Option<Vec<usize>>,
    limits: DeviceLimits,
    sm_count: u32,
    cooperative: bool,
    /// The kernel's `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` as
    /// last set (0: the driver's default, static + dynamic ≤ 48 KiB); the
    /// lock orders the driver call with the record, so concurrent launches
    /// asking for different sizes leave the larger.
    dynamic_shared_opt_in: Mutex<u32>,
    timing: AtomicBool,
    state: Mutex<TimingState>,
}

// SAFETY: CUmodule and CUfunction are driver handles usable from any thread
// once the context is current (every call binds it first); the module is
// unloaded only in `drop`.
unsafe impl Send for Launcher {}
// SAFETY: as above; mutable state is behind a Mutex / atomics.
unsafe impl Sync for Launcher {}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher")
            .field("entry", &self.entry)
            .field("resources", &self.resources)
            .field("params", &self.params)
            .finish()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // cudarc's calls start by taking an error it stored (and return it
        // without doing their work): take it out first, put it back last.
        let stored = self.ctx.check_err();
        // `cuModuleUnload` does not wait for the module's kernels still
        // queued (on any stream: `launch_on`), so the context's work is
        // waited for, except while the stream captures a graph (a
        // synchronisation would invalidate the capture; nothing of it runs
        // before its replay) or may (the query failed). The query makes the
        // context current.
        let capturing = super::stream_capturing(&self.stream).unwrap_or_else(|e| {
            self.ctx.record_err::<()>(Err(e));
            true
        });
        // SAFETY: the context is alive (held by `self.ctx`) and current
        // unless the query failed (the unload then fails and records why);
        // the calls below only wait for it and unload this module.
        unsafe {
            if !capturing {
                self.ctx.record_err(result::ctx::synchronize());
            }
            // Loaded in `load`, unloaded only here.
            self.ctx.record_err(result::module::unload(self.module));
        }
        self.ctx.record_err(stored);
    }
}

fn launch_error(entry: &str, call: &str) -> impl FnOnce(cudarc::driver::DriverError) -> GpuError {
    let kernel = entry.to_owned();
    let call = call.to_owned();
    move |e| GpuError::Launch {
        kernel,
        message: format!("{call}: {e}"),
        context_lost: super::is_sticky(&e),
    }
}

impl Launcher {
    /// Loads `cubin` into `ctx` and resolves `entry`. `resources` are the
    /// linker's figures; the driver's are merged in (the larger register
    /// and shared-memory counts, the smaller thread limit).
    pub fn load(
        ctx: &GpuContext,
        cubin: &[u8],
        entry: &str,
        resources: KernelResources,
    ) -> GpuResult<Self> {
        check_cubin(cubin, entry)?;
        let cuda = ctx.cuda().clone();
        cuda.bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        // The driver reads the image in place: give it 8-byte alignment.
        let mut aligned = vec![0u64; cubin.len().div_ceil(8)];
        // SAFETY: `aligned` has room for `cubin.len()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                cubin.as_ptr(),
                aligned.as_mut_ptr() as *mut u8,
                cubin.len(),
            )
        };
        // SAFETY: a complete ELF image checked above; the driver copies it.
        let module = unsafe { result::module::load_data(aligned.as_ptr() as *const c_void) }
            .map_err(|e| {
                let call = if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_BINARY_FOR_GPU {
                    format!(
                        "cuModuleLoadData (the cubin was linked for another architecture; link with -arch={})",
                        ctx.arch()
                    )
                } else {
                    "cuModuleLoadData".to_owned()
                };
                launch_error(entry, &call)(e)
            })?;
        let name = CString::new(entry).expect("checked: no NUL");
        // SAFETY: `module` was just loaded.
        let function = match unsafe { result::module::get_function(module, name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: not used afterwards.
                let _ = unsafe { result::module::unload(module) };
                return Err(launch_error(entry, "cuModuleGetFunction")(e));
            }
        };
        let attr = |a: CUfunction_attribute| -> Option<u32> {
            // SAFETY: `function` belongs to the loaded module.
            unsafe { result::function::get_function_attribute(function, a) }
                .ok()
                .map(|v| v.max(0) as u32)
        };
        let driver_regs = attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS).unwrap_or(0);
        let driver_shared =
            attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).unwrap_or(0);
        let driver_max = attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
        let merged = KernelResources {
            registers: resources.registers.max(driver_regs),
            static_shared_bytes: resources.static_shared_bytes.max(driver_shared),
            max_threads_per_block: match (resources.max_threads_per_block, driver_max) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        };
        Ok(Launcher {
            ctx: cuda,
            stream: ctx.stream().clone(),
            module,
            function,
            entry: entry.to_owned(),
            resources: merged,
            params: param_sizes(function, cubin, entry),
            limits: *ctx.limits(),
            sm_count: ctx.info().sm_count,
            cooperative: ctx.info().cooperative_launch,
            dynamic_shared_opt_in: Mutex::new(0),
            timing: AtomicBool::new(false),
            state: Mutex::new(TimingState {
                stats: KernelStats::default(),
                pending: VecDeque::new(),
            }),
        })
    }

    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The merged resources launches are validated against.
    pub fn resources(&self) -> &KernelResources {
        &self.resources
    }

    /// Parameter sizes from `cuFuncGetParamInfo` (None if the driver could
    /// not tell).
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// The stream [`Self::launch`] uses.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Turns per-launch event timing on or off (off by default: two events
    /// created, recorded, queried and destroyed per launch cost several
    /// microseconds of host time, more than a small kernel's launch).
    pub fn set_timing(&self, on: bool) {
        self.timing.store(on, Ordering::Relaxed);
    }

    /// A [`LaunchConfig::linear`] for this kernel on this device, validated.
    pub fn config_for(&self, work_items: u64, block: u32) -> GpuResult<LaunchConfig> {
        LaunchConfig::for_kernel_on(&self.limits, &self.resources, work_items, block)
    }

    /// Launches on the launcher's stream.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in type and meaning
    /// (sizes are checked, types cannot be), and the kernel must stay within
    /// the buffers it is given.
    pub unsafe fn launch(&self, cfg: &LaunchConfig, args: &mut KernelArgs<'_>) -> GpuResult<()> {
        self.launch_impl(&self.stream, cfg, args, false)
    }

    /// Launches on `stream` (e.g. one being captured into a graph).
    ///
    /// # Safety
    /// As [`Self::launch`].
    pub unsafe fn launch_on(
        &self,
        stream: &Arc<CudaStream>,
        cfg: &LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> GpuResult<()> {
        self.launch_impl(stream, cfg, args, false)
    }

    /// Blocks of `threads` threads (and `dynamic_shared_bytes`) one SM holds
    /// at once, by this kernel's registers and shared memory
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub fn blocks_per_sm(&self, threads: u32, dynamic_shared_bytes: u32) -> GpuResult<u32> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        // The occupancy calculator counts no block whose dynamic shared
        // memory is above the kernel's opt-in.
        self.opt_in_shared(
            &LaunchConfig::new((1, 1, 1), (threads.max(1), 1, 1))
                .with_dynamic_shared(dynamic_shared_bytes),
        )?;
        // SAFETY: `function` belongs to the loaded module.
        let per_sm = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                self.function,
                threads as i32,
                dynamic_shared_bytes as usize,
            )
        }
        .map_err(driver_error("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        Ok(per_sm.max(0) as u32)
    }

    /// Blocks of this shape the whole device holds at once:
    /// [`Self::blocks_per_sm`] × the SM count.
    pub fn resident_blocks(&self, threads: u32, dynamic_shared_bytes: u32) -> GpuResult<u32> {
        Ok(self
            .blocks_per_sm(threads, dynamic_shared_bytes)?
            .saturating_mul(self.sm_count))
    }

    /// A cooperative launch (`cuLaunchCooperativeKernel`): every block is
    /// resident at once, so the grid may not exceed what the device holds.
    ///
    /// # Safety
    /// As [`Self::launch`].
    pub unsafe fn launch_cooperative(
        &self,
        cfg: &LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> GpuResult<()> {
        if !self.cooperative {
            return Err(GpuError::invalid_config(
                "this device does not support cooperative launches",
            ));
        }
        let per_sm =
            self.blocks_per_sm(cfg.threads_per_block() as u32, cfg.dynamic_shared_bytes)?;
        let resident = u64::from(per_sm) * u64::from(self.sm_count);
        if cfg.blocks() > resident {
            return Err(GpuError::invalid_config(format!(
                "a cooperative launch of {} blocks exceeds the {resident} that can be resident \
                 ({per_sm} per SM × {} SMs)",
                cfg.blocks(),
                self.sm_count
            )));
        }
        self.launch_impl(&self.stream, cfg, args, true)
    }

    /// Raises the kernel's dynamic shared memory limit to what `cfg` asks
    /// when static + dynamic exceed the default 48 KiB per block (after
    /// [`LaunchConfig::validate`]: never beyond the device's opt-in limit).
    /// Once per larger size; a kernel's attribute is per function, shared
    /// by every launch.
    fn opt_in_shared(&self, cfg: &LaunchConfig) -> GpuResult<()> {
        cfg.validate(&self.resources, &self.limits)?;
        let bytes = cfg.dynamic_shared_bytes;
        if !cfg.needs_shared_opt_in(&self.resources, &self.limits) {
            return Ok(());
        }
        let mut set = self
            .dynamic_shared_opt_in
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if bytes <= *set {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        // SAFETY: `function` belongs to the loaded module; `bytes` is within
        // the device's opt-in limit (validated above).
        unsafe {
            result::function::set_function_attribute(
                self.function,
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(launch_error(
            &self.entry,
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
        ))?;
        *set = bytes;
        Ok(())
    }

    unsafe fn launch_impl(
        &self,
        stream: &Arc<CudaStream>,
        cfg: &LaunchConfig,
        args: &mut KernelArgs<'_>,
        cooperative: bool,
    ) -> GpuResult<()> {
        self.opt_in_shared(cfg)?;
        if let Some(params) = &self.params {
            check_arguments(&self.entry, params, &args.sizes())?;
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        let capturing = !matches!(
            stream.capture_status(),
            Ok(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        );
        let timed = self.timing.load(Ordering::Relaxed) && !capturing;

        let KernelArgs {
            order,
            values,
            reads,
            writes,
            alignments,
        } = args;
        let mut read_ptrs: Vec<CUdeviceptr> = Vec::with_capacity(reads.len());
        let mut write_ptrs: Vec<CUdeviceptr> = Vec::with_capacity(writes.len());
        let mut guards = Vec::with_capacity(reads.len() + writes.len());
        for r in reads.iter() {
            let (p, g) = r.device_ptr(stream);
            read_ptrs.push(p);
            guards.push(g);
        }
        for w in writes.iter_mut() {
            let (p, g) = w.device_ptr_mut(stream);
            write_ptrs.push(p);
            guards.push(g);
        }
        let aligned = alignments.iter().try_for_each(|(index, align, name)| {
            let address = match order.get(*index) {
                Some(Slot::Read(i)) => read_ptrs[*i],
                Some(Slot::Write(i)) => write_ptrs[*i],
                _ => {
                    return Err(GpuError::invalid_config(format!(
                    "argument {index} `{name}` of `{}`: an alignment was required of an argument \
                         that is not a device pointer",
                    self.entry
                )))
                }
            };
            check_alignment(&self.entry, *index, name, address, *align)
        });
        if let Err(e) = aligned {
            // Refused before the launch; the guards go as after one.
            if capturing {
                guards.into_iter().for_each(std::mem::forget);
            } else {
                drop(guards);
            }
            return Err(e);
        }
        let mut params: Vec<*mut c_void> = order
            .iter()
            .map(|slot| match slot {
                Slot::Value(i) => values[*i].0.as_ptr() as *mut c_void,
                Slot::Read(i) => &read_ptrs[*i] as *const CUdeviceptr as *mut c_void,
                Slot::Write(i) => &write_ptrs[*i] as *const CUdeviceptr as *mut c_void,
            })
            .collect();

        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = if timed {
            Some(
                stream
                    .record_event(flags)
                    .map_err(driver_error("cuEventRecord"))?,
            )
        } else {
            None
        };
        let (grid, block, shared) = (cfg.grid, cfg.block, cfg.dynamic_shared_bytes);
        let launched = if cooperative {
            result::launch_cooperative_kernel(
                self.function,
                grid,
                block,
                shared,
                stream.cu_stream(),
                &mut params,
            )
        } else {
            result::launch_kernel(
                self.function,
                grid,
                block,
                shared,
                stream.cu_stream(),
                &mut params,
            )
        };
        if capturing {
            // A captured stream must not record events that later waits
            // outside the capture would see; see `CapturedGraph::capture`.
            guards.into_iter().for_each(std::mem::forget);
        } else {
            // Record the buffers' read/write events after the launch.
            drop(guards);
        }
        launched.map_err(launch_error(
            &self.entry,
            if cooperative {
                "cuLaunchCooperativeKernel"
            } else {
                "cuLaunchKernel"
            },
        ))?;
        let end = match start {
            Some(s) => Some((
                s,
                stream
                    .record_event(flags)
                    .map_err(driver_error("cuEventRecord"))?,
            )),
            None => None,
        };
        self.ctx
            .check_err()
            .map_err(driver_error("(deferred, recorded by cudarc)"))?;

        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stats.launches += 1;
        if let Some(pair) = end {
            st.pending.push_back(pair);
        }
        // cuEventQuery on a capturing thread (relaxed mode aside) would
        // invalidate the capture: earlier launches' times wait.
        if !capturing {
            collect_timings(&mut st, false);
        }
        Ok(())
    }

    /// Statistics, with the times of every finished launch collected.
    pub fn stats(&self) -> KernelStats {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        collect_timings(&mut st, false);
        st.stats.clone()
    }

    /// Waits for the launcher's stream, then returns statistics covering
    /// every launch issued so far.
    pub fn stats_synchronized(&self) -> GpuResult<KernelStats> {
        self.stream
            .synchronize()
            .map_err(driver_error("cuStreamSynchronize"))?;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        collect_timings(&mut st, true);
        Ok(st.stats.clone())
    }
}

/// Moves finished launches' times into the statistics (all of them when
/// `wait`, else only completed ones, oldest first).
fn collect_timings(st: &mut TimingState, wait: bool) {
    while let Some((start, end)) = st.pending.front() {
        if !wait && !end.is_complete() {
            break;
        }
        if let Ok(ms) = start.elapsed_ms(end) {
            let d = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
            st.stats.timed_launches += 1;
            st.stats.total_time += d;
            st.stats.last_time = Some(d);
        }
        st.pending.pop_front();
    }
    while st.pending.len() > MAX_PENDING_TIMINGS {
        st.pending.pop_front();
    }
}

/// Sizes of the kernel's parameters: as many as the cubin records
/// (`metadata::kernel_param_sizes`), each asked of the driver
/// (`cuFuncGetParamInfo`, CUDA ≥ 12.4, which the availability probe
/// guarantees), which has the last word on the launch. The count comes from
/// the cubin because the driver API of CUDA 13.0 has no call for it, and
/// asking past the last parameter is an API error compute-sanitizer reports.
/// None when the cubin does not say (then launches are not checked).
fn param_sizes(function: sys::CUfunction, cubin: &[u8], entry: &str) -> Option<Vec<usize>> {
    let recorded = metadata::kernel_param_sizes(cubin, entry).ok()??;
    let mut sizes = Vec::with_capacity(recorded.len());
    for index in 0..recorded.len() {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `function` is live; two valid out-pointers.
        let rc = unsafe { sys::cuFuncGetParamInfo(function, index, &mut offset, &mut size) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Some(recorded);
        }
        sizes.push(size);
    }
    Some(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(registers: u32, shared: u32, max: Option<u32>) -> KernelResources {
        KernelResources {
            registers,
            static_shared_bytes: shared,
            max_threads_per_block: max,
        }
    }

    #[test]
    fn register_granularity() {
        // 64 registers × 1024 threads: exactly the register file.
        assert_eq!(registers_per_block(64, 1024, 32), 65536);
        // 40 registers round to 1280 per warp.
        assert_eq!(registers_per_block(40, 1024, 32), 1280 * 32);
        // 65 registers × 992 threads: the plain product (64480) fits 65536,
        // the per-warp allocation (2304 × 31 warps) does not.
        assert_eq!(registers_per_block(65, 992, 32), 2304 * 31);
        // A partial warp costs a whole one.
        assert_eq!(registers_per_block(32, 33, 32), 2 * 1024);
        assert_eq!(registers_per_block(0, 1024, 32), 0);
    }

    #[test]
    fn linear_and_2d_helpers() {
        let c = LaunchConfig::linear(1000, 128).unwrap();
        assert_eq!(
            (c.grid, c.block, c.dynamic_shared_bytes),
            ((8, 1, 1), (128, 1, 1), 0)
        );
        assert_eq!(LaunchConfig::linear(1024, 128).unwrap().grid, (8, 1, 1));
        assert_eq!(LaunchConfig::linear(1, 128).unwrap().grid, (1, 1, 1));
        assert!(LaunchConfig::linear(0, 128).is_err());
        assert!(LaunchConfig::linear(10, 0).is_err());
        assert!(LaunchConfig::linear(u64::MAX, 1).is_err());
        let c = LaunchConfig::grid_2d(1920, 1080, (16, 16)).unwrap();
        assert_eq!((c.grid, c.block), ((120, 68, 1), (16, 16, 1)));
        assert_eq!(c.threads_per_block(), 256);
        assert_eq!(c.blocks(), 120 * 68);
        assert!(LaunchConfig::grid_2d(0, 10, (16, 16)).is_err());
        assert!(LaunchConfig::grid_2d(10, 10, (16, 0)).is_err());
        let cd: cudarc::driver::LaunchConfig = c.with_dynamic_shared(512).into();
        assert_eq!(
            (cd.grid_dim, cd.block_dim, cd.shared_mem_bytes),
            ((120, 68, 1), (16, 16, 1), 512)
        );
    }

    #[test]
    fn for_kernel_checks_registers() {
        // The scan kernel: 128 threads, up to 64 registers, 2–6 KiB shared.
        let scan = res(64, 6144, Some(128));
        let c = LaunchConfig::for_kernel(&scan, 1000 * 128, 128).unwrap();
        assert_eq!(c.grid, (1000, 1, 1));
        // 1024 threads × 64 registers fit; × 65 do not.
        assert!(LaunchConfig::for_kernel(&res(64, 0, None), 4096, 1024).is_ok());
        let e = LaunchConfig::for_kernel(&res(65, 0, None), 4096, 1024).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("registers") && msg.contains("65536"), "{msg}");
        assert!(msg.contains("at most 896 threads"), "{msg}");
        // Registers beyond the architectural maximum.
        assert!(LaunchConfig::for_kernel(&res(256, 0, None), 32, 32).is_err());
    }

    #[test]
    fn for_kernel_checks_launch_bounds_and_shared_memory() {
        let bounded = res(32, 0, Some(128));
        let e = LaunchConfig::for_kernel(&bounded, 1024, 256).unwrap_err();
        assert!(e.to_string().contains("launch bound of 128"), "{e}");
        // Static shared memory alone over 48 KiB.
        let e = LaunchConfig::for_kernel(&res(32, 49153, None), 1, 32).unwrap_err();
        assert!(e.to_string().contains("shared memory"), "{e}");
        // Static + dynamic.
        let limits = DeviceLimits::default();
        let c = LaunchConfig::linear(1, 32).unwrap();
        assert!(c
            .with_dynamic_shared(40 * 1024)
            .validate(&res(32, 8 * 1024, None), &limits)
            .is_ok());
        assert!(c
            .with_dynamic_shared(40 * 1024 + 1)
            .validate(&res(32, 8 * 1024, None), &limits)
            .is_err());
        assert!(!c
            .with_dynamic_shared(40 * 1024)
            .needs_shared_opt_in(&res(32, 8 * 1024, None), &limits));
        // A device with an opt-in limit above 48 KiB (an H100: 227 KiB)
        // takes more dynamic shared memory, opted in; static stays ≤ 48 KiB.
        let big = DeviceLimits {
            shared_bytes_per_block_optin: 227 * 1024,
            ..limits
        };
        let c90 = c.with_dynamic_shared(90 * 1024);
        assert!(c90.validate(&res(32, 8 * 1024, None), &big).is_ok());
        assert!(c90.needs_shared_opt_in(&res(32, 8 * 1024, None), &big));
        let e = c90.validate(&res(32, 8 * 1024, None), &limits).unwrap_err();
        assert!(e.to_string().contains("with opt-in"), "{e}");
        assert!(c
            .with_dynamic_shared(227 * 1024 - 8 * 1024 + 1)
            .validate(&res(32, 8 * 1024, None), &big)
            .is_err());
        let e = c.validate(&res(32, 48 * 1024 + 1, None), &big).unwrap_err();
        assert!(e.to_string().contains("static shared memory"), "{e}");
    }

    #[test]
    fn validate_dimensions() {
        let r = res(32, 0, None);
        let l = DeviceLimits::default();
        assert!(LaunchConfig::new((1, 1, 1), (1024, 1, 1))
            .validate(&r, &l)
            .is_ok());
        assert!(LaunchConfig::new((1, 1, 1), (1025, 1, 1))
            .validate(&r, &l)
            .is_err());
        assert!(LaunchConfig::new((1, 1, 1), (32, 32, 2))
            .validate(&r, &l)
            .is_err());
        assert!(LaunchConfig::new((1, 1, 1), (1, 1, 65))
            .validate(&r, &l)
            .is_err());
        assert!(LaunchConfig::new((0, 1, 1), (32, 1, 1))
            .validate(&r, &l)
            .is_err());
        assert!(LaunchConfig::new((1, 1, 1), (32, 0, 1))
            .validate(&r, &l)
            .is_err());
        assert!(
            LaunchConfig::new((i32::MAX as u32, 65535, 65535), (32, 1, 1))
                .validate(&r, &l)
                .is_ok()
        );
        assert!(LaunchConfig::new((1, 65536, 1), (32, 1, 1))
            .validate(&r, &l)
            .is_err());
        assert!(LaunchConfig::new((u32::MAX, 1, 1), (32, 1, 1))
            .validate(&r, &l)
            .is_err());
    }

    #[test]
    fn max_block_threads() {
        let l = DeviceLimits::default();
        assert_eq!(res(64, 0, None).max_block_threads(&l), 1024);
        assert_eq!(res(65, 0, None).max_block_threads(&l), 896);
        assert_eq!(res(128, 0, None).max_block_threads(&l), 512);
        assert_eq!(res(255, 0, None).max_block_threads(&l), 256);
        assert_eq!(res(32, 0, Some(200)).max_block_threads(&l), 192);
        assert_eq!(res(0, 0, None).max_block_threads(&l), 1024);
    }

    #[test]
    fn arguments_are_sized_and_checked() {
        #[derive(Clone, Copy)]
        #[repr(C)]
        struct Five([f32; 5]);
        // SAFETY: plain data, `#[repr(C)]`.
        unsafe impl DeviceRepr for Five {}
        let mut args = KernelArgs::new();
        assert!(args.is_empty());
        args.value(7u64)
            .value(3u32)
            .null_ptr()
            .value(Five([1.0; 5]));
        assert_eq!(args.sizes(), vec![8, 4, 8, 20]);
        assert_eq!(args.len(), 4);
        assert!(check_arguments("k", &[8, 4, 8, 20], &args.sizes()).is_ok());
        let e = check_arguments("k", &[8, 8, 8, 20], &args.sizes()).unwrap_err();
        assert!(
            e.to_string().contains("argument 1 of `k` is 4 bytes"),
            "{e}"
        );
        let e = check_arguments("k", &[8, 4, 8], &args.sizes()).unwrap_err();
        assert!(
            e.to_string().contains("takes 3 parameters, 4 arguments"),
            "{e}"
        );
        // Values are stored by copy, byte for byte.
        assert_eq!(args.values[1].0[0] as u32, 3);
        assert_eq!(args.values[0].0[0] as u64, 7);
    }

    #[test]
    fn alignment_requirements_name_the_argument() {
        assert!(check_alignment("scan", 1, "queries", 0x7f00_0000_0100, 16).is_ok());
        assert!(check_alignment("scan", 1, "queries", 0, 16).is_ok());
        let e = check_alignment("scan", 1, "queries", 0x7f00_0000_0104, 16).unwrap_err();
        assert!(matches!(e, GpuError::InvalidConfig { .. }));
        let msg = e.to_string();
        assert!(
            msg.contains("argument 1 `queries` of `scan`")
                && msg.contains("0x7f0000000104")
                && msg.contains("16 bytes"),
            "{msg}"
        );
        assert!(check_alignment("scan", 0, "dataset", 64, 12).is_err());
        // A requirement on the last pushed argument is recorded with its
        // index; with no argument yet there is nothing to require.
        let mut args = KernelArgs::new();
        args.require_alignment(16, "nothing");
        args.value(1u64)
            .null_ptr()
            .require_alignment(4, "filter_bits");
        assert_eq!(args.alignments, vec![(1, 4, "filter_bits".to_string())]);
    }

    fn f32_v4() -> ScanContract {
        ScanContract {
            elem_bytes: 4,
            veclen: 4,
            id_bytes: 4,
            capacity: 32,
        }
    }

    #[test]
    fn scan_counts_are_checked_not_truncated() {
        let c = f32_v4();
        assert_eq!(
            c.scalars(1000, 128, 7, 10).unwrap(),
            ScanScalars {
                n_rows: 1000,
                dim: 128,
                n_queries: 7,
                k: 10
            }
        );
        let max = u64::from(u32::MAX);
        assert_eq!(c.scalars(1, 4, max, 1).unwrap().n_queries, u32::MAX);
        // One past the 32-bit parameter: an error naming argument and value
        // (an `as u32` would have launched 0 queries / a 0-dim scan).
        let e = c.scalars(1, 4, max + 1, 1).unwrap_err();
        assert_eq!(
            e,
            ScanArgError::TooLarge {
                argument: "n_queries",
                value: max + 1,
                max
            }
        );
        assert_eq!(e.argument(), "n_queries");
        assert!(e.to_string().contains("`n_queries` = 4294967296"), "{e}");
        let e = c.scalars(1, (max + 1) * 4, 1, 1).unwrap_err();
        assert_eq!(e.argument(), "dim");
        assert!(e.to_string().contains("17179869184"), "{e}");
        let e: GpuError = e.into();
        assert!(matches!(e, GpuError::InvalidConfig { .. }) && e.to_string().contains("`dim`"));
        // dim must be a multiple of veclen; veclen 1 takes any dim.
        let e = c.scalars(1, 130, 1, 1).unwrap_err();
        assert_eq!(
            e,
            ScanArgError::DimNotMultipleOfVeclen {
                dim: 130,
                veclen: 4
            }
        );
        assert!(ScanContract { veclen: 1, ..c }
            .scalars(1, 130, 1, 1)
            .is_ok());
        assert!(c.scalars(1, 0, 1, 1).is_ok());
        // k within 1..=capacity.
        assert_eq!(c.scalars(1, 4, 1, 0).unwrap_err().argument(), "k");
        assert_eq!(
            c.scalars(1, 4, 1, 33).unwrap_err(),
            ScanArgError::K {
                k: 33,
                capacity: 32
            }
        );
        // u32 ids stop one short of 2^32 - 1 rows; i64 ids do not.
        assert!(c.scalars(max - 1, 4, 1, 1).is_ok());
        assert_eq!(c.scalars(max, 4, 1, 1).unwrap_err().argument(), "n_rows");
        let wide = ScanContract { id_bytes: 8, ..c };
        assert!(wide.scalars(max * 4, 4, 1, 1).is_ok());
        // ... up to the kernel's own bound.
        assert!(wide.scalars(SCAN_MAX_ROWS - 1, 4, 1, 1).is_ok());
        let e = wide.scalars(SCAN_MAX_ROWS, 4, 1, 1).unwrap_err();
        assert_eq!(e.argument(), "n_rows");
        assert!(e.to_string().contains("9223372036854775807"), "{e}");
    }

    #[test]
    fn scan_pointer_alignment_follows_the_variant() {
        let c = f32_v4();
        assert_eq!(c.vector_align(), 16);
        // i8/u8 v16 and f16 v8 load 16 bytes too; veclen 1 only its element.
        let i8v16 = ScanContract {
            elem_bytes: 1,
            veclen: 16,
            ..c
        };
        assert_eq!(i8v16.vector_align(), 16);
        assert_eq!(ScanContract { veclen: 1, ..c }.vector_align(), 4);
        assert!(c.check_offset("queries", 128 * 4).is_ok());
        // Row 1 of a dim-3 matrix seen by a v4 kernel: 12 bytes in.
        assert_eq!(
            c.check_offset("queries", 12).unwrap_err(),
            ScanArgError::Misaligned {
                argument: "queries",
                offset: 12,
                align: 16
            }
        );
        assert_eq!(
            c.check_offset("dataset", 4).unwrap_err().argument(),
            "dataset"
        );
        assert!(c.check_offset("out_dists", 4).is_ok());
        assert!(c.check_offset("out_dists", 2).is_err());
        let wide = ScanContract { id_bytes: 8, ..c };
        assert!(wide.check_offset("out_ids", 4).is_err());
        assert!(wide.check_offset("out_ids", 8).is_ok());
        // Other kernels' rows (the IVF scan's `data`) need a vector load's alignment.
        assert_eq!(c.check_offset("data", 4).unwrap_err().argument(), "data");
        assert!(c.check_offset("data", 16 * 4).is_ok());
        let names: Vec<&str> = c.pointer_alignments().iter().map(|p| p.0).collect();
        assert!(names.iter().all(|n| SCAN_PARAMS.contains(n)), "{names:?}");
    }

    /// Needs nvJitLink (found as for every link test), no GPU.
    #[test]
    fn cubin_checks() {
        let plan = crate::link::Planner::new("scan_f16_i64_v8_k256")
            .add_named("scan_f16_i64_v8_k256")
            .unwrap()
            .add_named("metric_cosine_f16")
            .unwrap()
            .add_named("filter_none_i64")
            .unwrap();
        let rt = crate::link::LinkRuntime::new(crate::link::RuntimeConfig {
            memory_capacity: 1,
            disk: None,
        })
        .unwrap();
        let linked = rt.link(&plan, crate::build::Arch::sm(80)).unwrap();
        let good = &linked.kernel.cubin;
        check_cubin(good, "scan_f16_i64_v8_k256").unwrap();
        // A prefix of the entry is not the entry.
        let e = check_cubin(good, "scan_f16_i64").unwrap_err().to_string();
        assert!(e.contains("not a function symbol"), "{e}");
        // A device function (libdevice's slow paths) is not launchable.
        let info = metadata::check_cubin(good, "scan_f16_i64_v8_k256").unwrap();
        let device_fn = info
            .functions
            .iter()
            .find(|f| *f != "scan_f16_i64_v8_k256")
            .expect("f16 cosine keeps device functions");
        let e = check_cubin(good, device_fn).unwrap_err().to_string();
        assert!(e.contains("device function"), "{e}");
        let mut other_machine = good.clone();
        other_machine[18..20].copy_from_slice(&62u16.to_le_bytes());
        let e = check_cubin(&other_machine, "scan_f16_i64_v8_k256").unwrap_err();
        assert!(e.to_string().contains("e_machine is 62"), "{e}");
        let e = check_cubin(b"// PTX\n.version 8.0", "k").unwrap_err();
        assert!(e.to_string().contains("must be linked first"), "{e}");
        let mut big_endian = good.clone();
        big_endian[5] = 2;
        assert!(check_cubin(&big_endian, "scan_f16_i64_v8_k256").is_err());
        assert!(check_cubin(good, "").is_err());
        assert!(check_cubin(good, "a\0b").is_err());
    }

    #[test]
    fn kernel_stats_mean() {
        let mut s = KernelStats::default();
        assert_eq!(s.mean_time(), None);
        s.timed_launches = 4;
        s.total_time = Duration::from_millis(10);
        assert_eq!(s.mean_time(), Some(Duration::from_micros(2500)));
    }
}
