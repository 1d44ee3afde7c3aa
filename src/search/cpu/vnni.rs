//! The exact integer scan for i8 and u8 with AVX-512 VNNI: dot products of
//! bytes (`vpdpbusd`, 64 multiply-adds per instruction against the fused
//! float kernel's 16), and every distance computed exactly, so that the
//! selection needs no error margin and no re-rank.
//!
//! Why exact: every integer sum fits its 32-bit accumulator for the dims
//! served here ([`serves`]: a multiple of 4, at most [`MAX_DIM`]), so the dot
//! product, and with the squared norms the l2 distance, are the integers the
//! reference fold computes (`Element::distance` for i8/u8). Converted to f32
//! once and finalised with the same IEEE operations in the same order, they
//! are the reference distances bit for bit; candidates enter [`TopK`] as
//! exact (`lo = hi = d`).
//!
//! `vpdpbusd` multiplies unsigned bytes by signed bytes. Flipping a byte's top
//! bit (`^ 0x80`) maps i8 `v` to the u8 `v + 128` and u8 `v` to the i8
//! `v − 128`, so one packing serves both types:
//! - i8: queries flipped (unsigned operand), rows as they are (signed):
//!   `Σ (q + 128)·x = q·x + 128·Σx`;
//! - u8: rows as they are (unsigned operand), queries flipped (signed):
//!   `Σ x·(q − 128) = q·x − 128·Σx`.
//!
//! Each row's correction `∓128·Σx` is computed once per search ([`IntRows`]).
//!
//! Layout and tiling follow the fused float kernel (`fused` module): queries
//! packed per task in panels of 64, or of 16 for fewer than 48 queries (for
//! each group of 4 elements, the panel's queries' 4 bytes side by side: one
//! vector load per 16 queries), rows read where they are (one 4-byte
//! broadcast per row and group), a register tile of 4 query vectors × 6 rows
//! (24 + 4 + 1 of 32 registers), or 1 × 8, of i32 accumulators.
//!
//! A task of one query packs no panel, where 15 of 16 lanes would be padding:
//! its bytes are multiplied with each row's 64 at a time (`vpdpbusd` on whole
//! rows, the last partial 64 masked), one row's sum reduced across the lanes,
//! and 16 rows' distances finalised together, rows as lanes ([`scan_one`]).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::fused::{COS, IP, L2};
use super::{Cand, Metric, TopK};

/// The largest dim served: every sum then fits (u8: `Σ q·x ≤ 65025·dim <
/// 2³¹`, `Σ x·(q − 128)` and `128·Σx` within ±`32640·dim`; i8 likewise,
/// smaller), and the reference's i32/u32 folds do not wrap.
pub(super) const MAX_DIM: usize = 33_024;

/// Register tiles: `QV` query vectors (16 lanes each) × `R` rows of i32
/// accumulators. Wide panels (64 queries × 6 rows: 24 + 4 + 1 of the 32
/// registers) for many queries; narrow ones (16 queries × 8 rows) for few,
/// where most lanes of a wide panel would be padding.
const WIDE: (usize, usize) = (4, 6);
const NARROW: (usize, usize) = (1, 8);

/// Below this many queries a task packs narrow panels.
const NARROW_BELOW: usize = 48;

/// Rows per block: about 256 KiB of rows (L2-resident while every query
/// panel passes over them, as the float kernel's blocks of f32 rows), a
/// multiple of both tiles' heights (6 and 8) so that only a shard's last
/// block has rows left over for one-row tiles, and at most 2040 (the float
/// blocks' 2046, rounded to the tiles): more blocks make more shards for the
/// threads to share.
pub(super) fn block_rows(dim: usize) -> usize {
    const TILES: usize = 24;
    ((262_144 / dim.max(1)) / TILES * TILES).clamp(TILES, 2040)
}

