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
use fraglink::link::Planner;
use fraglink::search::cpu::init_cpu_threads;
use fraglink::search::data::{
    check_ground_truth, memory_limit, read_dataset, read_ground_truth, recall_at_k,
    synthetic_bytes, try_synthetic_of, DataError, MemoryLimit, Synthetic,
};
use fraglink::search::ivf::MetricSpec;
use fraglink::search::kernels::SearchKernels;
use fraglink::search::knn::gpu::variant_by_env;
use fraglink::search::knn::{self, plan::SharedMemory};
use fraglink::search::plan::plan;
use fraglink::search::route::{Device, Searcher};
use fraglink::search::RESULT_BYTES_PER_SLOT;
use fraglink::search::{search_reference, Bitset, DType, Filter, Metric, SearchParams, Vectors};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::link::{fail, link_json};
use crate::repeat::{check as check_repeat, repeat};

#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// Base vectors (.fvecs, .bvecs or .npy); synthetic data when absent.
    #[arg(long, requires = "queries")]
    pub base: Option<PathBuf>,
    /// Query vectors, same format and dim as --base (or as the --index).
    #[arg(long)]
    pub queries: Option<PathBuf>,
    /// Ground-truth neighbour ids (.ivecs or .npy); computed exactly when absent.
    #[arg(long)]
    pub groundtruth: Option<PathBuf>,
    /// Synthetic data: base rows.
    #[arg(long, default_value_t = 20_000, conflicts_with_all = ["base", "index"])]
    pub n: usize,
    /// Synthetic data: dimension.
    #[arg(long, default_value_t = 128, conflicts_with_all = ["base", "index"])]
    pub dim: usize,
    /// Synthetic data: queries.
    #[arg(long, default_value_t = 200, conflicts_with_all = ["base", "index"])]
    pub nq: usize,
    /// Synthetic data: clustered (Gaussian blobs) or gaussian (one blob, no
    /// structure for an index to find) [default: clustered].
    #[arg(long, conflicts_with_all = ["base", "index"])]
    pub data: Option<Synthetic>,
    /// Synthetic data: seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Neighbours per query.
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// l2, l2sqrt (the square root of l2, applied to the selected distances),
    /// ip (inner product) or cosine [default: l2; an --index's own metric].
    #[arg(long)]
    pub metric: Option<MetricSpec>,
    /// f32, f16, i8 or u8 [default: f32] (synthetic data; files and an
    /// --index carry their own, and a different --dtype is an error).
    #[arg(long)]
    pub dtype: Option<DType>,
    /// Search an IVF-Flat index file (`fraglink index build`) with --queries.
    #[arg(long, conflicts_with_all = ["base", "ivf_flat", "nlist"])]
    pub index: Option<PathBuf>,
    /// Build an IVF-Flat index in memory (from --base or synthetic data) and search it.
    #[arg(long, requires = "nlist")]
    pub ivf_flat: bool,
    /// Inverted lists of the --ivf-flat index.
    #[arg(long, requires = "ivf_flat")]
    pub nlist: Option<usize>,
    /// Lists probed per query (IVF only) [default: 16, at most nlist].
    #[arg(long)]
    pub nprobe: Option<usize>,
    /// none, or bitset:FRACTION (that fraction of rows allowed, seeded).
    #[arg(long, default_value = "none")]
    pub filter: String,
    /// auto (the cost model decides), cpu or gpu.
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// Architecture to link the GPU plan for when there is no GPU (default sm_90).
    #[arg(long)]
    pub arch: Option<String>,
    /// Run the search this many times in this process and report the
    /// median (QPS from it), the fastest and the first run; every run must
    /// return the same neighbours.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn parse_filter(spec: &str, n: usize, seed: u64) -> Result<Filter, String> {
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

pub(crate) fn spinner(msg: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap());
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// `what` needs `bytes` beside `held` bytes already counted: an error naming
/// `what` when the sum overflows or exceeds the memory limit.
pub(crate) fn fits(
    what: &str,
    bytes: Option<u64>,
    held: u64,
    limit: MemoryLimit,
) -> Result<u64, String> {
    match bytes.and_then(|b| b.checked_add(held)) {
        Some(total) if total <= limit.bytes => Ok(total),
        Some(total) => Err(format!(
            "{what}: needs {total} bytes in memory, more than the {limit} this process may use"
        )),
        None => Err(format!("{what}: the size overflows 64 bits")),
    }
}

