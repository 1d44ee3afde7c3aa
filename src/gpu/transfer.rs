//! Explicit host ↔ device transfers.
//!
//! Nothing in this layer copies data between host and device unless one of
//! [`Transfer`]'s methods is called. Device operations take
//! [`GpuView`]/[`GpuViewMut`] (a host slice does not type-check); an API
//! that must accept either placement at run time takes a [`DeviceInput`] and
//! calls [`DeviceInput::require_device`], which refuses host data with
//! [`GpuError::ImplicitTransfer`] and a hint naming the upload call.
//!
//! Synchronous transfers (`upload`, `download`) return when the data has
//! arrived: `CudaStream::memcpy_htod` / `memcpy_dtoh` (`cuMemcpyHtoDAsync` /
//! `cuMemcpyDtoHAsync`) followed by `cuStreamSynchronize`. Asynchronous ones
//! need page-locked host memory ([`PinnedBuffer`], whose event keeps host
//! access ordered after the copy) and return a [`PendingTransfer`] timed
//! with two CUDA events. [`Transfer::upload_queued`] sits between: a
//! host → device copy from pageable memory queued in stream order, which
//! returns once the driver has staged the source (a search's queries: the
//! kernels after it read them in order, and no wait holds the host before
//! the first launch).
//!
//! ## Pinned memory: write-combined for uploads only
//!
//! A pinned buffer is allocated for one direction ([`pinned_alloc_flags`]).
//! Upload staging is **write-combined** (`CU_MEMHOSTALLOC_WRITECOMBINED`):
//! the host only writes it, the CPU's write-combining buffers make those
//! writes fast and keep the buffer out of the CPU caches, and the device
//! reads it over PCIe up to ~40 % faster. Reads of write-combined memory by
//! the host are uncached — typically an order of magnitude slower than
//! ordinary memory — so download buffers, which the host reads after the
//! copy, are plain pinned memory (flags 0), cached as usual.
//! [`PinnedBuffer::from_slice`] and [`PinnedBuffer::for_upload`] make
//! upload staging; [`PinnedBuffer::zeroed`] and
//! [`PinnedBuffer::for_download`] make download buffers.

use std::os::raw::c_uint;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaStream, DevicePtrMut, DeviceRepr, DeviceSlice, DriverError,
    HostSlice, SyncOnDrop, ValidAsZeroBits,
};

use super::memory::{CudaMemory, DeviceMemory, GpuBuffer, GpuView, GpuViewMut, MemoryPool};
use super::{driver_error, GpuContext, GpuError, GpuResult};
use crate::sync::lock;

/// Which way bytes moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferDirection {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// Transfer statistics of one [`Transfer`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransferStats {
    pub bytes_to_device: u64,
    pub bytes_to_host: u64,
    pub bytes_device_to_device: u64,
    /// Transfers issued (including zero-length ones, which move nothing).
    pub transfers: u64,
    /// Time spent in timed transfers: host wall time of synchronous ones
    /// (including the stream synchronisation), event time of waited
    /// asynchronous ones.
    pub duration: Duration,
    /// Bytes of the timed transfers (the numerator of [`Self::gbps`]).
    pub timed_bytes: u64,
}

impl TransferStats {
    /// Throughput of the timed transfers in GB/s (10⁹ bytes per second); 0
    /// before anything was timed.
    pub fn gbps(&self) -> f64 {
        let secs = self.duration.as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            self.timed_bytes as f64 / secs / 1e9
        }
    }

    fn issued(&mut self, direction: TransferDirection, bytes: u64) {
        self.transfers += 1;
        match direction {
            TransferDirection::HostToDevice => self.bytes_to_device += bytes,
            TransferDirection::DeviceToHost => self.bytes_to_host += bytes,
            TransferDirection::DeviceToDevice => self.bytes_device_to_device += bytes,
        }
    }

    fn timed(&mut self, bytes: u64, duration: Duration) {
        self.timed_bytes += bytes;
        self.duration += duration;
    }
}

/// Where a [`DeviceInput`]'s data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    Host,
    Device,
}

/// Data an operation receives whose placement is only known at run time.
/// Converting into it never moves data; [`Self::require_device`] and
/// [`Self::require_host`] turn a wrong placement into
/// [`GpuError::ImplicitTransfer`].
pub enum DeviceInput<'a, T, M: DeviceMemory = CudaMemory> {
    Host(&'a [T]),
    Device(GpuView<'a, T, M>),
}

impl<T, M: DeviceMemory> Clone for DeviceInput<'_, T, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, M: DeviceMemory> Copy for DeviceInput<'_, T, M> {}

impl<T, M: DeviceMemory> std::fmt::Debug for DeviceInput<'_, T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceInput::Host(s) => write!(f, "DeviceInput::Host({} elements)", s.len()),
            DeviceInput::Device(v) => f.debug_tuple("DeviceInput::Device").field(v).finish(),
        }
    }
}

