//! `fraglink link` and `fraglink cache`.

use std::path::PathBuf;
use std::process::ExitCode;

use fraglink::build::Arch;
use fraglink::link::{LinkRuntime, Linked, Planner};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct LinkArgs {
    /// Target architecture (sm_XX); default: the current GPU's.
    #[arg(long)]
    pub arch: Option<String>,
    /// Entry point symbol; repeat for several kernels in one link. Default:
    /// the first fragment's name.
    #[arg(long)]
    pub entry: Vec<String>,
    /// Print machine-readable JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the cubin here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also print nvJitLink's info log.
    #[arg(long)]
    pub verbose: bool,
    /// Fragment names (see `fraglink catalog`).
    #[arg(required = true)]
    pub fragments: Vec<String>,
}

/// The CLI's error exit: one `error:` message, exit code 2.
pub fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(2)
}

/// The architecture to link for: `--arch`, else the current device's.
pub fn target_arch(arch: Option<&str>) -> Result<Arch, String> {
    match arch {
        Some(a) => {
            let parsed = Arch::parse(a, "--arch").map_err(|e| e.to_string())?;
            // sm_90a stays arch-specific: its own target and cache key.
            Ok(parsed.real())
        }
        None => fraglink::gpu::GpuContext::default_arch()
            .map_err(|e| format!("{e}; pass --arch sm_XX to link without a GPU")),
    }
}

/// The `link` object of `--json` outputs (also used by `fraglink search`).
pub fn link_json(l: &Linked) -> serde_json::Value {
    let m = &l.kernel.metadata;
    let kernels: Vec<serde_json::Value> = l
        .kernel
        .kernels
        .iter()
        .map(|k| {
            json!({
                "entry": k.entry,
                "registers": k.registers,
                "spill_stores": k.spill_stores,
                "spill_loads": k.spill_loads,
                "stack_bytes": k.stack_bytes,
                "shared_bytes": k.shared_bytes,
            })
        })
        .collect();
    json!({
        "entry": l.kernel.entry,
        "kernels": kernels,
        "arch": l.kernel.arch,
        "cubin_bytes": l.kernel.cubin.len(),
        "registers": m.registers,
        "spill_stores": m.spill_stores,
        "spill_loads": m.spill_loads,
        "stack_bytes": m.stack_bytes,
        "shared_bytes": m.shared_bytes,
        "link_ms": m.link_ms,
        "elapsed_ms": l.elapsed.as_secs_f64() * 1e3,
        "source": l.source,
        "key": l.key.hex(),
    })
}

