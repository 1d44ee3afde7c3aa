//! Pooled, typed device memory.
//!
//! [`MemoryPool`] rounds every request up to a size class, keeps blocks that
//! come back (a [`GpuBuffer`] returns its block on drop) and serves later
//! requests of the same class from them. What a block *is* belongs to a
//! [`DeviceMemory`] backend: [`CudaMemory`] allocates `CudaSlice<u8>` through
//! cudarc, [`HostMemory`] plain host bytes with a capacity — the latter exists
//! so that the pool's own bookkeeping (rounding, reuse, eviction, limits,
//! statistics) is tested on machines without a GPU.
//!
//! ## Rules
//!
//! * A request of `n` bytes (`len * size_of::<T>()`) above
//!   [`PoolConfig::max_allocation`] fails with
//!   [`GpuError::AllocationTooLarge`]. Otherwise its size class is
//!   `max(n, min_allocation)` rounded by [`SizeClasses`], capped at
//!   `max_allocation`.
//! * A pool for a device is sized from the device's memory
//!   ([`PoolConfig::for_device`], [`MemoryPool::cuda_for_device`]): one
//!   allocation may take up to [`DEVICE_ALLOCATION_FRACTION`] of it, so a
//!   dataset of any size the card can hold stays on the GPU path; the
//!   default classes ([`SizeClasses::PowerOfTwoSteps`] with 8 steps) waste
//!   less than 12.5 % of a request, where plain powers of two waste up to
//!   100 % (a 2.1 GB dataset would reserve 4 GiB).
//! * An idle block of exactly that class is reused (a *hit*, most recently
//!   returned first); otherwise the backend allocates one (a *miss*). When the
//!   backend is out of memory the pool frees all its idle blocks and retries
//!   once; if that fails too the caller gets [`GpuError::OutOfMemory`] with the
//!   class size as `requested` and the backend's free bytes as `available`.
//! * [`PoolConfig::max_pool_bytes`] caps the bytes kept **idle**. When a
//!   returning block would exceed it, [`EvictionPolicy::Lru`] frees the least
//!   recently returned idle blocks until it fits; [`EvictionPolicy::None`]
//!   frees the returning block instead. Blocks larger than the cap are never
//!   kept.
//! * Backend calls (allocation and freeing, which may synchronise a stream)
//!   happen outside the pool's lock.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::cudaError_enum;
use cudarc::driver::{result, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr};

use super::{driver_error, GpuContext, GpuError, GpuResult};

// ---------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------

/// Where a pool's blocks come from.
pub trait DeviceMemory: Send + Sync + 'static {
    /// One raw allocation of at least the requested bytes.
    type Block: Send + Sync + 'static;

    /// Allocates `bytes` bytes; [`GpuError::OutOfMemory`] when they do not
    /// fit.
    fn alloc(&self, bytes: u64) -> GpuResult<Self::Block>;

    /// Gives a block back.
    fn free(&self, block: Self::Block);

    /// Bytes the backend could still allocate (best effort).
    fn available(&self) -> u64;

    /// Waits until blocks given back with [`free`](Self::free) can be
    /// allocated again. A stream-ordered backend frees when the stream gets
    /// there; the pool calls this before retrying an allocation that ran
    /// out of memory.
    fn settle(&self) {}
}

/// A shared backend: lets the owner watch it (e.g. [`HostMemory::used`])
/// while a pool uses it, and after the pool is gone.
impl<M: DeviceMemory> DeviceMemory for Arc<M> {
    type Block = M::Block;

    fn alloc(&self, bytes: u64) -> GpuResult<Self::Block> {
        (**self).alloc(bytes)
    }

    fn free(&self, block: Self::Block) {
        (**self).free(block)
    }

    fn available(&self) -> u64 {
        (**self).available()
    }

    fn settle(&self) {
        (**self).settle()
    }
}

/// A plain in-memory backend: real host allocations, counted against a
/// fixed capacity. Used to test the pool without a GPU, and usable wherever a
/// pool of host scratch space with the same statistics is wanted.
#[derive(Debug)]
pub struct HostMemory {
    capacity: u64,
    used: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
}

impl HostMemory {
    /// A backend that can hold `capacity` bytes at once.
    pub fn new(capacity: u64) -> Self {
        HostMemory {
            capacity,
            used: AtomicU64::new(0),
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
        }
    }

    /// Bytes currently allocated from this backend.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// `(allocations, frees)` made through this backend so far.
    pub fn calls(&self) -> (u64, u64) {
        (
            self.allocs.load(Ordering::SeqCst),
            self.frees.load(Ordering::SeqCst),
        )
    }
}

impl DeviceMemory for HostMemory {
    type Block = Box<[u8]>;

    fn alloc(&self, bytes: u64) -> GpuResult<Box<[u8]>> {
        let reserved = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|&u| u <= self.capacity)
            });
        if let Err(used) = reserved {
            return Err(GpuError::OutOfMemory {
                requested: bytes,
                available: self.capacity.saturating_sub(used),
            });
        }
        let len = usize::try_from(bytes).map_err(|_| GpuError::OutOfMemory {
            requested: bytes,
            available: self.available(),
        })?;
        self.allocs.fetch_add(1, Ordering::SeqCst);
        Ok(vec![0u8; len].into_boxed_slice())
    }

    fn free(&self, block: Box<[u8]>) {
        self.used.fetch_sub(block.len() as u64, Ordering::SeqCst);
        self.frees.fetch_add(1, Ordering::SeqCst);
    }

    fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.used())
    }
}

/// Device memory through cudarc: blocks are `CudaSlice<u8>` allocated on one
/// stream (`CudaStream::alloc`, i.e. `cuMemAllocAsync` where the device has
/// memory pools, else `cuMemAlloc`), freed by dropping them (`cuMemFreeAsync`
/// / `cuMemFree` after the slice's pending reads and writes).
///
/// While the stream captures a graph ([`CapturedGraph`](super::CapturedGraph))
/// the stream-ordered calls would be captured too: an allocation would
/// become a graph node whose address is valid only during a replay (and the
/// pool would hand it out), a free of a block from outside the graph fails
/// (`CUDA_ERROR_INVALID_VALUE`). So allocations are refused then, and frees
/// wait until the next allocation or free after the capture.
#[derive(Debug, Clone)]
pub struct CudaMemory {
    stream: Arc<CudaStream>,
    deferred: Arc<Mutex<Vec<CudaSlice<u8>>>>,
}

impl CudaMemory {
    /// Allocates on `ctx`'s stream.
    pub fn new(ctx: &GpuContext) -> Self {
        Self::on_stream(ctx.stream().clone())
    }