impl<'a, T, M: DeviceMemory> From<&'a [T]> for DeviceInput<'a, T, M> {
    fn from(s: &'a [T]) -> Self {
        DeviceInput::Host(s)
    }
}

impl<'a, T, M: DeviceMemory> From<&'a Vec<T>> for DeviceInput<'a, T, M> {
    fn from(s: &'a Vec<T>) -> Self {
        DeviceInput::Host(s.as_slice())
    }
}

impl<'a, T, M: DeviceMemory> From<GpuView<'a, T, M>> for DeviceInput<'a, T, M> {
    fn from(v: GpuView<'a, T, M>) -> Self {
        DeviceInput::Device(v)
    }
}

impl<'a, T, M: DeviceMemory> From<&'a GpuBuffer<T, M>> for DeviceInput<'a, T, M> {
    fn from(b: &'a GpuBuffer<T, M>) -> Self {
        DeviceInput::Device(b.view())
    }
}

/// The hint of a host → GPU refusal.
pub const UPLOAD_HINT: &str = "upload it explicitly first: `Transfer::upload_new(&pool, data)` \
     for a new buffer, or `Transfer::upload(data, &mut buffer)` into an existing one";
/// The hint of a device → CPU refusal.
pub const DOWNLOAD_HINT: &str = "download it explicitly first: `Transfer::download_vec(view)`, \
     or `Transfer::download(view, &mut host)` into an existing slice";

impl<'a, T, M: DeviceMemory> DeviceInput<'a, T, M> {
    pub fn placement(&self) -> Placement {
        match self {
            DeviceInput::Host(_) => Placement::Host,
            DeviceInput::Device(_) => Placement::Device,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            DeviceInput::Host(s) => s.len(),
            DeviceInput::Device(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device view, or [`GpuError::ImplicitTransfer`] when the data is
    /// on the host. `what` names the argument in the message.
    pub fn require_device(self, what: &str) -> GpuResult<GpuView<'a, T, M>> {
        match self {
            DeviceInput::Device(v) => Ok(v),
            DeviceInput::Host(s) => Err(GpuError::ImplicitTransfer {
                what: format!(
                    "`{what}` ({} elements) is in host memory but the operation runs on the GPU",
                    s.len()
                ),
                hint: UPLOAD_HINT.into(),
            }),
        }
    }

    /// The host slice, or [`GpuError::ImplicitTransfer`] when the data is on
    /// the device.
    pub fn require_host(self, what: &str) -> GpuResult<&'a [T]> {
        match self {
            DeviceInput::Host(s) => Ok(s),
            DeviceInput::Device(v) => Err(GpuError::ImplicitTransfer {
                what: format!(
                    "`{what}` ({} elements) is in device memory but the operation runs on the CPU",
                    v.len()
                ),
                hint: DOWNLOAD_HINT.into(),
            }),
        }
    }
}

fn require_same_len(
    what: &'static str,
    source_len: usize,
    destination_len: usize,
) -> GpuResult<()> {
    if source_len == destination_len {
        Ok(())
    } else {
        Err(GpuError::LengthMismatch {
            what,
            source_len,
            destination_len,
        })
    }
}

/// The `cuMemHostAlloc` flags of a pinned buffer used for `direction`:
/// write-combined for upload staging (host writes, device reads), plain
/// page-locked memory (0) for download buffers, which the host reads — a
/// host read of write-combined memory bypasses the caches and is very slow
/// (see the module documentation).
pub fn pinned_alloc_flags(direction: TransferDirection) -> c_uint {
    match direction {
        TransferDirection::HostToDevice => sys::CU_MEMHOSTALLOC_WRITECOMBINED as c_uint,
        TransferDirection::DeviceToHost | TransferDirection::DeviceToDevice => 0,
    }
}

/// `len` elements of page-locked host memory from `cuMemHostAlloc` with
/// chosen flags (cudarc's `PinnedHostSlice` is always write-combined). The
/// event orders host access after the copies that use it, as cudarc's does.
struct PinnedAlloc<T> {
    ptr: *mut T,
    len: usize,
    event: CudaEvent,
    ctx: Arc<CudaContext>,
}

// SAFETY: the memory is owned by this value; host access goes through
// `&self` / `&mut self`, device access is ordered by the event.
unsafe impl<T: Send> Send for PinnedAlloc<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for PinnedAlloc<T> {}

impl<T> Drop for PinnedAlloc<T> {
    fn drop(&mut self) {
        // Copies still reading or writing the memory finish first.
        let quiet = self.quiesce();
        self.ctx.record_err(quiet);
        // SAFETY: allocated by `cuMemHostAlloc` in `PinnedAlloc::new`, freed
        // only here, after the last copy using it (`quiesce` made the
        // context current).
        self.ctx
            .record_err(unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) });
    }
}

