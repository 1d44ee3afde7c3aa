//! fraglink's cold-link overhead over raw nvJitLink, interleaved.
//!
//! Criterion runs one side after the other, so a machine that gets busier
//! (or cooler) half-way shows up as "overhead". Here each round links the
//! same plan once through the planner (memory cache emptied, no disk cache)
//! and once through raw nvJitLink with the identical command line and
//! inputs, alternating which goes first. Reported:
//! * the median of the per-round ratios planner / raw, and its quartiles;
//! * the planner's own overhead measured inside the same call: the request's
//!   `elapsed` minus the time spent in nvJitLink (`link_ms`), which no
//!   neighbour's noise can inflate much.
//!
//! Then the first call of a tensor-core k-NN search's kernel pair
//! (knn_tile + knn_rerank, f32 l2, sm_90), cold: the two links one after the
//! other against [`LinkRuntime::link_all`], which links them at the same
//! time, alternating which goes first (`FRAGLINK_BENCH_PAIR_ROUNDS`, default
//! 5: a round takes seconds).
//!
//! Then quick links against cold LTO links for sm_90
//! ([`LinkRuntime::link_quick`]: the fragments' SASS without LTO, what a
//! cold first call of a search links), interleaved: the first-call scan
//! (`scan_f32_u32_v4_k32` + l2 + no filter) and the same k-NN pair
//! (`FRAGLINK_BENCH_QUICK_ROUNDS`, default 20).
//!
//! `cargo bench --bench link_overhead` (`FRAGLINK_BENCH_ROUNDS`, default 40).
//! The last line is JSON for `benches/run.sh`.

use std::time::{Duration, Instant};

use fraglink::build::Arch;
use fraglink::fragments::{FilterFragment, MetricFragment, NoneFilter, ScanFragment, F32, L2, U32};
use fraglink::link::{LinkRuntime, Planner, RuntimeConfig, Source};
use fraglink::sys::{InputType, NvJitLink};

const ARCH: Arch = Arch::sm(80);

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// `var` as a round count of at least 3, else `default`.
fn rounds_from_env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 3)
        .unwrap_or(default)
}

/// A plan of the named fragments, the first naming the kernel.
fn named(frags: &[&str]) -> Planner {
    frags
        .iter()
        .fold(Planner::new(frags[0]), |p, f| p.add_named(f).expect(f))
}

/// The k-NN pair of [`pair_rounds`] and [`quick_rounds`].
fn knn_pair() -> [Planner; 2] {
    [
        named(&[
            "knn_tile_f32_tf32x3_q64_r64_k32_a16",
            "metric_l2_f32",
            "filter_none_u32",
        ]),
        named(&["knn_rerank_f32_k32", "metric_l2_f32"]),
    ]
}

/// Median ms of the k-NN pair's cold links, one by one and through
/// `link_all`, over `rounds` interleaved rounds, and the per-round ratio.
fn pair_rounds(rt: &LinkRuntime, rounds: usize) -> (f64, f64, f64) {
    let [tile, rerank] = knn_pair();
    let arch = Arch::sm(90);
    let one_by_one = || {
        rt.clear();
        let t = Instant::now();
        for p in [&tile, &rerank] {
            assert_eq!(rt.link(p, arch).unwrap().source, Source::Linked);
        }
        t.elapsed().as_secs_f64() * 1e3
    };
    let together = || {
        rt.clear();
        let t = Instant::now();
        let all = rt.link_all(&[&tile, &rerank], arch).unwrap();
        assert!(all.iter().all(|l| l.source == Source::Linked));
        t.elapsed().as_secs_f64() * 1e3
    };
    together();
    let (mut seq, mut all, mut ratios) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        let (s, a) = if round % 2 == 0 {
            let s = one_by_one();
            (s, together())
        } else {
            let a = together();
            (one_by_one(), a)
        };
        ratios.push(a / s);
        seq.push(s);
        all.push(a);
    }
    let m = |v: Vec<f64>| quantile(&sorted(v), 0.5);
    (m(seq), m(all), m(ratios))
}

/// Medians over `rounds` interleaved rounds, sm_90: the scan's cold LTO
/// link and its quick link (ms, and the per-round ratio quick / LTO), and
/// the k-NN pair's two quick links (ms).
fn quick_rounds(rt: &LinkRuntime, rounds: usize) -> (f64, f64, f64, f64) {
    let arch = Arch::sm(90);
    let scan = named(&["scan_f32_u32_v4_k32", "metric_l2_f32", "filter_none_u32"]);
    let pair = knn_pair();
    let lto = || {
        rt.clear();
        let t = Instant::now();
        assert_eq!(rt.link(&scan, arch).unwrap().source, Source::Linked);
        t.elapsed().as_secs_f64() * 1e3
    };
    let quick = |plans: &[&Planner]| {
        rt.clear();
        let t = Instant::now();
        for p in plans {
            let l = rt.link_quick(p, arch).unwrap().expect("SASS for sm_90");
            assert!(l.kernel.quick && l.source == Source::Linked);
        }
        t.elapsed().as_secs_f64() * 1e3
    };
    lto();
    quick(&[&scan]);
    let (mut lto_ms, mut quick_ms, mut ratios, mut pair_ms) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let (l, q) = if round % 2 == 0 {
            let l = lto();
            (l, quick(&[&scan]))
        } else {
            let q = quick(&[&scan]);
            (lto(), q)
        };
        ratios.push(q / l);
        lto_ms.push(l);
        quick_ms.push(q);
        pair_ms.push(quick(&[&pair[0], &pair[1]]));
    }
    let m = |v: Vec<f64>| quantile(&sorted(v), 0.5);
    (m(lto_ms), m(quick_ms), m(ratios), m(pair_ms))
}

