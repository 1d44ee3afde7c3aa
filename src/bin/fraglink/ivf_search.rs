//! `fraglink search --index FILE` and `fraglink search --ivf-flat --nlist N`:
//! approximate k-NN through an IVF-Flat index (read from a file, or built in
//! memory from the search's data), with QPS and recall against the exact
//! answer (brute force by the same fold; `--groundtruth` when given).

use std::process::ExitCode;
use std::time::Instant;

use fraglink::search::cpu::init_cpu_threads;
use fraglink::search::data::{
    check_ground_truth, memory_limit, read_ground_truth, read_vectors, recall_at_k, DataError,
};
use fraglink::search::gpu::GpuSearcher;
use fraglink::search::ivf::gpu::{max_k, GpuIvfIndex};
use fraglink::search::ivf::{
    read_index, search_ivf, IvfBuildParams, IvfIndex, IvfSearchParams, MetricSpec, DEFAULT_NPROBE,
};
use fraglink::search::route::{Device, Searcher};
use fraglink::search::{search_cpu, Metric, SearchParams, Vectors};
use serde_json::json;

use crate::index::{check_build, timed_build};
use crate::link::fail;
use crate::repeat::repeat;
use crate::search::{check_k, fits, fits_results, load_data, parse_filter, spinner, SearchArgs};