impl<T> PinnedAlloc<T> {
    /// Waits until no copy uses the memory, returning an error cudarc had
    /// stored (from a destructor) if there was one. cudarc's own event
    /// calls return such an error *instead of* waiting, and its recording
    /// of the event after a copy is skipped the same way, so the event may
    /// be stale: with an error stored this waits for the whole context.
    /// The driver is called directly, so the wait always happens.
    fn quiesce(&self) -> Result<(), DriverError> {
        let stored = self.ctx.check_err();
        // SAFETY: the context is alive (held by `self.ctx`).
        unsafe { result::ctx::set_current(self.ctx.cu_ctx()) }?;
        if stored.is_err() {
            result::ctx::synchronize()?;
        } else {
            // SAFETY: the event is alive (owned by `self`).
            unsafe { result::event::synchronize(self.event.cu_event()) }?;
        }
        stored
    }

    /// `len` (≥ 1) uninitialised elements.
    fn new(ctx: &Arc<CudaContext>, len: usize, flags: c_uint) -> GpuResult<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b > 0 && b < isize::MAX as usize)
            .ok_or_else(|| GpuError::invalid_config(format!("pinned buffer of {len} elements")))?;
        ctx.bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        let event = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver_error("cuEventCreate"))?;
        // SAFETY: a plain allocation; the pointer is checked below.
        let ptr = unsafe { result::malloc_host(bytes, flags) }
            .map_err(driver_error("cuMemHostAlloc"))? as *mut T;
        if ptr.is_null() || !ptr.is_aligned() {
            return Err(GpuError::invalid_config(
                "cuMemHostAlloc returned a null or misaligned pointer",
            ));
        }
        Ok(PinnedAlloc {
            ptr,
            len,
            event,
            ctx: ctx.clone(),
        })
    }
}

impl<T> HostSlice<T> for PinnedAlloc<T> {
    fn len(&self) -> usize {
        self.len
    }

    unsafe fn stream_synced_slice<'a>(
        &'a self,
        stream: &'a CudaStream,
    ) -> (&'a [T], SyncOnDrop<'a>) {
        stream.context().record_err(stream.wait(&self.event));
        (
            std::slice::from_raw_parts(self.ptr, self.len),
            SyncOnDrop::Record(Some((&self.event, stream))),
        )
    }

    unsafe fn stream_synced_mut_slice<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (&'a mut [T], SyncOnDrop<'a>) {
        stream.context().record_err(stream.wait(&self.event));
        (
            std::slice::from_raw_parts_mut(self.ptr, self.len),
            SyncOnDrop::Record(Some((&self.event, stream))),
        )
    }
}

/// Page-locked host memory (`cuMemHostAlloc`) for asynchronous transfers in
/// one direction: write-combined upload staging, or plain pinned download
/// buffers ([`pinned_alloc_flags`]; the module documentation says why).
/// Either works for either transfer; reading an upload buffer on the host is
/// merely slow. Host access waits for pending copies.
pub struct PinnedBuffer<T> {
    /// `None` for length 0 (the driver does not allocate zero bytes).
    inner: Option<PinnedAlloc<T>>,
    direction: TransferDirection,
}

impl<T> std::fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len())
            .field("direction", &self.direction)
            .finish()
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> PinnedBuffer<T> {
    /// `len` zeroed elements allocated for `direction`'s use
    /// ([`pinned_alloc_flags`]).
    pub fn zeroed_for(
        ctx: &GpuContext,
        len: usize,
        direction: TransferDirection,
    ) -> GpuResult<Self> {
        if len == 0 {
            return Ok(PinnedBuffer {
                inner: None,
                direction,
            });
        }
        let alloc = PinnedAlloc::<T>::new(ctx.cuda(), len, pinned_alloc_flags(direction))?;
        // SAFETY: `ptr` points to `len` elements of fresh memory nothing else
        // uses yet, and zero bits are a valid `T` (`ValidAsZeroBits`).
        unsafe { std::ptr::write_bytes(alloc.ptr, 0, len) };
        Ok(PinnedBuffer {
            inner: Some(alloc),
            direction,
        })
    }

    /// `len` zeroed elements of plain pinned memory: a buffer to
    /// [`Transfer::download_async`] into and read on the host.
    pub fn zeroed(ctx: &GpuContext, len: usize) -> GpuResult<Self> {
        Self::for_download(ctx, len)
    }

    /// `len` zeroed elements of plain pinned memory, for downloads.
    pub fn for_download(ctx: &GpuContext, len: usize) -> GpuResult<Self> {
        Self::zeroed_for(ctx, len, TransferDirection::DeviceToHost)
    }

    /// `len` zeroed elements of write-combined memory: upload staging to fill
    /// from the host (write, do not read) and [`Transfer::upload_async`].
    pub fn for_upload(ctx: &GpuContext, len: usize) -> GpuResult<Self> {
        Self::zeroed_for(ctx, len, TransferDirection::HostToDevice)
    }

    /// A copy of `data` in write-combined upload staging.
    pub fn from_slice(ctx: &GpuContext, data: &[T]) -> GpuResult<Self> {
        let mut b = Self::for_upload(ctx, data.len())?;
        b.as_mut_slice()?.copy_from_slice(data);
        Ok(b)
    }

    /// The contents, after any pending copy into them has finished. Slow on
    /// upload staging (write-combined memory is uncached for host reads).
    pub fn as_slice(&self) -> GpuResult<&[T]> {
        match &self.inner {
            None => Ok(&[]),
            Some(s) => {
                s.quiesce().map_err(driver_error("cuEventSynchronize"))?;
                // SAFETY: `len` initialised elements (zeroed at allocation),
                // no copy pending, borrowed as long as `self`.
                Ok(unsafe { std::slice::from_raw_parts(s.ptr, s.len) })
            }
        }
    }

    /// The contents, writable, after pending copies have finished.
    pub fn as_mut_slice(&mut self) -> GpuResult<&mut [T]> {
        match &mut self.inner {
            None => Ok(&mut []),
            Some(s) => {
                s.quiesce().map_err(driver_error("cuEventSynchronize"))?;
                // SAFETY: as in `as_slice`, borrowed mutably with `self`.
                Ok(unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) })
            }
        }
    }
}

