//! The device context: driver availability, device enumeration, one
//! `cudarc` context plus a stream per [`GpuContext`].
//!
//! cudarc loads `libcuda` on its first driver call and **panics** when it
//! cannot, and resolves each driver function on its first use, panicking
//! when the library lacks it (cudarc is built against the CUDA 12.4 driver
//! API here, `cuda-12040`: the oldest that has every call fraglink makes,
//! `cuFuncGetParamInfo` being the newest of them). cudarc's version
//! features exclude one another across a build, so this one is also every
//! downstream crate's (examples/downstream pins it): a crate that takes
//! fraglink and cudarc names `cuda-12040` or none. The cost: codes a newer
//! driver may return that 12.4's error enum lacks (`CUDA_ERROR_CONTAINED`,
//! 226, a contained hardware fault; 721; 916) arrive as values outside
//! cudarc's Rust enum.
//! [`GpuContext::available`] therefore probes on its own first, once per
//! process: it opens the driver library with `libloading`, asks
//! `cuDriverGetVersion` whether the driver covers the 12.4 API, and only
//! then lets cudarc load it and call `cuInit`. Every constructor goes
//! through that probe, so a machine without a driver, or with one older
//! than CUDA 12.4 (NVIDIA driver 550), gets
//! [`GpuError::DeviceNotAvailable`], never a panic.

use std::ffi::c_int;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{result, CudaContext, CudaStream};
use once_cell::sync::OnceCell;

use super::{driver_error, GpuError, GpuResult};
use crate::build::Arch;

/// Driver API version cudarc is built against (`cuda-12040`), as
/// `cuDriverGetVersion` reports it: a driver reporting less may lack
/// functions cudarc resolves on first use (`cuFuncGetParamInfo` is 12.4).
pub const REQUIRED_DRIVER_VERSION: i32 = 12040;

/// The oldest NVIDIA driver release (Linux x86_64, as in CUDA's release
/// notes) whose `cuDriverGetVersion` reports at least `cuda_version` (e.g.
/// 12040 → 550), for the CUDA 12 and 13 releases; `None` for others.
pub fn minimum_driver_release(cuda_version: i32) -> Option<u32> {
    const RELEASES: &[(i32, u32)] = &[
        (12000, 525),
        (12010, 530),
        (12020, 535),
        (12030, 545),
        (12040, 550),
        (12050, 555),
        (12060, 560),
        (12080, 570),
        (12090, 575),
        (13000, 580),
    ];
    RELEASES
        .iter()
        .find(|(v, _)| *v == cuda_version)
        .map(|(_, r)| *r)
}

/// `12040` → `"12.4"`.
fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// Why a driver reporting CUDA `found` cannot serve bindings that need CUDA
/// `needed` (both as `cuDriverGetVersion` reports them): the reason of the
/// probe's [`GpuError::DeviceNotAvailable`].
pub fn driver_too_old_reason(found: i32, needed: i32) -> String {
    let release = match minimum_driver_release(needed) {
        Some(r) => format!(" (NVIDIA driver {r} or newer)"),
        None => String::new(),
    };
    format!(
        "the CUDA driver supports CUDA {}, but fraglink's driver bindings need CUDA {} or newer{release}; update the NVIDIA driver",
        cuda_version_text(found),
        cuda_version_text(needed),
    )
}

/// File names tried for the driver library, in order.
#[cfg(windows)]
pub const DRIVER_LIBRARY_NAMES: &[&str] = &["nvcuda.dll"];
/// File names tried for the driver library, in order.
#[cfg(not(windows))]
pub const DRIVER_LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// What one device can do, as far as launch checks need it. [`Default`] is
/// the limit set of every architecture CUDA 12 supports (sm_50 and newer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    pub max_threads_per_block: u32,
    /// `(x, y, z)` block dimension limits.
    pub max_block_dim: (u32, u32, u32),
    /// `(x, y, z)` grid dimension limits.
    pub max_grid_dim: (u32, u32, u32),
    /// 32-bit registers available to one block.
    pub registers_per_block: u32,
    /// Shared memory per block without opting in (48 KiB).
    pub shared_bytes_per_block: u32,
    /// Shared memory per block a kernel may opt in to.
    pub shared_bytes_per_block_optin: u32,
    /// Shared memory of one SM, shared by its resident blocks.
    pub shared_bytes_per_sm: u32,
    pub warp_size: u32,
}