/// Two result sets of `nq` queries (the search's and the exact ground
/// truth's) beside `held` bytes, checked before either is allocated; the
/// bytes held with them.
pub(crate) fn fits_results(
    a: &SearchArgs,
    nq: usize,
    held: u64,
    limit: MemoryLimit,
) -> Result<u64, String> {
    let results = (nq as u64)
        .checked_mul(a.k as u64)
        .and_then(|s| s.checked_mul(2 * RESULT_BYTES_PER_SLOT));
    let what = format!(
        "--k {} for {nq} queries (the results and the exact ground truth)",
        a.k
    );
    fits(&what, results, held, limit)
}

/// The synthetic data set, its sizes checked (option by option) before anything
/// is allocated.
pub(crate) fn synthetic_data(
    a: &SearchArgs,
    limit: MemoryLimit,
) -> Result<(Vectors, Vectors, u64), String> {
    if a.n == 0 || a.dim == 0 {
        return Err("--n and --dim must be at least 1".into());
    }
    if a.nq == 0 {
        return Err("--nq 0: there must be at least one query".into());
    }
    check_k(a, a.n, "--n")?;
    let dtype = a.dtype.unwrap_or(DType::F32);
    let what = format!(
        "--n {} --dim {} --nq {} (synthetic {} data)",
        a.n, a.dim, a.nq, dtype
    );
    let bytes = fits(&what, synthetic_bytes(a.n, a.dim, a.nq, dtype), 0, limit)?;
    let kind = a.data.unwrap_or(Synthetic::Clustered);
    let (b, q) =
        try_synthetic_of(kind, a.n, a.dim, a.nq, dtype, a.seed).map_err(|e| e.to_string())?;
    Ok((b, q, bytes))
}

/// k ≤ n: asking for more neighbours than the base has rows is an error.
pub(crate) fn check_k(a: &SearchArgs, n: usize, base: &str) -> Result<(), String> {
    if a.k > n {
        return Err(format!(
            "--k {} exceeds the number of base rows, {n} ({base}): k must be at most n",
            a.k
        ));
    }
    Ok(())
}

/// The base and queries: files (checked) or synthetic, with the bytes held.
pub(crate) fn load_data(
    a: &SearchArgs,
    limit: MemoryLimit,
) -> Result<(Vectors, Vectors, u64), String> {
    match (&a.base, &a.queries) {
        (Some(b), Some(q)) => {
            let (base, queries) = read_dataset(b, q).map_err(|e| e.to_string())?;
            for (v, path) in [(&base, b), (&queries, q)] {
                if v.rows() == 0 {
                    return Err(DataError::Empty { path: path.clone() }.to_string());
                }
                if v.dim() == 0 {
                    return Err(format!("{}: vectors of dimension 0", path.display()));
                }
                if let Some(max) = v.dtype().max_dim().filter(|&m| v.dim() > m) {
                    let e = fraglink::search::SearchError::DimTooLarge {
                        dtype: v.dtype(),
                        dim: v.dim(),
                        max,
                    };
                    return Err(format!("{}: {e}", path.display()));
                }
            }
            if let Some(d) = a.dtype.filter(|&d| d != base.dtype()) {
                return Err(format!(
                    "--dtype {d} conflicts with --base {}, which holds {} vectors",
                    b.display(),
                    base.dtype()
                ));
            }
            check_k(a, base.rows(), &format!("--base {}", b.display()))?;
            // Held already, so no overflow; saturating all the same.
            let bytes = (base.rows() as u64)
                .saturating_add(queries.rows() as u64)
                .saturating_mul(base.dim() as u64)
                .saturating_mul(base.dtype().size() as u64);
            Ok((base, queries, bytes))
        }
        (None, Some(_)) => Err("--queries needs --base (or --index)".into()),
        (Some(_), None) => Err("--base needs --queries".into()),
        (None, None) => synthetic_data(a, limit),
    }
}