impl<T> PinnedBuffer<T> {
    pub fn len(&self) -> usize {
        self.inner.as_ref().map_or(0, |s| s.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The direction the buffer was allocated for.
    pub fn direction(&self) -> TransferDirection {
        self.direction
    }

    /// Whether the buffer is write-combined (upload staging).
    pub fn is_write_combined(&self) -> bool {
        pinned_alloc_flags(self.direction) & sys::CU_MEMHOSTALLOC_WRITECOMBINED as c_uint != 0
    }

    /// The flags the driver holds for the allocation (`cuMemHostGetFlags`:
    /// `CU_MEMHOSTALLOC_*`), to check what [`Self::is_write_combined`] says
    /// against the memory itself. 0 for an empty buffer (no allocation).
    pub fn driver_flags(&self) -> GpuResult<u32> {
        let Some(s) = &self.inner else { return Ok(0) };
        // SAFETY: the context is alive (held by the allocation).
        unsafe { result::ctx::set_current(s.ctx.cu_ctx()) }
            .map_err(driver_error("cuCtxSetCurrent"))?;
        let mut flags: c_uint = 0;
        // SAFETY: `s.ptr` is a live `cuMemHostAlloc` allocation; a valid
        // out-pointer.
        unsafe { sys::cuMemHostGetFlags(&mut flags, s.ptr as *mut std::ffi::c_void) }
            .result()
            .map_err(driver_error("cuMemHostGetFlags"))?;
        Ok(flags)
    }
}

/// An asynchronous copy in flight. [`Self::wait`] blocks until it is done
/// and adds its event-measured time to the [`Transfer`]'s statistics;
/// dropping it does not wait (the copy still completes in stream order).
#[must_use = "a pending transfer is only timed when waited for"]
pub struct PendingTransfer<'t> {
    stats: &'t Mutex<TransferStats>,
    events: Option<(CudaEvent, CudaEvent)>,
    bytes: u64,
    direction: TransferDirection,
}

impl std::fmt::Debug for PendingTransfer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingTransfer")
            .field("bytes", &self.bytes)
            .field("direction", &self.direction)
            .finish()
    }
}

impl PendingTransfer<'_> {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn direction(&self) -> TransferDirection {
        self.direction
    }

    /// Whether the copy has finished (`cuEventQuery`). An error (a fault
    /// earlier on the stream, which the event never gets past) is returned,
    /// not read as "not yet": a loop polling this would otherwise spin
    /// forever.
    pub fn is_complete(&self) -> GpuResult<bool> {
        match &self.events {
            None => Ok(true),
            Some((_, end)) => end.try_is_complete().map_err(driver_error("cuEventQuery")),
        }
    }

    /// Waits for the copy (`cuEventSynchronize`) and returns its device
    /// time (`cuEventElapsedTime`).
    pub fn wait(mut self) -> GpuResult<Duration> {
        let Some((start, end)) = self.events.take() else {
            return Ok(Duration::ZERO);
        };
        let ms = start
            .elapsed_ms(&end)
            .map_err(driver_error("cuEventElapsedTime"))?;
        let d = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
        lock(self.stats).timed(self.bytes, d);
        Ok(d)
    }
}

/// Issues transfers on one stream and counts them.
#[derive(Debug)]
pub struct Transfer {
    stream: Arc<CudaStream>,
    stats: Mutex<TransferStats>,
    /// Whether the device reads pageable memory through the host's page
    /// tables (`CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES`,
    /// e.g. Grace Hopper): there a pageable copy need not be staged before
    /// its call returns, so [`Self::upload_queued`] waits as
    /// [`Self::upload`] does. Unknown (the query failed) counts as yes.
    reads_host_page_tables: bool,
}

