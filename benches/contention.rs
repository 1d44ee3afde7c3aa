//! Link contention: 64 threads ask for 16 distinct kernels (4 threads per
//! key), all released at once by a barrier, each round from empty caches.
//!
//! - fraglink: one [`LinkRuntime`] with a fresh memory cache and no disk
//!   cache — single flight per key, different keys link in parallel;
//! - the cuVS planner's scheme: one exclusive `Mutex` held across lookup,
//!   link and insert, linking with the same [`Linker`] (raw nvJitLink) and the
//!   same options.
//!
//! A plain harness (no criterion): every round needs fresh caches and a
//! barrier, and one round takes seconds. Prints one JSON object (also to
//! `--json FILE`); no timed assertions.
//!
//! ```text
//! cargo bench --bench contention -- [--rounds N] [--json FILE]
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use fraglink::build::Arch;
use fraglink::link::linker::{LinkInput, LinkOutput};
use fraglink::link::{LinkOptions, LinkRuntime, Linker, Planner, RuntimeConfig, Source};
use serde_json::json;

const ARCH: Arch = Arch::sm(80);
const THREADS: usize = 64;
const KEYS: usize = 16;

/// 16 plans with distinct scan fragments, each with the l2 metric of its
/// dtype and the `none` filter of its idx.
fn plans() -> Vec<Planner> {
    let scans: Vec<_> = fraglink::fragments::catalog()
        .iter()
        .filter(|f| f.family == "scan")
        .take(KEYS)
        .collect();
    assert_eq!(
        scans.len(),
        KEYS,
        "the catalog has at least 16 scan fragments"
    );
    scans
        .iter()
        .map(|s| {
            let dtype = s.param("dtype").expect("scan has dtype");
            let idx = s.param("idx").expect("scan has idx");
            Planner::new(s.name)
                .add_named(s.name)
                .and_then(|p| p.add_named(&format!("metric_l2_{dtype}")))
                .and_then(|p| p.add_named(&format!("filter_none_{idx}")))
                .expect("fragments exist")
        })
        .collect()
}

/// The options fraglink's runtime links a plan with.
fn options(p: &Planner) -> LinkOptions {
    let mut o = p.options(ARCH);
    if o.kernels_used.is_empty() {
        o.kernels_used.push(p.entry().to_string());
    }
    o
}

struct Round {
    wall: Duration,
    /// Per-thread time from release to having its kernel.
    latencies: Vec<Duration>,
    links: usize,
}

/// Runs `work(thread index)` on 64 threads released together; the clock
/// starts when the main thread passes the barrier.
fn run_round<F>(work: F) -> (Duration, Vec<(Duration, bool)>)
where
    F: Fn(usize) -> bool + Sync,
{
    let barrier = Barrier::new(THREADS + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    let linked = work(t);
                    (started.elapsed(), linked)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (started.elapsed(), results)
    })
}

fn fraglink_round(linker: &Linker, plans: &[Planner]) -> Round {
    let rt = LinkRuntime::with_linker(
        linker.clone(),
        RuntimeConfig {
            memory_capacity: 64,
            disk: None,
        },
    )
    .expect("runtime");
    let (wall, results) = run_round(|t| {
        let l = rt.link(&plans[t % plans.len()], ARCH).expect("link");
        l.source == Source::Linked
    });
    finish(wall, results)
}

fn mutex_round(linker: &Linker, plans: &[Planner]) -> Round {
    let cache: Mutex<HashMap<String, Arc<LinkOutput>>> = Mutex::new(HashMap::new());
    let (wall, results) = run_round(|t| {
        let p = &plans[t % plans.len()];
        // cuVS keys on the fragment names (and holds the lock throughout).
        let key = format!("{}|{}", p.fragment_names().join(","), ARCH);
        let mut map = cache.lock().unwrap();
        if map.contains_key(&key) {
            return false;
        }
        let inputs: Vec<LinkInput<'_>> = p
            .static_fragments()
            .iter()
            .map(|f| LinkInput::fragment(f))
            .collect();
        let out = linker.link(&inputs, &options(p)).expect("link");
        map.insert(key, Arc::new(out));
        true
    });
    finish(wall, results)
}

fn finish(wall: Duration, results: Vec<(Duration, bool)>) -> Round {
    Round {
        wall,
        links: results.iter().filter(|r| r.1).count(),
        latencies: results.into_iter().map(|r| r.0).collect(),
    }
}

fn secs(d: &[Duration]) -> Vec<f64> {
    d.iter().map(Duration::as_secs_f64).collect()
}

fn stats(v: &[f64]) -> serde_json::Value {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let median = if s.is_empty() {
        f64::NAN
    } else if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    json!({
        "min": s.first(),
        "median": median,
        "max": s.last(),
        "n": s.len(),
    })
}

fn side(rounds: &[Round]) -> serde_json::Value {
    let walls: Vec<f64> = rounds.iter().map(|r| r.wall.as_secs_f64()).collect();
    let lat_median: Vec<f64> = rounds
        .iter()
        .map(|r| {
            let mut l = secs(&r.latencies);
            l.sort_by(f64::total_cmp);
            l[l.len() / 2]
        })
        .collect();
    json!({
        "wall_s": walls,
        "wall": stats(&walls),
        "thread_latency_median_s": stats(&lat_median),
        "links_per_round": rounds.iter().map(|r| r.links).collect::<Vec<_>>(),
    })
}

fn main() {
    let mut rounds = 10usize;
    let mut json_out: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(rounds),
            "--json" => json_out = args.next(),
            _ => {} // `--bench` and the like from cargo
        }
    }
    let linker = Linker::open().expect("nvJitLink");
    let plans = plans();

    // Warm-up (not counted): loads nvJitLink's code paths once per side.
    fraglink_round(&linker, &plans[..1]);
    mutex_round(&linker, &plans[..1]);

    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        // Alternate which side goes first, so drift hits both.
        if i % 2 == 0 {
            ours.push(fraglink_round(&linker, &plans));
            theirs.push(mutex_round(&linker, &plans));
        } else {
            theirs.push(mutex_round(&linker, &plans));
            ours.push(fraglink_round(&linker, &plans));
        }
        eprintln!(
            "contention round {}/{rounds}: fraglink {:.3} s, mutex {:.3} s",
            i + 1,
            ours[i].wall.as_secs_f64(),
            theirs[i].wall.as_secs_f64()
        );
    }
    let out = json!({
        "threads": THREADS,
        "keys": KEYS,
        "arch": ARCH.to_string(),
        "rounds": rounds,
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "plans": plans.iter().map(|p| p.fragment_names()).collect::<Vec<_>>(),
        "fraglink": side(&ours),
        "mutex": side(&theirs),
    });
    println!("{out}");
    if let Some(path) = json_out {
        std::fs::write(&path, format!("{out}\n")).expect("write --json file");
    }
}
