//! The cost model: should an operation run on the GPU or on the CPU?
//!
//! An operation is described by an [`OpDesc`] (bytes each way, work on each
//! side, whether its kernel still needs a link). The analytical model:
//!
//! ```text
//! gpu = (bytes_to + bytes_from) / pcie_bandwidth + launch_overhead
//!       + gpu_work / gpu_throughput
//!       + (link_cost if the kernel is not linked yet)
//! cpu = cpu_overhead + cpu_work / cpu_throughput
//! ```
//!
//! The link is a one-time cost of a configuration, not of the operation's
//! size: learning's correction (below) never scales it, and the link cost in
//! use is the mean of the links observed ([`AdaptiveCostModel::learn_link`]),
//! [`GpuParams::link_s`] until the first.
//!
//! where `cpu_throughput` is **calibrated** on this machine once per process: a
//! ~10 ms micro-benchmark of an f32 dot-product loop on every rayon thread
//! ([`calibrated_cpu_throughput`]), cached; [`CostParams::cpu_throughput`]
//! overrides it (tests). Work is counted in flops (a multiply-add is 2).
//!
//! **Adaptive learning.** [`GpuCostModel::learn`] records observed durations per
//! (operation, size bucket = ⌊log2 work⌋, target) as ratios observed /
//! analytical (a ratio, not an absolute time, so that sizes within a bucket
//! still scale). Once a key has `min_samples` observations, its estimate becomes
//! the blend `(1 − w) · analytical + w · mean ratio · analytical` with weight
//! `w = n / (n + prior_weight)`, which tends to the observed mean as n grows;
//! the estimate's confidence rises from the analytical one towards 1 by the
//! same weight. Lookups take no lock (a fixed table of operations and
//! sequence-locked statistics, `table` module) and one hash of the operation
//! name; a warm [`GpuCostModel::choose`] costs well under 100 ns
//! (`cargo bench --bench cost`). At most 256 distinct operations are learned
//! per model; later ones keep their analytical estimates.
//!
//! **No GPU** ([`GpuAvailability::Unavailable`]): every choice is the CPU with
//! [`Reason::NoGpu`], displayed as `no GPU: <why>`.
//!
//! **Recovery** ([`run_with_fallback`], [`execute`]): run the GPU closure with a
//! batch size; on an out-of-memory error retry with the batch halved down to a
//! minimum, on any other error (or out of memory at the minimum) run the CPU
//! closure; the [`FallbackResult`] says what ran, whether it fell back, why, and
//! every attempt. It is generic over [`RecoverableError`], so it does not depend
//! on the GPU module's error type.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

mod table;

use table::{Stat, StatTable, BUCKETS};

/// Where an operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Cpu,
    Gpu,
}

impl Target {
    fn index(self) -> usize {
        match self {
            Target::Cpu => 0,
            Target::Gpu => 1,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Target::Cpu => "cpu",
            Target::Gpu => "gpu",
        })
    }
}

/// An operation to place.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDesc {
    /// The kind of operation (learning is per operation name and size bucket).
    pub operation: Cow<'static, str>,
    /// Bytes to copy host → device before the kernel (0 if already resident).
    pub bytes_to_device: u64,
    /// Bytes to copy device → host afterwards.
    pub bytes_from_device: u64,
    /// Work the GPU does, in flops (or any unit matching the GPU throughput).
    pub gpu_work: f64,
    /// Work the CPU path does, in flops (the unit of the calibration).
    pub cpu_work: f64,
    /// The kernel is not linked / loaded yet: add the link cost.
    pub needs_link: bool,
}

impl OpDesc {
    pub fn new(operation: impl Into<Cow<'static, str>>) -> Self {
        OpDesc {
            operation: operation.into(),
            bytes_to_device: 0,
            bytes_from_device: 0,
            gpu_work: 0.0,
            cpu_work: 0.0,
            needs_link: false,
        }
    }

    pub fn to_device(mut self, bytes: u64) -> Self {
        self.bytes_to_device = bytes;
        self
    }

    pub fn from_device(mut self, bytes: u64) -> Self {
        self.bytes_from_device = bytes;
        self
    }

    /// The same work on both sides.
    pub fn work(mut self, flops: f64) -> Self {
        self.gpu_work = flops;
        self.cpu_work = flops;
        self
    }

    pub fn gpu_work(mut self, flops: f64) -> Self {
        self.gpu_work = flops;
        self
    }

    pub fn cpu_work(mut self, flops: f64) -> Self {
        self.cpu_work = flops;
        self
    }

    pub fn needs_link(mut self, yes: bool) -> Self {
        self.needs_link = yes;
        self
    }

    /// A brute-force comparison of `queries` vectors against `rows` vectors of
    /// `dim` elements of `element_bytes` each, keeping `per_query` results of 12
    /// bytes (an i64 id and an f32 value) per query: 2 flops per element pair;
    /// uploads the queries (and the rows unless `rows_resident`), downloads the
    /// results. The operations that are such scans name themselves
    /// (`OpDesc::knn`, defined beside the search in `search::ops`), so this
    /// module knows operations by their shape only.
    pub fn brute_force(
        operation: impl Into<Cow<'static, str>>,
        rows: usize,
        dim: usize,
        queries: usize,
        per_query: usize,
        element_bytes: usize,
        rows_resident: bool,
    ) -> Self {
        let es = element_bytes as u64;
        let base = if rows_resident {
            0
        } else {
            (rows as u64).saturating_mul(dim as u64).saturating_mul(es)
        };
        OpDesc::new(operation)
            .to_device(
                base.saturating_add(
                    (queries as u64)
                        .saturating_mul(dim as u64)
                        .saturating_mul(es),
                ),
            )
            .from_device(
                (queries as u64)
                    .saturating_mul(per_query as u64)
                    .saturating_mul(12),
            )
            .work(2.0 * rows as f64 * dim as f64 * queries as f64)
    }