    /// Allocates on `stream`.
    pub fn on_stream(stream: Arc<CudaStream>) -> Self {
        CudaMemory {
            stream,
            deferred: Arc::default(),
        }
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether the stream is capturing a graph ([`super::stream_capturing`]:
    /// an invalidated capture included, as the frees of a failed recording
    /// closure's buffers happen then). A failed query counts as not
    /// capturing: the call that follows meets the error.
    fn capturing(&self) -> bool {
        super::stream_capturing(&self.stream).unwrap_or(false)
    }

    /// Frees the blocks dropped during a capture, once none runs.
    fn free_deferred(&self) {
        let blocks = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        drop(blocks);
    }
}

impl DeviceMemory for CudaMemory {
    type Block = CudaSlice<u8>;

    fn alloc(&self, bytes: u64) -> GpuResult<CudaSlice<u8>> {
        if self.capturing() {
            return Err(GpuError::invalid_config(
                "device allocation while the pool's stream captures a graph: allocate every \
                 buffer before CapturedGraph::capture",
            ));
        }
        self.free_deferred();
        let n = usize::try_from(bytes).map_err(|_| GpuError::OutOfMemory {
            requested: bytes,
            available: self.available(),
        })?;
        // SAFETY: the bytes are uninitialised device memory; every typed
        // access goes through views whose contents are written (upload,
        // kernel) before they are read, as with any cudaMalloc'd buffer.
        match unsafe { self.stream.alloc::<u8>(n) } {
            Ok(slice) => Ok(slice),
            Err(e) if e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(GpuError::OutOfMemory {
                    requested: bytes,
                    available: self.available(),
                })
            }
            Err(e) => Err(driver_error("cuMemAlloc")(e)),
        }
    }

    fn free(&self, block: CudaSlice<u8>) {
        if self.capturing() {
            self.deferred
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(block);
            return;
        }
        self.free_deferred();
        drop(block);
    }

    fn available(&self) -> u64 {
        let ctx = self.stream.context();
        // `bind_to_thread` takes an error cudarc stored for a later call:
        // put it back, for that call (or the retried allocation) to report.
        if let Err(e) = ctx.bind_to_thread() {
            ctx.record_err::<()>(Err(e));
            return 0;
        }
        result::mem_get_info()
            .map(|(free, _)| free as u64)
            .unwrap_or(0)
    }

    /// `cuMemFreeAsync` returns a block to the device's pool only when the
    /// stream reaches the free, and the pool gives memory back to the
    /// device at a synchronisation: synchronise, so an out-of-memory retry
    /// after a trim finds the trimmed bytes. An error here is the stream's
    /// (a fault): kept for the retried allocation to report.
    fn settle(&self) {
        // No synchronisation while capturing: it is illegal then (and an
        // allocation then is refused before any retry).
        if !self.capturing() {
            let ctx = self.stream.context();
            ctx.record_err(self.stream.synchronize());
        }
    }
}

// ---------------------------------------------------------------------------
// Configuration and statistics
// ---------------------------------------------------------------------------

/// How request sizes are rounded to size classes (after raising them to
/// [`PoolConfig::min_allocation`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeClasses {
    /// The next power of two: at most 2× waste, few classes, high reuse.
    PowerOfTwo,
    /// Each power-of-two range `[2^e, 2^(e+1)]` split into `steps` equal
    /// classes (the next multiple of `max(1, 2^e / steps)`, `2^e` the largest
    /// power of two ≤ the request): less than `1/steps` waste (8 steps:
    /// < 12.5 %), `steps` classes per doubling. With 8 steps every class
    /// from 16 MiB up is a multiple of 2 MiB, the driver's own granularity
    /// for large allocations. `steps` must be a power of two.
    PowerOfTwoSteps { steps: u32 },
    /// Classes `min_allocation · ratio^k` (each at least one byte larger
    /// than the previous); `ratio` must be > 1. 1.25 wastes at most 25 %.
    Geometric { ratio: f64 },
    /// The next multiple of `step` bytes (`step` ≥ 1).
    Linear { step: u64 },
    /// No rounding: only equal sizes reuse each other.
    Exact,
}

/// What happens when returning a block would keep more than
/// [`PoolConfig::max_pool_bytes`] idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Free the least recently returned idle blocks until the new one fits.
    Lru,
    /// Keep what is idle; free the returning block.
    None,
}

/// Pool settings. All sizes in bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// Most bytes kept idle for reuse.
    pub max_pool_bytes: u64,
    /// Smallest size class.
    pub min_allocation: u64,
    /// Largest single allocation; larger requests are refused.
    pub max_allocation: u64,
    pub size_classes: SizeClasses,
    pub eviction: EvictionPolicy,
}

/// Size classes of [`PoolConfig::default`] and [`PoolConfig::for_device`]:
/// powers of two in 8 steps, so a class wastes less than 12.5 % of its
/// request.
pub const DEFAULT_SIZE_CLASSES: SizeClasses = SizeClasses::PowerOfTwoSteps { steps: 8 };

/// Share of the device's total memory one allocation may take in a pool
/// sized by [`PoolConfig::for_device`], as `(numerator, denominator)`: 7/8.
/// The remaining eighth (10 GiB of an 80 GiB H100, 512 MiB of a 4 GiB card)
/// is left for the CUDA context and loaded modules, the queries and results
/// a search allocates beside its dataset, and other users of the device. A
/// request that fits the cap but not the free memory still fails, as
/// [`GpuError::OutOfMemory`], which callers handle (smaller batches, then
/// the CPU).
pub const DEVICE_ALLOCATION_FRACTION: (u64, u64) = (7, 8);

/// Share of the device's total memory a pool sized by
/// [`PoolConfig::for_device`] keeps idle for reuse, as `(numerator,
/// denominator)`: 1/4. An allocation that runs out of memory frees the idle
/// blocks and retries first, so they never cost a search its memory.
pub const DEVICE_IDLE_FRACTION: (u64, u64) = (1, 4);

/// Granularity `for_device`'s caps are rounded down to (the driver's page
/// size for large allocations).
const DEVICE_GRANULARITY: u64 = 2 << 20;

impl Default for PoolConfig {
    /// For a backend whose size is not known: 1 GiB idle at most, 512 B per
    /// allocation at least and no cap of the pool's own (the backend's memory
    /// is the limit), [`DEFAULT_SIZE_CLASSES`], LRU eviction. A pool on a
    /// device should use [`PoolConfig::for_device`].
    fn default() -> Self {
        PoolConfig {
            max_pool_bytes: 1 << 30,
            min_allocation: 512,
            max_allocation: u64::MAX,
            size_classes: DEFAULT_SIZE_CLASSES,
            eviction: EvictionPolicy::Lru,
        }
    }
}

/// `bytes × fraction`, rounded down to `granularity` (≥ 1), without
/// overflow.
fn fraction_of(bytes: u64, (num, den): (u64, u64), granularity: u64) -> u64 {
    let share = (u128::from(bytes) * u128::from(num) / u128::from(den.max(1))) as u64;
    share - share % granularity.max(1)
}

impl PoolConfig {
    /// The pool for a device with `total_memory` bytes (`cuDeviceTotalMem`,
    /// [`DeviceInfo::total_memory`](super::DeviceInfo::total_memory)): one
    /// allocation up to [`DEVICE_ALLOCATION_FRACTION`] of it, up to
    /// [`DEVICE_IDLE_FRACTION`] of it kept idle (both rounded down to 2 MiB),
    /// [`DEFAULT_SIZE_CLASSES`], 512 B minimum, LRU eviction. The total, not
    /// the momentary free memory, sets the caps: they describe the card, and
    /// what is free at allocation time is the backend's answer. An unknown
    /// total (0) gives [`PoolConfig::default`].
    pub fn for_device(total_memory: u64) -> PoolConfig {
        let max_allocation =
            fraction_of(total_memory, DEVICE_ALLOCATION_FRACTION, DEVICE_GRANULARITY);
        let defaults = PoolConfig::default();
        if max_allocation < defaults.min_allocation {
            return defaults;
        }
        PoolConfig {
            max_pool_bytes: fraction_of(total_memory, DEVICE_IDLE_FRACTION, DEVICE_GRANULARITY),
            max_allocation,
            ..defaults
        }
    }

