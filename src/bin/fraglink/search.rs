//! `fraglink search`: the main job. Exact k-NN end to end: data (synthetic or
//! files), the GPU plan and its link result, routing, the one-time upload of
//! the base (GPU route), QPS and recall. The base goes to the device once
//! ([`Searcher::index`]) and every query batch searches the resident copy;
//! the upload is reported apart and is not part of the search time or QPS.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fraglink::build::Arch;
use fraglink::link::LinkRuntime;
use fraglink::search::data::{read_dataset, read_ground_truth, recall_at_k, synthetic};
use fraglink::search::plan::plan;
use fraglink::search::route::{Device, Searcher};
use fraglink::search::{search_reference, Bitset, DType, Filter, Metric, SearchParams};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::link::{fail, link_json};

#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// Base vectors (.fvecs, .bvecs or .npy); synthetic data when absent.
    #[arg(long, requires = "queries")]
    pub base: Option<PathBuf>,
    /// Query vectors, same format and dim as --base.
    #[arg(long, requires = "base")]
    pub queries: Option<PathBuf>,
    /// Ground-truth neighbour ids (.ivecs or .npy); computed exactly when absent.
    #[arg(long)]
    pub groundtruth: Option<PathBuf>,
    /// Synthetic data: base rows.
    #[arg(long, default_value_t = 20_000)]
    pub n: usize,
    /// Synthetic data: dimension.
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// Synthetic data: queries.
    #[arg(long, default_value_t = 200)]
    pub nq: usize,
    /// Synthetic data: seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// l2, ip (inner product) or cosine.
    #[arg(long, default_value = "l2")]
    pub metric: Metric,
    /// f32, f16, i8 or u8 (synthetic data; files carry their own).
    #[arg(long, default_value = "f32")]
    pub dtype: DType,
    /// none, or bitset:FRACTION (that fraction of rows allowed, seeded).
    #[arg(long, default_value = "none")]
    pub filter: String,
    /// auto (the cost model decides), cpu or gpu.
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// Architecture to link the GPU plan for when there is no GPU (default sm_90).
    #[arg(long)]
    pub arch: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_filter(spec: &str, n: usize, seed: u64) -> Result<Filter, String> {
    if spec == "none" {
        return Ok(Filter::None);
    }
    let frac = spec
        .strip_prefix("bitset:")
        .ok_or_else(|| format!("--filter `{spec}`: expected none or bitset:FRACTION"))?;
    let f: f64 = frac
        .parse()
        .ok()
        .filter(|f: &f64| (0.0..=1.0).contains(f))
        .ok_or_else(|| format!("--filter `{spec}`: FRACTION must be a number in [0, 1]"))?;
    Ok(Filter::Bitset(Bitset::random(n, f, seed ^ 0x5eed)))
}

fn spinner(msg: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap());
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

