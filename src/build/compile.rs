//! NVRTC → LTO-IR per arch → nvFatbin, in parallel, behind a content-hash
//! cache so an unchanged fragment costs one hash and one file copy.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::arch::Arch;
use super::render::{entry_display, Rendered};
use crate::sys::nvfatbin::Nvfatbin;
use crate::sys::nvrtc::{Nvrtc, Output};

/// Bumped when the cache's meaning changes.
const CACHE_FORMAT: &str = "fraglink-fatbin-cache-v2";

/// Options nvFatbin gets: smallest output (DESIGN.md decision 1).
pub const FATBIN_OPTIONS: &[&str] = &["-compress-all", "-compress-mode=size"];

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("NVRTC failed on fragment `{fragment}` for {arch} (source {source_path}, matrix entry {entry}):\n{log}")]
    Nvrtc {
        fragment: String,
        arch: String,
        source_path: PathBuf,
        entry: String,
        log: String,
    },
    #[error("nvFatbin failed on fragment `{fragment}`: {message}")]
    Fatbin { fragment: String, message: String },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Everything a compile depends on besides the source.
pub struct CompileContext<'a> {
    pub nvrtc: &'a Nvrtc,
    pub nvfatbin: &'a Nvfatbin,
    pub archs: &'a [Arch],
    /// `-I` directories, fragment headers first.
    pub include_dirs: &'a [PathBuf],
    /// Extra NVRTC options from the builder.
    pub extra_options: &'a [String],
    /// Digest of the project's headers (they are `#include`d, so they are
    /// part of every fragment's content).
    pub headers_digest: String,
    /// NVRTC and nvFatbin versions, e.g. `nvrtc 12.9 nvfatbin 12.9`.
    pub tool_versions: String,
    /// Where rendered sources are written (`<name>.cu`).
    pub gen_dir: &'a Path,
    /// Where fatbins are written (`<name>.fatbin`).
    pub fatbin_dir: &'a Path,
    /// Content-hash cache of fatbins, shared by builds of every profile.
    pub cache_dir: Option<&'a Path>,
    pub jobs: usize,
}

/// One fragment's outcome.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub name: String,
    pub fatbin_path: PathBuf,
    pub fatbin_len: usize,
    /// blake3 of the fatbin bytes, hex.
    pub hash: String,
    pub cached: bool,
    pub compile_time: Duration,
}

/// The NVRTC options for one arch.
pub fn nvrtc_options(arch: Arch, include_dirs: &[PathBuf], extra: &[String]) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-dlto".to_string(),
        "--relocatable-device-code=true".to_string(),
        "-std=c++17".to_string(),
        "-default-device".to_string(),
    ];
    o.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
    o.extend(extra.iter().cloned());
    o
}