    /// Checks the settings; [`GpuError::InvalidConfig`] names the bad one.
    pub fn validate(&self) -> GpuResult<()> {
        if self.min_allocation == 0 {
            return Err(GpuError::invalid_config(
                "PoolConfig::min_allocation must be ≥ 1",
            ));
        }
        if self.max_allocation < self.min_allocation {
            return Err(GpuError::invalid_config(format!(
                "PoolConfig::max_allocation ({}) is below min_allocation ({})",
                self.max_allocation, self.min_allocation
            )));
        }
        match self.size_classes {
            SizeClasses::Geometric { ratio } if !(ratio > 1.0 && ratio.is_finite()) => {
                Err(GpuError::invalid_config(format!(
                    "SizeClasses::Geometric ratio must be a finite number > 1, got {ratio}"
                )))
            }
            SizeClasses::Linear { step: 0 } => Err(GpuError::invalid_config(
                "SizeClasses::Linear step must be ≥ 1",
            )),
            SizeClasses::PowerOfTwoSteps { steps } if !steps.is_power_of_two() => {
                Err(GpuError::invalid_config(format!(
                    "SizeClasses::PowerOfTwoSteps steps must be a power of two ≥ 1, got {steps}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The size class of a request of `bytes` (≤ `max_allocation`).
    pub fn size_class(&self, bytes: u64) -> u64 {
        let n = bytes.max(self.min_allocation);
        let rounded = match self.size_classes {
            SizeClasses::PowerOfTwo => n.checked_next_power_of_two().unwrap_or(u64::MAX),
            SizeClasses::PowerOfTwoSteps { steps } => power_of_two_step_class(n, steps),
            SizeClasses::Linear { step } => {
                let step = step.max(1);
                n.div_ceil(step).saturating_mul(step)
            }
            SizeClasses::Exact => n,
            SizeClasses::Geometric { ratio } => {
                let mut class = self.min_allocation;
                while class < n {
                    let next = (class as f64 * ratio).ceil();
                    class = if next >= u64::MAX as f64 {
                        u64::MAX
                    } else {
                        (next as u64).max(class + 1)
                    };
                }
                class
            }
        };
        rounded.min(self.max_allocation.max(n))
    }
}

/// The class of `n` bytes (≥ 1) in [`SizeClasses::PowerOfTwoSteps`]: the
/// next multiple of `max(1, 2^e / steps)`, where `2^e ≤ n < 2^(e+1)`. The
/// class exceeds `n` by less than one step, i.e. by less than `n / steps`.
pub fn power_of_two_step_class(n: u64, steps: u32) -> u64 {
    if n <= 1 {
        return n;
    }
    let floor = 1u64 << (63 - n.leading_zeros());
    let step = (floor / u64::from(steps.max(1))).max(1);
    n.div_ceil(step).saturating_mul(step)
}

/// Pool statistics. "Requested" bytes are what callers asked for,
/// "reserved" bytes what the pool holds from the backend (size classes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AllocationStats {
    /// Requested bytes of every successful allocation so far.
    pub allocated_bytes: u64,
    /// Requested bytes of every buffer dropped so far.
    pub freed_bytes: u64,
    /// Requested bytes of live buffers (`allocated - freed`).
    pub current_bytes: u64,
    /// Highest `current_bytes` seen.
    pub peak_bytes: u64,
    /// Bytes held from the backend: live blocks plus idle ones.
    pub reserved_bytes: u64,
    /// Bytes of idle blocks kept for reuse.
    pub idle_bytes: u64,
    /// Successful allocations.
    pub allocations: u64,
    /// Allocations served from an idle block.
    pub pool_hits: u64,
    /// Allocations that needed a new block from the backend.
    pub pool_misses: u64,
    /// Allocations that failed (out of memory, too large).
    pub failed_allocations: u64,
    /// Blocks the backend allocated.
    pub backend_allocations: u64,
    /// Blocks given back to the backend (evictions, trims, refusals, drop).
    pub backend_frees: u64,
    /// Idle blocks freed to respect `max_pool_bytes` (LRU) or not kept
    /// because they did not fit (None).
    pub evictions: u64,
    /// `1 - current_bytes / reserved_bytes` (0 when nothing is reserved): the
    /// share of held memory that backs no requested byte — class rounding
    /// plus idle blocks.
    pub fragmentation: f64,
}

impl AllocationStats {
    /// `pool_hits / (pool_hits + pool_misses)`, 0 before any allocation.
    pub fn hit_rate(&self) -> f64 {
        let total = self.pool_hits + self.pool_misses;
        if total == 0 {
            0.0
        } else {
            self.pool_hits as f64 / total as f64
        }
    }
}

// ---------------------------------------------------------------------------
// The pool
// ---------------------------------------------------------------------------

struct IdleBlock<B> {
    class: u64,
    block: B,
}

struct PoolState<B> {
    /// Idle blocks by return tick: the first entry is the least recently
    /// returned.
    idle: BTreeMap<u64, IdleBlock<B>>,
    /// Ticks of idle blocks per class, oldest first.
    by_class: HashMap<u64, VecDeque<u64>>,
    tick: u64,
    live_reserved: u64,
    stats: AllocationStats,
}

impl<B> PoolState<B> {
    fn take_class(&mut self, class: u64) -> Option<B> {
        let ticks = self.by_class.get_mut(&class)?;
        let tick = ticks.pop_back()?;
        if ticks.is_empty() {
            self.by_class.remove(&class);
        }
        let idle = self.idle.remove(&tick)?;
        self.stats.idle_bytes -= idle.class;
        Some(idle.block)
    }

    fn take_oldest(&mut self) -> Option<IdleBlock<B>> {
        let (_, idle) = self.idle.pop_first()?;
        if let Some(ticks) = self.by_class.get_mut(&idle.class) {
            ticks.pop_front();
            if ticks.is_empty() {
                self.by_class.remove(&idle.class);
            }
        }
        self.stats.idle_bytes -= idle.class;
        Some(idle)
    }

    fn put(&mut self, class: u64, block: B) {
        self.tick += 1;
        self.idle.insert(self.tick, IdleBlock { class, block });
        self.by_class.entry(class).or_default().push_back(self.tick);
        self.stats.idle_bytes += class;
    }

    fn snapshot(&self) -> AllocationStats {
        let mut s = self.stats.clone();
        s.reserved_bytes = self.live_reserved + s.idle_bytes;
        s.fragmentation = if s.reserved_bytes == 0 {
            0.0
        } else {
            1.0 - s.current_bytes as f64 / s.reserved_bytes as f64
        };
        s
    }
}

struct PoolShared<M: DeviceMemory> {
    backend: M,
    config: PoolConfig,
    state: Mutex<PoolState<M::Block>>,
}

impl<M: DeviceMemory> PoolShared<M> {
    fn lock(&self) -> MutexGuard<'_, PoolState<M::Block>> {
        // The state stays consistent across a panic elsewhere (no invariant
        // spans an unwind point), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn free_all(&self, blocks: Vec<M::Block>) {
        for b in blocks {
            self.backend.free(b);
        }
    }

    /// Takes a buffer's block back (called from `GpuBuffer::drop`).
    fn release(&self, block: M::Block, class: u64, requested: u64) {
        let mut to_free = Vec::new();
        {
            let mut st = self.lock();
            st.live_reserved -= class;
            st.stats.current_bytes -= requested;
            st.stats.freed_bytes += requested;
            let cap = self.config.max_pool_bytes;
            if class > cap {
                to_free.push(block);
            } else {
                if st.stats.idle_bytes + class > cap {
                    match self.config.eviction {
                        EvictionPolicy::Lru => {
                            while st.stats.idle_bytes + class > cap {
                                match st.take_oldest() {
                                    Some(old) => {
                                        st.stats.evictions += 1;
                                        to_free.push(old.block);
                                    }
                                    None => break,
                                }
                            }
                        }
                        EvictionPolicy::None => {}
                    }
                }
                if st.stats.idle_bytes + class <= cap {
                    st.put(class, block);
                } else {
                    st.stats.evictions += 1;
                    to_free.push(block);
                }
            }
            st.stats.backend_frees += to_free.len() as u64;
        }
        self.free_all(to_free);
    }

    /// Frees every idle block; returns the bytes released.
    fn trim(&self) -> u64 {
        let (blocks, bytes) = {
            let mut st = self.lock();
            let bytes = st.stats.idle_bytes;
            let mut blocks = Vec::with_capacity(st.idle.len());
            while let Some(idle) = st.take_oldest() {
                blocks.push(idle.block);
            }
            st.stats.backend_frees += blocks.len() as u64;
            (blocks, bytes)
        };
        self.free_all(blocks);
        bytes
    }
}

impl<M: DeviceMemory> Drop for PoolShared<M> {
    fn drop(&mut self) {
        self.trim();
    }
}

/// A thread-safe pool of device memory in size classes. Cheap to clone
/// (clones share the pool); buffers keep it alive.
pub struct MemoryPool<M: DeviceMemory = CudaMemory> {
    shared: Arc<PoolShared<M>>,
}

impl<M: DeviceMemory> Clone for MemoryPool<M> {
    fn clone(&self) -> Self {
        MemoryPool {
            shared: self.shared.clone(),
        }
    }
}

impl<M: DeviceMemory> std::fmt::Debug for MemoryPool<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPool")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl MemoryPool<CudaMemory> {
    /// A pool of device memory on `ctx`'s stream.
    pub fn cuda(ctx: &GpuContext, config: PoolConfig) -> GpuResult<Self> {
        MemoryPool::new(CudaMemory::new(ctx), config)
    }

    /// A pool on `ctx`'s stream sized from the device's total memory
    /// ([`PoolConfig::for_device`]).
    pub fn cuda_for_device(ctx: &GpuContext) -> GpuResult<Self> {
        Self::cuda(ctx, PoolConfig::for_device(ctx.info().total_memory))
    }
}

impl<M: DeviceMemory> MemoryPool<M> {
    /// A pool over `backend`; [`GpuError::InvalidConfig`] for bad settings.
    pub fn new(backend: M, config: PoolConfig) -> GpuResult<Self> {
        config.validate()?;
        Ok(MemoryPool {
            shared: Arc::new(PoolShared {
                backend,
                config,
                state: Mutex::new(PoolState {
                    idle: BTreeMap::new(),
                    by_class: HashMap::new(),
                    tick: 0,
                    live_reserved: 0,
                    stats: AllocationStats::default(),
                }),
            }),
        })
    }

    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    pub fn backend(&self) -> &M {
        &self.shared.backend
    }

    /// A buffer of `len` elements of `T`, contents unspecified (a reused
    /// block holds whatever its previous owner left).
    pub fn alloc<T: DeviceRepr>(&self, len: usize) -> GpuResult<GpuBuffer<T, M>> {
        let Some(requested) = (len as u64).checked_mul(std::mem::size_of::<T>() as u64) else {
            self.shared.lock().stats.failed_allocations += 1;
            return Err(GpuError::AllocationTooLarge {
                requested: u64::MAX,
                max_allocation: self.shared.config.max_allocation,
            });
        };
        let (block, class) = self.alloc_raw(requested)?;
        Ok(GpuBuffer {
            block: Some(block),
            class,
            len,
            pool: self.shared.clone(),
            _elem: PhantomData,
        })
    }

    fn alloc_raw(&self, requested: u64) -> GpuResult<(M::Block, u64)> {
        let shared = &*self.shared;
        let config = &shared.config;
        if requested > config.max_allocation {
            shared.lock().stats.failed_allocations += 1;
            return Err(GpuError::AllocationTooLarge {
                requested,
                max_allocation: config.max_allocation,
            });
        }
        let class = config.size_class(requested);
        let hit = {
            let mut st = shared.lock();
            let hit = st.take_class(class);
            if hit.is_some() {
                st.stats.pool_hits += 1;
                Self::account(&mut st, class, requested);
            }
            hit
        };
        if let Some(block) = hit {
            return Ok((block, class));
        }
        let mut block = shared.backend.alloc(class);
        if matches!(block, Err(GpuError::OutOfMemory { .. })) {
            let idle = shared.lock().stats.idle_bytes;
            // Only a request the idle blocks could make room for empties
            // the cache: one larger than the device's free memory and all
            // idle bytes together would fail again with nothing to reuse.
            if idle > 0 && class <= idle.saturating_add(shared.backend.available()) {
                shared.trim();
                shared.backend.settle();
                block = shared.backend.alloc(class);
            }
        }
        let mut st = shared.lock();
        match block {
            Ok(block) => {
                st.stats.pool_misses += 1;
                st.stats.backend_allocations += 1;
                Self::account(&mut st, class, requested);
                Ok((block, class))
            }
            Err(e) => {
                st.stats.failed_allocations += 1;
                Err(e)
            }
        }
    }

    fn account(st: &mut PoolState<M::Block>, class: u64, requested: u64) {
        st.live_reserved += class;
        st.stats.allocations += 1;
        st.stats.allocated_bytes += requested;
        st.stats.current_bytes += requested;
        st.stats.peak_bytes = st.stats.peak_bytes.max(st.stats.current_bytes);
    }

    /// The size class a request of `bytes` gets.
    pub fn size_class(&self, bytes: u64) -> u64 {
        self.shared.config.size_class(bytes)
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> AllocationStats {
        self.shared.lock().snapshot()
    }

    /// Frees every idle block; returns the bytes released.
    pub fn trim(&self) -> u64 {
        self.shared.trim()
    }
}

// ---------------------------------------------------------------------------
// Buffers and views
// ---------------------------------------------------------------------------

/// `len` elements of `T` in device memory from a [`MemoryPool`]; the block
/// goes back to the pool on drop. There is no host access: data moves only
/// through [`Transfer`](super::Transfer).
pub struct GpuBuffer<T, M: DeviceMemory = CudaMemory> {
    block: Option<M::Block>,
    class: u64,
    len: usize,
    pool: Arc<PoolShared<M>>,
    _elem: PhantomData<fn() -> T>,
}

impl<T, M: DeviceMemory> Drop for GpuBuffer<T, M> {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            self.pool.release(block, self.class, self.size_bytes());
        }
    }
}

impl<T, M: DeviceMemory> std::fmt::Debug for GpuBuffer<T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.len)
            .field("reserved_bytes", &self.class)
            .finish()
    }
}