    /// ⌊log2(work)⌋ of the larger of the two work figures (0 below 2).
    #[inline]
    pub fn size_bucket(&self) -> u32 {
        let w = self.gpu_work.max(self.cpu_work);
        if w.is_nan() || w < 2.0 {
            return 0;
        }
        let exp = ((w.to_bits() >> 52) & 0x7ff) as i64 - 1023;
        exp.clamp(0, BUCKETS as i64 - 1) as u32
    }
}

/// An estimated execution time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Total, seconds (+inf when the target is unavailable).
    pub seconds: f64,
    /// Host ↔ device copies (GPU only), seconds, before learning's correction.
    pub transfer_s: f64,
    /// Fixed costs: launch (GPU), fork/join (CPU), seconds, uncorrected.
    pub overhead_s: f64,
    /// Linking and loading kernels not linked yet (GPU), seconds; added
    /// after the correction, which it never enters.
    pub link_s: f64,
    /// Work / throughput, seconds, uncorrected.
    pub compute_s: f64,
    /// The learned correction factor applied to the analytical sum (1 = none).
    pub correction: f64,
    /// Confidence in the estimate, 0 … 1.
    pub confidence: f32,
    /// Observations behind the correction.
    pub samples: u64,
}

impl Cost {
    /// An unavailable target.
    pub const UNAVAILABLE: Cost = Cost {
        seconds: f64::INFINITY,
        transfer_s: 0.0,
        overhead_s: 0.0,
        link_s: 0.0,
        compute_s: f64::INFINITY,
        correction: 1.0,
        confidence: 1.0,
        samples: 0,
    };

    /// The estimate as a duration (saturating).
    pub fn time(&self) -> Duration {
        Duration::try_from_secs_f64(self.seconds).unwrap_or(Duration::MAX)
    }

    /// The part learning corrects: everything but the link.
    fn analytical(&self) -> f64 {
        self.transfer_s + self.overhead_s + self.compute_s
    }
}

/// Why a target was chosen. `Display` gives the text (formatting happens only
/// when someone asks, so a decision allocates nothing).
#[derive(Debug, Clone, PartialEq)]
pub enum Reason {
    /// No usable GPU; the payload says why.
    NoGpu(Arc<str>),
    /// The GPU's estimate was lower.
    GpuFaster { gpu_s: f64, cpu_s: f64 },
    /// The CPU's estimate was lower (or equal).
    CpuFaster { gpu_s: f64, cpu_s: f64 },
    /// The CPU's estimate was lower only because the GPU's kernels still
    /// need a link (`link_s` of `gpu_s`); linked, the GPU would win
    /// ([`AdaptiveCostModel::choose_unlinked`]).
    CpuUntilLinked { gpu_s: f64, cpu_s: f64, link_s: f64 },
    /// [`CostParams::force`] chose.
    Forced(Target),
}

fn fmt_secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoGpu(why) => write!(f, "no GPU: {why}"),
            Reason::GpuFaster { gpu_s, cpu_s } => write!(
                f,
                "GPU estimated faster: {} vs {} on the CPU",
                fmt_secs(*gpu_s),
                fmt_secs(*cpu_s)
            ),
            Reason::CpuFaster { gpu_s, cpu_s } => write!(
                f,
                "CPU estimated faster: {} vs {} on the GPU",
                fmt_secs(*cpu_s),
                fmt_secs(*gpu_s)
            ),
            Reason::CpuUntilLinked {
                gpu_s,
                cpu_s,
                link_s,
            } => write!(
                f,
                "CPU estimated faster until the GPU kernels are linked: {} vs {} on the GPU, {} of it the link",
                fmt_secs(*cpu_s),
                fmt_secs(*gpu_s),
                fmt_secs(*link_s)
            ),
            Reason::Forced(t) => write!(f, "forced to the {t} by configuration"),
        }
    }
}

/// A placement decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub target: Target,
    pub reason: Reason,
    pub cpu: Cost,
    /// [`Cost::UNAVAILABLE`] when there is no GPU.
    pub gpu: Cost,
    /// Confidence in the decision: 1 when there is no alternative or it was
    /// forced, otherwise the lesser of the two estimates' confidences.
    pub confidence: f32,
}

/// The GPU's performance figures for the analytical model.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuParams {
    /// Effective host ↔ device bandwidth, bytes per second.
    pub pcie_bytes_per_s: f64,
    /// Per-operation launch + synchronisation overhead, seconds.
    pub launch_overhead_s: f64,
    /// Cost of linking and loading a configuration's kernels not yet
    /// linked, seconds, until a link has been observed
    /// ([`AdaptiveCostModel::learn_link`]).
    pub link_s: f64,
    /// Sustained work rate of the kernels, flops per second.
    pub throughput: f64,
    /// Confidence in these figures (0 … 1).
    pub confidence: f32,
}

impl Default for GpuParams {
    /// Conservative figures for a PCIe 3/4 x16 card running the scan kernels:
    /// 12 GB/s, 20 µs launch + sync, 2 Tflop/s; confidence 0.3 (nothing was
    /// measured; learning corrects them). Link 0.5 s: a cold link of the
    /// k-NN pair (knn_tile + knn_rerank, linked at the same time) took
    /// 0.46 s median on a 2-core VM (`fraglink search`, sm_90, nvJitLink
    /// 13.0; BENCHMARKS.md: 0.63 s through `link_all`), the scan alone
    /// 0.19 s; the first link observed replaces it.
    fn default() -> Self {
        GpuParams {
            pcie_bytes_per_s: 12e9,
            launch_overhead_s: 20e-6,
            link_s: 0.5,
            throughput: 2e12,
            confidence: 0.3,
        }
    }
}

/// Whether a GPU can be used.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuAvailability {
    Available(GpuParams),
    /// No usable GPU, and why (e.g. "no CUDA driver (libcuda.so not found)").
    Unavailable(Arc<str>),
}

