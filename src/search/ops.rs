//! The search's operations as the cost model sees them: the model
//! ([`crate::cost`]) knows operations by shape and name only, and the search
//! names and sizes its own.

use super::cpu::CpuKernel;
use super::DType;
use crate::cost::OpDesc;

/// How much faster the CPU search runs i8/u8 with the VNNI byte kernel than
/// f32, whose work the calibrated rate (an f32 dot-product loop) prices
/// (BENCHMARKS.md, "Search on the CPU": 100k × 128, 1000 queries, k 10, one
/// thread: f32 l2 291 ms, i8 and u8 87–98 ms). Measured with many queries; a
/// heuristic for few, which the model's learned timings correct.
pub(crate) const BYTE_KERNEL_SPEEDUP: f64 = 3.0;

impl DType {
    /// The cost model's name of exact k-NN over this element type.
    pub fn knn_operation(self) -> &'static str {
        match self {
            DType::F32 => "knn.f32",
            DType::F16 => "knn.f16",
            DType::I8 => "knn.i8",
            DType::U8 => "knn.u8",
        }
    }
}

impl OpDesc {
    /// Exact k-NN of `nq` queries over `n` rows of `dim` elements of `dtype`:
    /// a [`OpDesc::brute_force`] scan keeping `k` (id, distance) pairs per
    /// query, the base uploaded unless `base_resident`. Where the CPU search
    /// takes the byte kernel (i8/u8 with AVX-512 VNNI: [`CpuKernel::for_search`])
    /// its work counts `BYTE_KERNEL_SPEEDUP` (3) times less than the calibration's
    /// f32 flops.
    pub fn knn(
        n: usize,
        dim: usize,
        nq: usize,
        k: usize,
        dtype: DType,
        base_resident: bool,
    ) -> Self {
        let op = OpDesc::brute_force(
            dtype.knn_operation(),
            n,
            dim,
            nq,
            k,
            dtype.size(),
            base_resident,
        );
        if CpuKernel::for_search(dtype, dim, nq) == CpuKernel::Avx512Vnni {
            let w = op.cpu_work / BYTE_KERNEL_SPEEDUP;
            op.cpu_work(w)
        } else {
            op
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knn_counts_bytes_and_flops() {
        let op = OpDesc::knn(1000, 128, 10, 5, DType::F16, false);
        assert_eq!(op.operation, "knn.f16");
        assert_eq!(op.bytes_to_device, (1000 + 10) * 128 * 2);
        assert_eq!(op.bytes_from_device, 10 * 5 * 12);
        assert_eq!(op.gpu_work, 2.0 * 1000.0 * 128.0 * 10.0);
        assert_eq!(op.cpu_work, op.gpu_work);
        let resident = OpDesc::knn(1000, 128, 10, 5, DType::U8, true);
        assert_eq!(resident.bytes_to_device, 10 * 128);
        assert_eq!(resident.operation, "knn.u8");
        let byte_kernel = CpuKernel::for_search(DType::U8, 128, 10) == CpuKernel::Avx512Vnni;
        let want = resident.gpu_work
            / if byte_kernel {
                BYTE_KERNEL_SPEEDUP
            } else {
                1.0
            };
        assert_eq!(resident.cpu_work, want);
    }
}