/// The cache key of a fragment: its source, every option, every tool version
/// and the project's headers.
pub fn cache_key(ctx: &CompileContext<'_>, r: &Rendered) -> String {
    let mut h = blake3::Hasher::new();
    let mut field = |b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(CACHE_FORMAT.as_bytes());
    field(r.source.as_bytes());
    field(ctx.tool_versions.as_bytes());
    field(ctx.headers_digest.as_bytes());
    for arch in ctx.archs {
        for o in nvrtc_options(*arch, ctx.include_dirs, ctx.extra_options) {
            field(o.as_bytes());
        }
    }
    for o in FATBIN_OPTIONS {
        field(o.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// Digest of every regular file under `dirs` (names and contents).
pub fn digest_dirs(dirs: &[PathBuf]) -> Result<String, CompileError> {
    let mut files = Vec::new();
    for d in dirs {
        collect_files(d, &mut files)?;
    }
    files.sort();
    let mut h = blake3::Hasher::new();
    for f in files {
        let bytes = std::fs::read(&f).map_err(|source| CompileError::Io {
            action: "reading",
            path: f.clone(),
            source,
        })?;
        h.update(f.to_string_lossy().as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(h.finalize().to_hex().to_string())
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), CompileError> {
    let rd = std::fs::read_dir(dir).map_err(|source| CompileError::Io {
        action: "listing",
        path: dir.to_path_buf(),
        source,
    })?;
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_files(&p, out)?;
        } else if p.is_file() {
            out.push(p);
        }
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CompileError> {
    // Write-then-rename: a concurrent build never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|source| CompileError::Io {
            action: "writing",
            path: path.to_path_buf(),
            source,
        })
}

fn compile_one(ctx: &CompileContext<'_>, r: &Rendered) -> Result<Compiled, CompileError> {
    let started = Instant::now();
    let source_path = ctx.gen_dir.join(format!("{}.cu", r.name));
    write_file(&source_path, r.source.as_bytes())?;
    let fatbin_path = ctx.fatbin_dir.join(format!("{}.fatbin", r.name));
    let key = cache_key(ctx, r);
    let cached_path = ctx.cache_dir.map(|d| d.join(format!("{key}.fatbin")));

    let (bytes, cached) = match cached_path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        Some(b) if !b.is_empty() => (b, true),
        _ => {
            let mut builder = ctx
                .nvfatbin
                .builder(
                    &FATBIN_OPTIONS
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>(),
                )
                .map_err(|e| CompileError::Fatbin {
                    fragment: r.name.clone(),
                    message: e.to_string(),
                })?;
            for arch in ctx.archs {
                let opts = nvrtc_options(*arch, ctx.include_dirs, ctx.extra_options);
                let out = ctx
                    .nvrtc
                    // The bare file name: a fatbin must not depend on where
                    // OUT_DIR is (the error below names the full path).
                    .compile(&r.source, &format!("{}.cu", r.name), &opts, Output::LtoIr)
                    .map_err(|e| CompileError::Nvrtc {
                        fragment: r.name.clone(),
                        arch: arch.to_string(),
                        source_path: source_path.clone(),
                        entry: entry_display(&r.entry),
                        log: e.to_string(),
                    })?;
                builder
                    .add_ltoir(
                        &out.bytes,
                        &arch.number.to_string(),
                        &format!("{}_{arch}", r.name),
                        "",
                    )
                    .map_err(|e| CompileError::Fatbin {
                        fragment: r.name.clone(),
                        message: e.to_string(),
                    })?;
            }
            let bytes = builder.finish().map_err(|e| CompileError::Fatbin {
                fragment: r.name.clone(),
                message: e.to_string(),
            })?;
            if let Some(p) = &cached_path {
                // A cache that cannot be written only costs time next build.
                let _ = write_file(p, &bytes);
            }
            (bytes, false)
        }
    };
    write_file(&fatbin_path, &bytes)?;
    Ok(Compiled {
        name: r.name.clone(),
        fatbin_path,
        fatbin_len: bytes.len(),
        hash: blake3::hash(&bytes).to_hex().to_string(),
        cached,
        compile_time: started.elapsed(),
    })
}

/// Compiles every fragment on `ctx.jobs` threads; results keep input order.
/// The first error (in input order) is returned.
pub fn compile_all(
    ctx: &CompileContext<'_>,
    rendered: &[Rendered],
) -> Result<Vec<Compiled>, CompileError> {
    for dir in [ctx.gen_dir, ctx.fatbin_dir]
        .into_iter()
        .chain(ctx.cache_dir)
    {
        std::fs::create_dir_all(dir).map_err(|source| CompileError::Io {
            action: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let next = AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<Compiled, CompileError>>>> =
        Mutex::new((0..rendered.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..ctx.jobs.max(1).min(rendered.len().max(1)) {
            s.spawn(|| loop {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(r) = rendered.get(i) else { break };
                let res = compile_one(ctx, r);
                if res.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                results.lock().unwrap()[i] = Some(res);
            });
        }
    });
    let mut out = Vec::with_capacity(rendered.len());
    for r in results.into_inner().unwrap().into_iter().flatten() {
        out.push(r?);
    }
    Ok(out)
}