/// Whether this CPU has the instructions (AVX-512F, BW and VNNI).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the kernel serves vectors of `dim` elements: whole 4-byte groups
/// (rows are read in place, 4 bytes at a time) and sums that cannot wrap.
pub(super) fn serves(dim: usize) -> bool {
    dim > 0 && dim.is_multiple_of(4) && dim <= MAX_DIM
}

/// The bytes of i8 or u8 data and whether they are signed.
#[derive(Clone, Copy)]
pub(crate) struct Bytes<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) signed: bool,
}

/// Σx and Σx² of one vector (exact; `dim ≤ MAX_DIM`). One loop per
/// signedness, so that each vectorises.
fn sums(v: &[u8], signed: bool) -> (i32, u32) {
    if signed {
        let s = v.iter().map(|&b| b as i8 as i32).sum();
        let sq = v
            .iter()
            .map(|&b| (b as i8 as i32 * b as i8 as i32) as u32)
            .sum();
        (s, sq)
    } else {
        let s = v.iter().map(|&b| b as i32).sum();
        let sq = v.iter().map(|&b| b as u32 * b as u32).sum();
        (s, sq)
    }
}

/// [`sums`] with the kernel's own instruction, 64 bytes at a time (the last
/// part masked): `Σx` is the dot product with ones, and `Σx²` comes from
/// the product with the flipped bytes, `Σ x·(x ^ 0x80)` = `Σx² ± 128·Σx`
/// (i8: `(x + 128)·x`, u8: `x·(x − 128)`), every partial sum within ±2³¹
/// for `v.len() ≤ MAX_DIM`. A search of one query reads its rows twice, for
/// these sums and for the scan: with the scalar loops the sums took most of
/// its time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn sums_vnni(v: &[u8], signed: bool) -> (i32, u32) {
    let flip = _mm512_set1_epi8(0x80u8 as i8);
    let ones = _mm512_set1_epi8(1);
    let (mut s, mut sq) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    for part in v.chunks(64) {
        let mask: __mmask64 = if part.len() == 64 {
            !0
        } else {
            (1u64 << part.len()) - 1
        };
        let x = _mm512_maskz_loadu_epi8(mask, part.as_ptr().cast());
        // Masked-off bytes are 0 in x; their flipped 0x80 meets a 0 operand.
        let xf = _mm512_xor_si512(x, flip);
        if signed {
            s = _mm512_dpbusd_epi32(s, ones, x);
            sq = _mm512_dpbusd_epi32(sq, xf, x);
        } else {
            s = _mm512_dpbusd_epi32(s, x, ones);
            sq = _mm512_dpbusd_epi32(sq, x, xf);
        }
    }
    let s = _mm512_reduce_add_epi32(s);
    let shifted = _mm512_reduce_add_epi32(sq);
    // Wrapping: Σx² < 2³² is the u32 these bits hold.
    let sq = if signed {
        shifted.wrapping_sub(s.wrapping_mul(128))
    } else {
        shifted.wrapping_add(s.wrapping_mul(128))
    };
    (s, sq as u32)
}

/// Σx and Σx² of each of `rows` (in parallel).
pub(super) fn row_sums(b: Bytes<'_>, dim: usize, rows: &[usize]) -> Vec<(i32, u32)> {
    use rayon::prelude::*;
    let row = |r: usize| &b.data[r * dim..(r + 1) * dim];
    #[cfg(target_arch = "x86_64")]
    if available() && dim <= MAX_DIM {
        // SAFETY: `available()` holds; rows of at most MAX_DIM bytes.
        return rows
            .par_iter()
            .map(|&r| unsafe { sums_vnni(row(r), b.signed) })
            .collect();
    }
    rows.par_iter().map(|&r| sums(row(r), b.signed)).collect()
}

/// Per-row values of one search, for the rows of the caller's `normal` list
/// (indexed like it).
pub(super) struct IntRows {
    /// What turns the instruction's sum into the dot product: `∓128·Σx`.
    corr: Vec<i32>,
    /// Σx² (l2).
    xx: Vec<u32>,
    /// √(Σx² as f32) (cosine).
    xs: Vec<f32>,
}