impl Default for DeviceLimits {
    fn default() -> Self {
        DeviceLimits {
            max_threads_per_block: 1024,
            max_block_dim: (1024, 1024, 64),
            max_grid_dim: (i32::MAX as u32, 65535, 65535),
            registers_per_block: 65536,
            shared_bytes_per_block: 48 * 1024,
            shared_bytes_per_block_optin: 48 * 1024,
            shared_bytes_per_sm: 64 * 1024,
            warp_size: 32,
        }
    }
}

/// One CUDA device, read without creating a context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// `(major, minor)`, e.g. `(8, 6)`.
    pub compute_capability: (u32, u32),
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Whether `cuLaunchCooperativeKernel` is supported.
    pub cooperative_launch: bool,
    pub limits: DeviceLimits,
}

impl DeviceInfo {
    /// The real architecture, e.g. `sm_86` (what nvJitLink's `-arch=` wants).
    pub fn arch(&self) -> Arch {
        let (major, minor) = self.compute_capability;
        Arch::sm(major * 10 + minor)
    }
}

/// How the probe ended: the number of devices, or why there is no GPU.
type Probe = Result<usize, String>;

static PROBE: OnceCell<Probe> = OnceCell::new();

/// The CUDA version the installed driver supports, as `cuDriverGetVersion`
/// reports it (e.g. 13000 for CUDA 13.0), read by opening the driver library
/// ourselves: no cudarc, no `cuInit`, no panic. `Err` says why not.
pub fn driver_version() -> Result<i32, String> {
    open_driver().map(|(_, v)| v)
}

fn open_driver() -> Result<(libloading::Library, i32), String> {
    let mut tried = Vec::new();
    let mut lib = None;
    for name in DRIVER_LIBRARY_NAMES {
        // SAFETY: loading the NVIDIA driver library runs its initialisers,
        // which is what every CUDA program does.
        match unsafe { libloading::Library::new(name) } {
            Ok(l) => {
                lib = Some(l);
                break;
            }
            Err(e) => tried.push(format!("{name} ({e})")),
        }
    }
    let Some(lib) = lib else {
        return Err(format!(
            "the CUDA driver library could not be loaded (tried {}); install the NVIDIA driver or add its directory to LD_LIBRARY_PATH",
            tried.join(", ")
        ));
    };
    // SAFETY: `cuDriverGetVersion(int*)` from cuda.h; callable before cuInit.
    let version = unsafe {
        let get: libloading::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
            match lib.get(b"cuDriverGetVersion\0") {
                Ok(f) => f,
                Err(e) => {
                    return Err(format!(
                        "the CUDA driver library has no cuDriverGetVersion: {e}"
                    ))
                }
            };
        let mut v: c_int = 0;
        let rc = get(&mut v);
        if rc != 0 {
            return Err(format!("cuDriverGetVersion failed with CUresult {rc}"));
        }
        v
    };
    Ok((lib, version))
}

/// Opens the driver library ourselves and checks its version, then lets
/// cudarc load it and initialise the driver. Runs once per process.
fn probe() -> Probe {
    let (lib, version) = open_driver()?;
    if version < REQUIRED_DRIVER_VERSION {
        return Err(driver_too_old_reason(version, REQUIRED_DRIVER_VERSION));
    }
    drop(lib);
    // cudarc loads the library on this first call and resolves each function
    // on its first use, panicking on a failure; the checks above make that
    // unreachable, this is the net. (No `is_culib_present`: it exists only
    // with cudarc's dynamic loading, which another crate may replace with
    // `dynamic-linking`; `fallback-dynamic-loading` allows that.)
    match std::panic::catch_unwind(|| {
        result::init()?;
        result::device::get_count()
    }) {
        Ok(Ok(n)) if n > 0 => Ok(n as usize),
        Ok(Ok(_)) => Err("the CUDA driver is installed but reports no device".into()),
        Ok(Err(e)) => Err(format!("cuInit failed: {e}")),
        Err(panic) => Err(format!(
            "cudarc could not use the CUDA driver library (needs the CUDA {} driver API): {}",
            cuda_version_text(REQUIRED_DRIVER_VERSION),
            panic_message(panic.as_ref())
        )),
    }
}

/// The text of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "panic without a message"
    }
}

fn probed() -> GpuResult<usize> {
    PROBE
        .get_or_init(probe)
        .clone()
        .map_err(|reason| GpuError::DeviceNotAvailable { reason })
}