pub fn run(a: &SearchArgs) -> ExitCode {
    let quiet = a.json;
    // Data.
    let pb = spinner("loading data", quiet);
    let (base, queries) = match (&a.base, &a.queries) {
        (Some(b), Some(q)) => match read_dataset(b, q) {
            Ok(v) => v,
            Err(e) => return fail(e),
        },
        _ => {
            if a.n == 0 || a.dim == 0 {
                return fail("--n and --dim must be at least 1");
            }
            synthetic(a.n, a.dim, a.nq, a.dtype, a.seed)
        }
    };
    pb.finish_and_clear();
    let filter = match parse_filter(&a.filter, base.rows(), a.seed) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let params = SearchParams::new(a.k, a.metric).with_filter(filter);

    // The router (probes the GPU; --device gpu without one is an error).
    let searcher = match Searcher::new(a.device) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };

    // The GPU plan, linked for the device (or --arch, or sm_90) so the
    // kernel that would run is visible even without a GPU.
    // A bad --arch is an error even where a GPU makes it moot.
    let asked = match a.arch.as_deref().map(|s| Arch::parse(s, "--arch")) {
        Some(Ok(x)) => Some(Arch::sm(x.number)),
        Some(Err(e)) => return fail(e),
        None => None,
    };
    let link_arch = match (searcher.gpu(), asked) {
        (Some(g), _) => g.context().arch(),
        (None, Some(x)) => x,
        (None, None) => Arch::sm(90),
    };
    let gpu_plan = plan(
        base.dtype(),
        a.metric,
        params.filter.fragment_name(),
        base.rows(),
        base.dim(),
        a.k,
    );
    let (fragments, link) = match &gpu_plan {
        Ok(p) => {
            let pb = spinner("linking the GPU plan", quiet);
            let linked = LinkRuntime::global().and_then(|rt| rt.link(&p.planner(), link_arch));
            pb.finish_and_clear();
            match linked {
                Ok(l) => (p.fragment_names(), Some(l)),
                Err(e) => return fail(format!("linking the GPU plan for {link_arch}: {e}")),
            }
        }
        Err(_) => (Vec::new(), None),
    };

    // The search: the base is uploaded once when the GPU takes it (timed
    // apart), then every query batch runs against the resident copy.
    let pb = spinner("searching", quiet);
    let index = searcher.index(&base);
    let routed = match index.search(&queries, &params) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    pb.finish_and_clear();
    let qps = queries.rows() as f64 / routed.seconds.max(1e-9);
    // Null when nothing was uploaded (the CPU route).
    let upload = index
        .resident()
        .map(|g| (g.device_bytes(), g.upload_time().as_secs_f64()));

    // Recall against exact ground truth.
    let pb = spinner("exact ground truth", quiet);
    let truth_started = Instant::now();
    let recall = match &a.groundtruth {
        Some(path) => match read_ground_truth(path) {
            Ok(t) if t.len() < queries.rows() => {
                return fail(format!(
                    "{}: {} ground-truth rows for {} queries",
                    path.display(),
                    t.len(),
                    queries.rows()
                ))
            }
            Ok(t) => recall_at_k(&routed.neighbors, &t, a.k),
            Err(e) => return fail(e),
        },
        None => match search_reference(&base, &queries, &params) {
            Ok(t) => recall_at_k(&routed.neighbors, &t, a.k),
            Err(e) => return fail(e),
        },
    };
    let truth_s = truth_started.elapsed().as_secs_f64();
    pb.finish_and_clear();

    let route = routed.target.to_string();
    let filter_desc = a.filter.clone();
    if a.json {
        let out = json!({
            "route": route,
            "reason": routed.reason,
            "fell_back": routed.fell_back,
            "fragments": fragments,
            "link": link.as_ref().map(link_json),
            "plan_error": gpu_plan.as_ref().err().map(|e| e.to_string()),
            "qps": qps,
            "search_ms": routed.seconds * 1e3,
            "upload_ms": upload.map(|(_, s)| s * 1e3),
            "upload_bytes": upload.map(|(b, _)| b),
            "recall": recall,
            "k": a.k,
            "n": base.rows(),
            "nq": queries.rows(),
            "dim": base.dim(),
            "metric": a.metric.to_string(),
            "dtype": base.dtype().to_string(),
            "filter": filter_desc,
        });
        println!("{out}");
        return ExitCode::SUCCESS;
    }
    println!(
        "data       {} × {} {} base, {} queries, k = {}, metric {}, filter {}",
        base.rows(),
        base.dim(),
        base.dtype(),
        queries.rows(),
        a.k,
        a.metric,
        filter_desc
    );
    println!(
        "route      {route}: {}{}",
        routed.reason,
        if routed.fell_back { " (fell back)" } else { "" }
    );
    match (&gpu_plan, &link) {
        (Ok(_), Some(l)) => {
            let m = &l.kernel.metadata;
            println!("gpu plan   {}", fragments.join(" + "));
            println!(
                "kernel     {} for {}: {} registers, {} spill stores, {} spill loads, {} B stack, {} B shared, {} B cubin",
                l.kernel.entry,
                l.kernel.arch,
                m.registers,
                m.spill_stores,
                m.spill_loads,
                m.stack_bytes,
                m.shared_bytes.unwrap_or(0),
                l.kernel.cubin.len()
            );
            println!(
                "link       {:.1} ms when linked; this run: {} in {:.2} ms",
                m.link_ms,
                match l.source {
                    fraglink::link::Source::Linked => "linked",
                    fraglink::link::Source::Memory => "memory cache",
                    fraglink::link::Source::Disk => "disk cache",
                },
                l.elapsed.as_secs_f64() * 1e3
            );
        }
        (Err(e), _) => println!("gpu plan   none: {e}"),
        _ => {}
    }
    match upload {
        Some((bytes, s)) => println!(
            "upload     {:.1} MB of base vectors to the GPU in {:.1} ms ({:.2} GB/s), once: not in the search time or QPS",
            bytes as f64 / 1e6,
            s * 1e3,
            bytes as f64 / s.max(1e-9) / 1e9
        ),
        None => println!("upload     none: the CPU path reads the base in host memory"),
    }
    println!("search     {:.1} ms, {:.0} QPS", routed.seconds * 1e3, qps);
    println!(
        "recall@{}  {:.4} (exact ground truth in {:.1} ms)",
        a.k,
        recall,
        truth_s * 1e3
    );
    ExitCode::SUCCESS
}