impl<T, M: DeviceMemory> GpuBuffer<T, M> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Requested bytes (`len * size_of::<T>()`).
    pub fn size_bytes(&self) -> u64 {
        self.len as u64 * std::mem::size_of::<T>() as u64
    }

    /// Bytes of the size class backing it.
    pub fn reserved_bytes(&self) -> u64 {
        self.class
    }

    /// The backend block (e.g. the `CudaSlice<u8>`).
    pub fn block(&self) -> &M::Block {
        self.block
            .as_ref()
            .expect("a live GpuBuffer always holds its block")
    }

    fn block_mut(&mut self) -> &mut M::Block {
        self.block
            .as_mut()
            .expect("a live GpuBuffer always holds its block")
    }

    /// The whole buffer.
    pub fn view(&self) -> GpuView<'_, T, M> {
        GpuView {
            buffer: self,
            offset: 0,
            len: self.len,
        }
    }

    /// The whole buffer, writable.
    pub fn view_mut(&mut self) -> GpuViewMut<'_, T, M> {
        let len = self.len;
        GpuViewMut {
            buffer: self,
            offset: 0,
            len,
        }
    }

    /// Elements `offset..offset + len`, or [`GpuError::InvalidAccess`].
    pub fn subview(&self, offset: usize, len: usize) -> GpuResult<GpuView<'_, T, M>> {
        self.view().subview(offset, len)
    }

    /// Elements `offset..offset + len`, writable, or
    /// [`GpuError::InvalidAccess`].
    pub fn subview_mut(&mut self, offset: usize, len: usize) -> GpuResult<GpuViewMut<'_, T, M>> {
        self.view_mut().into_subview_mut(offset, len)
    }
}

fn check_range(offset: usize, len: usize, size: usize) -> GpuResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(GpuError::InvalidAccess { offset, len, size }),
    }
}

/// A read-only window of a [`GpuBuffer`]: elements
/// `offset()..offset() + len()` of the buffer.
pub struct GpuView<'a, T, M: DeviceMemory = CudaMemory> {
    buffer: &'a GpuBuffer<T, M>,
    offset: usize,
    len: usize,
}

impl<T, M: DeviceMemory> Clone for GpuView<'_, T, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, M: DeviceMemory> Copy for GpuView<'_, T, M> {}

impl<T, M: DeviceMemory> std::fmt::Debug for GpuView<'_, T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuView")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("buffer", self.buffer)
            .finish()
    }
}