fn attribute(dev: cudarc::driver::sys::CUdevice, attr: Attr) -> GpuResult<u32> {
    // SAFETY: `dev` came from cuDeviceGet after a successful probe.
    let v = unsafe { result::device::get_attribute(dev, attr) }
        .map_err(driver_error("cuDeviceGetAttribute"))?;
    Ok(v.max(0) as u32)
}

fn read_device(ordinal: usize) -> GpuResult<DeviceInfo> {
    let dev = result::device::get(ordinal as c_int).map_err(driver_error("cuDeviceGet"))?;
    let name = result::device::get_name(dev).map_err(driver_error("cuDeviceGetName"))?;
    // SAFETY: as above.
    let total_memory =
        unsafe { result::device::total_mem(dev) }.map_err(driver_error("cuDeviceTotalMem"))? as u64;
    let limits = DeviceLimits {
        max_threads_per_block: attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_block_dim: (
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
        ),
        max_grid_dim: (
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ),
        registers_per_block: attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)?,
        shared_bytes_per_block: attribute(
            dev,
            Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
        )?,
        shared_bytes_per_block_optin: attribute(
            dev,
            Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?,
        shared_bytes_per_sm: attribute(
            dev,
            Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )?,
        warp_size: attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
    };
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: (
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        total_memory,
        sm_count: attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        cooperative_launch: attribute(dev, Attr::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0,
        limits,
    })
}

/// One device's primary context and the stream fraglink works on.
///
/// Cheap to clone (two `Arc`s and the device description). The stream is a
/// non-blocking stream of its own (not the legacy NULL stream), so work on
/// it can be captured into a CUDA graph.
///
/// Creating that stream puts cudarc into its multi-stream mode, where each
/// buffer carries read and write events: every pointer argument of a
/// launch, copy or memset then costs a `cuStreamWaitEvent` before it and a
/// `cuEventRecord` after it (about 35 driver calls before a k-NN search's
/// first kernel), and every allocation two `cuEventCreate`. On one stream
/// the stream's own order already orders everything, so [`GpuContext::new`]
/// turns that tracking off; [`GpuContext::new_stream`] turns it back on
/// for the buffers allocated after it. A stream made through cudarc
/// directly ([`GpuContext::cuda`]) needs `enable_event_tracking` first.
#[derive(Debug, Clone)]
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
}

impl GpuContext {
    /// `Ok(())` when the driver loads, is new enough, initialises, and
    /// reports at least one device; [`GpuError::DeviceNotAvailable`] with
    /// the reason otherwise. Probes once per process; no panic either way.
    pub fn available() -> GpuResult<()> {
        probed().map(|_| ())
    }

    /// Number of CUDA devices ([`GpuError::DeviceNotAvailable`] without a
    /// driver or device).
    pub fn device_count() -> GpuResult<usize> {
        probed()
    }

    /// Every device, read through `cuDeviceGet*` without creating contexts.
    pub fn devices() -> GpuResult<Vec<DeviceInfo>> {
        let n = probed()?;
        (0..n).map(read_device).collect()
    }

    /// The real architecture of device 0 (e.g. `sm_86`), read without
    /// creating a context: what to link for on this machine.
    pub fn default_arch() -> GpuResult<Arch> {
        probed()?;
        Ok(read_device(0)?.arch())
    }

    /// The primary context of device `ordinal` (`cuDevicePrimaryCtxRetain`
    /// through `CudaContext::new`) and a fresh non-blocking stream.
    pub fn new(ordinal: usize) -> GpuResult<Self> {
        let n = probed()?;
        if ordinal >= n {
            return Err(GpuError::DeviceNotAvailable {
                reason: format!("device {ordinal} requested, the driver reports {n} device(s)"),
            });
        }
        let info = read_device(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
        let stream = ctx.new_stream().map_err(driver_error("cuStreamCreate"))?;
        // SAFETY: nothing is allocated on this context object yet, and all
        // work goes to `stream` until `new_stream` turns tracking back on
        // (see the type's documentation). `CudaContext::new` returns an
        // object of its own, so no other user's context changes.
        unsafe { ctx.disable_event_tracking() };
        Ok(GpuContext { ctx, stream, info })
    }

    /// Device 0.
    #[allow(clippy::should_implement_trait)] // fallible: not `Default`
    pub fn default() -> GpuResult<Self> {
        Self::new(0)
    }

    /// The device this context is on.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }

    /// `(major, minor)` compute capability.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.info.compute_capability
    }