pub fn run(a: &SearchArgs) -> ExitCode {
    if let Err(e) = check_repeat(a.repeat) {
        return fail(e);
    }
    // Every run-time variable, whichever device serves this search.
    if let Err(e) = fraglink::search::env::check() {
        return fail(e);
    }
    if a.index.is_some() || a.ivf_flat {
        return crate::ivf_search::run(a);
    }
    if a.nprobe.is_some() {
        return fail("--nprobe applies to IVF searches only (--index or --ivf-flat)");
    }
    let spec = a.metric.unwrap_or(MetricSpec::plain(Metric::L2));
    let quiet = a.json;
    let limit = memory_limit();
    // Data.
    let pb = spinner("loading data", quiet);
    let (base, queries, data_bytes) = match load_data(a, limit) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    pb.finish_and_clear();
    if let Err(e) = fits_results(a, queries.rows(), data_bytes, limit) {
        return fail(e);
    }
    // Ground truth from a file: read and checked against this search (rows,
    // columns, ids) before it runs.
    let truth_started = Instant::now();
    let file_truth = match &a.groundtruth {
        Some(path) => match read_ground_truth(path).and_then(|t| {
            check_ground_truth(path, &t, queries.rows(), base.rows(), a.k).map(|()| t)
        }) {
            Ok(t) => Some(t),
            Err(e) => return fail(e),
        },
        None => None,
    };
    let file_truth_s = truth_started.elapsed().as_secs_f64();
    let filter = match parse_filter(&a.filter, base.rows(), a.seed) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let params = SearchParams::new(a.k, spec.metric).with_filter(filter);

    // The CPU path's threads (RAYON_NUM_THREADS, clamped), before anything
    // starts rayon's pool (the router's cost model is the first).
    match init_cpu_threads() {
        Ok(t) => {
            if let Some(w) = t.warning {
                eprintln!("warning: {w}");
            }
        }
        Err(e) => return fail(e),
    }

    // The router (probes the GPU; --device gpu without one is an error).
    let searcher = match Searcher::new(a.device) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };

    // The GPU plan, linked for the device (or --arch, or sm_90) so the
    // kernel that would run is visible even without a GPU.
    // A bad --arch is an error even where a GPU makes it moot.
    let asked = match a.arch.as_deref().map(|s| Arch::parse(s, "--arch")) {
        Some(Ok(x)) => Some(x.real()),
        Some(Err(e)) => return fail(e),
        None => None,
    };
    let link_arch = match (searcher.gpu(), asked) {
        (Some(g), _) => g.context().arch(),
        (None, Some(x)) => x,
        (None, None) => Arch::sm(90),
    };
    let shared = searcher.gpu().map_or(SharedMemory::H100, |g| {
        SharedMemory::of(g.context().limits())
    });
    let gpu_plan = gpu_plan(&base, &queries, &params, link_arch, shared);
    let (fragments, link) = match &gpu_plan {
        Ok((planners, names)) => {
            let pb = spinner("linking the GPU plan", quiet);
            // Without a GPU the link only describes the plan: it must not
            // fail over the cache settings, which the CPU route never uses,
            // but a usable disk cache spares a repeated run the link. With a
            // GPU, every kernel of the plan is linked here, into the runtime
            // the search links through, so the timed searches find them
            // linked.
            let runtime = if searcher.gpu().is_some() {
                LinkRuntime::global()
            } else {
                LinkRuntime::describing()
            };
            // The plan's kernels at the same time (LinkRuntime::link_all).
            let linked = runtime.and_then(|rt| {
                let plans: Vec<&Planner> = planners.iter().collect();
                Ok(rt.link_all(&plans, link_arch)?.into_iter().next())
            });
            pb.finish_and_clear();
            match linked {
                Ok(l) => (names.clone(), l),
                Err(e) => return fail(format!("linking the GPU plan for {link_arch}: {e}")),
            }
        }
        Err(_) => (Vec::new(), None),
    };

    // The search: the base is uploaded once when the GPU takes it (timed
    // apart), then every query batch runs against the resident copy.
    let pb = spinner("searching", quiet);
    let index = searcher.index(&base);
    // FRAGLINK_SEARCH_TRACE: the last repetition's trace (the warmest).
    let mut last_trace = None;
    let searched = repeat(
        a.repeat,
        "the search",
        || {
            let mut r = index.search(&queries, &params).map_err(|e| e.to_string())?;
            let s = r.seconds;
            last_trace = r.trace.take();
            Ok((r, s))
        },
        // A repetition served elsewhere (a GPU fault answered on the CPU)
        // would time another path under the first one's route.
        |x, y| {
            x.neighbors.bitwise_eq(&y.neighbors)
                && (x.target, x.fell_back, x.gpu_kernel) == (y.target, y.fell_back, y.gpu_kernel)
        },
    );
    let (mut routed, timings) = match searched {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    // l2sqrt: the post-process maps the selected distances (never the selection).
    for d in routed.neighbors.distances.iter_mut() {
        *d = spec.post.apply(*d);
    }
    pb.finish_and_clear();
    let search_s = timings.median();
    let qps = queries.rows() as f64 / search_s.max(1e-9);
    // Null when nothing was uploaded (the CPU route).
    let upload = index
        .resident()
        .map(|g| (g.upload_bytes(), g.upload_time().as_secs_f64()));

    // Recall against exact ground truth.
    let pb = spinner("exact ground truth", quiet);
    let truth_started = Instant::now();
    let recall = match &file_truth {
        Some(t) => recall_at_k(&routed.neighbors, t, a.k),
        None => match search_reference(&base, &queries, &params) {
            Ok(t) => recall_at_k(&routed.neighbors, &t, a.k),
            Err(e) => return fail(e),
        },
    };
    let truth_s = truth_started.elapsed().as_secs_f64() + file_truth_s;
    pb.finish_and_clear();

    let route = routed.target.to_string();
    let filter_desc = a.filter.clone();
    if a.json {
        let mut out = json!({
            "route": route,
            "reason": routed.reason,
            "fell_back": routed.fell_back,
            "fragments": fragments,
            "gpu_kernel": routed.gpu_kernel,
            "special_rows": routed.special_rows,
            "special_queries": routed.special_queries,
            "link": link.as_ref().map(link_json),
            "plan_error": gpu_plan.as_ref().err().map(|e| e.to_string()),
            "qps": qps,
            "search_ms": search_s * 1e3,
            "upload_ms": upload.map(|(_, s)| s * 1e3),
            "upload_bytes": upload.map(|(b, _)| b),
            "prepare_ms": routed.link_seconds * 1e3,
            "trace": last_trace,
            "recall": recall,
            "k": a.k,
            "n": base.rows(),
            "nq": queries.rows(),
            "dim": base.dim(),
            "metric": spec.to_string(),
            "dtype": base.dtype().to_string(),
            "filter": filter_desc,
        });
        for (key, v) in timings.json_fields() {
            out[key] = v;
        }
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
        spec,
        filter_desc
    );
    println!(
        "route      {route}: {}{}",
        routed.reason,
        if routed.fell_back { " (fell back)" } else { "" }
    );
    if let Some(k) = routed.gpu_kernel {
        let mut apart = Vec::new();
        if routed.special_rows > 0 {
            apart.push(format!(
                "the scan over {} special rows beside it",
                routed.special_rows
            ));
        }
        if routed.special_queries > 0 {
            apart.push(format!(
                "{} special queries answered apart",
                routed.special_queries
            ));
        }
        match apart.is_empty() {
            true => println!("ran        {k}"),
            false => println!("ran        {k} ({})", apart.join("; ")),
        }
    }
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
            "upload     {:.1} MB of base vectors (with their norms and f16 copies where the GPU path uses them) to the GPU in {:.1} ms ({:.2} GB/s), once: not in the search time or QPS",
            bytes as f64 / 1e6,
            s * 1e3,
            bytes as f64 / s.max(1e-9) / 1e9
        ),
        None => println!("upload     none: the CPU path reads the base in host memory"),
    }
    if routed.target == fraglink::cost::Target::Gpu {
        println!(
            "prepare    the GPU kernels loaded (linked too, where the plan above did not link them) before the first search in {:.2} ms: not in the search time or QPS",
            routed.link_seconds * 1e3
        );
    }
    println!("search     {}, {:.0} QPS", timings.describe(), qps);
    println!(
        "recall@{}  {:.4} (exact ground truth in {:.1} ms)",
        a.k,
        recall,
        truth_s * 1e3
    );
    ExitCode::SUCCESS
}