impl<'a, T, M: DeviceMemory> From<&'a GpuBuffer<T, M>> for GpuView<'a, T, M> {
    fn from(buffer: &'a GpuBuffer<T, M>) -> Self {
        buffer.view()
    }
}

impl<'a, T, M: DeviceMemory> GpuView<'a, T, M> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First element, counted from the start of the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn size_bytes(&self) -> u64 {
        self.len as u64 * std::mem::size_of::<T>() as u64
    }

    pub fn buffer(&self) -> &'a GpuBuffer<T, M> {
        self.buffer
    }

    /// Elements `offset..offset + len` **of this view**, or
    /// [`GpuError::InvalidAccess`] naming the view's length as `size`.
    pub fn subview(&self, offset: usize, len: usize) -> GpuResult<GpuView<'a, T, M>> {
        check_range(offset, len, self.len)?;
        Ok(GpuView {
            buffer: self.buffer,
            offset: self.offset + offset,
            len,
        })
    }

    /// `(..mid, mid..)`, or [`GpuError::InvalidAccess`] when `mid > len`.
    pub fn split_at(&self, mid: usize) -> GpuResult<(GpuView<'a, T, M>, GpuView<'a, T, M>)> {
        check_range(mid, 0, self.len)?;
        Ok((self.subview(0, mid)?, self.subview(mid, self.len - mid)?))
    }
}

impl<'a, T: DeviceRepr> GpuView<'a, T, CudaMemory> {
    /// The cudarc view of these elements (a `CudaView<T>` over the pooled
    /// `CudaSlice<u8>`, via `CudaSlice::transmute` and `CudaView::try_slice`).
    pub fn as_cuda(&self) -> GpuResult<CudaView<'a, T>> {
        let block: &'a CudaSlice<u8> = self.buffer.block();
        // SAFETY: the block holds at least `buffer.len` elements of `T`
        // (class ≥ requested bytes), device allocations are 256-byte aligned,
        // and `T: DeviceRepr` is plain data.
        let whole =
            unsafe { block.transmute::<T>(self.buffer.len) }.ok_or(GpuError::InvalidAccess {
                offset: 0,
                len: self.buffer.len,
                size: block.len() / std::mem::size_of::<T>().max(1),
            })?;
        whole
            .try_slice(self.offset..self.offset + self.len)
            .ok_or(GpuError::InvalidAccess {
                offset: self.offset,
                len: self.len,
                size: self.buffer.len,
            })
    }
}

/// A writable window of a [`GpuBuffer`].
pub struct GpuViewMut<'a, T, M: DeviceMemory = CudaMemory> {
    buffer: &'a mut GpuBuffer<T, M>,
    offset: usize,
    len: usize,
}

impl<T, M: DeviceMemory> std::fmt::Debug for GpuViewMut<'_, T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuViewMut")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("buffer", &*self.buffer)
            .finish()
    }
}

impl<'a, T, M: DeviceMemory> From<&'a mut GpuBuffer<T, M>> for GpuViewMut<'a, T, M> {
    fn from(buffer: &'a mut GpuBuffer<T, M>) -> Self {
        buffer.view_mut()
    }
}

impl<'a, T, M: DeviceMemory> GpuViewMut<'a, T, M> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// First element, counted from the start of the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn size_bytes(&self) -> u64 {
        self.len as u64 * std::mem::size_of::<T>() as u64
    }

    /// This window, read-only.
    pub fn as_view(&self) -> GpuView<'_, T, M> {
        GpuView {
            buffer: &*self.buffer,
            offset: self.offset,
            len: self.len,
        }
    }

    /// A read-only window of this one (offsets relative to this view).
    pub fn subview(&self, offset: usize, len: usize) -> GpuResult<GpuView<'_, T, M>> {
        self.as_view().subview(offset, len)
    }

    /// A writable window of this one, borrowing it.
    pub fn subview_mut(&mut self, offset: usize, len: usize) -> GpuResult<GpuViewMut<'_, T, M>> {
        check_range(offset, len, self.len)?;
        Ok(GpuViewMut {
            buffer: &mut *self.buffer,
            offset: self.offset + offset,
            len,
        })
    }

    /// A writable window of this one, consuming it (keeps the lifetime `'a`).
    pub fn into_subview_mut(self, offset: usize, len: usize) -> GpuResult<GpuViewMut<'a, T, M>> {
        check_range(offset, len, self.len)?;
        Ok(GpuViewMut {
            buffer: self.buffer,
            offset: self.offset + offset,
            len,
        })
    }

    /// A shorter-lived copy of this handle.
    pub fn reborrow(&mut self) -> GpuViewMut<'_, T, M> {
        GpuViewMut {
            buffer: &mut *self.buffer,
            offset: self.offset,
            len: self.len,
        }
    }
}

