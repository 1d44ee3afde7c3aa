//! The GPU execution contract: a device context, pooled typed device memory,
//! explicit transfers, kernel launch from a linked cubin, and the per-family
//! dispatch strategy (direct launches or CUDA graph replay).
//!
//! The layer is deliberately thin over cudarc's driver API (`cudarc::driver`),
//! so that the part which cannot run without a GPU stays small:
//!
//! * [`context`]: [`GpuContext`] wraps a `cudarc::driver::CudaContext` and one
//!   non-blocking stream; [`GpuContext::available`] answers "is there a
//!   driver and a device?" **before** the first driver call, because cudarc
//!   panics when `libcuda` cannot be loaded.
//! * [`memory`]: [`MemoryPool`] hands out typed [`GpuBuffer`]s from size
//!   classes and takes them back on drop; its bookkeeping is generic over
//!   [`DeviceMemory`], so the pool logic is tested on the CPU with
//!   [`HostMemory`] while [`CudaMemory`] is the real backend.
//! * [`transfer`]: [`Transfer`] moves data between host and device, only when
//!   asked; [`DeviceInput`] turns "a host slice was handed to a GPU
//!   operation" into [`GpuError::ImplicitTransfer`] with a hint.
//! * [`launch`]: [`Launcher`] loads a cubin and launches its entry point;
//!   [`LaunchConfig`] is validated against the kernel's resources on the CPU.
//! * [`dispatch`]: [`DispatchRegistry`] decides direct launch vs graph
//!   capture per kernel family, with `FRAGLINK_CUDA_DISPATCH` overrides.
//!
//! Everything that does not touch the driver (pool bookkeeping, views, launch
//! configuration checks, dispatch decisions, the implicit-transfer guard) is
//! unit-tested without a GPU; the device paths are exercised by the ignored
//! tests in `tests/gpu_device.rs` on a CUDA machine.
//!
//! No function of this module panics because the driver or the device is
//! missing: every entry point that reaches the driver goes through
//! [`GpuContext::available`] first and returns
//! [`GpuError::DeviceNotAvailable`] instead.

pub mod context;
pub mod dispatch;
pub mod launch;
pub mod memory;
pub mod transfer;

pub use context::{DeviceInfo, DeviceLimits, GpuContext};
pub use dispatch::{
    parse_override, CapturedGraph, Decision, DecisionSource, DispatchOverrides, DispatchPolicy,
    DispatchRegistry, DispatchStrategy, KernelCharacteristics, OverrideError, OverrideErrorKind,
    DISPATCH_ENV,
};
pub use launch::{KernelArgs, KernelResources, KernelStats, LaunchConfig, Launcher};
pub use memory::{
    AllocationStats, CudaMemory, DeviceMemory, EvictionPolicy, GpuBuffer, GpuView, GpuViewMut,
    HostMemory, MemoryPool, PoolConfig, SizeClasses,
};
pub use transfer::{
    DeviceInput, PendingTransfer, PinnedBuffer, Placement, Transfer, TransferDirection,
    TransferStats,
};

use cudarc::driver::DriverError;

/// Result of the GPU layer.
pub type GpuResult<T> = Result<T, GpuError>;

/// Everything the GPU layer reports. Byte counts are `u64`, element
/// offsets and lengths `usize`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library, a driver too old for the API cudarc was built
    /// against, `cuInit` failing, or no device (or not the asked-for one).
    /// Callers take the CPU path.
    #[error("no usable CUDA device: {reason}")]
    DeviceNotAvailable { reason: String },

    /// The device (or the in-memory backend) could not provide `requested`
    /// bytes; `available` is what it reported free at that moment.
    #[error("out of device memory: requested {requested} bytes, {available} bytes available")]
    OutOfMemory { requested: u64, available: u64 },

    /// A single allocation above [`PoolConfig::max_allocation`].
    #[error("allocation of {requested} bytes exceeds the pool's max_allocation of {max_allocation} bytes")]
    AllocationTooLarge { requested: u64, max_allocation: u64 },

    /// A view or copy outside its buffer: elements `offset..offset + len` of
    /// a region of `size` elements.
    #[error("invalid access: elements {offset}..{offset}+{len} of a region of {size} elements")]
    InvalidAccess {
        offset: usize,
        len: usize,
        size: usize,
    },

    /// Source and destination of a copy differ in length.
    #[error("length mismatch in {what}: source has {source_len} elements, destination {destination_len}")]
    LengthMismatch {
        what: &'static str,
        source_len: usize,
        destination_len: usize,
    },

    /// Host data handed to a GPU operation (or device data to a host one).
    /// Nothing is copied behind the caller's back; `hint` names the explicit
    /// call that moves the data.
    #[error("implicit transfer refused: {what}; {hint}")]
    ImplicitTransfer { what: String, hint: String },

    /// A kernel launch (or module load) the driver rejected. `context_lost`:
    /// the error is one of the sticky ones ([`is_sticky`]).
    #[error("launch of `{kernel}` failed: {message}")]
    Launch {
        kernel: String,
        message: String,
        context_lost: bool,
    },

    /// Any other driver call that failed; `message` is cudarc's
    /// `DriverError` text (error name and description). `context_lost`: the
    /// error is one of the sticky ones ([`is_sticky`]).
    #[error("CUDA driver call {call} failed: {message}")]
    Driver {
        call: &'static str,
        message: String,
        context_lost: bool,
    },

    /// A configuration that cannot work (launch dimensions, resources, pool
    /// settings, a malformed cubin), detected before reaching the driver.
    #[error("invalid configuration: {reason}")]
    InvalidConfig { reason: String },

    /// `FRAGLINK_CUDA_DISPATCH` (or an override string) could not be parsed.
    #[error(transparent)]
    Override(#[from] OverrideError),
}