impl GpuAvailability {
    pub fn unavailable(why: impl Into<Arc<str>>) -> Self {
        GpuAvailability::Unavailable(why.into())
    }
}

/// Everything the model is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct CostParams {
    /// CPU work rate (flops/s); `None` = the calibrated value of this machine.
    pub cpu_throughput: Option<f64>,
    /// Fixed CPU cost per operation (thread-pool fork/join), seconds.
    pub cpu_overhead_s: f64,
    /// Confidence in the analytical CPU estimate.
    pub cpu_confidence: f32,
    pub gpu: GpuAvailability,
    /// Always choose this target (if available).
    pub force: Option<Target>,
    /// Observations per (operation, bucket, target) before they count.
    pub min_samples: u64,
    /// k in the blend weight n / (n + k).
    pub prior_weight: f64,
    /// Record observations at all.
    pub learning: bool,
}

impl Default for CostParams {
    /// Calibrated CPU, no GPU ("not probed"), learning on with 5 samples / prior 8.
    fn default() -> Self {
        CostParams {
            cpu_throughput: None,
            cpu_overhead_s: 5e-6,
            cpu_confidence: 0.6,
            gpu: GpuAvailability::unavailable("not probed"),
            force: None,
            min_samples: 5,
            prior_weight: 8.0,
            learning: true,
        }
    }
}

impl CostParams {
    pub fn with_gpu(mut self, gpu: GpuParams) -> Self {
        self.gpu = GpuAvailability::Available(gpu);
        self
    }

    pub fn without_gpu(mut self, why: impl Into<Arc<str>>) -> Self {
        self.gpu = GpuAvailability::unavailable(why);
        self
    }

    pub fn with_cpu_throughput(mut self, flops_per_s: f64) -> Self {
        self.cpu_throughput = Some(flops_per_s);
        self
    }
}

/// Placement decisions for operations (the HeliosDB seed's cost-model hooks).
pub trait GpuCostModel: Send + Sync {
    /// Estimated CPU time.
    fn estimate_cpu(&self, op: &OpDesc) -> Cost;
    /// Estimated GPU time ([`Cost::UNAVAILABLE`] without a GPU).
    fn estimate_gpu(&self, op: &OpDesc) -> Cost;
    /// The cheaper target, with both estimates and the reason.
    fn choose(&self, op: &OpDesc) -> Choice;
    /// Records how long `op` took on `target`: its own time, without a
    /// one-time link of its kernels (that is
    /// [`AdaptiveCostModel::learn_link`]'s).
    fn learn(&self, op: &OpDesc, target: Target, observed: Duration);
}

// --------------------------------------------------------------------------------
// CPU calibration
// --------------------------------------------------------------------------------

#[inline(always)]
fn dot_kernel(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 32];
    for (ca, cb) in a.chunks_exact(32).zip(b.chunks_exact(32)) {
        for i in 0..32 {
            acc[i] = ca[i].mul_add(cb[i], acc[i]);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_kernel(a, b)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has avx2 and fma (checked above).
        return unsafe { dot_avx2(a, b) };
    }
    // Without hardware fma, mul_add is a libm call: use plain multiply-adds.
    let mut acc = [0.0f32; 16];
    for (ca, cb) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for i in 0..16 {
            acc[i] += ca[i] * cb[i];
        }
    }
    acc.iter().sum()
}

/// Runs `reps` dot products of 2048 elements on every rayon thread; seconds.
fn run_dots(reps: usize) -> f64 {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads().max(1);
    let t0 = Instant::now();
    let s: f32 = (0..threads)
        .into_par_iter()
        .map(|t| {
            let a: Vec<f32> = (0..2048).map(|i| ((i + t) % 7) as f32 * 0.25).collect();
            let b: Vec<f32> = (0..2048).map(|i| (i % 5) as f32 * 0.5).collect();
            let mut s = 0.0f32;
            for _ in 0..reps {
                s += dot(std::hint::black_box(&a), std::hint::black_box(&b));
            }
            s
        })
        .sum();
    std::hint::black_box(s);
    t0.elapsed().as_secs_f64()
}

fn calibrate() -> f64 {
    let threads = rayon::current_num_threads().max(1) as f64;
    // Warm-up and speed probe, then a run of about 10 ms.
    let probe_reps = 200usize;
    let t = run_dots(probe_reps).max(1e-6);
    let reps = ((probe_reps as f64 * 0.010 / t) as usize).clamp(probe_reps, 1_000_000);
    let t = run_dots(reps).max(1e-6);
    2.0 * 2048.0 * reps as f64 * threads / t
}

/// This machine's CPU work rate in flops per second: an f32 dot-product loop
/// (fma when available) on every thread of rayon's pool, measured once per
/// process (about 10–20 ms) and cached.
pub fn calibrated_cpu_throughput() -> f64 {
    static CAL: OnceLock<f64> = OnceLock::new();
    *CAL.get_or_init(calibrate)
}

// --------------------------------------------------------------------------------
// The adaptive model
// --------------------------------------------------------------------------------

/// Learned statistics of one (operation, size bucket, target).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    pub samples: u64,
    /// Mean of observed / analytical.
    pub mean_ratio: f64,
    /// Standard deviation of observed / analytical (0 below 2 samples).
    pub ratio_std: f64,
    /// The correction applied to the analytical estimate now.
    pub correction: f64,
}

/// The analytical model plus per-(operation, size) learning. Thread-safe;
/// decisions take no lock (the `table` module).
pub struct AdaptiveCostModel {
    params: CostParams,
    cpu_throughput: f64,
    stats: StatTable,
    links: LinkStat,
}

/// The links observed: their count and mean, seconds (f64 bits), read
/// without a lock; updates (one per cold configuration) take one.
#[derive(Default)]
struct LinkStat {
    update: std::sync::Mutex<()>,
    n: std::sync::atomic::AtomicU64,
    mean_bits: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for AdaptiveCostModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveCostModel")
            .field("params", &self.params)
            .field("cpu_throughput", &self.cpu_throughput)
            .finish_non_exhaustive()
    }
}