/// Whether the driver knows `ptr` as page-locked or device-visible memory
/// (its memory type is set), which a DMA may read after the copy's call
/// returns; plain pageable memory, unknown to the driver, is not. The
/// plural `cuPointerGetAttributes` answers an unknown pointer with a zero
/// type and success, where the singular call returns an error that
/// compute-sanitizer reports. A failed query counts as page-locked (the
/// caller then waits).
fn is_page_locked(ptr: *const std::ffi::c_void) -> bool {
    let mut kind: u32 = 0;
    let mut attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut data = [(&mut kind as *mut u32).cast::<std::ffi::c_void>()];
    // SAFETY: one attribute, its 32-bit CUmemorytype written to `kind`; the
    // driver only looks `ptr` up, never dereferences it.
    let r = unsafe {
        sys::cuPointerGetAttributes(
            1,
            &mut attribute,
            data.as_mut_ptr(),
            ptr as sys::CUdeviceptr,
        )
    };
    r != sys::cudaError_enum::CUDA_SUCCESS || kind != 0
}

impl Transfer {
    /// Transfers on `ctx`'s stream.
    pub fn new(ctx: &GpuContext) -> Self {
        Self::on_stream(ctx.stream().clone())
    }

    /// Transfers on `stream`.
    pub fn on_stream(stream: Arc<CudaStream>) -> Self {
        let reads_host_page_tables = stream
            .context()
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
            )
            .ok()
            .is_none_or(|v| v != 0);
        Transfer {
            stream,
            stats: Mutex::new(TransferStats::default()),
            reads_host_page_tables,
        }
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn stats(&self) -> TransferStats {
        lock(&self.stats).clone()
    }

    pub fn reset_stats(&self) {
        *lock(&self.stats) = TransferStats::default();
    }

    /// Waits for everything issued on the stream.
    pub fn synchronize(&self) -> GpuResult<()> {
        self.stream
            .synchronize()
            .map_err(driver_error("cuStreamSynchronize"))?;
        self.check_deferred()
    }

    fn check_deferred(&self) -> GpuResult<()> {
        self.stream
            .context()
            .check_err()
            .map_err(driver_error("(deferred, recorded by cudarc)"))
    }

    fn timed_sync(
        &self,
        direction: TransferDirection,
        bytes: u64,
        f: impl FnOnce() -> GpuResult<()>,
    ) -> GpuResult<()> {
        let t0 = Instant::now();
        f()?;
        self.synchronize()?;
        let d = t0.elapsed();
        let mut s = lock(&self.stats);
        s.issued(direction, bytes);
        s.timed(bytes, d);
        Ok(())
    }

    /// Copies `src` into `dst` (equal lengths) and waits for it.
    pub fn upload<'b, T: DeviceRepr + 'b>(
        &self,
        src: &[T],
        dst: impl Into<GpuViewMut<'b, T>>,
    ) -> GpuResult<()> {
        let mut dst = dst.into();
        require_same_len("upload", src.len(), dst.len())?;
        if src.is_empty() {
            lock(&self.stats).issued(TransferDirection::HostToDevice, 0);
            return Ok(());
        }
        let bytes = dst.size_bytes();
        self.timed_sync(TransferDirection::HostToDevice, bytes, || {
            let mut view = dst.as_cuda_mut()?;
            self.stream
                .memcpy_htod(src, &mut view)
                .map_err(driver_error("cuMemcpyHtoDAsync"))
        })
    }

    /// Queues a copy of `src` into `dst` (equal lengths) in stream order and
    /// returns without waiting for it where `src` is pageable memory: there
    /// `cuMemcpyHtoDAsync` returns once the driver has staged `src` (CUDA's
    /// documented behaviour for pageable host → device copies), so `src`
    /// may change or go at once. Page-locked `src` (the driver knows it:
    /// `cuPointerGetAttributes`) is read by the DMA after the call returns,
    /// so there the copy is waited for, as [`Self::upload`] does; so it is
    /// on a device that reads pageable memory through the host's page
    /// tables.
    ///
    /// A small search's query uploads take this: each wait of
    /// [`Self::upload`] (cudarc's own after a pageable copy, then ours) holds
    /// the host before the first launch, and kernels queued after the copy
    /// see its data anyway. Not timed (counted in the statistics' bytes and
    /// transfers only).
    pub fn upload_queued<'b, T: DeviceRepr + 'b>(
        &self,
        src: &[T],
        dst: impl Into<GpuViewMut<'b, T>>,
    ) -> GpuResult<()> {
        let mut dst = dst.into();
        require_same_len("upload", src.len(), dst.len())?;
        let bytes = dst.size_bytes();
        lock(&self.stats).issued(TransferDirection::HostToDevice, bytes);
        if src.is_empty() {
            return Ok(());
        }
        let mut view = dst.as_cuda_mut()?;
        self.stream
            .context()
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        {
            // Records the write on the block (cudarc's event tracking) when
            // dropped, after the copy is queued.
            let (ptr, _record) = view.device_ptr_mut(&self.stream);
            // SAFETY: `ptr` is the start of `dst`'s `src.len()` elements of
            // T (equal lengths checked), valid for the copy (the view
            // borrows the block); `src` is read before this returns where it
            // is pageable, and otherwise waited for below.
            unsafe { result::memcpy_htod_async(ptr, src, self.stream.cu_stream()) }
                .map_err(driver_error("cuMemcpyHtoDAsync"))?;
        }
        if self.reads_host_page_tables || is_page_locked(src.as_ptr().cast()) {
            self.synchronize()?;
        }
        self.check_deferred()
    }