impl IntRows {
    /// From each row's [`row_sums`].
    pub(super) fn from_sums(signed: bool, sums: &[(i32, u32)]) -> Self {
        IntRows {
            corr: sums
                .iter()
                .map(|&(s, _)| if signed { -128 * s } else { 128 * s })
                .collect(),
            xx: sums.iter().map(|&(_, sq)| sq).collect(),
            xs: sums.iter().map(|&(_, sq)| (sq as f32).sqrt()).collect(),
        }
    }
}

/// One task's queries, packed, with their selection state.
pub(super) struct IntQueries {
    dim: usize,
    /// Queries per panel: 16 (narrow) or 64 (wide); 1 for a single query.
    p: usize,
    /// Real queries (the rest of the last panel is padding).
    n: usize,
    /// `panels[j·p·dim + (g·p + i)·4 + e]` = element `4g + e` of query
    /// `j·p + i`, top bit flipped; padding lanes 0 (no contribution).
    panels: Vec<u8>,
    /// Σq² and √(Σq² as f32), padded to whole panels.
    qq: Vec<u32>,
    qs: Vec<f32>,
    /// [`TopK::threshold`] per query; −inf for padding lanes (never pass).
    thr: Vec<f32>,
}

impl IntQueries {
    /// Packs `queries` (each `dim` bytes of the search's type).
    pub(super) fn new(queries: &[&[u8]], signed: bool, dim: usize) -> Self {
        assert!(serves(dim) && queries.iter().all(|q| q.len() == dim));
        let n = queries.len();
        // One query: its flipped bytes in order (the layout below with p = 1).
        let p = match n {
            1 => 1,
            _ if n < NARROW_BELOW => NARROW.0 * 16,
            _ => WIDE.0 * 16,
        };
        let np = n.div_ceil(p);
        let mut panels = vec![0u8; np * p * dim];
        let (mut qq, mut qs) = (vec![0u32; np * p], vec![0f32; np * p]);
        for (i, q) in queries.iter().enumerate() {
            let panel = &mut panels[(i / p) * p * dim..][..p * dim];
            for (l, &v) in q.iter().enumerate() {
                panel[((l / 4) * p + i % p) * 4 + l % 4] = v ^ 0x80;
            }
            let (_, sq) = sums(q, signed);
            qq[i] = sq;
            qs[i] = (sq as f32).sqrt();
        }
        let mut thr = vec![f32::INFINITY; n];
        thr.resize(np * p, f32::NEG_INFINITY);
        IntQueries {
            dim,
            p,
            n,
            panels,
            qq,
            qs,
            thr,
        }
    }
}

/// One block of rows: their ids (ascending), their bytes, and their slice of
/// the search's [`IntRows`] (`at`: index of the block's first row there).
pub(super) struct IntBlock<'a> {
    pub rows: &'a [&'a [u8]],
    pub ids: &'a [usize],
    pub aux: &'a IntRows,
    pub at: usize,
}