/// The GPU plan of the search on `arch` with `shared` memory per block, as
/// planners (the first kernel's first: what the `kernel` line describes)
/// and the names of every fragment they link: the library's rule
/// ([`SearchKernels::decide`], `FRAGLINK_KNN_VARIANT` honoured), so the plan
/// line names what a search would run (rows or queries special for the
/// tensor-core bounds can still change that at run time: special queries
/// take the scan or the select, special rows add a scan of their own; the
/// report's `gpu_kernel` names what ran); else why none.
fn gpu_plan(
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
    arch: Arch,
    shared: SharedMemory,
) -> Result<(Vec<Planner>, Vec<&'static str>), String> {
    let (dtype, metric, filter) = (base.dtype(), params.metric, params.filter.fragment_name());
    let r = knn::KnnRequest {
        device: arch,
        shared,
        dtype,
        metric,
        filter,
        n_rows: base.rows(),
        dim: base.dim(),
        nq: queries.rows(),
        k: params.k,
    };
    let scan = plan(dtype, metric, filter, base.rows(), base.dim(), params.k).map_err(Into::into);
    let kernels =
        SearchKernels::decide(&r, scan, variant_by_env().as_deref()).map_err(|e| e.to_string())?;
    let planners = kernels.kernels().into_iter().map(|(p, _)| p).collect();
    Ok((planners, kernels.fragment_names()))
}
