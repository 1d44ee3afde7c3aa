//! The fused float scan: dot products and candidate selection in one pass, so
//! that no block of dot products is ever written to memory.
//!
//! Why: with the gemm crate, a search spent 45% of its time in gemm's AVX2
//! microkernel and another ~15% packing operands and re-reading the dot-product
//! block to select candidates (perf, 100k × 128 f32, 1 thread). Here a register
//! tile holds the dot products of `QV × LANES` queries (the vector lanes) with
//! `R` rows; when the tile's dot products are complete, each is turned into
//! its lower bound `lo` in registers and compared with its query's current
//! threshold, and only the rare (query, row) pairs with `lo < threshold` leave
//! the registers, for [`TopK::offer`]. The bounds are those of the parent
//! module's [`Approx`] structs, computed with the same IEEE operations in the
//! same order (so a vector `lo` equals the scalar one bit for bit), and a dot
//! product from any summation order is within their margin (parent module docs):
//! the candidates are a superset of the exact top-k as with the GEMM path, and
//! the exact re-rank decides.
//!
//! Layout: the queries are packed once per task, transposed in panels of
//! `P = QV × LANES` (for each element index `l`, the `P` queries' `l`-th
//! values side by side: one vector load each); rows are read where they are
//! (no packing: packing a block of rows into interleaved tiles was measured
//! at ~12% of the scan), one broadcast per (row, element). A panel (P × dim
//! floats, 32 KiB at dim 128 with AVX-512) stays in L1/L2 while a block of
//! rows (about 256 KiB) streams from L2.

use super::simd::Simd;
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::{Approx, Cand, CosApprox, IpApprox, L2Approx, Metric, TopK};

/// How the CPU search computes its dot products (more may come: match with
/// a wildcard arm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpuKernel {
    /// The gemm crate's GEMM into a block of dot products, then a selection
    /// pass over the block (any CPU; gemm picks its own instruction set).
    Gemm,
    /// The fused scan with AVX2 and FMA (8 lanes, tiles of 16 queries × 6 rows).
    Avx2,
    /// The fused scan with AVX-512F (16 lanes, tiles of 64 queries × 6 rows).
    Avx512,
    /// [`CpuKernel::Avx512`] for f32 and f16; for i8 and u8 (dims a multiple
    /// of 4, up to 33024) exact byte dot products with AVX-512 VNNI
    /// (`vnni` module), 64 multiply-adds per instruction, and no re-rank.
    Avx512Vnni,
}