impl Default for AdaptiveCostModel {
    fn default() -> Self {
        Self::new(CostParams::default())
    }
}

impl AdaptiveCostModel {
    /// A model with `params`; calibrates the CPU (once per process) unless
    /// `params.cpu_throughput` is set.
    pub fn new(params: CostParams) -> Self {
        let cpu_throughput = params
            .cpu_throughput
            .unwrap_or_else(calibrated_cpu_throughput);
        AdaptiveCostModel {
            params,
            cpu_throughput,
            stats: StatTable::default(),
            links: LinkStat::default(),
        }
    }

    pub fn params(&self) -> &CostParams {
        &self.params
    }

    /// The CPU work rate in use (flops/s).
    pub fn cpu_throughput(&self) -> f64 {
        self.cpu_throughput
    }

    /// What was learned for (operation, bucket of `op`, target), if anything.
    pub fn observed(&self, op: &OpDesc, target: Target) -> Option<Observed> {
        let s = self.stats.get(&op.operation, op.size_bucket() as usize)[target.index()];
        (s.n > 0).then(|| Observed {
            samples: s.n,
            mean_ratio: s.mean,
            ratio_std: if s.n > 1 {
                (s.m2 / (s.n - 1) as f64).sqrt()
            } else {
                0.0
            },
            correction: s.factor,
        })
    }

    /// Forgets everything learned (the links observed included).
    pub fn reset(&self) {
        self.stats.clear();
        let _held = self.links.update.lock().unwrap_or_else(|p| p.into_inner());
        self.links.n.store(0, Ordering::Release);
        self.links.mean_bits.store(0, Ordering::Relaxed);
    }

    /// Records how long linking (and loading) a configuration's kernels
    /// took: one-time costs a search made before its work, never in what
    /// [`learn`](GpuCostModel::learn) is given. Later estimates of an
    /// operation whose kernels still need a link add the mean of these.
    pub fn learn_link(&self, observed: Duration) {
        let x = observed.as_secs_f64();
        if !(self.params.learning && x.is_finite() && x >= 0.0) {
            return;
        }
        let _held = self.links.update.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.links.n.load(Ordering::Relaxed) + 1;
        let mean = f64::from_bits(self.links.mean_bits.load(Ordering::Relaxed));
        let mean = mean + (x - mean) / n as f64;
        self.links
            .mean_bits
            .store(mean.to_bits(), Ordering::Relaxed);
        self.links.n.store(n, Ordering::Release);
    }

    /// The link cost estimates add now, seconds, and how many observed
    /// links it is the mean of (0: [`GpuParams::link_s`]); `None` without a
    /// GPU.
    pub fn link_estimate(&self) -> Option<(f64, u64)> {
        match &self.params.gpu {
            GpuAvailability::Available(g) => Some(self.link_seconds(g)),
            GpuAvailability::Unavailable(_) => None,
        }
    }

    /// [`choose`](GpuCostModel::choose) for `op` whose kernels are not
    /// linked yet (the link's cost in the GPU's estimate), and whether the
    /// GPU would be chosen once they are. Where only the link sends `op` to
    /// the CPU, the reason says so ([`Reason::CpuUntilLinked`]) and the
    /// caller may link in the background meanwhile.
    pub fn choose_unlinked(&self, op: &OpDesc) -> (Choice, bool) {
        let mut choice = self.choose(&op.clone().needs_link(true));
        let Reason::CpuFaster { gpu_s, cpu_s } = choice.reason else {
            return (choice, false);
        };
        let linked = self.choose(&op.clone().needs_link(false));
        if linked.target != Target::Gpu {
            return (choice, false);
        }
        choice.reason = Reason::CpuUntilLinked {
            gpu_s,
            cpu_s,
            link_s: choice.gpu.link_s,
        };
        (choice, true)
    }

    #[inline]
    fn link_seconds(&self, g: &GpuParams) -> (f64, u64) {
        match self.links.n.load(Ordering::Acquire) {
            0 => (g.link_s, 0),
            n => (
                f64::from_bits(self.links.mean_bits.load(Ordering::Relaxed)),
                n,
            ),
        }
    }

    #[inline]
    fn learned(&self, op: &OpDesc) -> [Stat; 2] {
        self.stats.get(&op.operation, op.size_bucket() as usize)
    }

    #[inline]
    fn cpu_analytical(&self, op: &OpDesc) -> Cost {
        Cost {
            seconds: 0.0,
            transfer_s: 0.0,
            overhead_s: self.params.cpu_overhead_s,
            link_s: 0.0,
            compute_s: op.cpu_work.max(0.0) / self.cpu_throughput,
            correction: 1.0,
            confidence: self.params.cpu_confidence,
            samples: 0,
        }
    }

    #[inline]
    fn gpu_analytical(&self, op: &OpDesc, g: &GpuParams) -> Cost {
        Cost {
            seconds: 0.0,
            transfer_s: (op.bytes_to_device + op.bytes_from_device) as f64 / g.pcie_bytes_per_s,
            overhead_s: g.launch_overhead_s,
            link_s: if op.needs_link {
                self.link_seconds(g).0
            } else {
                0.0
            },
            compute_s: op.gpu_work.max(0.0) / g.throughput,
            correction: 1.0,
            confidence: g.confidence,
            samples: 0,
        }
    }

    #[inline]
    fn corrected(mut c: Cost, s: &Stat) -> Cost {
        let (factor, w) = if s.n > 0 && s.weight > 0.0 {
            (s.factor, s.weight)
        } else {
            (1.0, 0.0)
        };
        c.correction = factor;
        c.seconds = c.analytical() * factor + c.link_s;
        c.confidence = c.confidence + (1.0 - c.confidence) * w as f32;
        c.samples = s.n;
        c
    }

