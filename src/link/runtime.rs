//! The process-wide link machinery: nvJitLink, NVRTC for run-time sources,
//! the memory cache and the disk cache.

use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use once_cell::sync::OnceCell;

use crate::build::arch::Arch;
use crate::sys::{InputType, Nvrtc, Output};

use super::cache::{CacheStats, SingleFlightCache, Source, Weighed};
use super::disk::{DiskCache, DiskCacheConfig, DiskLookup};
use super::key::LinkKey;
use super::linker::{LinkInput, Linker};
use super::metadata::{self, KernelMetadata};
use super::LinkError;

/// fraglink's device headers, embedded so that run-time sources can
/// `#include "metric.cuh"` etc. wherever the binary runs.
const FRAGLINK_HEADERS: &[(&str, &str)] = &[
    ("abi.cuh", include_str!("../../fragments/abi.cuh")),
    ("common.cuh", include_str!("../../fragments/common.cuh")),
    ("filter.cuh", include_str!("../../fragments/filter.cuh")),
    ("metric.cuh", include_str!("../../fragments/metric.cuh")),
    ("scan.cuh", include_str!("../../fragments/scan.cuh")),
];

/// A linked, checked kernel.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LinkedKernel {
    #[serde(skip)]
    pub key: Option<LinkKey>,
    pub entry: String,
    pub arch: String,
    pub fragments: Vec<String>,
    pub metadata: KernelMetadata,
    /// nvJitLink's `-verbose` info log of the link that produced the cubin.
    pub info_log: String,
    #[serde(skip)]
    pub cubin: Vec<u8>,
}

impl Weighed for LinkedKernel {
    fn bytes(&self) -> u64 {
        (self.cubin.len() + self.info_log.len()) as u64
    }
}

/// A kernel and where this request got it from.
#[derive(Debug, Clone)]
pub struct Linked {
    pub kernel: Arc<LinkedKernel>,
    pub source: Source,
    pub key: LinkKey,
    /// What this request cost (a cache hit's lookup, or the whole link).
    pub elapsed: std::time::Duration,
}

/// Settings of a [`LinkRuntime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Linked kernels kept in memory (least recently used evicted first).
    pub memory_capacity: usize,
    /// `None` disables the disk cache.
    pub disk: Option<DiskCacheConfig>,
}

impl RuntimeConfig {
    /// `FRAGLINK_MEMORY_CACHE_ENTRIES` (default 256) and the disk cache's
    /// variables (see [`DiskCacheConfig::from_env`]).
    pub fn from_env() -> Result<Self, LinkError> {
        let memory_capacity = std::env::var("FRAGLINK_MEMORY_CACHE_ENTRIES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(256);
        let disk = match DiskCacheConfig::from_env() {
            Ok(c) => Some(c),
            // No home directory: link without a disk cache rather than fail.
            Err(e @ super::disk::DiskCacheError::NoCacheDir) => {
                eprintln!("fraglink: warning: {e}");
                None
            }
            Err(e) => return Err(e.into()),
        };
        Ok(RuntimeConfig {
            memory_capacity,
            disk,
        })
    }
}

/// One resolved input.
/// One resolved input, borrowed where possible: a cache hit allocates
/// nothing for the embedded fragments.
struct Input<'a> {
    name: &'a str,
    hash: std::borrow::Cow<'a, str>,
    kind: InputType,
    bytes: InputBytes<'a>,
}

enum InputBytes<'a> {
    Embedded(&'a [u8]),
    Compiled(Arc<Vec<u8>>),
}

impl InputBytes<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            InputBytes::Embedded(b) => b,
            InputBytes::Compiled(b) => b,
        }
    }
}

pub struct LinkRuntime {
    linker: Linker,
    memory: SingleFlightCache<LinkKey, LinkedKernel, LinkError>,
    disk: Option<DiskCache>,
    nvrtc: OnceCell<Nvrtc>,
    /// Run-time sources compiled to LTO-IR, by content hash.
    sources: DashMap<String, Arc<Vec<u8>>>,
}

static GLOBAL: OnceCell<LinkRuntime> = OnceCell::new();

/// The format of a disk-cache payload: a JSON description, then the cubin.
fn encode(kernel: &LinkedKernel) -> Vec<u8> {
    let json = serde_json::to_vec(kernel).unwrap_or_default();
    let mut out = Vec::with_capacity(4 + json.len() + kernel.cubin.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&kernel.cubin);
    out
}