impl CpuKernel {
    /// Every kernel, slowest first.
    pub const ALL: [CpuKernel; 4] = [
        CpuKernel::Gemm,
        CpuKernel::Avx2,
        CpuKernel::Avx512,
        CpuKernel::Avx512Vnni,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CpuKernel::Gemm => "gemm",
            CpuKernel::Avx2 => "avx2",
            CpuKernel::Avx512 => "avx512",
            CpuKernel::Avx512Vnni => "avx512vnni",
        }
    }

    /// Whether this CPU can run the kernel (run-time detection).
    pub fn available(self) -> bool {
        match self {
            CpuKernel::Gemm => true,
            #[cfg(target_arch = "x86_64")]
            CpuKernel::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            CpuKernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            CpuKernel::Avx512Vnni => super::vnni::available(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU can run (detected once per process).
    pub fn detect() -> CpuKernel {
        static BEST: std::sync::OnceLock<CpuKernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            CpuKernel::ALL
                .into_iter()
                .rev()
                .find(|k| k.available())
                .unwrap_or(CpuKernel::Gemm)
        })
    }

    /// The kernel [`search_cpu`](super::search_cpu) uses for `nq` queries: the
    /// fastest this CPU has, except for few queries, where a fused kernel
    /// computes whole panels of mostly padding lanes (64 queries with AVX-512,
    /// 16 with AVX2). Measured (one thread, 100k × 128 f32, l2, k = 10, CPU
    /// ms per search, gemm / avx2 / avx512): 1 query 11.8 / 22.4 / 31.6,
    /// 16 queries 25.0 / 19.7 / 29.5, 32 queries 36.4 / 30.1 / 31.0,
    /// 64 queries 41.7 / 33.9 / 30.3.
    pub fn for_queries(nq: usize) -> CpuKernel {
        let best = CpuKernel::detect();
        if nq <= 1 {
            CpuKernel::Gemm
        } else if matches!(best, CpuKernel::Avx512 | CpuKernel::Avx512Vnni)
            && nq < 48
            && CpuKernel::Avx2.available()
        {
            CpuKernel::Avx2
        } else {
            best
        }
    }

    /// [`CpuKernel::for_queries`] for a search of `dtype` vectors of `dim`
    /// elements: i8 and u8 take the exact VNNI kernel where it serves the dim,
    /// one query included (its single-query path). Measured (one thread,
    /// 100k × 128, k = 10, ms per search, i8 l2 / i8 ip / u8 l2 / u8 ip; gemm,
    /// avx2, avx512vnni):
    /// - 1 query: 8.9 / 7.2 / 7.2 / 7.4, 13.9 / 13.1 / 9.7 / 10.3, 10.8 / 9.6 / 7.0 / 7.2
    ///   with a 16-query panel; with the single-query path and the rows' sums
    ///   by VNNI (criterion medians, gemm and avx512vnni interleaved by case,
    ///   2026-11-27): gemm 11.0 / 12.5 / 11.5 / 9.9, avx512vnni 4.7 / 4.2 / 2.8 / 3.0;
    /// - 2 queries: 12.3 / 11.4 / 11.6 / 11.1, 12.4 / 13.1 / 9.9 / 10.5, 10.0 / 10.6 / 6.3 / 6.8;
    /// - 8 queries: 15.5 / 12.9 / 13.4 / 12.8, 14.6 / 10.6 / 10.1 / 9.9, 9.4 / 8.3 / 6.1 / 5.8;
    /// - 20 queries: 17.5 / 15.6 / 16.7 / 16.5, 17.6 / 14.5 / 14.4 / 14.7, 10.7 / 7.3 / 7.9 / 8.2.
    pub fn for_search(dtype: crate::search::DType, dim: usize, nq: usize) -> CpuKernel {
        use crate::search::DType;
        let bytes = matches!(dtype, DType::I8 | DType::U8) && super::vnni::serves(dim);
        if bytes && nq >= 1 && CpuKernel::detect() == CpuKernel::Avx512Vnni {
            return CpuKernel::Avx512Vnni;
        }
        CpuKernel::for_queries(nq)
    }

    /// `self` if this CPU can run it, otherwise the fastest one it can.
    pub fn usable(self) -> CpuKernel {
        if self.available() {
            self
        } else {
            CpuKernel::detect()
        }
    }

    /// Queries per packed panel (0 for [`CpuKernel::Gemm`], which packs nothing).
    pub(super) fn panel(self) -> usize {
        match self {
            CpuKernel::Gemm => 0,
            CpuKernel::Avx2 => AVX2_QV * 8,
            CpuKernel::Avx512 | CpuKernel::Avx512Vnni => AVX512_QV * 16,
        }
    }
}

impl std::fmt::Display for CpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

// Register tiles: QV query vectors × R rows of accumulators, plus QV vectors
// of query values and one broadcast row value: 4 × 6 + 4 + 1 = 29 of AVX-512's
// 32 registers, 2 × 6 + 2 + 1 = 15 of AVX2's 16. Enough independent
// accumulators to hide the fma latency, one broadcast feeds QV fmas, and the R
// row pointers stay in general registers (with 12 rows they spilled: measured,
// a stack reload per row and element).
const AVX512_QV: usize = 4;
const AVX512_R: usize = 6;
const AVX2_QV: usize = 2;
const AVX2_R: usize = 6;

/// Rows per block of the fused scan: about 256 KiB of f32 rows (L2-resident
/// while every query panel passes over them), a multiple of the tile height so
/// that only a shard's last block has rows left over for one-row tiles.
pub(super) fn block_rows(dim: usize) -> usize {
    const TILE: usize = 6; // AVX512_R = AVX2_R
    ((65_536 / dim.max(1)) / TILE * TILE).clamp(TILE, 2046)
}

/// Per-metric constants of the bounds (parent module's `float_bound_consts`):
/// l2 `(c_l2, abs)`, inner product `(0, abs)`, cosine `(0, c_cos + abs)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct BoundConsts {
    pub metric: Metric,
    pub c: f32,
    pub e: f32,
}

/// One task's queries, packed for the fused kernels, with their selection state.
pub(super) struct PackedQueries {
    kernel: CpuKernel,
    dim: usize,
    /// Real queries (the rest of the last panel is padding).
    n: usize,
    /// Panels of `P × dim`: `panels[p·P·dim + l·P + i]` = query `p·P + i`, element `l`.
    panels: Vec<f32>,
    /// Per-query bound values, padded to whole panels: l2 (|q|², |q|), inner
    /// product (c_ip·|q|, 0), cosine (1/|q|, 0).
    qa: Vec<f32>,
    qb: Vec<f32>,
    /// The current threshold of each query ([`TopK::threshold`]); −inf for
    /// padding lanes, which therefore never pass.
    thr: Vec<f32>,
}