fn main() {
    let rounds = rounds_from_env("FRAGLINK_BENCH_ROUNDS", 40);
    let quick_rounds_n = rounds_from_env("FRAGLINK_BENCH_QUICK_ROUNDS", 20);
    let pair_rounds_n = rounds_from_env("FRAGLINK_BENCH_PAIR_ROUNDS", 5);
    let plan = Planner::new("scan_f32_u32_v4_k128")
        .add::<ScanFragment<F32, U32, 4, 128>>()
        .add::<MetricFragment<L2, F32>>()
        .add::<FilterFragment<NoneFilter, U32>>();
    // The planner's own command line: the raw side passes exactly this.
    let args = plan.options(ARCH).to_args();
    let nvjitlink = NvJitLink::open(None).expect("nvJitLink");
    let rt = LinkRuntime::new(RuntimeConfig {
        memory_capacity: 4,
        disk: None,
    })
    .expect("link runtime");

    let raw = || {
        let t = Instant::now();
        let mut h = nvjitlink.create(&args).unwrap();
        for f in plan.static_fragments() {
            h.add(InputType::Fatbin, f.fatbin, f.name).unwrap();
        }
        h.complete().unwrap();
        let cubin = h.cubin().unwrap();
        let log = h.info_log().unwrap();
        std::hint::black_box((cubin, log));
        t.elapsed()
    };
    let planner = || {
        rt.clear();
        let t = Instant::now();
        let l = rt.link(&plan, ARCH).unwrap();
        let total = t.elapsed();
        assert_eq!(l.source, Source::Linked);
        let inside = Duration::from_secs_f64(l.kernel.metadata.link_ms / 1e3);
        (total, total.saturating_sub(inside))
    };
    // Warm-up: first links load nvJitLink's code and fill allocator pools.
    for _ in 0..3 {
        raw();
        planner();
    }
    let (mut ratios, mut raw_ms, mut plan_ms, mut own_us) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let (r, (p, own)) = if round % 2 == 0 {
            let r = raw();
            (r, planner())
        } else {
            let p = planner();
            (raw(), p)
        };
        ratios.push(p.as_secs_f64() / r.as_secs_f64());
        raw_ms.push(r.as_secs_f64() * 1e3);
        plan_ms.push(p.as_secs_f64() * 1e3);
        own_us.push(own.as_secs_f64() * 1e6);
    }
    let (ratios, raw_ms, plan_ms, own_us) = (
        sorted(ratios),
        sorted(raw_ms),
        sorted(plan_ms),
        sorted(own_us),
    );
    let m = |v: &[f64]| quantile(v, 0.5);
    println!(
        "cold link, {rounds} interleaved rounds, {ARCH}, {}",
        args.join(" ")
    );
    println!("  raw nvJitLink   median {:.2} ms", m(&raw_ms));
    println!("  planner         median {:.2} ms", m(&plan_ms));
    println!(
        "  ratio           median {:.4} (quartiles {:.4} .. {:.4})",
        m(&ratios),
        quantile(&ratios, 0.25),
        quantile(&ratios, 0.75)
    );
    println!(
        "  planner's own   median {:.1} us per cold link ({:.2}% of the raw link)",
        m(&own_us),
        m(&own_us) / 1e3 / m(&raw_ms) * 100.0
    );
    let (pair_seq_ms, pair_all_ms, pair_ratio) = pair_rounds(&rt, pair_rounds_n);
    println!(
        "k-NN pair (knn_tile_f32_tf32x3_q64_r64_k32_a16 + knn_rerank_f32_k32, sm_90), cold, \
         {pair_rounds_n} interleaved rounds, {} threads available",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("  one by one      median {pair_seq_ms:.1} ms");
    println!(
        "  link_all        median {pair_all_ms:.1} ms (per-round ratio median {pair_ratio:.3})"
    );
    let (scan_lto_ms, scan_quick_ms, quick_ratio, pair_quick_ms) =
        quick_rounds(&rt, quick_rounds_n);
    println!(
        "quick links vs cold LTO links, sm_90, {quick_rounds_n} interleaved rounds \
         (scan_f32_u32_v4_k32 + metric_l2_f32 + filter_none_u32)"
    );
    println!("  LTO link        median {scan_lto_ms:.2} ms");
    println!(
        "  quick link      median {scan_quick_ms:.3} ms (per-round ratio median {quick_ratio:.4})"
    );
    println!("  k-NN pair quick median {pair_quick_ms:.3} ms (both kernels)");
    println!(
        "{}",
        serde_json::json!({
            "rounds": rounds,
            "raw_ms": m(&raw_ms),
            "planner_ms": m(&plan_ms),
            "ratio": m(&ratios),
            "ratio_q1": quantile(&ratios, 0.25),
            "ratio_q3": quantile(&ratios, 0.75),
            "own_us": m(&own_us),
            "pair_rounds": pair_rounds_n,
            "pair_one_by_one_ms": pair_seq_ms,
            "pair_link_all_ms": pair_all_ms,
            "pair_ratio": pair_ratio,
            "quick_rounds": quick_rounds_n,
            "scan_lto_ms": scan_lto_ms,
            "scan_quick_ms": scan_quick_ms,
            "quick_ratio": quick_ratio,
            "pair_quick_ms": pair_quick_ms,
            "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
        })
    );
}
