//! `fraglink index build`: an IVF-Flat index from a base file, written as a
//! versioned, checksummed index file (`fraglink search --index` reads it).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use fraglink::search::cpu::init_cpu_threads;
use fraglink::search::data::{read_vectors, DataError};
use fraglink::search::ivf::{
    build_index, write_index, IvfBuildParams, IvfError, IvfIndex, MetricSpec,
};
use fraglink::search::{DType, Vectors};
use serde_json::json;

use crate::link::fail;

#[derive(clap::Subcommand, Debug)]
pub enum IndexCommand {
    /// Build an approximate-search index from base vectors and write it to a file.
    Build(IndexBuildArgs),
}

/// Index kinds.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Inverted lists in cuVS's interleaved layout, exact distances inside them.
    IvfFlat,
}

#[derive(clap::Args, Debug)]
pub struct IndexBuildArgs {
    /// Index kind.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// Inverted lists (k-means centroids), 1 ≤ nlist ≤ rows.
    #[arg(long)]
    pub nlist: usize,
    /// Base vectors (.fvecs, .bvecs or .npy).
    #[arg(long)]
    pub base: PathBuf,
    /// l2, l2sqrt, ip or cosine.
    #[arg(long, default_value = "l2")]
    pub metric: MetricSpec,
    /// The base's element type (f32, f16, i8, u8); an error when the file holds another.
    #[arg(long)]
    pub dtype: Option<DType>,
    /// k-means seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// k-means Lloyd iterations at most.
    #[arg(long, default_value_t = IvfBuildParams::new(1, MetricSpec::plain(fraglink::search::Metric::L2)).iterations)]
    pub iterations: usize,
    /// Elements per lane of the interleaved lists [default: 1 for f32 (the CPU
    /// scan reads such groups in place), else cuVS's rule: 16 bytes when dim
    /// allows, else 1].
    #[arg(long)]
    pub veclen: Option<usize>,
    /// The index file to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
}

/// The checks a build makes on its options against the base before k-means.
pub fn check_build(
    base: &Vectors,
    nlist: usize,
    dtype: Option<DType>,
    what: &str,
) -> Result<(), String> {
    if let Some(d) = dtype.filter(|&d| d != base.dtype()) {
        return Err(format!(
            "--dtype {d} conflicts with {what}, which holds {} vectors",
            base.dtype()
        ));
    }
    if nlist == 0 || nlist > base.rows() {
        return Err(format!(
            "--nlist {nlist}: must be between 1 and the number of base rows, {} ({what})",
            base.rows()
        ));
    }
    Ok(())
}

/// Builds, timed; the seconds include k-means, assignment and list layout.
pub fn timed_build(base: &Vectors, p: &IvfBuildParams) -> Result<(IvfIndex, f64), String> {
    let started = Instant::now();
    // The build checks the veclen; only --veclen sets one (name it).
    let index = build_index(base, p).map_err(|e| match e {
        IvfError::BadVeclen { .. } => format!("--veclen: {e}"),
        e => e.to_string(),
    })?;
    Ok((index, started.elapsed().as_secs_f64()))
}

pub fn run(c: &IndexCommand) -> ExitCode {
    let IndexCommand::Build(a) = c;
    match build(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn build(a: &IndexBuildArgs) -> Result<(), String> {
    let Kind::IvfFlat = a.kind;
    if let Some(w) = init_cpu_threads().map_err(|e| e.to_string())?.warning {
        eprintln!("warning: {w}");
    }
    let base = read_vectors(&a.base).map_err(|e| e.to_string())?;
    if base.rows() == 0 {
        return Err(DataError::Empty {
            path: a.base.clone(),
        }
        .to_string());
    }
    check_build(
        &base,
        a.nlist,
        a.dtype,
        &format!("--base {}", a.base.display()),
    )?;
    let mut p = IvfBuildParams::new(a.nlist, a.metric).with_seed(a.seed);
    p.iterations = a.iterations;
    p.veclen = a.veclen;
    let (index, seconds) = timed_build(&base, &p)?;
    write_index(&a.out, &index).map_err(|e| e.to_string())?;
    let lens: Vec<usize> = (0..index.nlist()).map(|l| index.list_len(l)).collect();
    let (min, max) = (
        lens.iter().min().copied().unwrap_or(0),
        lens.iter().max().copied().unwrap_or(0),
    );
    if a.json {
        println!(
            "{}",
            json!({
                "index": a.out.display().to_string(),
                "kind": "ivf-flat",
                "nlist": index.nlist(),
                "n": index.rows(),
                "dim": index.dim(),
                "dtype": index.dtype().to_string(),
                "metric": index.metric().to_string(),
                "veclen": index.veclen(),
                "seed": a.seed,
                "build_seconds": seconds,
                "list_min": min,
                "list_max": max,
            })
        );
    } else {
        println!(
            "index      ivf-flat, {} lists over {} × {} {} ({}), veclen {}, seed {}",
            index.nlist(),
            index.rows(),
            index.dim(),
            index.dtype(),
            index.metric(),
            index.veclen(),
            a.seed
        );
        println!("build      {seconds:.2} s; list sizes {min}..{max}");
        println!("written    {}", a.out.display());
    }
    Ok(())
}