impl PackedQueries {
    /// Packs `n = qa.len()` queries of `dim` floats (`rows`) for `kernel`
    /// (not [`CpuKernel::Gemm`]).
    pub(super) fn new(
        kernel: CpuKernel,
        dim: usize,
        rows: &[&[f32]],
        qa: &[f32],
        qb: &[f32],
    ) -> Self {
        let p = kernel.panel();
        assert!(p > 0, "the GEMM kernel packs no queries");
        let n = qa.len();
        assert!(qb.len() == n && rows.len() == n && rows.iter().all(|r| r.len() == dim));
        let np = n.div_ceil(p);
        let mut panels = vec![0.0f32; np * p * dim];
        for (i, row) in rows.iter().enumerate() {
            let panel = &mut panels[(i / p) * p * dim..][..p * dim];
            for (l, &v) in row.iter().enumerate() {
                panel[l * p + i % p] = v;
            }
        }
        let pad = |v: &[f32], fill: f32| {
            let mut out = v.to_vec();
            out.resize(np * p, fill);
            out
        };
        PackedQueries {
            kernel,
            dim,
            n,
            panels,
            qa: pad(qa, 0.0),
            qb: pad(qb, 0.0),
            thr: pad(&vec![f32::INFINITY; n], f32::NEG_INFINITY),
        }
    }
}

/// One block of rows to scan against every packed query.
pub(super) struct RowBlock<'a> {
    /// The rows (each `dim` floats), in ascending id order.
    pub rows: &'a [&'a [f32]],
    /// Their dataset ids.
    pub ids: &'a [usize],
    /// Per-row bound values: l2 (|x|², |x|), inner product (|x|, 0), cosine (1/|x|, 0).
    pub xa: &'a [f32],
    pub xb: &'a [f32],
}