    #[inline]
    fn estimates(&self, op: &OpDesc) -> (Cost, Option<Cost>) {
        let s = self.learned(op);
        let cpu = Self::corrected(self.cpu_analytical(op), &s[0]);
        let gpu = match &self.params.gpu {
            GpuAvailability::Available(g) => {
                Some(Self::corrected(self.gpu_analytical(op, g), &s[1]))
            }
            GpuAvailability::Unavailable(_) => None,
        };
        (cpu, gpu)
    }
}

impl GpuCostModel for AdaptiveCostModel {
    fn estimate_cpu(&self, op: &OpDesc) -> Cost {
        self.estimates(op).0
    }

    fn estimate_gpu(&self, op: &OpDesc) -> Cost {
        self.estimates(op).1.unwrap_or(Cost::UNAVAILABLE)
    }

    fn choose(&self, op: &OpDesc) -> Choice {
        let (cpu, gpu) = self.estimates(op);
        let gpu = match (gpu, &self.params.gpu) {
            (Some(g), _) => g,
            (None, GpuAvailability::Unavailable(why)) => {
                return Choice {
                    target: Target::Cpu,
                    reason: Reason::NoGpu(why.clone()),
                    cpu,
                    gpu: Cost::UNAVAILABLE,
                    confidence: 1.0,
                }
            }
            (None, GpuAvailability::Available(_)) => unreachable!(),
        };
        if let Some(t) = self.params.force {
            return Choice {
                target: t,
                reason: Reason::Forced(t),
                cpu,
                gpu,
                confidence: 1.0,
            };
        }
        let (target, reason) = if gpu.seconds < cpu.seconds {
            (
                Target::Gpu,
                Reason::GpuFaster {
                    gpu_s: gpu.seconds,
                    cpu_s: cpu.seconds,
                },
            )
        } else {
            (
                Target::Cpu,
                Reason::CpuFaster {
                    gpu_s: gpu.seconds,
                    cpu_s: cpu.seconds,
                },
            )
        };
        Choice {
            target,
            reason,
            cpu,
            gpu,
            confidence: cpu.confidence.min(gpu.confidence),
        }
    }

    fn learn(&self, op: &OpDesc, target: Target, observed: Duration) {
        if !self.params.learning {
            return;
        }
        let analytical = match (target, &self.params.gpu) {
            (Target::Cpu, _) => self.cpu_analytical(op).analytical(),
            (Target::Gpu, GpuAvailability::Available(g)) => self.gpu_analytical(op, g).analytical(),
            (Target::Gpu, GpuAvailability::Unavailable(_)) => return,
        };
        let obs = observed.as_secs_f64();
        if !(analytical > 0.0 && analytical.is_finite() && obs > 0.0) {
            return;
        }
        let x = obs / analytical;
        let (min_samples, prior) = (
            self.params.min_samples.max(1),
            self.params.prior_weight.max(0.0),
        );
        // A full table (more distinct operations than it holds) leaves the
        // operation analytical: nothing to do about it here.
        let _ = self.stats.update(
            &op.operation,
            op.size_bucket() as usize,
            target.index(),
            |s| {
                s.n += 1;
                let delta = x - s.mean;
                s.mean += delta / s.n as f64;
                s.m2 += delta * (x - s.mean);
                if s.n >= min_samples {
                    s.weight = s.n as f64 / (s.n as f64 + prior);
                    s.factor = 1.0 - s.weight + s.weight * s.mean;
                } else {
                    s.weight = 0.0;
                    s.factor = 1.0;
                }
            },
        );
    }
}

// --------------------------------------------------------------------------------
// Fallback and error recovery
// --------------------------------------------------------------------------------

/// An error a GPU attempt can end with; only out-of-memory is retried.
pub trait RecoverableError: fmt::Display {
    fn is_out_of_memory(&self) -> bool;
}

/// Batch sizes for out-of-memory recovery: start at `initial`, halve on every
/// out-of-memory error while the batch is above `min` (never below `min`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    pub initial: usize,
    pub min: usize,
}

impl BatchPolicy {
    pub fn new(initial: usize, min: usize) -> Self {
        BatchPolicy {
            initial: initial.max(1),
            min: min.max(1),
        }
    }

    /// The batch after an out-of-memory error at `batch`, if any is left.
    pub fn next(&self, batch: usize) -> Option<usize> {
        (batch > self.min).then(|| (batch / 2).max(self.min))
    }
}

/// One try.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub target: Target,
    /// The batch size given to the GPU closure (0 for the CPU).
    pub batch: usize,
    /// `None` = succeeded.
    pub error: Option<String>,
    pub out_of_memory: bool,
    pub elapsed: Duration,
}

/// A value and how it was obtained.
#[derive(Debug, Clone, PartialEq)]
pub struct FallbackResult<T> {
    pub value: T,
    pub target_used: Target,
    /// The GPU was chosen but the CPU produced the value.
    pub fell_back: bool,
    /// Why the value came from `target_used`.
    pub reason: String,
    /// Every try in order, the successful one last.
    pub attempts: Vec<Attempt>,
}