fn decode(bytes: &[u8]) -> Option<LinkedKernel> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let json = bytes.get(4..4usize.checked_add(len)?)?;
    let mut k: LinkedKernel = serde_json::from_slice(json).ok()?;
    k.cubin = bytes[4 + len..].to_vec();
    Some(k)
}

impl LinkRuntime {
    pub fn new(config: RuntimeConfig) -> Result<Self, LinkError> {
        Self::with_linker(Linker::open()?, config)
    }

    pub fn with_linker(linker: Linker, config: RuntimeConfig) -> Result<Self, LinkError> {
        let disk = match config.disk {
            Some(c) => match DiskCache::open(c) {
                Ok(d) => Some(d),
                // The disk cache only saves time: an unusable directory
                // must not stop linking.
                Err(e) => {
                    eprintln!("fraglink: warning: {e}; disk cache disabled");
                    None
                }
            },
            None => None,
        };
        Ok(LinkRuntime {
            linker,
            memory: SingleFlightCache::new(config.memory_capacity),
            disk,
            nvrtc: OnceCell::new(),
            sources: DashMap::new(),
        })
    }

    /// The process-wide runtime, configured from the environment on first use.
    /// A failure is returned, and retried by the next call.
    pub fn global() -> Result<&'static LinkRuntime, LinkError> {
        GLOBAL.get_or_try_init(|| LinkRuntime::new(RuntimeConfig::from_env()?))
    }

    pub fn linker(&self) -> &Linker {
        &self.linker
    }

    pub fn disk(&self) -> Option<&DiskCache> {
        self.disk.as_ref()
    }

    pub fn stats(&self) -> CacheStats {
        self.memory.stats()
    }

    /// Empties the memory cache (the disk cache has its own `clear`).
    pub fn clear(&self) {
        self.memory.clear();
    }

    pub fn set_memory_capacity(&self, entries: usize) {
        self.memory.set_capacity(entries);
    }

    fn nvrtc(&self) -> Result<&Nvrtc, LinkError> {
        self.nvrtc.get_or_try_init(|| Ok(Nvrtc::open(None)?))
    }

    /// Compiles a run-time fragment to LTO-IR for `arch`, once per content.
    fn compile_source(
        &self,
        name: &str,
        source: &str,
        arch: Arch,
    ) -> Result<(String, Arc<Vec<u8>>), LinkError> {
        let nvrtc = self.nvrtc()?;
        let (maj, min) = nvrtc.version()?;
        super::linker::check_versions(self.linker.version(), (maj as u32, min as u32))?;
        // The same NVRTC command line as the build's, for the target's
        // virtual arch, with CUDA's headers found beside this NVRTC (or by
        // the library search) and fraglink's own embedded in the binary, so
        // a copied binary needs no source tree.
        let (include_dirs, _) =
            crate::sys::loader::cuda_include_dirs(Some(nvrtc.path())).map_err(|tried| {
                LinkError::HeadersNotFound {
                    tried: tried.join("; "),
                }
            })?;
        let options =
            crate::build::compile::nvrtc_options(Arch::compute(arch.number), &include_dirs, &[]);
        let mut h = blake3::Hasher::new();
        h.update(format!("nvrtc {maj}.{min}\0").as_bytes());
        for o in &options {
            h.update(o.as_bytes());
            h.update(b"\0");
        }
        h.update(source.as_bytes());
        for (file, text) in FRAGLINK_HEADERS {
            h.update(file.as_bytes());
            h.update(text.as_bytes());
        }
        let hash = h.finalize().to_hex().to_string();
        if let Some(b) = self.sources.get(&hash) {
            return Ok((hash, b.clone()));
        }
        let out =
            nvrtc.compile_with_headers(source, name, FRAGLINK_HEADERS, &options, Output::LtoIr)?;
        let bytes = Arc::new(out.bytes);
        self.sources.insert(hash.clone(), bytes.clone());
        Ok((hash, bytes))
    }

    /// Links `plan` for `arch` (memory cache, then disk cache, then nvJitLink).
    pub fn link(&self, plan: &super::Planner, arch: Arch) -> Result<Linked, LinkError> {
        let requested = Instant::now();
        let arch = Arch::sm(arch.number);
        let entry = plan.entry();
        if plan.is_empty() {
            return Err(LinkError::EmptyPlan {
                entry: entry.to_string(),
            });
        }
        let mut inputs: Vec<Input> = Vec::new();
        for f in plan.static_fragments() {
            let covered = f.archs.iter().any(|a| {
                crate::build::arch::Arch::parse(a, "catalog")
                    .map(|b| b.links_for(arch))
                    .unwrap_or(false)
            });
            if !covered {
                return Err(LinkError::ArchNotCovered {
                    fragment: f.name.to_string(),
                    arch: arch.to_string(),
                    built: f.archs.join(", "),
                });
            }
            inputs.push(Input {
                name: f.name,
                hash: f.hash.into(),
                kind: InputType::Fatbin,
                bytes: InputBytes::Embedded(f.fatbin),
            });
        }
        for (name, source) in plan.sources() {
            let (hash, bytes) = self.compile_source(name, source, arch)?;
            inputs.push(Input {
                name,
                hash: hash.into(),
                kind: InputType::LtoIr,
                bytes: InputBytes::Compiled(bytes),
            });
        }
        let mut options = plan.options(arch);
        if options.kernels_used.is_empty() {
            options.kernels_used.push(entry.to_string());
        }
        let args = options.to_args();
        let pairs: Vec<(&str, &str)> = inputs.iter().map(|i| (i.name, i.hash.as_ref())).collect();
        let key = LinkKey::new(entry, &pairs, &args, self.linker.version());

        let produce = || -> Result<(LinkedKernel, Source), LinkError> {
            let hex = key.hex();
            if let Some(disk) = &self.disk {
                if let DiskLookup::Hit(bytes) = disk.get(&hex) {
                    // A payload that decodes but fails the cubin check is
                    // treated as a miss and overwritten by the fresh link.
                    if let Some(mut k) = decode(&bytes) {
                        if k.entry == entry && metadata::check_cubin(&k.cubin, entry).is_ok() {
                            k.key = Some(key);
                            return Ok((k, Source::Disk));
                        }
                    }
                }
            }
            let link_inputs: Vec<LinkInput<'_>> = inputs
                .iter()
                .map(|inp| LinkInput {
                    name: inp.name,
                    kind: inp.kind,
                    bytes: inp.bytes.as_slice(),
                })
                .collect();
            let started = Instant::now();
            let out = self.linker.link(&link_inputs, &options)?;
            let link_ms = started.elapsed().as_secs_f64() * 1e3;
            metadata::check_cubin(&out.cubin, entry).map_err(|source| LinkError::Cubin {
                entry: entry.to_string(),
                source,
            })?;
            let metadata = match metadata::entry_resources(&out.info_log, entry) {
                Ok(res) => KernelMetadata::new(&res, out.cubin.len(), link_ms),
                // No ptxas output in the log: read the cubin instead.
                Err(e) if e.verbose_missing() => {
                    let res = metadata::cubin_resources(&out.cubin, entry).map_err(|source| {
                        LinkError::Cubin {
                            entry: entry.to_string(),
                            source,
                        }
                    })?;
                    KernelMetadata::from_cubin(
                        entry,
                        &arch.to_string(),
                        &res,
                        out.cubin.len(),
                        link_ms,
                    )
                }
                Err(e) => return Err(e.into()),
            };
            let kernel = LinkedKernel {
                key: Some(key),
                entry: entry.to_string(),
                arch: arch.to_string(),
                fragments: inputs.iter().map(|i| i.name.to_string()).collect(),
                metadata,
                info_log: out.info_log,
                cubin: out.cubin,
            };
            if let Some(disk) = &self.disk {
                // The disk cache is an optimisation: failing to write it is
                // not a failed link.
                let _ = disk.put(&hex, &encode(&kernel));
            }
            Ok((kernel, Source::Linked))
        };
        let (kernel, source) = self
            .memory
            .get_or_try_insert(&key, produce)
            .map_err(LinkError::from_shared)?;
        Ok(Linked {
            kernel,
            source,
            key,
            elapsed: requested.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_roundtrip_and_garbage() {
        let k = LinkedKernel {
            key: None,
            entry: "e".into(),
            arch: "sm_80".into(),
            fragments: vec!["a".into()],
            metadata: KernelMetadata {
                entry: "e".into(),
                arch: "sm_80".into(),
                registers: 32,
                spill_stores: 0,
                spill_loads: 0,
                stack_bytes: 0,
                shared_bytes: Some(2048),
                barriers: Some(1),
                cubin_bytes: 3,
                link_ms: 1.5,
            },
            info_log: "log".into(),
            cubin: vec![1, 2, 3],
        };
        let d = decode(&encode(&k)).unwrap();
        assert_eq!(
            (d.entry.as_str(), d.cubin.as_slice(), d.metadata.registers),
            ("e", &[1u8, 2, 3][..], 32)
        );
        assert!(decode(&[]).is_none());
        assert!(decode(&[255, 255, 255, 255, 0]).is_none());
        assert!(decode(&[2, 0, 0, 0, b'{']).is_none());
    }
}