    /// Whether the driver knows `host` as page-locked (or device-visible)
    /// memory, which [`Self::upload_queued`] waits for; ordinary pageable
    /// memory is not. Unknown (the driver could not say) counts as yes.
    pub fn is_page_locked<T>(&self, host: &[T]) -> bool {
        self.stream.context().bind_to_thread().is_err() || is_page_locked(host.as_ptr().cast())
    }

    /// A new buffer from `pool` that a copy of `src` is queued into
    /// ([`Self::upload_queued`]: pageable `src` may go at once).
    pub fn upload_new_queued<T: DeviceRepr>(
        &self,
        pool: &MemoryPool<CudaMemory>,
        src: &[T],
    ) -> GpuResult<GpuBuffer<T>> {
        let mut buf = pool.alloc::<T>(src.len())?;
        self.upload_queued(src, &mut buf)?;
        Ok(buf)
    }

    /// A new buffer from `pool` holding a copy of `src`.
    pub fn upload_new<T: DeviceRepr>(
        &self,
        pool: &MemoryPool<CudaMemory>,
        src: &[T],
    ) -> GpuResult<GpuBuffer<T>> {
        let mut buf = pool.alloc::<T>(src.len())?;
        self.upload(src, &mut buf)?;
        Ok(buf)
    }

    /// Copies `src` into `dst` (equal lengths) and waits for it.
    pub fn download<'b, T: DeviceRepr + 'b>(
        &self,
        src: impl Into<GpuView<'b, T>>,
        dst: &mut [T],
    ) -> GpuResult<()> {
        let src = src.into();
        require_same_len("download", src.len(), dst.len())?;
        if dst.is_empty() {
            lock(&self.stats).issued(TransferDirection::DeviceToHost, 0);
            return Ok(());
        }
        self.timed_sync(TransferDirection::DeviceToHost, src.size_bytes(), || {
            let view = src.as_cuda()?;
            self.stream
                .memcpy_dtoh(&view, dst)
                .map_err(driver_error("cuMemcpyDtoHAsync"))
        })
    }

    /// A host copy of `src`.
    pub fn download_vec<'b, T: DeviceRepr + Default + Clone + 'b>(
        &self,
        src: impl Into<GpuView<'b, T>>,
    ) -> GpuResult<Vec<T>> {
        let src = src.into();
        let mut out = vec![T::default(); src.len()];
        self.download(src, &mut out)?;
        Ok(out)
    }