/// Offers every row of `block` to every query's selection (`tops[i]` is query
/// `i` of `q`); `exact(i, id)` is the reference distance of query `i` to row
/// `id` (for [`TopK`]'s compaction).
pub(super) fn scan_block(
    q: &mut PackedQueries,
    block: &RowBlock<'_>,
    consts: BoundConsts,
    tops: &mut [TopK],
    exact: &mut dyn FnMut(usize, usize) -> f32,
) {
    let m = block.rows.len();
    assert!(block.ids.len() == m && block.xa.len() == m && block.xb.len() == m);
    assert!(block.rows.iter().all(|r| r.len() == q.dim));
    assert_eq!(tops.len(), q.n);
    let mut st = State {
        q,
        block,
        consts,
        tops,
        exact,
    };
    match st.q.kernel {
        CpuKernel::Gemm => unreachable!("PackedQueries::new refuses the GEMM kernel"),
        // SAFETY: a PackedQueries for a fused kernel exists only after
        // `CpuKernel::usable` chose it on this CPU (parent module), and the
        // asserts above give every row `dim` elements.
        #[cfg(target_arch = "x86_64")]
        CpuKernel::Avx512 | CpuKernel::Avx512Vnni => unsafe { scan_avx512(&mut st) },
        #[cfg(target_arch = "x86_64")]
        CpuKernel::Avx2 => unsafe { scan_avx2(&mut st) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("fused kernels are x86_64 only (CpuKernel::available)"),
    }
}

struct State<'s, 'a> {
    q: &'s mut PackedQueries,
    block: &'s RowBlock<'a>,
    consts: BoundConsts,
    tops: &'s mut [TopK],
    exact: &'s mut dyn FnMut(usize, usize) -> f32,
}

// The metric as a const generic parameter of the kernels (here and `vnni`).
pub(super) const L2: u8 = 0;
pub(super) const IP: u8 = 1;
pub(super) const COS: u8 = 2;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scan_avx512(st: &mut State<'_, '_>) {
    match st.consts.metric {
        Metric::L2 => scan::<Avx512, AVX512_QV, AVX512_R, L2>(st),
        Metric::InnerProduct => scan::<Avx512, AVX512_QV, AVX512_R, IP>(st),
        Metric::Cosine => scan::<Avx512, AVX512_QV, AVX512_R, COS>(st),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scan_avx2(st: &mut State<'_, '_>) {
    match st.consts.metric {
        Metric::L2 => scan::<Avx2, AVX2_QV, AVX2_R, L2>(st),
        Metric::InnerProduct => scan::<Avx2, AVX2_QV, AVX2_R, IP>(st),
        Metric::Cosine => scan::<Avx2, AVX2_QV, AVX2_R, COS>(st),
    }
}

/// Every panel over every row of the block: whole tiles of R rows, then the
/// block's last rows one at a time.
#[inline(always)]
unsafe fn scan<S: Simd, const QV: usize, const R: usize, const M: u8>(st: &mut State<'_, '_>) {
    let p = QV * S::LANES;
    let m = st.block.rows.len();
    for q0 in (0..st.q.thr.len()).step_by(p) {
        let mut j = 0;
        while j + R <= m {
            tile::<S, QV, R, M>(st, q0, j);
            j += R;
        }
        while j < m {
            tile::<S, QV, 1, M>(st, q0, j);
            j += 1;
        }
    }
}

/// Rows `j .. j + R` against panel queries `q0 .. q0 + P`.
#[inline(always)]
unsafe fn tile<S: Simd, const QV: usize, const R: usize, const M: u8>(
    st: &mut State<'_, '_>,
    q0: usize,
    j: usize,
) {
    let (lanes, dim) = (S::LANES, st.q.dim);
    let p = QV * lanes;
    let panel = st.q.panels.as_ptr().add(q0 * dim);
    let rows: [*const f32; R] = std::array::from_fn(|r| st.block.rows[j + r].as_ptr());
    let mut acc = [[S::zero(); QV]; R];
    for l in 0..dim {
        let qv: [S::V; QV] = std::array::from_fn(|v| S::load(panel.add(l * p + v * lanes)));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = S::splat_load(rows[r].add(l));
            for v in 0..QV {
                acc_r[v] = S::fma(qv[v], x, acc_r[v]);
            }
        }
    }
    let c = st.consts;
    for (r, acc_r) in acc.iter().enumerate() {
        let jr = j + r;
        let xa = S::splat(st.block.xa[jr]);
        let xb = S::splat(st.block.xb[jr]);
        for (v, &dot) in acc_r.iter().enumerate() {
            let qi = q0 + v * lanes;
            let qa = S::load(st.q.qa.as_ptr().add(qi));
            let lo = match M {
                // (qq + xx) − 2·dot − (c·(s·s) + abs), s = qn + xn (L2Approx::lows)
                L2 => {
                    let qb = S::load(st.q.qb.as_ptr().add(qi));
                    let d = S::sub(S::add(qa, xa), S::mul(S::splat(2.0), dot));
                    let s = S::add(qb, xb);
                    S::sub(
                        d,
                        S::add(S::mul(S::splat(c.c), S::mul(s, s)), S::splat(c.e)),
                    )
                }
                // −dot − (cq·xn + abs) (IpApprox::lows); −dot as an exact product by −1
                IP => S::sub(
                    S::mul(dot, S::splat(-1.0)),
                    S::add(S::mul(qa, xa), S::splat(c.e)),
                ),
                // (1 − (dot·qinv)·xinv) − e (CosApprox::lows)
                _ => S::sub(
                    S::sub(S::splat(1.0), S::mul(S::mul(dot, qa), xa)),
                    S::splat(c.e),
                ),
            };
            let mask = S::lt_mask(lo, S::load(st.q.thr.as_ptr().add(qi)));
            if mask != 0 {
                let mut dots = [0.0f32; 16];
                S::store(dot, dots.as_mut_ptr());
                offer_lanes(st, &dots[..lanes], mask, qi, jr);
            }
        }
    }
}

/// The rare path: offers (query `q0 + lane`, row `j`) for every set bit of
/// `mask`, with the scalar bounds of the parent module.
#[inline(never)]
fn offer_lanes(st: &mut State<'_, '_>, dots: &[f32], mut mask: u32, q0: usize, j: usize) {
    let b = st.block;
    let c = st.consts;
    while mask != 0 {
        let lane = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        let i = q0 + lane;
        let dot = dots[lane];
        let (qa, qb) = (st.q.qa[i], st.q.qb[i]);
        let (d, e) = match c.metric {
            Metric::L2 => L2Approx {
                qq: qa,
                qn: qb,
                xx: b.xa,
                xn: b.xb,
                c: c.c,
                abs: c.e,
            }
            .bounds(dot, j),
            Metric::InnerProduct => IpApprox {
                cq: qa,
                xn: b.xa,
                abs: c.e,
            }
            .bounds(dot, j),
            Metric::Cosine => CosApprox {
                qinv: qa,
                xinv: b.xa,
                e: c.e,
            }
            .bounds(dot, j),
        };
        let exact = &mut *st.exact;
        let top = &mut st.tops[i];
        top.offer(
            Cand {
                lo: d - e,
                hi: d + e,
                id: b.ids[j],
                exact: false,
            },
            &mut |id| exact(i, id),
        );
        st.q.thr[i] = top.threshold();
    }
}