impl<T> FallbackResult<T> {
    pub fn is_gpu(&self) -> bool {
        self.target_used == Target::Gpu
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> FallbackResult<U> {
        FallbackResult {
            value: f(self.value),
            target_used: self.target_used,
            fell_back: self.fell_back,
            reason: self.reason,
            attempts: self.attempts,
        }
    }

    /// Time spent in the try that produced the value.
    pub fn final_elapsed(&self) -> Duration {
        self.attempts.last().map_or(Duration::ZERO, |a| a.elapsed)
    }
}

/// Runs `target`'s path: the GPU closure (given a batch size) with halving on
/// out-of-memory per `batch`, then the CPU closure if the GPU path fails; or
/// the CPU closure directly when `target` is the CPU. `why` is the reason the
/// target was chosen (e.g. `choice.reason`).
pub fn run_with_fallback<T, E: RecoverableError>(
    target: Target,
    why: &dyn fmt::Display,
    batch: BatchPolicy,
    mut gpu: impl FnMut(usize) -> Result<T, E>,
    cpu: impl FnOnce() -> T,
) -> FallbackResult<T> {
    let mut attempts = Vec::new();
    let fallback_reason = if target == Target::Gpu {
        let mut b = batch.initial;
        loop {
            let t0 = Instant::now();
            match gpu(b) {
                Ok(value) => {
                    attempts.push(Attempt {
                        target: Target::Gpu,
                        batch: b,
                        error: None,
                        out_of_memory: false,
                        elapsed: t0.elapsed(),
                    });
                    let reason = if b == batch.initial {
                        why.to_string()
                    } else {
                        format!("{why}; ran with the batch reduced from {} to {b} after running out of GPU memory", batch.initial)
                    };
                    return FallbackResult {
                        value,
                        target_used: Target::Gpu,
                        fell_back: false,
                        reason,
                        attempts,
                    };
                }
                Err(e) => {
                    let oom = e.is_out_of_memory();
                    let msg = e.to_string();
                    attempts.push(Attempt {
                        target: Target::Gpu,
                        batch: b,
                        error: Some(msg.clone()),
                        out_of_memory: oom,
                        elapsed: t0.elapsed(),
                    });
                    match (oom, batch.next(b)) {
                        (true, Some(nb)) => b = nb,
                        (true, None) => {
                            break format!("GPU out of memory even at the minimum batch of {b} ({msg}); fell back to the CPU")
                        }
                        (false, _) => break format!("GPU failed ({msg}); fell back to the CPU"),
                    }
                }
            }
        }
    } else {
        why.to_string()
    };
    let t0 = Instant::now();
    let value = cpu();
    attempts.push(Attempt {
        target: Target::Cpu,
        batch: 0,
        error: None,
        out_of_memory: false,
        elapsed: t0.elapsed(),
    });
    FallbackResult {
        value,
        target_used: Target::Cpu,
        fell_back: target == Target::Gpu,
        reason: fallback_reason,
        attempts,
    }
}

/// Chooses a target for `op`, runs it with [`run_with_fallback`], and teaches
/// the model the duration of the try that produced the value (a GPU run with a
/// reduced batch is not learned: it is not the operation that was estimated).
pub fn execute<M: GpuCostModel + ?Sized, T, E: RecoverableError>(
    model: &M,
    op: &OpDesc,
    batch: BatchPolicy,
    gpu: impl FnMut(usize) -> Result<T, E>,
    cpu: impl FnOnce() -> T,
) -> FallbackResult<T> {
    let choice = model.choose(op);
    let r = run_with_fallback(choice.target, &choice.reason, batch, gpu, cpu);
    let last = r.attempts.last().expect("at least one attempt");
    if r.target_used == Target::Cpu || last.batch == batch.initial {
        model.learn(op, r.target_used, last.elapsed);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 k-NN as `search::ops` describes it.
    fn knn_f32(n: usize, dim: usize, nq: usize, k: usize, resident: bool) -> OpDesc {
        OpDesc::brute_force("knn.f32", n, dim, nq, k, 4, resident)
    }

    fn model(gpu: bool) -> AdaptiveCostModel {
        let p = CostParams::default().with_cpu_throughput(100e9);
        AdaptiveCostModel::new(if gpu {
            p.with_gpu(GpuParams {
                pcie_bytes_per_s: 10e9,
                launch_overhead_s: 10e-6,
                link_s: 0.05,
                throughput: 10e12,
                confidence: 0.3,
            })
        } else {
            p.without_gpu("no CUDA driver")
        })
    }

    fn approx(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
    }

    #[test]
    fn analytical_estimates() {
        let m = model(true);
        let op = OpDesc::new("x")
            .to_device(1_000_000_000)
            .from_device(0)
            .work(1e12);
        let g = m.estimate_gpu(&op);
        assert!(approx(g.transfer_s, 0.1));
        assert!(approx(g.overhead_s, 10e-6));
        assert!(approx(g.compute_s, 0.1));
        assert!(approx(g.seconds, 0.2 + 10e-6));
        let linked = m.estimate_gpu(&op.clone().needs_link(true));
        assert!(approx(linked.seconds - g.seconds, 0.05));
        let c = m.estimate_cpu(&op);
        assert!(approx(c.seconds, 10.0 + 5e-6));
        assert_eq!(c.confidence, 0.6);
        assert_eq!(g.confidence, 0.3);
        assert_eq!(g.time(), Duration::from_secs_f64(g.seconds));
    }

    #[test]
    fn the_link_is_learned_apart_and_never_corrected() {
        let m = model(true);
        let op = knn_f32(100_000, 128, 10, 10, true);
        let cold = op.clone().needs_link(true);
        assert_eq!(m.link_estimate(), Some((0.05, 0)));
        let g = m.estimate_gpu(&op);
        assert!(approx(m.estimate_gpu(&cold).seconds, g.seconds + 0.05));
        // Searches 3× slower than the analytical model: the correction
        // scales the search, the link is added as observed.
        for _ in 0..40 {
            m.learn(&op, Target::Gpu, Duration::from_secs_f64(3.0 * g.seconds));
        }
        let warm = m.estimate_gpu(&op);
        assert!(warm.correction > 2.5, "{warm:?}");
        let c = m.estimate_gpu(&cold);
        assert!(approx(c.seconds, warm.seconds + 0.05), "{c:?} {warm:?}");
        assert!(approx(c.link_s, 0.05));
        // The mean of the links observed replaces the configured figure.
        m.learn_link(Duration::from_millis(400));
        m.learn_link(Duration::from_millis(600));
        let (mean, n) = m.link_estimate().unwrap();
        assert_eq!(n, 2);
        assert!(approx(mean, 0.5));
        assert!(approx(m.estimate_gpu(&cold).seconds, warm.seconds + 0.5));
        assert!(approx(m.estimate_gpu(&op).seconds, warm.seconds));
        // Forgotten with the rest; nothing learned without a GPU or learning.
        m.reset();
        assert_eq!(m.link_estimate(), Some((0.05, 0)));
        assert_eq!(model(false).link_estimate(), None);
        let off = AdaptiveCostModel::new(CostParams {
            learning: false,
            ..model(true).params().clone()
        });
        off.learn_link(Duration::from_secs(1));
        assert_eq!(off.link_estimate(), Some((0.05, 0)));
    }

    /// Cold, a search the GPU would win linked goes to the CPU only where
    /// the link outweighs the difference, saying so; forced and GPU-less
    /// choices are left as they are.
    #[test]
    fn an_unlinked_configuration_costs_its_link_once() {
        let m = model(true);
        // GPU ≈ 0.6 ms + transfer, CPU ≈ 33 ms: the 50 ms link sends it to
        // the CPU, and the GPU would win once linked.
        let small = knn_f32(100_000, 128, 128, 10, true);
        let (c, background) = m.choose_unlinked(&small);
        assert_eq!(c.target, Target::Cpu, "{}", c.reason);
        assert!(background);
        let Reason::CpuUntilLinked { link_s, .. } = c.reason else {
            panic!("{}", c.reason);
        };
        assert!(approx(link_s, 0.05));
        assert!(c
            .reason
            .to_string()
            .contains("until the GPU kernels are linked"));
        assert_eq!(m.choose(&small).target, Target::Gpu);
        // Large enough that the link does not matter: the GPU, cold.
        let big = knn_f32(1_000_000, 128, 10_000, 10, true);
        let (c, background) = m.choose_unlinked(&big);
        assert_eq!(c.target, Target::Gpu, "{}", c.reason);
        assert!(!background);
        assert!(approx(c.gpu.link_s, 0.05));
        // The CPU either way: nothing to link for.
        let tiny = knn_f32(100, 16, 1, 1, false);
        let (c, background) = m.choose_unlinked(&tiny);
        assert!(matches!(c.reason, Reason::CpuFaster { .. }), "{}", c.reason);
        assert!(!background);
        // Forced, or no GPU: as `choose` says.
        let forced = AdaptiveCostModel::new(CostParams {
            force: Some(Target::Gpu),
            ..model(true).params().clone()
        });
        let (c, background) = forced.choose_unlinked(&small);
        assert_eq!((c.target, background), (Target::Gpu, false));
        let (c, background) = model(false).choose_unlinked(&small);
        assert!(matches!(c.reason, Reason::NoGpu(_)));
        assert!(!background);
    }

    #[test]
    fn choice_flips_with_size() {
        let m = model(true);
        let small = knn_f32(1000, 128, 1, 10, false);
        let big = knn_f32(1_000_000, 128, 10_000, 10, true);
        let cs = m.choose(&small);
        assert_eq!(cs.target, Target::Cpu, "{}", cs.reason);
        assert!(cs.reason.to_string().starts_with("CPU estimated faster"));
        let cb = m.choose(&big);
        assert_eq!(cb.target, Target::Gpu, "{}", cb.reason);
        assert!(cb.reason.to_string().starts_with("GPU estimated faster"));
        assert!((cb.confidence - 0.3).abs() < 1e-6);
        // Somewhere between, it flips exactly once.
        let mut last = Target::Cpu;
        let mut flips = 0;
        for e in 10..34 {
            let op = OpDesc::new("x").to_device(1 << 20).work((1u64 << e) as f64);
            let t = m.choose(&op).target;
            if t != last {
                flips += 1;
                last = t;
            }
        }
        assert_eq!((flips, last), (1, Target::Gpu));
    }

    #[test]
    fn no_gpu_means_cpu_with_reason() {
        let m = model(false);
        let c = m.choose(&OpDesc::new("x").work(1e15));
        assert_eq!(c.target, Target::Cpu);
        assert_eq!(c.reason.to_string(), "no GPU: no CUDA driver");
        assert_eq!(c.gpu.seconds, f64::INFINITY);
        assert_eq!(c.confidence, 1.0);
        assert_eq!(m.estimate_gpu(&OpDesc::new("x")), Cost::UNAVAILABLE);
        m.learn(
            &OpDesc::new("x").work(1e9),
            Target::Gpu,
            Duration::from_millis(1),
        );
        assert!(m
            .observed(&OpDesc::new("x").work(1e9), Target::Gpu)
            .is_none());
    }

    #[test]
    fn forced_target() {
        let mut p = CostParams::default()
            .with_cpu_throughput(1e9)
            .with_gpu(GpuParams::default());
        p.force = Some(Target::Gpu);
        let m = AdaptiveCostModel::new(p);
        let c = m.choose(&OpDesc::new("tiny").work(1.0));
        assert_eq!(
            (c.target, c.reason.clone()),
            (Target::Gpu, Reason::Forced(Target::Gpu))
        );
    }

    #[test]
    fn learning_changes_the_decision_after_min_samples() {
        let m = model(true);
        let op = knn_f32(1_000_000, 128, 1000, 10, true);
        let first = m.choose(&op);
        assert_eq!(first.target, Target::Gpu);
        let g = first.gpu.seconds;
        let slow = Duration::from_secs_f64(g * 1000.0);
        for i in 1..m.params().min_samples {
            m.learn(&op, Target::Gpu, slow);
            let c = m.choose(&op);
            assert_eq!(c.target, Target::Gpu, "after {i} samples");
            assert_eq!(c.gpu.samples, i);
            assert_eq!(c.gpu.correction, 1.0);
        }
        m.learn(&op, Target::Gpu, slow);
        let c = m.choose(&op);
        assert_eq!(c.target, Target::Cpu, "{}", c.reason);
        let n = m.params().min_samples as f64;
        let w = n / (n + 8.0);
        assert!(approx(c.gpu.correction, 1.0 - w + w * 1000.0));
        assert!(c.gpu.confidence > 0.3 && c.gpu.confidence < 1.0);
        let o = m.observed(&op, Target::Gpu).unwrap();
        assert!(approx(o.mean_ratio, 1000.0) && o.ratio_std < 1e-6);
        // Other sizes and operations are unaffected.
        let other = knn_f32(1_000_000, 128, 100_000, 10, true);
        assert_eq!(m.choose(&other).gpu.correction, 1.0);
        assert_eq!(
            m.choose(&OpDesc {
                operation: "knn.f16".into(),
                ..op.clone()
            })
            .gpu
            .correction,
            1.0
        );
        // Confidence keeps rising with more samples and tends to 1.
        let mut prev = c.gpu.confidence;
        for _ in 0..50 {
            m.learn(&op, Target::Gpu, slow);
        }
        let c2 = m.choose(&op);
        assert!(c2.gpu.confidence > prev && c2.gpu.confidence > 0.9);
        prev = c2.gpu.correction as f32;
        assert!(prev > 500.0);
        m.reset();
        assert_eq!(m.choose(&op).target, Target::Gpu);
    }

    #[test]
    fn learning_can_be_disabled() {
        let mut p = CostParams::default().with_cpu_throughput(1e9);
        p.learning = false;
        let m = AdaptiveCostModel::new(p);
        let op = OpDesc::new("x").work(1e6);
        for _ in 0..10 {
            m.learn(&op, Target::Cpu, Duration::from_secs(1));
        }
        assert!(m.observed(&op, Target::Cpu).is_none());
    }

    #[test]
    fn size_buckets() {
        assert_eq!(OpDesc::new("x").size_bucket(), 0);
        assert_eq!(OpDesc::new("x").work(1024.0).size_bucket(), 10);
        assert_eq!(OpDesc::new("x").work(2047.0).size_bucket(), 10);
        assert_eq!(OpDesc::new("x").cpu_work(4096.0).size_bucket(), 12);
        assert_eq!(OpDesc::new("x").work(f64::NAN).size_bucket(), 0);
        assert_eq!(OpDesc::new("x").work(1e300).size_bucket(), 63);
    }

    #[test]
    fn calibration_is_plausible_and_cached() {
        let a = calibrated_cpu_throughput();
        // (Debug builds run the loop unoptimised: only plausibility here.)
        assert!(a > 1e6 && a < 1e14, "{a}");
        assert_eq!(a, calibrated_cpu_throughput());
        assert_eq!(AdaptiveCostModel::default().cpu_throughput(), a);
    }

    #[derive(Debug)]
    enum E {
        Oom,
        Other,
    }
    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(match self {
                E::Oom => "out of memory",
                E::Other => "launch failed",
            })
        }
    }
    impl RecoverableError for E {
        fn is_out_of_memory(&self) -> bool {
            matches!(self, E::Oom)
        }
    }