    fn pending(
        &self,
        direction: TransferDirection,
        bytes: u64,
        f: impl FnOnce() -> GpuResult<()>,
    ) -> GpuResult<PendingTransfer<'_>> {
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .stream
            .record_event(flags)
            .map_err(driver_error("cuEventRecord"))?;
        f()?;
        let end = self
            .stream
            .record_event(flags)
            .map_err(driver_error("cuEventRecord"))?;
        self.check_deferred()?;
        lock(&self.stats).issued(direction, bytes);
        Ok(PendingTransfer {
            stats: &self.stats,
            events: Some((start, end)),
            bytes,
            direction,
        })
    }

    fn empty(&self, direction: TransferDirection) -> PendingTransfer<'_> {
        lock(&self.stats).issued(direction, 0);
        PendingTransfer {
            stats: &self.stats,
            events: None,
            bytes: 0,
            direction,
        }
    }

    /// Starts copying pinned `src` into `dst` (equal lengths); returns at
    /// once. `src` cannot be written from the host until the copy is done
    /// (its accessors wait).
    pub fn upload_async<'b, T: DeviceRepr + ValidAsZeroBits + Copy + 'b>(
        &self,
        src: &PinnedBuffer<T>,
        dst: impl Into<GpuViewMut<'b, T>>,
    ) -> GpuResult<PendingTransfer<'_>> {
        let mut dst = dst.into();
        require_same_len("upload_async", src.len(), dst.len())?;
        let Some(host) = src.inner.as_ref() else {
            return Ok(self.empty(TransferDirection::HostToDevice));
        };
        let bytes = dst.size_bytes();
        self.pending(TransferDirection::HostToDevice, bytes, || {
            let mut view = dst.as_cuda_mut()?;
            self.stream
                .memcpy_htod(host, &mut view)
                .map_err(driver_error("cuMemcpyHtoDAsync"))
        })
    }

    /// Starts copying `src` into pinned `dst` (equal lengths); returns at
    /// once. `dst`'s accessors wait for the copy. Allocate `dst` with
    /// [`PinnedBuffer::for_download`] (or `zeroed`): plain pinned memory, which
    /// the host reads at full speed, unlike write-combined upload staging.
    pub fn download_async<'b, T: DeviceRepr + ValidAsZeroBits + Copy + 'b>(
        &self,
        src: impl Into<GpuView<'b, T>>,
        dst: &mut PinnedBuffer<T>,
    ) -> GpuResult<PendingTransfer<'_>> {
        let src = src.into();
        require_same_len("download_async", src.len(), dst.len())?;
        let Some(host) = dst.inner.as_mut() else {
            return Ok(self.empty(TransferDirection::DeviceToHost));
        };
        self.pending(TransferDirection::DeviceToHost, src.size_bytes(), || {
            let view = src.as_cuda()?;
            self.stream
                .memcpy_dtoh(&view, host)
                .map_err(driver_error("cuMemcpyDtoHAsync"))
        })
    }

    /// Sets `dst` to zero bytes (`cuMemsetD8Async`), ordered on the stream;
    /// does not wait.
    pub fn zero<'b, T: DeviceRepr + ValidAsZeroBits + 'b>(
        &self,
        dst: impl Into<GpuViewMut<'b, T>>,
    ) -> GpuResult<()> {
        // SAFETY: zero bits are a valid `T` (`ValidAsZeroBits`).
        unsafe { self.set_bytes(dst.into(), 0) }
    }

    /// Sets every bit of `dst` (`cuMemsetD8Async` of 0xFF), ordered on the
    /// stream; does not wait. Each f32 becomes a NaN, a value no kernel
    /// distance output holds (the scans, the re-rank and the select rank a
    /// NaN distance as +inf and pad with ±inf). A launch the kernel refuses
    /// by its own contract check writes nothing, so a NaN left after it
    /// shows the refusal where the output would otherwise keep whatever an
    /// earlier search left in the pooled block: plausible, wrong results.
    pub fn fill_nan<'b>(&self, dst: impl Into<GpuViewMut<'b, f32>>) -> GpuResult<()> {
        // SAFETY: every bit pattern is a valid f32.
        unsafe { self.set_bytes(dst.into(), 0xFF) }
    }

    /// Sets every bit of `dst` (`cuMemsetD8Async` of 0xFF), ordered on the
    /// stream; does not wait: each count becomes `u32::MAX`. knn_tile's
    /// candidate counts start so, above every capacity: a re-rank block
    /// whose counts the kernel before it left unwritten (it refused its
    /// launch) writes nothing (fragments/README.md), as
    /// [`fill_nan`](Self::fill_nan) shows an unwritten distance.
    pub fn fill_ones<'b>(&self, dst: impl Into<GpuViewMut<'b, u32>>) -> GpuResult<()> {
        // SAFETY: every bit pattern is a valid u32.
        unsafe { self.set_bytes(dst.into(), 0xFF) }
    }

    /// Sets every byte of `dst` to `byte` (`cuMemsetD8Async`), ordered on the
    /// stream (the write is recorded on the block, as cudarc's own memsets
    /// do); does not wait.
    ///
    /// # Safety
    /// Bytes all equal to `byte` must be a valid `T`.
    unsafe fn set_bytes<T: DeviceRepr>(
        &self,
        mut dst: GpuViewMut<'_, T>,
        byte: u8,
    ) -> GpuResult<()> {
        if !dst.is_empty() {
            let mut view = dst.as_cuda_mut()?;
            let bytes = view.num_bytes();
            self.stream
                .context()
                .bind_to_thread()
                .map_err(driver_error("cuMemsetD8Async"))?;
            let (ptr, _record) = view.device_ptr_mut(&self.stream);
            // SAFETY: `ptr` addresses `bytes` bytes of a live device block this
            // view borrows mutably; the set is ordered on the block's stream
            // (`_record` records it); the caller vouches for the bytes.
            unsafe { result::memset_d8_async(ptr, byte, bytes, self.stream.cu_stream()) }
                .map_err(driver_error("cuMemsetD8Async"))?;
            self.check_deferred()?;
        }
        Ok(())
    }

    /// Device-to-device copy (`cuMemcpyDtoDAsync`), ordered on the stream;
    /// does not wait.
    pub fn copy<'b, 'c, T: DeviceRepr + 'b + 'c>(
        &self,
        src: impl Into<GpuView<'b, T>>,
        dst: impl Into<GpuViewMut<'c, T>>,
    ) -> GpuResult<()> {
        let (src, mut dst) = (src.into(), dst.into());
        require_same_len("copy", src.len(), dst.len())?;
        if !src.is_empty() {
            let from = src.as_cuda()?;
            let mut to = dst.as_cuda_mut()?;
            self.stream
                .memcpy_dtod(&from, &mut to)
                .map_err(driver_error("cuMemcpyDtoDAsync"))?;
            self.check_deferred()?;
        }
        lock(&self.stats).issued(TransferDirection::DeviceToDevice, src.size_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{HostMemory, MemoryPool, PoolConfig};

    fn host_pool() -> MemoryPool<HostMemory> {
        MemoryPool::new(HostMemory::new(1 << 20), PoolConfig::default()).unwrap()
    }

    #[test]
    fn host_data_for_a_gpu_operation_is_refused_with_an_upload_hint() {
        let data = vec![1.0f32, 2.0, 3.0];
        let input: DeviceInput<'_, f32, HostMemory> = (&data).into();
        assert_eq!(input.placement(), Placement::Host);
        assert_eq!(input.len(), 3);
        let e = input.require_device("queries").unwrap_err();
        match &e {
            GpuError::ImplicitTransfer { what, hint } => {
                assert!(
                    what.contains("`queries`") && what.contains("3 elements"),
                    "{what}"
                );
                assert!(hint.contains("Transfer::upload_new"), "{hint}");
                assert!(hint.contains("Transfer::upload("), "{hint}");
            }
            other => panic!("expected ImplicitTransfer, got {other:?}"),
        }
        let text = e.to_string();
        assert!(text.starts_with("implicit transfer refused"), "{text}");
        assert!(text.contains("upload"), "{text}");
        // A slice converts the same way.
        let input: DeviceInput<'_, f32, HostMemory> = data[..2].into();
        assert!(matches!(
            input.require_device("x"),
            Err(GpuError::ImplicitTransfer { .. })
        ));
    }

    #[test]
    fn device_data_passes_the_device_check_and_fails_the_host_one() {
        let pool = host_pool();
        let buf = pool.alloc::<u32>(10).unwrap();
        let input: DeviceInput<'_, u32, HostMemory> = (&buf).into();
        assert_eq!(input.placement(), Placement::Device);
        let v = input.require_device("dataset").unwrap();
        assert_eq!((v.offset(), v.len()), (0, 10));
        let sub: DeviceInput<'_, u32, HostMemory> = buf.subview(2, 5).unwrap().into();
        assert_eq!(sub.len(), 5);
        let e = sub.require_host("dataset").unwrap_err();
        match e {
            GpuError::ImplicitTransfer { what, hint } => {
                assert!(what.contains("device memory"), "{what}");
                assert!(hint.contains("Transfer::download_vec"), "{hint}");
            }
            other => panic!("expected ImplicitTransfer, got {other:?}"),
        }
        let host = [1u32, 2];
        let h: DeviceInput<'_, u32, HostMemory> = host[..].into();
        assert_eq!(h.require_host("ids").unwrap(), &[1, 2]);
        assert!(format!("{h:?}").contains("Host(2 elements)"));
    }

    #[test]
    fn length_mismatch_is_checked_before_any_driver_call() {
        assert!(require_same_len("upload", 4, 4).is_ok());
        let e = require_same_len("upload", 3, 4).unwrap_err();
        assert_eq!(
            e,
            GpuError::LengthMismatch {
                what: "upload",
                source_len: 3,
                destination_len: 4
            }
        );
        assert!(e
            .to_string()
            .contains("source has 3 elements, destination 4"));
    }

    #[test]
    fn write_combined_only_for_upload_staging() {
        // Uploads: the host writes, the device reads: write-combined.
        assert_eq!(
            pinned_alloc_flags(TransferDirection::HostToDevice),
            sys::CU_MEMHOSTALLOC_WRITECOMBINED as c_uint
        );
        // Downloads: the host reads the result: plain page-locked memory,
        // never write-combined (uncached host reads).
        assert_eq!(pinned_alloc_flags(TransferDirection::DeviceToHost), 0);
        assert_eq!(pinned_alloc_flags(TransferDirection::DeviceToDevice), 0);
        // Empty buffers need no driver and keep their direction.
        let wc = sys::CU_MEMHOSTALLOC_WRITECOMBINED as c_uint;
        for (direction, combined) in [
            (TransferDirection::HostToDevice, true),
            (TransferDirection::DeviceToHost, false),
        ] {
            let b = PinnedBuffer::<f32> {
                inner: None,
                direction,
            };
            assert_eq!(
                (b.direction(), b.is_write_combined()),
                (direction, combined)
            );
            assert!(b.is_empty());
            assert_eq!(pinned_alloc_flags(direction) & wc != 0, combined);
        }
    }

    #[test]
    fn stats_bookkeeping_and_gbps() {
        let mut s = TransferStats::default();
        assert_eq!(s.gbps(), 0.0);
        s.issued(TransferDirection::HostToDevice, 1_000_000_000);
        s.timed(1_000_000_000, Duration::from_millis(500));
        s.issued(TransferDirection::DeviceToHost, 500);
        s.issued(TransferDirection::DeviceToDevice, 7);
        assert_eq!(s.transfers, 3);
        assert_eq!(
            (s.bytes_to_device, s.bytes_to_host, s.bytes_device_to_device),
            (1_000_000_000, 500, 7)
        );
        assert!((s.gbps() - 2.0).abs() < 1e-9, "{}", s.gbps());
    }
}