    /// The real architecture, e.g. `sm_86`; `ctx.arch().to_string()` is the
    /// value of nvJitLink's `-arch=`.
    pub fn arch(&self) -> Arch {
        self.info.arch()
    }

    /// The device's launch limits.
    pub fn limits(&self) -> &DeviceLimits {
        &self.info.limits
    }

    /// The underlying cudarc context, for calls this layer does not wrap.
    pub fn cuda(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream transfers and launches of this context use by default.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Another non-blocking stream on this device (`cuStreamCreate`). It
    /// turns cudarc's event tracking back on (see [`GpuContext`]): buffers
    /// allocated from now on order their use across streams by themselves;
    /// those allocated before carry no events, so their use on the new
    /// stream must be ordered by the caller (e.g. [`Self::synchronize`]).
    pub fn new_stream(&self) -> GpuResult<Arc<CudaStream>> {
        // SAFETY: turning tracking on only adds waits and records.
        unsafe { self.ctx.enable_event_tracking() };
        self.ctx
            .new_stream()
            .map_err(driver_error("cuStreamCreate"))
    }

    /// Waits for this context's stream (`cuStreamSynchronize`), then reports
    /// any error cudarc recorded in a destructor.
    pub fn synchronize(&self) -> GpuResult<()> {
        self.stream
            .synchronize()
            .map_err(driver_error("cuStreamSynchronize"))?;
        self.check_deferred()
    }

    /// `(free, total)` device memory in bytes (`cuMemGetInfo`).
    pub fn memory_info(&self) -> GpuResult<(u64, u64)> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        let (free, total) = result::mem_get_info().map_err(driver_error("cuMemGetInfo"))?;
        Ok((free as u64, total as u64))
    }

    /// Errors cudarc stored from calls that could not return one (drops,
    /// event records); cleared by reading.
    pub fn check_deferred(&self) -> GpuResult<()> {
        self.ctx
            .check_err()
            .map_err(driver_error("(deferred, recorded by cudarc)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_are_the_cuda12_baseline() {
        let l = DeviceLimits::default();
        assert_eq!(l.registers_per_block, 65536);
        assert_eq!(l.shared_bytes_per_block, 49152);
        assert_eq!(l.max_threads_per_block, 1024);
        assert_eq!(l.warp_size, 32);
    }

    #[test]
    fn arch_from_compute_capability() {
        let info = DeviceInfo {
            ordinal: 0,
            name: "test".into(),
            compute_capability: (8, 6),
            total_memory: 0,
            sm_count: 1,
            cooperative_launch: false,
            limits: DeviceLimits::default(),
        };
        assert_eq!(info.arch().to_string(), "sm_86");
        assert_eq!(
            DeviceInfo {
                compute_capability: (12, 0),
                ..info
            }
            .arch()
            .to_string(),
            "sm_120"
        );
    }

    #[test]
    fn too_old_driver_names_both_versions_and_the_release() {
        assert_eq!(REQUIRED_DRIVER_VERSION, 12040);
        assert_eq!(minimum_driver_release(REQUIRED_DRIVER_VERSION), Some(550));
        let reason = driver_too_old_reason(12020, REQUIRED_DRIVER_VERSION);
        assert_eq!(
            reason,
            "the CUDA driver supports CUDA 12.2, but fraglink's driver bindings need CUDA 12.4 \
             or newer (NVIDIA driver 550 or newer); update the NVIDIA driver"
        );
        let e = GpuError::DeviceNotAvailable { reason };
        assert!(e.to_string().starts_with("no usable CUDA device: "), "{e}");
        // A CUDA 11 driver, and a needed version without a known release.
        let old = driver_too_old_reason(11080, 12040);
        assert!(
            old.contains("supports CUDA 11.8,") && old.contains("driver 550"),
            "{old}"
        );
        let unknown = driver_too_old_reason(12040, 12070);
        assert!(unknown.contains("need CUDA 12.7 or newer;"), "{unknown}");
        assert_eq!(minimum_driver_release(13000), Some(580));
        assert_eq!(minimum_driver_release(12070), None);
    }

    #[test]
    fn probe_is_stable_and_never_panics() {
        // Whatever this machine has, two calls agree and neither panics.
        let a = GpuContext::available();
        let b = GpuContext::available();
        assert_eq!(a, b);
        if let Err(e) = a {
            assert!(e.is_device_not_available(), "{e}");
            assert!(GpuContext::new(0).unwrap_err().is_device_not_available());
            assert!(GpuContext::devices().unwrap_err().is_device_not_available());
        }
    }
}