pub fn run(a: &SearchArgs) -> ExitCode {
    match search(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// Where the index came from.
struct Loaded {
    index: IvfIndex,
    /// The base when the search holds it (built in memory); else the index's lists hold it.
    base: Option<Vectors>,
    queries: Vectors,
    /// The file, or `memory`.
    name: String,
    build_seconds: Option<f64>,
    load_seconds: Option<f64>,
    held: u64,
}

fn from_file(a: &SearchArgs, path: &std::path::Path) -> Result<Loaded, String> {
    let qpath = a.queries.as_ref().ok_or("--index needs --queries")?;
    let started = Instant::now();
    let index = read_index(path).map_err(|e| e.to_string())?;
    let load_seconds = started.elapsed().as_secs_f64();
    let what = format!("--index {}", path.display());
    if let Some(m) = a.metric.filter(|&m| m != index.metric()) {
        return Err(format!(
            "--metric {m} conflicts with {what}, built for {}",
            index.metric()
        ));
    }
    if let Some(d) = a.dtype.filter(|&d| d != index.dtype()) {
        return Err(format!(
            "--dtype {d} conflicts with {what}, which holds {} vectors",
            index.dtype()
        ));
    }
    let queries = read_vectors(qpath).map_err(|e| e.to_string())?;
    if queries.rows() == 0 {
        return Err(DataError::Empty {
            path: qpath.clone(),
        }
        .to_string());
    }
    if queries.dtype() != index.dtype() || queries.dim() != index.dim() {
        return Err(format!(
            "--queries {} holds {} × {} {} vectors, {what} holds dim {} {}",
            qpath.display(),
            queries.rows(),
            queries.dim(),
            queries.dtype(),
            index.dim(),
            index.dtype()
        ));
    }
    check_k(a, index.rows(), &what)?;
    let held = (index.list_bytes() + queries.size_bytes()) as u64;
    Ok(Loaded {
        index,
        base: None,
        queries,
        name: path.display().to_string(),
        build_seconds: None,
        load_seconds: Some(load_seconds),
        held,
    })
}

fn in_memory(a: &SearchArgs) -> Result<Loaded, String> {
    let nlist = a.nlist.ok_or("--ivf-flat needs --nlist")?;
    let (base, queries, held) = load_data(a, memory_limit())?;
    check_build(&base, nlist, a.dtype, "the base")?;
    // The index holds a copy of the base (interleaved, padded to groups of 32).
    let held = fits(
        "the in-memory index",
        Some(base.size_bytes() as u64 * 2),
        held,
        memory_limit(),
    )?;
    let spec = a.metric.unwrap_or(MetricSpec::plain(Metric::L2));
    let p = IvfBuildParams::new(nlist, spec).with_seed(a.seed);
    let pb = spinner("building the IVF-Flat index", a.json);
    let (index, seconds) = timed_build(&base, &p)?;
    pb.finish_and_clear();
    Ok(Loaded {
        index,
        base: Some(base),
        queries,
        name: "memory".into(),
        build_seconds: Some(seconds),
        load_seconds: None,
        held,
    })
}

/// `--device gpu`: the device (an error without one); `auto` and `cpu`: the
/// CPU path (IVF has no cost model yet, and the CPU path is the reference).
fn gpu_for(a: &SearchArgs) -> Result<Option<GpuSearcher>, String> {
    if a.device != Device::Gpu {
        return Ok(None);
    }
    let searcher = Searcher::new(Device::Gpu).map_err(|e| e.to_string())?;
    Ok(searcher.gpu().cloned())
}

fn search(a: &SearchArgs) -> Result<(), String> {
    let mut gpu = gpu_for(a)?;
    if let Some(w) = init_cpu_threads().map_err(|e| e.to_string())?.warning {
        eprintln!("warning: {w}");
    }
    let l = match &a.index {
        Some(path) => from_file(a, path)?,
        None => in_memory(a)?,
    };
    let (index, queries) = (&l.index, &l.queries);
    let nprobe = a.nprobe.unwrap_or(DEFAULT_NPROBE);
    if nprobe == 0 {
        return Err("--nprobe 0: at least one list must be probed".into());
    }
    let nprobe = nprobe.min(index.nlist());
    let held = fits_results(a, queries.rows(), l.held, memory_limit())?;
    let filter = parse_filter(&a.filter, index.rows(), a.seed)?;
    let params = IvfSearchParams::new(a.k, nprobe).with_filter(filter.clone());
    let file_truth = match &a.groundtruth {
        Some(path) => {
            let t = read_ground_truth(path).map_err(|e| e.to_string())?;
            check_ground_truth(path, &t, queries.rows(), index.rows(), a.k)
                .map_err(|e| e.to_string())?;
            Some(t)
        }
        None => None,
    };

    // A k beyond every IVF scan's capacity, or lists no IVF scan reads: the
    // CPU path serves the search, as it does brute force's beyond the GPU's
    // reach (decided before the index is uploaded).
    if gpu.is_some() {
        match max_k(index.dtype(), index.veclen()) {
            Some(max) if a.k > max => {
                eprintln!(
                    "warning: k = {} is beyond the GPU IVF-Flat scan's {max}: the CPU path serves this search",
                    a.k
                );
                gpu = None;
            }
            Some(_) => {}
            None => {
                eprintln!(
                    "warning: no GPU IVF-Flat scan reads {} lists of veclen {}: the CPU path serves this search",
                    index.dtype().name(),
                    index.veclen()
                );
                gpu = None;
            }
        }
    }
    let pb = spinner("searching", a.json);
    let started = Instant::now();
    // The GPU route uploads the index first (timed apart, like brute force's upload).
    let dev = match &gpu {
        Some(g) => Some(GpuIvfIndex::upload(g, index).map_err(|e| e.to_string())?),
        None => None,
    };
    let upload_seconds = dev.as_ref().map(|_| started.elapsed().as_secs_f64());
    let (found, timings) = repeat(
        a.repeat,
        "the IVF-Flat search",
        || {
            let t = Instant::now();
            let found = match &dev {
                Some(d) => d.search(queries, &params).map_err(|e| e.to_string())?,
                None => search_ivf(index, queries, &params).map_err(|e| e.to_string())?,
            };
            Ok((found, t.elapsed().as_secs_f64()))
        },
        PartialEq::eq,
    )?;
    let seconds = timings.median();
    let route = if gpu.is_some() { "gpu" } else { "cpu" };
    pb.finish_and_clear();
    let qps = queries.rows() as f64 / seconds.max(1e-9);

    // The exact answer: brute force over the base (the index's lists hold it
    // bit for bit when the search did not load it).
    let pb = spinner("exact answer", a.json);
    let truth_started = Instant::now();
    let recall = match &file_truth {
        Some(t) => recall_at_k(&found, t, a.k),
        None => {
            let rebuilt;
            let base = match &l.base {
                Some(b) => b,
                None => {
                    fits(
                        "the exact answer (the base, rebuilt from the index)",
                        Some(index.list_bytes() as u64),
                        held,
                        memory_limit(),
                    )?;
                    rebuilt = index.reconstruct();
                    &rebuilt
                }
            };
            let p = SearchParams::new(a.k, index.metric().metric).with_filter(filter);
            let t = search_cpu(base, queries, &p).map_err(|e| e.to_string())?;
            recall_at_k(&found, &t, a.k)
        }
    };
    let truth_s = truth_started.elapsed().as_secs_f64();
    pb.finish_and_clear();

    if a.json {
        let mut out = json!({
            "route": route,
            "upload_ms": upload_seconds.map(|s| s * 1e3),
            "index": l.name,
            "kind": "ivf-flat",
            "nlist": index.nlist(),
            "nprobe": nprobe,
            "build_seconds": l.build_seconds,
            "load_seconds": l.load_seconds,
            "qps": qps,
            "search_ms": seconds * 1e3,
            "recall": recall,
            "k": a.k,
            "n": index.rows(),
            "nq": queries.rows(),
            "dim": index.dim(),
            "metric": index.metric().to_string(),
            "dtype": index.dtype().to_string(),
            "veclen": index.veclen(),
            "filter": a.filter,
        });
        for (key, v) in timings.json_fields() {
            out[key] = v;
        }
        println!("{out}");
        return Ok(());
    }
    println!(
        "data       {} × {} {} base, {} queries, k = {}, metric {}, filter {}",
        index.rows(),
        index.dim(),
        index.dtype(),
        queries.rows(),
        a.k,
        index.metric(),
        a.filter
    );
    match (l.build_seconds, l.load_seconds) {
        (Some(b), _) => println!(
            "index      ivf-flat in memory, {} lists, built in {b:.2} s",
            index.nlist()
        ),
        (_, Some(s)) => println!(
            "index      ivf-flat {}, {} lists, read in {:.1} ms",
            l.name,
            index.nlist(),
            s * 1e3
        ),
        _ => {}
    }
    match upload_seconds {
        Some(s) => println!(
            "route      gpu: index uploaded in {:.1} ms (not in the search time)",
            s * 1e3
        ),
        None => println!("route      cpu: the IVF-Flat CPU path (--device gpu for the device)"),
    }
    println!(
        "search     nprobe {nprobe}: {}, {qps:.0} QPS",
        timings.describe()
    );
    println!(
        "recall@{}  {recall:.4} (exact answer in {:.1} ms)",
        a.k,
        truth_s * 1e3
    );
    Ok(())
}