    #[test]
    fn backoff_halves_then_succeeds() {
        let mut seen = Vec::new();
        let r = run_with_fallback(
            Target::Gpu,
            &"why",
            BatchPolicy::new(1024, 100),
            |b| {
                seen.push(b);
                if b > 256 {
                    Err(E::Oom)
                } else {
                    Ok(b)
                }
            },
            || 0,
        );
        assert_eq!(seen, vec![1024, 512, 256]);
        assert_eq!(
            (r.value, r.target_used, r.fell_back),
            (256, Target::Gpu, false)
        );
        assert!(
            r.reason.contains("reduced from 1024 to 256"),
            "{}",
            r.reason
        );
        assert_eq!(r.attempts.len(), 3);
        assert!(r.attempts[0].out_of_memory && r.attempts[2].error.is_none());
    }

    #[test]
    fn backoff_stops_at_the_minimum_then_falls_back() {
        let mut seen = Vec::new();
        let r = run_with_fallback(
            Target::Gpu,
            &"why",
            BatchPolicy::new(1000, 300),
            |b| {
                seen.push(b);
                Err::<i32, _>(E::Oom)
            },
            || 7,
        );
        assert_eq!(seen, vec![1000, 500, 300]);
        assert_eq!(
            (r.value, r.target_used, r.fell_back),
            (7, Target::Cpu, true)
        );
        assert!(r.reason.contains("minimum batch of 300"), "{}", r.reason);
        assert_eq!(r.attempts.len(), 4);
        assert_eq!(r.attempts[3].target, Target::Cpu);
    }