pub fn run(args: &LinkArgs) -> ExitCode {
    let arch = match target_arch(args.arch.as_deref()) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let mut plan = Planner::empty();
    if args.entry.is_empty() {
        plan = plan.with_entry(args.fragments[0].clone());
    }
    for e in &args.entry {
        plan = plan.with_entry(e.clone());
    }
    for name in &args.fragments {
        plan = match plan.add_named(name) {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
    }
    let rt = match LinkRuntime::global() {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    let linked = match rt.link(&plan, arch) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    if let Some(out) = &args.out {
        if let Err(e) = std::fs::write(out, &linked.kernel.cubin) {
            return fail(format!("writing {}: {e}", out.display()));
        }
    }
    if args.json {
        println!("{}", link_json(&linked));
    } else {
        let m = &linked.kernel.metadata;
        println!("arch         {}", linked.kernel.arch);
        println!("fragments    {}", linked.kernel.fragments.join(" "));
        println!("cubin        {} bytes", linked.kernel.cubin.len());
        for k in &linked.kernel.kernels {
            println!("entry        {}", k.entry);
            println!(
                "resources    {} registers, {} spill stores, {} spill loads, {} stack bytes, {} shared bytes",
                k.registers,
                k.spill_stores,
                k.spill_loads,
                k.stack_bytes,
                k.shared_bytes.map_or("?".to_string(), |b| b.to_string())
            );
        }
        println!(
            "link         {:.1} ms; this request: {} in {:.2} ms",
            m.link_ms,
            match linked.source {
                fraglink::link::Source::Linked => "linked",
                fraglink::link::Source::Memory => "memory cache hit",
                fraglink::link::Source::Disk => "disk cache hit",
            },
            linked.elapsed.as_secs_f64() * 1e3
        );
        println!("key          {}", linked.key);
        if let Some(out) = &args.out {
            println!("written      {}", out.display());
        }
    }
    if args.verbose {
        eprintln!("{}", linked.kernel.info_log);
    }
    ExitCode::SUCCESS
}

#[derive(clap::Subcommand, Debug)]
pub enum CacheCommand {
    /// Show the disk cache's location, size and limits. A directory that
    /// cannot be read is an error (exit 2), not an empty cache.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Remove every entry of the disk cache.
    Clear,
}

/// What `cache stats` reports, from an open cache or from a directory that
/// does not exist yet (an empty cache: a look creates nothing).
struct StatsReport<'a> {
    /// `None`: disabled by FRAGLINK_CACHE_DISABLE.
    dir: Option<&'a std::path::Path>,
    exists: bool,
    enabled: bool,
    warning: Option<&'a str>,
    stats: fraglink::link::disk::DiskStats,
    max_bytes: u64,
}

impl StatsReport<'_> {
    fn print(&self, json: bool) {
        let s = &self.stats;
        if json {
            println!(
                "{}",
                json!({
                    // Lossy: a path need not be UTF-8 (serde_json
                    // refuses to serialise such a Path).
                    "dir": self.dir.map(|d| d.to_string_lossy()),
                    "exists": self.exists,
                    "enabled": self.enabled,
                    "warning": self.warning,
                    "entries": s.entries,
                    "bytes": s.bytes,
                    "temp_files": s.temp_files,
                    "temp_bytes": s.temp_bytes,
                    "max_bytes": self.max_bytes,
                })
            );
            return;
        }
        match (self.dir, self.exists) {
            (Some(d), true) => println!("dir        {}", d.display()),
            (Some(d), false) => println!(
                "dir        {} (does not exist yet: the first link makes it)",
                d.display()
            ),
            (None, _) => println!("dir        (none: disabled by FRAGLINK_CACHE_DISABLE)"),
        }
        println!("enabled    {}", self.enabled);
        if let Some(w) = self.warning {
            println!("warning    {w}");
        }
        println!("entries    {}", s.entries);
        println!(
            "bytes      {} of {} max ({} more in {} temporary files)",
            s.bytes, self.max_bytes, s.temp_bytes, s.temp_files
        );
    }
}

pub fn run_cache(cmd: &CacheCommand) -> ExitCode {
    use fraglink::link::disk::{DiskCache, DiskCacheConfig};
    // `clear` never writes, so it does not consult FRAGLINK_CACHE_MAX_BYTES.
    let config = match cmd {
        CacheCommand::Stats { .. } => DiskCacheConfig::from_env(),
        CacheCommand::Clear => DiskCacheConfig::location_from_env(),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // Reading or clearing creates nothing: opening a cache makes its
    // directory (and missing parents), which a look at it should not.
    if config.enabled
        && matches!(
            std::fs::symlink_metadata(&config.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        )
    {
        match cmd {
            CacheCommand::Stats { json } => StatsReport {
                dir: Some(&config.dir),
                exists: false,
                enabled: true,
                warning: None,
                stats: Default::default(),
                max_bytes: config.max_bytes,
            }
            .print(*json),
            CacheCommand::Clear => {
                println!("nothing removed: {} does not exist", config.dir.display())
            }
        }
        return ExitCode::SUCCESS;
    }
    let cache = match DiskCache::open(config) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // A disabled configuration does not look for a directory.
    let dir = (!cache.dir().as_os_str().is_empty()).then(|| cache.dir());
    match cmd {
        CacheCommand::Stats { json } => {
            let s = match cache.try_stats() {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            StatsReport {
                dir,
                exists: dir.is_some(),
                enabled: cache.is_enabled(),
                warning: cache.warning(),
                stats: s,
                max_bytes: cache.max_bytes(),
            }
            .print(*json);
            ExitCode::SUCCESS
        }
        CacheCommand::Clear => match cache.clear() {
            Ok(bytes) => {
                match dir {
                    Some(d) => println!("removed {bytes} bytes from {}", d.display()),
                    None => {
                        println!("disk cache disabled by FRAGLINK_CACHE_DISABLE; nothing removed")
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
    }
}