impl GpuError {
    /// True for [`GpuError::DeviceNotAvailable`]: the caller should take the
    /// CPU path rather than report an error.
    pub fn is_device_not_available(&self) -> bool {
        matches!(self, GpuError::DeviceNotAvailable { .. })
    }

    /// True for a sticky driver error (a kernel's illegal address, an
    /// assertion, ...): the context is unusable for the rest of the
    /// process, and every later call on it fails the same way.
    pub fn is_context_lost(&self) -> bool {
        matches!(
            self,
            GpuError::Driver {
                context_lost: true,
                ..
            } | GpuError::Launch {
                context_lost: true,
                ..
            }
        )
    }

    pub(crate) fn invalid_config(reason: impl Into<String>) -> Self {
        GpuError::InvalidConfig {
            reason: reason.into(),
        }
    }
}

/// Wraps a cudarc [`DriverError`] from `call` into [`GpuError::Driver`].
pub(crate) fn driver_error(call: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |e| GpuError::Driver {
        call,
        message: e.to_string(),
        context_lost: is_sticky(&e),
    }
}

/// Whether `stream` is capturing a graph, an invalidated capture included
/// (it captures until `cuStreamEndCapture`). Makes the stream's context
/// current first. Not through `CudaStream::capture_status`, whose
/// `bind_to_thread` takes (and so would lose) an error cudarc stored for a
/// later call to report.
pub(crate) fn stream_capturing(stream: &cudarc::driver::CudaStream) -> Result<bool, DriverError> {
    use cudarc::driver::result;
    use cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream holds its context alive; `cuStreamIsCapturing`
    // only reads the stream's state.
    unsafe {
        result::ctx::set_current(stream.context().cu_ctx())?;
        Ok(result::stream::is_capturing(stream.cu_stream())? != CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

/// The driver errors after which a context cannot be used again (CUDA's
/// "sticky" errors). NVIDIA's documentation of several of them says the
/// process is left in an inconsistent state and must be restarted, so
/// fraglink does not try to recover: a lost context sends every later
/// search of the process to the CPU (`Searcher`).
pub fn is_sticky(e: &DriverError) -> bool {
    use cudarc::driver::sys::cudaError_enum as E;
    matches!(
        e.0,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ASSERT
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
            | E::CUDA_ERROR_NVLINK_UNCORRECTABLE
            | E::CUDA_ERROR_EXTERNAL_DEVICE
            | E::CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::cudaError_enum as E;

    #[test]
    fn sticky_driver_errors_mark_the_context_lost() {
        // (DriverError's text needs the driver library: build the errors
        // by hand.)
        for code in [
            E::CUDA_ERROR_ILLEGAL_ADDRESS,
            E::CUDA_ERROR_MISALIGNED_ADDRESS,
            E::CUDA_ERROR_ASSERT,
        ] {
            assert!(is_sticky(&DriverError(code)), "{code:?}");
        }
        for code in [
            E::CUDA_ERROR_OUT_OF_MEMORY,
            E::CUDA_ERROR_INVALID_VALUE,
            E::CUDA_ERROR_NOT_READY,
        ] {
            assert!(!is_sticky(&DriverError(code)), "{code:?}");
        }
        let lost = |context_lost| GpuError::Driver {
            call: "cuStreamSynchronize",
            message: String::new(),
            context_lost,
        };
        assert!(lost(true).is_context_lost());
        assert!(!lost(false).is_context_lost());
        assert!(!GpuError::invalid_config("x").is_context_lost());
    }
}
