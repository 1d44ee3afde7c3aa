//! `fraglink prelink`: link plans ahead of time into the disk cache.

use std::path::PathBuf;
use std::process::ExitCode;

use fraglink::build::Arch;
use fraglink::families::PLAN_FAMILIES;
use fraglink::link::prelink::{prelink_with, PrelinkReport, Progress};
use fraglink::link::{profile, LinkRuntime, Planner};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::link::{fail, target_arch};

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("plans").required(true).args(["from", "family", "all"])))]
pub struct PrelinkArgs {
    /// Target architecture (sm_XX). Default: with --from, each plan's
    /// recorded arch; otherwise the current GPU's.
    #[arg(long)]
    pub arch: Option<String>,
    /// A profile written with FRAGLINK_PROFILE=FILE by an earlier run.
    #[arg(long, value_name = "PROFILE")]
    pub from: Option<PathBuf>,
    /// Every valid plan of one shipped family: scan, ivf_scan, knn or select
    /// (an unknown name is an error listing them).
    #[arg(long, value_name = "F")]
    pub family: Option<String>,
    /// Every valid plan of every shipped family.
    #[arg(long)]
    pub all: bool,
    /// Parallel links (default: one per core). At most two per core and one
    /// per plan, whatever is asked: each link can take hundreds of MB.
    #[arg(long, default_value_t = 0)]
    pub jobs: usize,
    /// Print the summary as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// The plans to link, each with its arch.
fn jobs(args: &PrelinkArgs) -> Result<Vec<(Planner, Arch)>, String> {
    let fixed = || target_arch(args.arch.as_deref());
    if let Some(path) = &args.from {
        let plans = profile::read(path).map_err(|e| e.to_string())?;
        let arch = args.arch.as_deref().map(|_| fixed()).transpose()?;
        return plans
            .iter()
            .map(|p| {
                let plan = p.planner().map_err(|e| {
                    format!(
                        "profile {}: plan `{}`: {e}",
                        path.display(),
                        p.entries.join(" ")
                    )
                })?;
                let arch = match arch {
                    Some(a) => a,
                    None => p.arch().map_err(|e| format!("{}: {e}", path.display()))?,
                };
                Ok((plan, arch))
            })
            .collect();
    }
    let families: Vec<_> = match &args.family {
        Some(name) => vec![fraglink::families::find(name).ok_or_else(|| {
            let known: Vec<&str> = PLAN_FAMILIES.iter().map(|f| f.name).collect();
            format!(
                "--family `{name}`: no such family; known: {}",
                known.join(", ")
            )
        })?],
        None => PLAN_FAMILIES.iter().collect(),
    };
    let arch = fixed()?;
    // A family's plans that cannot exist on this arch (fragments with a
    // minimum arch above it, e.g. the TF32 k-NN variants below sm_80) are
    // not prelinked: no search would ever ask for them there.
    Ok(families
        .iter()
        .flat_map(|f| f.plans())
        .filter(|p| p.static_fragments().iter().all(|f| f.links_for(arch)))
        .map(|p| (p, arch))
        .collect())
}

fn bar(total: usize, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
            .expect("a valid template"),
    );
    pb
}

fn summary_json(r: &PrelinkReport) -> serde_json::Value {
    json!({
        "total": r.total(),
        "linked": r.linked,
        "from_disk": r.from_disk,
        "from_memory": r.from_memory,
        "failed": r.failed.iter().map(|f| json!({
            "entry": f.entry,
            "fragments": f.fragments,
            "arch": f.arch.to_string(),
            "error": f.error.to_string(),
        })).collect::<Vec<_>>(),
        "elapsed_ms": r.elapsed.as_secs_f64() * 1e3,
        "disk_cache": r.disk_cache,
    })
}

pub fn run(args: &PrelinkArgs) -> ExitCode {
    let jobs = match jobs(args) {
        Ok(j) => j,
        Err(e) => return fail(e),
    };
    let rt = match LinkRuntime::global() {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    // Read the disk cache's settings now: an invalid value is one error,
    // not one failure per plan.
    if let Err(e) = rt.try_disk() {
        return fail(e);
    }
    let refs: Vec<(&Planner, Arch)> = jobs.iter().map(|(p, a)| (p, *a)).collect();
    let pb = bar(refs.len(), args.json);
    let report = prelink_with(rt, &refs, args.jobs, &|p: &Progress<'_>| {
        pb.set_message(p.entry.to_string());
        pb.inc(1);
    });
    pb.finish_and_clear();
    if args.json {
        println!("{}", summary_json(&report));
    } else {
        println!(
            "prelinked {} plans in {:.2} s: {} linked, {} from disk, {} already in memory, {} failed",
            report.total(),
            report.elapsed.as_secs_f64(),
            report.linked,
            report.from_disk,
            report.from_memory,
            report.failed.len()
        );
        for f in &report.failed {
            println!("failed       {} ({}): {}", f.entry, f.arch, f.error);
        }
    }
    if !report.disk_cache {
        eprintln!(
            "fraglink: warning: no disk cache (FRAGLINK_CACHE_DISABLE or no cache directory): \
             the prelinked kernels end with this process"
        );
    }
    if !report.failed.is_empty() {
        return fail(format!(
            "{} of {} plans failed to link",
            report.failed.len(),
            report.total()
        ));
    }
    ExitCode::SUCCESS
}