impl<'a, T: DeviceRepr> GpuViewMut<'a, T, CudaMemory> {
    /// The cudarc view of these elements (`CudaSlice::transmute_mut` and
    /// `CudaViewMut::try_slice_mut` over the pooled block).
    pub fn as_cuda_mut(&mut self) -> GpuResult<CudaViewMut<'_, T>> {
        self.reborrow().into_cuda_mut()
    }

    /// As [`Self::as_cuda_mut`], consuming the view (keeps the lifetime `'a`).
    pub fn into_cuda_mut(self) -> GpuResult<CudaViewMut<'a, T>> {
        let (offset, len) = (self.offset, self.len);
        let (block, total) = self.into_block()?;
        // SAFETY: as in `GpuView::as_cuda`; `into_block` checked that the
        // block holds `total` elements.
        let mut whole =
            unsafe { block.transmute_mut::<T>(total) }.ok_or(GpuError::InvalidAccess {
                offset: 0,
                len: total,
                size: total,
            })?;
        let view = whole
            .try_slice_mut(offset..offset + len)
            .ok_or(GpuError::InvalidAccess {
                offset,
                len,
                size: total,
            })?;
        // cudarc ≥ 0.19 ties a sub-view of a `CudaViewMut<'a>` to the borrow
        // of that view (`try_slice_mut<'b>(&'b mut self) -> CudaViewMut<'b>`)
        // and has no consuming form, so a typed window at an offset cannot
        // keep `'a` on its own.
        // SAFETY: only the lifetime changes. `view` holds the device
        // pointer, a length and the `&'a` references to the block's events
        // and stream that `whole` holds (a `CudaViewMut` owns none of them,
        // so nothing in `view` can point into `whole`); `whole` is dropped
        // here, which leaves `view` the only view of the block, borrowed
        // mutably for `'a` through `self.buffer`.
        Ok(unsafe { std::mem::transmute::<CudaViewMut<'_, T>, CudaViewMut<'a, T>>(view) })
    }

    /// These elements' bytes as a cudarc view, consuming the view (keeps
    /// `'a`): what [`KernelArgs`](super::KernelArgs) passes to a kernel.
    /// The same memory, events and stream as [`Self::into_cuda_mut`].
    pub fn into_cuda_bytes_mut(self) -> GpuResult<CudaViewMut<'a, u8>> {
        let (offset, len) = (self.offset, self.len);
        let size = std::mem::size_of::<T>();
        let (block, total) = self.into_block()?;
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(GpuError::InvalidAccess {
                offset,
                len,
                size: total,
            });
        }
        block
            .try_slice_mut(offset * size..(offset + len) * size)
            .ok_or(GpuError::InvalidAccess {
                offset,
                len,
                size: total,
            })
    }

    /// The pooled block and the buffer's length in elements, checked to fit.
    fn into_block(self) -> GpuResult<(&'a mut CudaSlice<u8>, usize)> {
        let total = self.buffer.len;
        let block: &'a mut CudaSlice<u8> = self.buffer.block_mut();
        let block_len = block.len();
        let fits = total
            .checked_mul(std::mem::size_of::<T>())
            .is_some_and(|bytes| bytes <= block_len);
        if !fits {
            return Err(GpuError::InvalidAccess {
                offset: 0,
                len: total,
                size: block_len / std::mem::size_of::<T>().max(1),
            });
        }
        Ok((block, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const KIB: u64 = 1024;

    fn pool(capacity: u64, config: PoolConfig) -> MemoryPool<HostMemory> {
        MemoryPool::new(HostMemory::new(capacity), config).unwrap()
    }

    fn cfg() -> PoolConfig {
        PoolConfig {
            max_pool_bytes: 64 * KIB,
            min_allocation: 256,
            max_allocation: 1 << 20,
            size_classes: SizeClasses::PowerOfTwo,
            eviction: EvictionPolicy::Lru,
        }
    }

    #[test]
    fn power_of_two_classes() {
        let c = cfg();
        assert_eq!(c.size_class(0), 256);
        assert_eq!(c.size_class(1), 256);
        assert_eq!(c.size_class(256), 256);
        assert_eq!(c.size_class(257), 512);
        assert_eq!(c.size_class(1000), 1024);
        assert_eq!(c.size_class(1024), 1024);
        assert_eq!(c.size_class(1025), 2048);
        // Rounding never goes above max_allocation.
        assert_eq!(c.size_class((1 << 19) + 1), 1 << 20);
        let c = PoolConfig {
            max_allocation: 3000,
            ..cfg()
        };
        assert_eq!(c.size_class(2049), 3000);
        assert_eq!(c.size_class(3000), 3000);
    }

    #[test]
    fn linear_exact_and_geometric_classes() {
        let lin = PoolConfig {
            size_classes: SizeClasses::Linear { step: 1000 },
            ..cfg()
        };
        assert_eq!(lin.size_class(1), 1000);
        assert_eq!(lin.size_class(1000), 1000);
        assert_eq!(lin.size_class(1001), 2000);
        let exact = PoolConfig {
            size_classes: SizeClasses::Exact,
            ..cfg()
        };
        assert_eq!(exact.size_class(1), 256);
        assert_eq!(exact.size_class(777), 777);
        let geo = PoolConfig {
            size_classes: SizeClasses::Geometric { ratio: 1.5 },
            ..cfg()
        };
        // 256, 384, 576, 864, 1296, …
        assert_eq!(geo.size_class(100), 256);
        assert_eq!(geo.size_class(257), 384);
        assert_eq!(geo.size_class(384), 384);
        assert_eq!(geo.size_class(385), 576);
        assert_eq!(geo.size_class(1000), 1296);
        // A ratio so small that ceil() does not grow still makes progress.
        let tiny = PoolConfig {
            size_classes: SizeClasses::Geometric { ratio: 1.000_001 },
            min_allocation: 1,
            ..cfg()
        };
        assert_eq!(tiny.size_class(10), 10);
        // Every class covers its request.
        for c in [&lin, &exact, &geo, &cfg()] {
            for n in [0u64, 1, 255, 256, 257, 4095, 4096, 65_537, 1 << 20] {
                let class = c.size_class(n);
                assert!(
                    class >= n && class >= c.min_allocation,
                    "{c:?} {n} -> {class}"
                );
            }
        }
    }

    #[test]
    fn power_of_two_steps_bound_the_waste() {
        const MIB: u64 = 1 << 20;
        let c = PoolConfig {
            size_classes: SizeClasses::PowerOfTwoSteps { steps: 8 },
            min_allocation: 512,
            max_allocation: u64::MAX,
            ..cfg()
        };
        // Powers of two are classes of their own; between them, eighths.
        assert_eq!(c.size_class(1), 512);
        assert_eq!(c.size_class(512), 512);
        assert_eq!(c.size_class(513), 576);
        assert_eq!(c.size_class(4000), 4096);
        assert_eq!(c.size_class(3000), 3072);
        assert_eq!(c.size_class(1 << 30), 1 << 30);
        // The case: a 2.1 GiB dataset reserved 4 GiB as a power of
        // two; in eighths it takes 2.25 GiB (9 steps of 256 MiB).
        let gib21 = 2_254_857_830u64;
        assert_eq!(c.size_class(gib21), 9 * 256 * MIB);
        assert_eq!(
            PoolConfig {
                size_classes: SizeClasses::PowerOfTwo,
                ..c.clone()
            }
            .size_class(gib21),
            4 << 30
        );
        assert_eq!(c.size_class(5 << 30), 5 << 30);
        assert_eq!(c.size_class((5 << 30) + 1), (5 << 30) + (512 * MIB));
        // Every class: covers the request, wastes < 1/8 of it, is a
        // multiple of 2 MiB from 16 MiB up, and classes never decrease.
        let mut probes: Vec<u64> = Vec::new();
        for e in 9..62u32 {
            let p = 1u64 << e;
            probes.extend([
                p - 1,
                p,
                p + 1,
                p + p / 3,
                p + p / 8,
                p + p / 8 + 1,
                2 * p - 1,
            ]);
        }
        probes.extend([gib21, 2_100_000_000, 3_000_000_001, 77 * (1 << 30) + 12_345]);
        probes.sort_unstable();
        let mut last = 0;
        for n in probes {
            let class = c.size_class(n);
            assert!(class >= n, "{n} -> {class}");
            let n_eff = n.max(c.min_allocation);
            assert!(
                (class - n_eff) * 8 < n_eff.max(8),
                "{n} -> {class}: waste ≥ 12.5 %"
            );
            if n_eff > 16 * MIB {
                assert_eq!(class % (2 * MIB), 0, "{n} -> {class}");
            }
            assert!(class >= last, "classes must not decrease at {n}");
            last = class;
        }
        // Near u64::MAX the class saturates instead of wrapping.
        assert_eq!(power_of_two_step_class(u64::MAX, 8), u64::MAX);
        assert_eq!(power_of_two_step_class(1, 8), 1);
        // One step: plain powers of two.
        for n in [2u64, 3, 1000, 1 << 40] {
            assert_eq!(power_of_two_step_class(n, 1), n.next_power_of_two());
        }
        assert!(PoolConfig {
            size_classes: SizeClasses::PowerOfTwoSteps { steps: 6 },
            ..c.clone()
        }
        .validate()
        .is_err());
        assert!(PoolConfig {
            size_classes: SizeClasses::PowerOfTwoSteps { steps: 0 },
            ..c
        }
        .validate()
        .is_err());
    }

    #[test]
    fn pools_are_sized_from_the_device_memory() {
        const GIB: u64 = 1 << 30;
        // An 80 GiB card: 70 GiB per allocation, 20 GiB idle.
        let h100 = PoolConfig::for_device(80 * GIB);
        assert_eq!(h100.max_allocation, 70 * GIB);
        assert_eq!(h100.max_pool_bytes, 20 * GIB);
        assert_eq!(h100.size_classes, DEFAULT_SIZE_CLASSES);
        assert_eq!(h100.eviction, EvictionPolicy::Lru);
        assert!(h100.validate().is_ok());
        // A dataset over 4 GiB (the old fixed cap) is accepted, and so is
        // one needing i64 ids: 2^32 rows of one byte.
        for n in [4 * GIB + 1, (u32::MAX as u64) + 1, 60 * GIB] {
            let class = h100.size_class(n);
            assert!(n <= h100.max_allocation && class <= h100.max_allocation);
            assert!((class - n) * 8 < n, "{n} -> {class}");
        }
        // Odd totals (what cuDeviceTotalMem really reports) round down to
        // 2 MiB and stay within the fraction.
        let total = 79_646_851_072u64;
        let c = PoolConfig::for_device(total);
        assert_eq!(c.max_allocation % (2 << 20), 0);
        assert!(c.max_allocation <= total / 8 * 7 && c.max_allocation + (2 << 20) > total / 8 * 7);
        assert!(c.max_pool_bytes <= total / 4);
        // A class never exceeds the cap, even for a request right at it.
        assert_eq!(c.size_class(c.max_allocation), c.max_allocation);
        assert_eq!(c.size_class(c.max_allocation - 1), c.max_allocation);
        // Unknown or tiny totals: the device-agnostic default.
        assert_eq!(PoolConfig::for_device(0), PoolConfig::default());
        assert_eq!(PoolConfig::for_device(1 << 20), PoolConfig::default());
        // The default has no fixed cap of its own any more.
        assert_eq!(PoolConfig::default().max_allocation, u64::MAX);
        // The sizing rule is the documented fraction.
        assert_eq!(fraction_of(8 * GIB, DEVICE_ALLOCATION_FRACTION, 1), 7 * GIB);
        assert_eq!(fraction_of(u64::MAX, (7, 8), 1), u64::MAX / 8 * 7 + 6);
    }

    #[test]
    fn invalid_configs_are_named() {
        let bad = [
            PoolConfig {
                min_allocation: 0,
                ..cfg()
            },
            PoolConfig {
                max_allocation: 100,
                ..cfg()
            },
            PoolConfig {
                size_classes: SizeClasses::Geometric { ratio: 1.0 },
                ..cfg()
            },
            PoolConfig {
                size_classes: SizeClasses::Geometric { ratio: f64::NAN },
                ..cfg()
            },
            PoolConfig {
                size_classes: SizeClasses::Linear { step: 0 },
                ..cfg()
            },
        ];
        for c in bad {
            let e = MemoryPool::new(HostMemory::new(1 << 20), c.clone()).unwrap_err();
            assert!(matches!(e, GpuError::InvalidConfig { .. }), "{c:?}: {e}");
        }
        assert!(PoolConfig::default().validate().is_ok());
    }

    #[test]
    fn reuse_hits_and_misses() {
        let p = pool(1 << 20, cfg());
        let a = p.alloc::<f32>(100).unwrap(); // 400 B -> 512
        assert_eq!(a.reserved_bytes(), 512);
        assert_eq!(a.size_bytes(), 400);
        drop(a);
        let s = p.stats();
        assert_eq!((s.pool_hits, s.pool_misses), (0, 1));
        assert_eq!(s.idle_bytes, 512);
        // Same class (500 B -> 512): a hit, no new backend allocation.
        let b = p.alloc::<u8>(500).unwrap();
        let s = p.stats();
        assert_eq!((s.pool_hits, s.pool_misses), (1, 1));
        assert_eq!(s.backend_allocations, 1);
        assert_eq!(p.backend().calls().0, 1);
        assert_eq!(s.idle_bytes, 0);
        // Another class: a miss.
        let c = p.alloc::<u8>(600).unwrap();
        let s = p.stats();
        assert_eq!((s.pool_hits, s.pool_misses), (1, 2));
        assert_eq!(s.hit_rate(), 1.0 / 3.0);
        drop((b, c));
        // Most recently returned block of a class is reused first.
        let s = p.stats();
        assert_eq!(s.idle_bytes, 512 + 1024);
    }

    #[test]
    fn current_peak_and_totals() {
        let p = pool(1 << 20, cfg());
        let a = p.alloc::<u64>(100).unwrap(); // 800
        let b = p.alloc::<u8>(300).unwrap(); // 300
        let s = p.stats();
        assert_eq!(s.current_bytes, 1100);
        assert_eq!(s.peak_bytes, 1100);
        assert_eq!(s.allocated_bytes, 1100);
        assert_eq!(s.reserved_bytes, 1024 + 512);
        drop(a);
        let s = p.stats();
        assert_eq!(s.current_bytes, 300);
        assert_eq!(s.peak_bytes, 1100);
        assert_eq!(s.freed_bytes, 800);
        let c = p.alloc::<u8>(50).unwrap();
        let s = p.stats();
        assert_eq!(s.current_bytes, 350);
        assert_eq!(s.peak_bytes, 1100);
        assert_eq!(s.allocations, 3);
        drop((b, c));
        let s = p.stats();
        assert_eq!(s.current_bytes, 0);
        assert_eq!(s.allocated_bytes, s.freed_bytes);
        assert_eq!(s.allocated_bytes, 1150);
        assert_eq!(s.reserved_bytes, s.idle_bytes);
    }

    #[test]
    fn fragmentation_figure() {
        let p = pool(1 << 20, cfg());
        assert_eq!(p.stats().fragmentation, 0.0);
        let a = p.alloc::<u8>(768).unwrap(); // class 1024
        let s = p.stats();
        assert!((s.fragmentation - 0.25).abs() < 1e-12, "{s:?}");
        let b = p.alloc::<u8>(1024).unwrap();
        let s = p.stats();
        assert!((s.fragmentation - (1.0 - 1792.0 / 2048.0)).abs() < 1e-12);
        drop(b);
        // The idle 1024 counts as held but unused.
        let s = p.stats();
        assert!((s.fragmentation - (1.0 - 768.0 / 2048.0)).abs() < 1e-12);
        drop(a);
        assert_eq!(p.stats().fragmentation, 1.0);
        p.trim();
        assert_eq!(p.stats().fragmentation, 0.0);
    }

    #[test]
    fn lru_eviction_over_max_pool_bytes() {
        let p = pool(
            1 << 20,
            PoolConfig {
                max_pool_bytes: 2048,
                ..cfg()
            },
        );
        let a = p.alloc::<u8>(1024).unwrap();
        let b = p.alloc::<u8>(512).unwrap();
        let c = p.alloc::<u8>(1024).unwrap();
        drop(a); // idle: a(1024)
        drop(b); // idle: a, b = 1536
        drop(c); // 2560 > 2048: evict a (oldest), keep b + c = 1536
        let s = p.stats();
        assert_eq!(s.evictions, 1);
        assert_eq!(s.idle_bytes, 1536);
        assert_eq!(s.backend_frees, 1);
        assert_eq!(p.backend().used(), 1536);
        // b is still idle: a 512 request hits.
        let _b2 = p.alloc::<u8>(400).unwrap();
        assert_eq!(p.stats().pool_hits, 1);
    }

    #[test]
    fn no_eviction_frees_the_returning_block() {
        let p = pool(
            1 << 20,
            PoolConfig {
                max_pool_bytes: 2048,
                eviction: EvictionPolicy::None,
                ..cfg()
            },
        );
        let a = p.alloc::<u8>(1024).unwrap();
        let b = p.alloc::<u8>(512).unwrap();
        let c = p.alloc::<u8>(1024).unwrap();
        drop(a);
        drop(b);
        drop(c); // does not fit: c itself is freed, a and b stay
        let s = p.stats();
        assert_eq!(s.evictions, 1);
        assert_eq!(s.idle_bytes, 1536);
        assert_eq!(p.backend().used(), 1536);
        let _ = p.alloc::<u8>(1024).unwrap();
        let _ = p.alloc::<u8>(512).unwrap();
        assert_eq!(p.stats().pool_hits, 2);
    }

    #[test]
    fn blocks_larger_than_the_pool_are_never_kept() {
        let p = pool(
            1 << 20,
            PoolConfig {
                max_pool_bytes: 1000,
                ..cfg()
            },
        );
        let small = p.alloc::<u8>(256).unwrap();
        drop(small);
        drop(p.alloc::<u8>(4096).unwrap());
        let s = p.stats();
        // The 256 stays idle; the 4096 went straight back.
        assert_eq!(s.idle_bytes, 256);
        assert_eq!(s.evictions, 0);
        assert_eq!(p.backend().used(), 256);
    }

    #[test]
    fn max_allocation_limit() {
        let p = pool(1 << 30, cfg());
        assert!(p.alloc::<u8>(1 << 20).is_ok());
        let e = p.alloc::<u8>((1 << 20) + 1).unwrap_err();
        assert_eq!(
            e,
            GpuError::AllocationTooLarge {
                requested: (1 << 20) + 1,
                max_allocation: 1 << 20
            }
        );
        // Element count × size overflow is a too-large request, not a wrap.
        let e = p.alloc::<u64>(usize::MAX).unwrap_err();
        assert!(matches!(
            e,
            GpuError::AllocationTooLarge {
                requested: u64::MAX,
                ..
            }
        ));
        assert_eq!(p.stats().failed_allocations, 2);
    }

    #[test]
    fn out_of_memory_numbers() {
        let p = pool(3000, cfg());
        let a = p.alloc::<u8>(2000).unwrap(); // class 2048, 952 left
        let e = p.alloc::<u8>(600).unwrap_err(); // class 1024
        assert_eq!(
            e,
            GpuError::OutOfMemory {
                requested: 1024,
                available: 952
            }
        );
        let s = p.stats();
        assert_eq!(s.failed_allocations, 1);
        assert_eq!(s.allocations, 1);
        assert_eq!(s.current_bytes, 2000);
        assert!(e.to_string().contains("1024") && e.to_string().contains("952"));
        drop(a);
    }

    #[test]
    fn out_of_memory_trims_idle_blocks_and_retries() {
        let p = pool(3000, cfg());
        drop(p.alloc::<u8>(2000).unwrap()); // 2048 idle
                                            // 1024 does not fit beside the idle 2048; the pool frees it and retries.
        let b = p.alloc::<u8>(1000).unwrap();
        assert_eq!(b.reserved_bytes(), 1024);
        let s = p.stats();
        assert_eq!(s.idle_bytes, 0);
        assert_eq!(s.backend_frees, 1);
        assert_eq!(p.backend().used(), 1024);
    }

    #[test]
    fn a_request_no_trim_could_serve_keeps_the_idle_blocks() {
        let p = pool(3000, cfg());
        drop(p.alloc::<u8>(2000).unwrap()); // 2048 idle, 952 free
                                            // 4096 > 2048 idle + 952 free: trimming could not make room.
        assert!(matches!(
            p.alloc::<u8>(4000),
            Err(GpuError::OutOfMemory { .. })
        ));
        assert_eq!(p.stats().idle_bytes, 2048);
        assert_eq!(p.stats().backend_frees, 0);
        // A size that overflows u64 is too large, not a request for u64::MAX.
        assert!(matches!(
            p.alloc::<u64>(usize::MAX),
            Err(GpuError::AllocationTooLarge { .. })
        ));
        assert_eq!(p.stats().idle_bytes, 2048);
    }

    #[test]
    fn stats_after_drops_and_pool_drop_frees_everything() {
        let backend_used;
        {
            let p = pool(1 << 20, cfg());
            let bufs: Vec<_> = (1..=10).map(|i| p.alloc::<f32>(i * 100).unwrap()).collect();
            let s = p.stats();
            assert_eq!(s.allocations, 10);
            assert_eq!(s.current_bytes, (1..=10).map(|i| i * 400).sum::<u64>());
            drop(bufs);
            let s = p.stats();
            assert_eq!(s.current_bytes, 0);
            assert_eq!(s.freed_bytes, s.allocated_bytes);
            assert!(s.idle_bytes > 0);
            backend_used = p.backend().used();
            assert_eq!(backend_used, s.idle_bytes);
            assert_eq!(p.trim(), backend_used);
            assert_eq!(p.backend().used(), 0);
        }
        // A buffer outliving its pool handle keeps the pool alive; dropping
        // it last returns the block, and the pool's drop frees it.
        let p = pool(1 << 20, cfg());
        let keep = p.clone();
        let buf = p.alloc::<u8>(10).unwrap();
        drop(p);
        assert_eq!(buf.len(), 10);
        drop(buf);
        assert_eq!(keep.backend().used(), 256);
        assert_eq!(keep.stats().idle_bytes, 256);

        let backend = Arc::new(HostMemory::new(1 << 20));
        let p = MemoryPool::new(backend.clone(), cfg()).unwrap();
        let a = p.alloc::<u8>(1000).unwrap();
        drop(p.alloc::<u8>(100).unwrap());
        drop(p);
        assert_eq!(backend.used(), 1024 + 256);
        drop(a); // the last handle: the pool goes, and frees all it held
        assert_eq!(backend.used(), 0);
        assert_eq!(backend.calls(), (2, 2));
    }

    #[test]
    fn zero_length_buffers_take_the_smallest_class() {
        let p = pool(1 << 20, cfg());
        let b = p.alloc::<f32>(0).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.reserved_bytes(), 256);
        assert!(b.view().is_empty());
        assert!(b.subview(0, 0).is_ok());
        assert!(b.subview(0, 1).is_err());
    }

    #[test]
    fn views_are_bounds_checked() {
        let p = pool(1 << 20, cfg());
        let mut b = p.alloc::<f32>(100).unwrap();
        let v = b.subview(10, 50).unwrap();
        assert_eq!((v.offset(), v.len(), v.size_bytes()), (10, 50, 200));
        // Offsets of a subview are relative to the view.
        let w = v.subview(40, 10).unwrap();
        assert_eq!((w.offset(), w.len()), (50, 10));
        assert_eq!(
            v.subview(41, 10).unwrap_err(),
            GpuError::InvalidAccess {
                offset: 41,
                len: 10,
                size: 50
            }
        );
        assert_eq!(
            b.subview(0, 101).unwrap_err(),
            GpuError::InvalidAccess {
                offset: 0,
                len: 101,
                size: 100
            }
        );
        // offset + len overflowing usize is an error, not a wrap.
        assert!(matches!(
            b.subview(usize::MAX, 2),
            Err(GpuError::InvalidAccess { .. })
        ));
        let (l, r) = b.view().split_at(30).unwrap();
        assert_eq!((l.offset(), l.len(), r.offset(), r.len()), (0, 30, 30, 70));
        assert!(b.view().split_at(101).is_err());
        let (l, r) = b.view().split_at(100).unwrap();
        assert_eq!((l.len(), r.len(), r.offset()), (100, 0, 100));

        let mut m = b.subview_mut(20, 60).unwrap();
        assert_eq!((m.offset(), m.len()), (20, 60));
        {
            let inner = m.subview_mut(10, 50).unwrap();
            assert_eq!((inner.offset(), inner.len()), (30, 50));
        }
        assert!(m.subview_mut(10, 51).is_err());
        assert_eq!(m.subview(59, 1).unwrap().offset(), 79);
        assert_eq!(m.as_view().len(), 60);
        let n = m.into_subview_mut(60, 0).unwrap();
        assert_eq!((n.offset(), n.len()), (80, 0));
        assert!(b.subview_mut(100, 1).is_err());
        let full: GpuViewMut<'_, f32, HostMemory> = (&mut b).into();
        assert_eq!(full.len(), 100);
    }

    #[test]
    fn thread_safety() {
        let p = pool(64 << 20, cfg());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let p = p.clone();
                thread::spawn(move || {
                    for i in 0..500usize {
                        let len = 1 + (i * 37 + t * 11) % 3000;
                        let a = p.alloc::<u8>(len).unwrap();
                        let b = p.alloc::<u32>(len / 2).unwrap();
                        assert_eq!(a.len(), len);
                        assert!(a.reserved_bytes() >= len as u64);
                        drop(a);
                        drop(b);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = p.stats();
        assert_eq!(s.allocations, 8 * 500 * 2);
        assert_eq!(s.pool_hits + s.pool_misses, s.allocations);
        assert_eq!(s.current_bytes, 0);
        assert_eq!(s.allocated_bytes, s.freed_bytes);
        assert!(s.idle_bytes <= p.config().max_pool_bytes);
        assert_eq!(p.backend().used(), s.idle_bytes);
        let (allocs, frees) = p.backend().calls();
        assert_eq!(allocs, s.backend_allocations);
        assert_eq!(frees, s.backend_frees);
        assert!(s.pool_hits > 0);
    }

    #[test]
    fn buffers_are_send_and_sync() {
        fn assert_send_sync<X: Send + Sync>() {}
        assert_send_sync::<GpuBuffer<f32, HostMemory>>();
        assert_send_sync::<GpuBuffer<f32, CudaMemory>>();
        assert_send_sync::<MemoryPool<CudaMemory>>();
    }
}