/// Offers every row of `block` to every query's selection (`tops[i]` is query
/// `i` of `q`), with exact distances.
pub(super) fn scan_block(
    q: &mut IntQueries,
    block: &IntBlock<'_>,
    signed: bool,
    metric: Metric,
    tops: &mut [TopK],
    exact: &mut dyn FnMut(usize, usize) -> f32,
) {
    let m = block.rows.len();
    assert!(block.ids.len() == m && block.at + m <= block.aux.corr.len());
    assert!(block.rows.iter().all(|r| r.len() == q.dim));
    assert_eq!(tops.len(), q.n);
    assert!(
        available(),
        "the VNNI kernel runs only where CpuKernel::available says so"
    );
    let mut st = State {
        q,
        block,
        tops,
        exact,
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` holds (asserted above) and every row has `dim`
    // bytes, a multiple of 4 (`IntQueries::new` asserted `serves(dim)`).
    unsafe {
        if st.q.p == 1 {
            scan_one_metric(&mut st, signed, metric)
        } else if st.q.p == WIDE.0 * 16 {
            scan_metric::<{ WIDE.0 }, { WIDE.1 }>(&mut st, signed, metric)
        } else {
            scan_metric::<{ NARROW.0 }, { NARROW.1 }>(&mut st, signed, metric)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (&mut st, signed, metric);
}

struct State<'s, 'a> {
    q: &'s mut IntQueries,
    block: &'s IntBlock<'a>,
    tops: &'s mut [TopK],
    exact: &'s mut dyn FnMut(usize, usize) -> f32,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scan_metric<const QV: usize, const R: usize>(
    st: &mut State<'_, '_>,
    signed: bool,
    metric: Metric,
) {
    match (signed, metric) {
        (true, Metric::L2) => scan::<QV, R, true, L2>(st),
        (true, Metric::InnerProduct) => scan::<QV, R, true, IP>(st),
        (true, Metric::Cosine) => scan::<QV, R, true, COS>(st),
        (false, Metric::L2) => scan::<QV, R, false, L2>(st),
        (false, Metric::InnerProduct) => scan::<QV, R, false, IP>(st),
        (false, Metric::Cosine) => scan::<QV, R, false, COS>(st),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scan_one_metric(st: &mut State<'_, '_>, signed: bool, metric: Metric) {
    match (signed, metric) {
        (true, Metric::L2) => scan_one::<true, L2>(st),
        (true, Metric::InnerProduct) => scan_one::<true, IP>(st),
        (true, Metric::Cosine) => scan_one::<true, COS>(st),
        (false, Metric::L2) => scan_one::<false, L2>(st),
        (false, Metric::InnerProduct) => scan_one::<false, IP>(st),
        (false, Metric::Cosine) => scan_one::<false, COS>(st),
    }
}

/// One query over every row of the block, 16 rows at a time: each row's
/// instruction sum (its bytes and the query's, 64 at a time, the last
/// partial 64 masked: a masked load reads nothing beyond the row) reduced
/// across the lanes, then the 16 rows finalised as [`tile`] finalises one
/// query's lanes, rows as lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scan_one<const SIGNED: bool, const M: u8>(st: &mut State<'_, '_>) {
    let (dim, m) = (st.q.dim, st.block.rows.len());
    let q = st.q.panels.as_ptr();
    let (whole, tail) = (dim / 64, dim % 64);
    let tail_mask: __mmask64 = (1u64 << tail) - 1;
    let mut j = 0;
    while j < m {
        let c = (m - j).min(16);
        let mut raw = [0i32; 16];
        for (r, raw_r) in raw.iter_mut().enumerate().take(c) {
            let x = st.block.rows[j + r].as_ptr();
            let mut acc = _mm512_setzero_si512();
            let dp = |acc: __m512i, qv: __m512i, xv: __m512i| {
                // The unsigned operand first: i8 queries flipped, u8 rows.
                if SIGNED {
                    _mm512_dpbusd_epi32(acc, qv, xv)
                } else {
                    _mm512_dpbusd_epi32(acc, xv, qv)
                }
            };
            for g in 0..whole {
                let qv = _mm512_loadu_si512(q.add(64 * g).cast());
                let xv = _mm512_loadu_si512(x.add(64 * g).cast());
                acc = dp(acc, qv, xv);
            }
            if tail != 0 {
                let qv = _mm512_maskz_loadu_epi8(tail_mask, q.add(64 * whole).cast());
                let xv = _mm512_maskz_loadu_epi8(tail_mask, x.add(64 * whole).cast());
                acc = dp(acc, qv, xv);
            }
            // Wrapping adds: the exact sum, whatever the order (it fits).
            *raw_r = _mm512_reduce_add_epi32(acc);
        }
        finish_one::<SIGNED, M>(st, &raw, j, c);
        j += c;
    }
}

/// Rows `j .. j + c` (c ≤ 16, lanes beyond c ignored) of one query: their
/// instruction sums `raw` to exact distances, offered where below the
/// query's threshold.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn finish_one<const SIGNED: bool, const M: u8>(
    st: &mut State<'_, '_>,
    raw: &[i32; 16],
    j: usize,
    c: usize,
) {
    let aux = st.block.aux;
    let at = st.block.at + j;
    // The rows' values as lanes (padding lanes 0 or 1: never offered).
    let lanes_i = |v: &[i32]| {
        let mut a = [0i32; 16];
        a[..c].copy_from_slice(&v[at..at + c]);
        _mm512_loadu_si512(a.as_ptr().cast())
    };
    let dot = _mm512_add_epi32(_mm512_loadu_si512(raw.as_ptr().cast()), lanes_i(&aux.corr));
    let (q, xs) = (&*st.q, &aux.xs);
    let d = distances::<SIGNED, M>(
        dot,
        || _mm512_set1_epi32(q.qq[0] as i32),
        || {
            let mut xx = [0u32; 16];
            xx[..c].copy_from_slice(&aux.xx[at..at + c]);
            _mm512_loadu_si512(xx.as_ptr().cast())
        },
        || _mm512_set1_ps(q.qs[0]),
        || {
            let mut v = [1.0f32; 16];
            v[..c].copy_from_slice(&xs[at..at + c]);
            _mm512_loadu_ps(v.as_ptr())
        },
    );
    let valid = ((1u32 << c) - 1) as u16;
    let thr = _mm512_set1_ps(st.q.thr[0]);
    let mask = _mm512_mask_cmp_ps_mask::<_CMP_LT_OQ>(valid, d, thr) as u32;
    if mask != 0 {
        let mut ds = [0.0f32; 16];
        _mm512_storeu_ps(ds.as_mut_ptr(), d);
        offer_rows(st, &ds, mask, j);
    }
}

/// The rare path of one query: offers row `j + lane` with its exact
/// distance for every set bit of `mask`, in row order, each still below the
/// threshold the rows before it left (as [`tile`] offers them, a row at a
/// time).
#[inline(never)]
fn offer_rows(st: &mut State<'_, '_>, ds: &[f32; 16], mut mask: u32, j: usize) {
    while mask != 0 {
        let lane = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        let d = ds[lane];
        if d.partial_cmp(&st.q.thr[0]) != Some(std::cmp::Ordering::Less) {
            continue;
        }
        let exact = &mut *st.exact;
        let top = &mut st.tops[0];
        top.offer(
            Cand {
                lo: d,
                hi: d,
                id: st.block.ids[j + lane],
                exact: true,
            },
            &mut |id| exact(0, id),
        );
        st.q.thr[0] = top.threshold();
    }
}

/// Every panel over every row of the block: whole tiles of R rows, then the
/// block's last rows one at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scan<const QV: usize, const R: usize, const SIGNED: bool, const M: u8>(
    st: &mut State<'_, '_>,
) {
    let m = st.block.rows.len();
    for q0 in (0..st.q.thr.len()).step_by(QV * 16) {
        let mut j = 0;
        while j + R <= m {
            tile::<QV, R, SIGNED, M>(st, q0, j);
            j += R;
        }
        while j < m {
            tile::<QV, 1, SIGNED, M>(st, q0, j);
            j += 1;
        }
    }
}

/// Rows `j .. j + R` against panel queries `q0 .. q0 + 16·QV`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<const QV: usize, const R: usize, const SIGNED: bool, const M: u8>(
    st: &mut State<'_, '_>,
    q0: usize,
    j: usize,
) {
    let (dim, p) = (st.q.dim, QV * 16);
    let panel = st.q.panels.as_ptr().add(q0 * dim);
    let rows: [*const u8; R] = std::array::from_fn(|r| st.block.rows[j + r].as_ptr());
    let mut acc = [[_mm512_setzero_si512(); QV]; R];
    for g in 0..dim / 4 {
        let qv: [__m512i; QV] =
            std::array::from_fn(|v| _mm512_loadu_si512(panel.add((g * p + v * 16) * 4).cast()));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_epi32(rows[r].add(4 * g).cast::<i32>().read_unaligned());
            for v in 0..QV {
                // The unsigned operand first: i8 queries flipped, u8 rows.
                acc_r[v] = if SIGNED {
                    _mm512_dpbusd_epi32(acc_r[v], qv[v], x)
                } else {
                    _mm512_dpbusd_epi32(acc_r[v], x, qv[v])
                };
            }
        }
    }
    let aux = st.block.aux;
    for (r, acc_r) in acc.iter().enumerate() {
        let jr = j + r;
        let at = st.block.at + jr;
        // The exact dot products (u8: their bits as u32).
        let corr = _mm512_set1_epi32(aux.corr[at]);
        for (v, &raw) in acc_r.iter().enumerate() {
            let qi = q0 + v * 16;
            let dot = _mm512_add_epi32(raw, corr);
            let q = &*st.q;
            let d = distances::<SIGNED, M>(
                dot,
                || _mm512_loadu_si512(q.qq.as_ptr().add(qi).cast()),
                || _mm512_set1_epi32(aux.xx[at] as i32),
                || _mm512_loadu_ps(q.qs.as_ptr().add(qi)),
                || _mm512_set1_ps(aux.xs[at]),
            );
            let thr = _mm512_loadu_ps(st.q.thr.as_ptr().add(qi));
            let mask = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(d, thr) as u32;
            if mask != 0 {
                let mut ds = [0.0f32; 16];
                _mm512_storeu_ps(ds.as_mut_ptr(), d);
                offer_lanes(st, &ds, mask, qi, jr);
            }
        }
    }
}

/// Exact distances of 16 lanes (queries of a panel, or rows of one query)
/// from their dot products `dot` (the rows' corrections added) and, taken
/// only where the metric needs them, the lanes' Σq² and Σx² (l2) or √Σq² and
/// √Σx² (cosine): the reference's integer folds, converted and finalised
/// with its IEEE operations in its order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn distances<const SIGNED: bool, const M: u8>(
    dot: __m512i,
    qq: impl FnOnce() -> __m512i,
    xx: impl FnOnce() -> __m512i,
    qs: impl FnOnce() -> __m512,
    xs: impl FnOnce() -> __m512,
) -> __m512 {
    // u8: the dot products' bits as u32.
    let as_f32 = |x: __m512i| {
        if SIGNED {
            _mm512_cvtepi32_ps(x)
        } else {
            _mm512_cvtepu32_ps(x)
        }
    };
    match M {
        // qq + xx − 2·dot: Σ(q − x)² ∈ [0, 2³²), exact in wrapping
        // 32-bit arithmetic; the reference's `a as f32`.
        L2 => {
            let s = _mm512_add_epi32(qq(), xx());
            _mm512_cvtepu32_ps(_mm512_sub_epi32(s, _mm512_add_epi32(dot, dot)))
        }
        // −(a as f32): an exact product by −1 (so 0 gives −0, as the reference).
        IP => _mm512_mul_ps(as_f32(dot), _mm512_set1_ps(-1.0)),
        // finalize_cosine: 1 − a / (√qq · √xx); zero norms are special rows
        // and queries, never here.
        _ => {
            let denom = _mm512_mul_ps(qs(), xs());
            _mm512_sub_ps(_mm512_set1_ps(1.0), _mm512_div_ps(as_f32(dot), denom))
        }
    }
}

/// The rare path: offers (query `q0 + lane`, row `j`) with its exact distance
/// for every set bit of `mask`.
#[inline(never)]
fn offer_lanes(st: &mut State<'_, '_>, ds: &[f32; 16], mut mask: u32, q0: usize, j: usize) {
    while mask != 0 {
        let lane = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        let i = q0 + lane;
        let d = ds[lane];
        let exact = &mut *st.exact;
        let top = &mut st.tops[i];
        top.offer(
            Cand {
                lo: d,
                hi: d,
                id: st.block.ids[j],
                exact: true,
            },
            &mut |id| exact(i, id),
        );
        st.q.thr[i] = top.threshold();
    }
}