    #[test]
    fn other_errors_fall_back_at_once() {
        let mut calls = 0;
        let r = run_with_fallback(
            Target::Gpu,
            &"why",
            BatchPolicy::new(64, 1),
            |_| {
                calls += 1;
                Err::<i32, _>(E::Other)
            },
            || 1,
        );
        assert_eq!(calls, 1);
        assert!(r.fell_back && r.reason.contains("launch failed"));
        let r = run_with_fallback(
            Target::Cpu,
            &Reason::NoGpu("none".into()),
            BatchPolicy::new(64, 1),
            |_| Err::<i32, _>(E::Other),
            || 2,
        );
        assert_eq!(
            (r.value, r.fell_back, r.reason.as_str()),
            (2, false, "no GPU: none")
        );
        assert_eq!(r.attempts.len(), 1);
    }

    #[test]
    fn execute_learns_what_ran() {
        let m = model(true);
        let op = knn_f32(1_000_000, 128, 1000, 10, true);
        let r = execute(
            &m,
            &op,
            BatchPolicy::new(8, 1),
            |_| Err::<u8, _>(E::Other),
            || 3,
        );
        assert!(r.fell_back);
        assert_eq!(m.observed(&op, Target::Cpu).unwrap().samples, 1);
        assert!(m.observed(&op, Target::Gpu).is_none());
        let r = execute(&m, &op, BatchPolicy::new(8, 1), Ok::<usize, E>, || 3);
        assert_eq!((r.value, r.target_used), (8, Target::Gpu));
        assert_eq!(m.observed(&op, Target::Gpu).unwrap().samples, 1);
    }
}
