//! Routing a search to the GPU or the CPU: the cost model decides per call
//! and says why; `Device::Cpu` / `Device::Gpu` override it. A GPU failure
//! (out of memory after halving the batch, or anything else) falls back to
//! the CPU path, which gives the same results. After a sticky driver error
//! (a kernel fault: the context is dead for the rest of the process) a
//! [`Searcher`] sends every later search to the CPU at once, saying why.
//!
//! [`Searcher::index`] prepares a base for any number of searches: the first
//! search sent to the GPU uploads it once ([`GpuIndex`]), and every search
//! and query batch after it uses the resident rows. The upload is timed
//! apart ([`Routed::upload_seconds`]) and left out of [`Routed::seconds`].
//!
//! **A configuration's first search.** The kernels a search would run on the
//! GPU ([`SearchKernels`]) may not be linked yet: a link costs a k-NN pair
//! about half a second, far more than a small search. The router asks the
//! link runtime (memory, then disk cache) and, where a link is due, adds its
//! cost to the GPU's estimate ([`AdaptiveCostModel::choose_unlinked`]):
//! - a search the GPU wins anyway links first, timed apart
//!   ([`Routed::link_seconds`], learned by
//!   [`AdaptiveCostModel::learn_link`]) and left out of what the model learns
//!   of the search, so one link never makes the GPU look slow for a size;
//! - a search only the link sends to the CPU runs there, and the kernels
//!   link on a background thread meanwhile (once per configuration;
//!   [`Searcher::with_background_links`]), so a later search finds them.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::cost::{
    run_with_fallback, AdaptiveCostModel, BatchPolicy, CostParams, GpuCostModel, GpuParams, OpDesc,
    RecoverableError, Target,
};
use crate::gpu::GpuContext;
use crate::link::{LinkRuntime, Planner};
use crate::sync::lock;

use super::gpu::{GpuSearchError, GpuSearcher};
use super::index::{GpuIndex, IndexShape};
use super::kernels::SearchKernels;
use super::{cpu::search_cpu, validate, Metric, Neighbors, SearchError, SearchParams, Vectors};

/// Where searches may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The cost model decides.
    Auto,
    Cpu,
    Gpu,
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            other => Err(format!(
                "unknown device `{other}` (expected auto, cpu or gpu)"
            )),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("--device gpu was asked for, but no GPU can be used: {reason}")]
    GpuUnavailable { reason: String },
    #[error(transparent)]
    Search(#[from] SearchError),
    /// An environment variable with a value it does not take.
    #[error("{variable} = `{value}`: expected {expected}")]
    Env {
        variable: &'static str,
        value: String,
        expected: &'static str,
    },
}

impl RecoverableError for GpuSearchError {
    fn is_out_of_memory(&self) -> bool {
        GpuSearchError::is_out_of_memory(self)
    }
}

/// A search's result and how it was obtained.
#[derive(Debug)]
pub struct Routed {
    pub neighbors: Neighbors,
    pub target: Target,
    /// Why this target (the cost model's reason, an override, or a fallback).
    pub reason: String,
    pub fell_back: bool,
    /// Wall time of the search itself (queries up, kernels, results down on
    /// the GPU); never the base's upload, nor a link the router made first
    /// ([`link_seconds`](Self::link_seconds)).
    pub seconds: f64,
    /// Wall time of the one-time upload of the base this search made (the
    /// first search of a [`SearchIndex`] sent to the GPU; counted even if
    /// the search then fell back to the CPU); 0 when the base was resident
    /// already or the model chose the CPU.
    pub upload_seconds: f64,
    /// Wall time of linking and loading the GPU kernels before the search
    /// (a configuration's first search on the GPU: the link, or a disk
    /// cache read, and the module load), left out of
    /// [`seconds`](Self::seconds); 0 when the model chose the CPU, and for
    /// a search whose kernels this searcher made ready before. A link can
    /// still happen inside the search, and count in `seconds`: a kernel
    /// evicted from the memory cache since, a batch halved after running out
    /// of memory (another tile), special queries (the scan or the select
    /// answers them), special rows (a scan of their own, and the candidate
    /// kernel's filtered variant), `FRAGLINK_GPU_KNN` or
    /// `FRAGLINK_KNN_VARIANT` changed while the process runs.
    pub link_seconds: f64,
    /// The GPU kernel that served the search (its last batch): the
    /// tensor-core candidate kernel (`knn_tile_*`), the exact scan
    /// (`scan_*`) or the two-pass select's distance kernel (`knn_dist_*`);
    /// `None` on the CPU.
    pub gpu_kernel: Option<&'static str>,
    /// On the tensor-core path: rows its bounds do not cover that the scan
    /// searched beside it, and queries the scan or the select answered
    /// apart ([`GpuSearch`](super::gpu::GpuSearch)'s `special_rows` and
    /// `special_queries`; the rows of the last batch, the queries of all).
    /// 0 elsewhere.
    pub special_rows: usize,
    pub special_queries: usize,
    /// Where the search's time went, when `FRAGLINK_SEARCH_TRACE` asks
    /// ([`crate::search::trace`]); `None` otherwise.
    pub trace: Option<crate::search::trace::SearchTrace>,
}

/// Searches on the best target.
pub struct Searcher {
    device: Device,
    model: AdaptiveCostModel,
    gpu: Option<GpuSearcher>,
    max_batch: usize,
    /// Set by the first search whose GPU try hit a sticky driver error
    /// ([`GpuSearchError::is_context_lost`]): the context is dead for the
    /// rest of the process, so later searches go to the CPU at once, saying
    /// why, instead of failing on the GPU each time first.
    lost: OnceLock<String>,
    /// Link on a background thread the kernels of a search the link alone
    /// sent to the CPU.
    background_links: bool,
    /// The configurations (their fragments) linking in the background now.
    linking: Arc<Mutex<HashSet<Vec<&'static str>>>>,
    /// Configurations whose background link failed: no longer counted as
    /// unlinked, so a search the GPU wins meets the error and says why
    /// instead of a link being tried again in the background each time.
    failed: Arc<Mutex<HashSet<Vec<&'static str>>>>,
    /// Searches whose kernels this searcher has linked and loaded: later
    /// ones skip the question (about 14 µs: `cargo bench --bench cost`,
    /// `route/linked_check`) for one lookup.
    ready: Mutex<HashSet<ReadyKey>>,
}

/// What decides a search's kernels, but the environment (read for a
/// configuration's first search): the base's shape, the query batches'
/// sizes, `k`, metric and filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ReadyKey {
    shape: IndexShape,
    batches: [usize; 2],
    k: usize,
    metric: Metric,
    filter: &'static str,
}

impl ReadyKey {
    fn of(base: &Vectors, nq: usize, max_batch: usize, params: &SearchParams) -> Self {
        let batch = nq.min(max_batch).max(1);
        ReadyKey {
            shape: IndexShape::of(base),
            batches: if nq == 0 { [0, 0] } else { [batch, nq % batch] },
            k: params.k,
            metric: params.metric,
            filter: params.filter.fragment_name(),
        }
    }
}

/// Ready searches remembered at most (then forgotten all at once: each
/// costs one question again).
const READY_ENTRIES: usize = 4096;

impl Searcher {
    /// Probes the GPU (never panics without a driver). Asking for
    /// `Device::Gpu` without one is an error.
    pub fn new(device: Device) -> Result<Self, RouteError> {
        let probe = match device {
            Device::Cpu => Err("the CPU was asked for".to_string()),
            _ => GpuContext::default()
                .and_then(GpuSearcher::new)
                .map_err(|e| e.to_string()),
        };
        let (gpu, params) = match probe {
            Ok(g) => (
                Some(g),
                CostParams::default().with_gpu(GpuParams::default()),
            ),
            Err(reason) if device == Device::Gpu => {
                return Err(RouteError::GpuUnavailable { reason })
            }
            Err(reason) => (None, CostParams::default().without_gpu(reason)),
        };
        let params = CostParams {
            force: match device {
                Device::Cpu => Some(Target::Cpu),
                Device::Gpu => Some(Target::Gpu),
                Device::Auto => None,
            },
            ..params
        };
        Ok(Searcher {
            device,
            model: AdaptiveCostModel::new(params),
            lost: OnceLock::new(),
            gpu,
            max_batch: usize::MAX,
            background_links: true,
            linking: Arc::default(),
            failed: Arc::default(),
            ready: Mutex::default(),
        })
    }

    /// Whether a search that goes to the CPU only because its GPU kernels
    /// are not linked yet starts their link on a background thread, so that
    /// a later search of the configuration finds them (default: yes). Off,
    /// such searches stay on the CPU until one the GPU wins even with the
    /// link pays it.
    pub fn with_background_links(mut self, yes: bool) -> Self {
        self.background_links = yes;
        self
    }

    /// The configurations linking in the background now, as their
    /// fragments' names.
    pub fn linking(&self) -> Vec<Vec<&'static str>> {
        lock(&self.linking).iter().cloned().collect()
    }

    /// The kernels of this search's GPU batches, distinct (the first
    /// batch's and, where the last is shorter, its own: the tensor-core
    /// tile depends on a batch's query count), and whether any still needs
    /// a full link (one a quick link serves does not: the search waits a
    /// millisecond for it, [`GpuSearcher::links_quickly`]). No kernels where they cannot be told (bad input: the search
    /// says why); a configuration whose background link failed counts as
    /// linked (a search the GPU wins then meets the error).
    fn cold_kernels(
        &self,
        gpu: &GpuSearcher,
        key: &ReadyKey,
        queries: &Vectors,
        params: &SearchParams,
    ) -> (Vec<SearchKernels>, bool) {
        let shape = key.shape;
        let mut kernels: Vec<SearchKernels> = Vec::new();
        // No queries: the search links what one without queries would.
        for (i, rows) in key.batches.into_iter().enumerate() {
            if i > 0 && rows == 0 {
                continue;
            }
            match gpu.kernels_for_rows(&shape, queries, params, rows) {
                Ok(k) => {
                    if kernels
                        .iter()
                        .all(|x| x.fragment_names() != k.fragment_names())
                    {
                        kernels.push(k);
                    }
                }
                Err(_) => return (Vec::new(), false),
            }
        }
        let failed: Vec<bool> = {
            let failed = lock(&self.failed);
            kernels
                .iter()
                .map(|k| failed.contains(&k.fragment_names()))
                .collect()
        };
        let cold = kernels
            .iter()
            .zip(failed)
            .any(|(k, failed)| !failed && !gpu.links_quickly(k));
        (kernels, cold)
    }

    /// Links `kernels` for the GPU on a thread of its own (no module load:
    /// that stays with the search thread's context), once per configuration
    /// at a time. Not learned as a link: it shares the CPU with the search.
    /// A failure marks the configuration (see `failed`); the next search the
    /// GPU wins meets it and says why.
    fn link_in_background(&self, kernels: SearchKernels) {
        let Some(gpu) = &self.gpu else {
            return;
        };
        let names = kernels.fragment_names();
        if !lock(&self.linking).insert(names.clone()) {
            return;
        }
        let arch = gpu.context().arch();
        // Leaves `linking` however the thread ends (a panic included).
        let entry = Linking {
            set: self.linking.clone(),
            names,
        };
        let failed = self.failed.clone();
        let _ = std::thread::Builder::new()
            .name("fraglink-link".into())
            .spawn(move || {
                let plans: Vec<Planner> = kernels.kernels().into_iter().map(|(p, _)| p).collect();
                let plans: Vec<&Planner> = plans.iter().collect();
                let ok = LinkRuntime::global().is_ok_and(|rt| rt.link_all(&plans, arch).is_ok());
                if !ok {
                    lock(&failed).insert(entry.names.clone());
                }
                drop(entry);
            });
        // Not spawned: the closure, and the entry with it, is dropped.
    }

    /// At most `queries` queries per GPU batch (≥ 1; default: all of a
    /// search's queries in one batch, halved only when the device runs out
    /// of memory). Bounds the device memory of a search's queries and
    /// results; the base stays resident across the batches either way.
    pub fn with_max_batch(mut self, queries: usize) -> Self {
        self.max_batch = queries.max(1);
        self
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn gpu(&self) -> Option<&GpuSearcher> {
        self.gpu.as_ref()
    }

    pub fn model(&self) -> &AdaptiveCostModel {
        &self.model
    }

    /// `base` prepared for searches: nothing moves until a search is sent
    /// to the GPU, which uploads it once for this index's lifetime.
    pub fn index<'a>(&'a self, base: &'a Vectors) -> SearchIndex<'a> {
        SearchIndex {
            searcher: self,
            base,
            gpu: OnceLock::new(),
        }
    }

    /// Exact k-NN of `queries` in `base`, on the target the model picks. The
    /// GPU path uploads `base` once for the call (all its batches); to search
    /// one base repeatedly, keep a [`SearchIndex`] from [`index`](Self::index).
    pub fn search(
        &self,
        base: &Vectors,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<Routed, RouteError> {
        self.index(base).search(queries, params)
    }

    /// The GPU path over query batches of `batch` rows, against the
    /// resident base.
    fn gpu_batched(
        index: &GpuIndex,
        queries: &Vectors,
        params: &SearchParams,
        batch: usize,
        ran: &GpuRan,
    ) -> Result<Neighbors, GpuSearchError> {
        // A retry (smaller batches) searches every query again.
        ran.special_queries.set(0);
        let search = |part: &Vectors| {
            let found = index.search(part, params)?;
            ran.kernel.set(
                found
                    .knn
                    .as_ref()
                    .map(|k| k.tile.name)
                    .or(found.select.as_ref().map(|s| s.dist.name))
                    .or(found.plan.as_ref().map(|p| p.scan.name)),
            );
            ran.quick.set(ran.quick.get() || found.linked.kernel.quick);
            ran.special_rows.set(found.special_rows);
            ran.special_queries
                .set(ran.special_queries.get() + found.special_queries);
            Ok::<_, GpuSearchError>(found.neighbors)
        };
        let nq = queries.rows();
        if batch >= nq {
            return search(queries);
        }
        let mut out = Neighbors {
            nq,
            k: params.k,
            ids: Vec::with_capacity(nq * params.k),
            distances: Vec::with_capacity(nq * params.k),
        };
        let mut start = 0;
        while start < nq {
            let end = (start + batch).min(nq);
            let part = queries.slice_rows(start, end);
            let r = search(&part)?;
            out.ids.extend(r.ids);
            out.distances.extend(r.distances);
            start = end;
        }
        Ok(out)
    }
}

/// What the GPU path ran for [`Routed`]: its last batch's kernel and
/// special rows, the special queries of every batch.
#[derive(Default)]
struct GpuRan {
    kernel: std::cell::Cell<Option<&'static str>>,
    /// A batch ran a quick link's kernel (`LinkedKernel::quick`): slower
    /// than the optimised one the model should learn.
    quick: std::cell::Cell<bool>,
    special_rows: std::cell::Cell<usize>,
    special_queries: std::cell::Cell<usize>,
}

/// Why a GPU try failed: the base's upload (not retried with smaller query
/// batches: they would not shrink it) or a search.
enum GpuTry<'e> {
    NoGpu,
    Lost(&'e str),
    Upload(&'e GpuSearchError),
    Search(GpuSearchError),
}

impl fmt::Display for GpuTry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuTry::NoGpu => f.write_str("no GPU searcher"),
            GpuTry::Lost(why) => {
                write!(f, "the GPU context was lost earlier in this process: {why}")
            }
            GpuTry::Upload(e) => write!(f, "uploading the base vectors: {e}"),
            GpuTry::Search(e) => e.fmt(f),
        }
    }
}

impl RecoverableError for GpuTry<'_> {
    fn is_out_of_memory(&self) -> bool {
        match self {
            GpuTry::NoGpu | GpuTry::Lost(_) | GpuTry::Upload(_) => false,
            GpuTry::Search(e) => e.is_out_of_memory(),
        }
    }
}

/// A base prepared for searches by a [`Searcher`] ([`Searcher::index`]):
/// the host rows (the CPU path reads them in place) and, from the first
/// search sent to the GPU on, their device copy. A failed upload is kept
/// too: later searches sent to the GPU fall back to the CPU at once, saying
/// why, instead of trying the copy again.
pub struct SearchIndex<'a> {
    searcher: &'a Searcher,
    base: &'a Vectors,
    gpu: OnceLock<Result<GpuIndex, GpuSearchError>>,
}

impl SearchIndex<'_> {
    pub fn base(&self) -> &Vectors {
        self.base
    }

    /// The resident device copy, once a search has uploaded it.
    pub fn resident(&self) -> Option<&GpuIndex> {
        self.gpu.get().and_then(|r| r.as_ref().ok())
    }

    /// How long the one-time upload took, once it happened.
    pub fn upload_time(&self) -> Option<Duration> {
        self.resident().map(GpuIndex::upload_time)
    }

    /// The device copy, uploading it on the first call (one upload however
    /// many threads ask); with the upload's wall time when this call made
    /// it. `None` without a GPU.
    fn gpu_index(&self) -> Option<(Result<&GpuIndex, &GpuSearchError>, Option<Duration>)> {
        let gpu = self.searcher.gpu.as_ref()?;
        let mut took = None;
        let r = self.gpu.get_or_init(|| {
            let t0 = Instant::now();
            let r = gpu.upload(self.base);
            took = Some(t0.elapsed());
            r
        });
        Some((r.as_ref(), took))
    }

    /// Exact k-NN of `queries` in the base, on the target the model picks
    /// (the base counted as already on the device once it is).
    pub fn search(&self, queries: &Vectors, params: &SearchParams) -> Result<Routed, RouteError> {
        let (s, base) = (self.searcher, self.base);
        validate(base, queries, params)?;
        let resident = self.resident().is_some();
        let op = OpDesc::knn(
            base.rows(),
            base.dim(),
            queries.rows(),
            params.k,
            base.dtype(),
            resident,
        );
        // Where the GPU wins with its kernels linked (or is forced): are
        // they? Nothing more is asked for a search the CPU takes anyway.
        let linked_choice = s.model.choose(&op);
        let key = ReadyKey::of(base, queries.rows(), s.max_batch, params);
        let (kernels, cold) = match (&s.gpu, linked_choice.target) {
            (Some(g), Target::Gpu) if !lock(&s.ready).contains(&key) => {
                s.cold_kernels(g, &key, queries, params)
            }
            _ => (Vec::new(), false),
        };
        let (choice, link_meanwhile) = if cold {
            s.model.choose_unlinked(&op)
        } else {
            (linked_choice, false)
        };
        // Linked (and loaded) before the clock starts: a one-time cost,
        // reported and learned apart. A failure is the GPU try's error (the
        // search falls back to the CPU saying why, without a second link).
        let mut link_seconds = 0.0;
        let mut prepare_failed = None;
        match (choice.target, &s.gpu) {
            (Target::Gpu, Some(g)) if !kernels.is_empty() => {
                let prepared: Result<Vec<Duration>, _> =
                    kernels.iter().map(|k| g.prepare_tiered(k)).collect();
                match prepared {
                    Ok(each) => {
                        let took: Duration = each.into_iter().sum();
                        if cold {
                            s.model.learn_link(took);
                        }
                        link_seconds = took.as_secs_f64();
                        let mut ready = lock(&s.ready);
                        if ready.len() >= READY_ENTRIES {
                            ready.clear();
                        }
                        ready.insert(key);
                    }
                    Err(e) => prepare_failed = Some(e),
                }
            }
            (Target::Cpu, Some(_)) if link_meanwhile && s.background_links => {
                for k in kernels {
                    s.link_in_background(k);
                }
            }
            _ => {}
        }
        let (gpu, uploaded) = match choice.target {
            Target::Gpu => match self.gpu_index() {
                Some((r, took)) => (Some(r), took),
                None => (None, None),
            },
            Target::Cpu => (None, None),
        };
        let tracing = crate::search::trace::enabled_by_env().map_err(|value| RouteError::Env {
            variable: crate::search::trace::TRACE_VAR,
            value,
            expected: crate::switch::SWITCH_EXPECTED,
        })?;
        if tracing {
            crate::search::trace::start();
        }
        let started = Instant::now();
        let nq = queries.rows();
        let ran = GpuRan::default();
        let result = run_with_fallback(
            choice.target,
            &choice.reason,
            BatchPolicy::new(nq.min(s.max_batch).max(1), 1),
            |batch| {
                if let Some(why) = s.lost.get() {
                    return Err(GpuTry::Lost(why));
                }
                if let Some(e) = prepare_failed.take() {
                    if e.is_context_lost() {
                        let _ = s.lost.set(e.to_string());
                    }
                    return Err(GpuTry::Search(e));
                }
                match gpu {
                    Some(Ok(index)) => Searcher::gpu_batched(index, queries, params, batch, &ran)
                        .map(Ok)
                        .map_err(|e| {
                            if e.is_context_lost() {
                                let _ = s.lost.set(e.to_string());
                            }
                            GpuTry::Search(e)
                        }),
                    Some(Err(e)) => Err(GpuTry::Upload(e)),
                    None => Err(GpuTry::NoGpu),
                }
            },
            || search_cpu(base, queries, params),
        );
        let seconds = started.elapsed().as_secs_f64();
        let trace = if tracing {
            crate::search::trace::mark("finish");
            crate::search::trace::finish()
        } else {
            None
        };
        // The model learns what it estimated: with the upload when this
        // search made it (the base was not resident when it chose).
        let upload = uploaded.unwrap_or_default();
        let learned = match result.target_used {
            Target::Gpu => result.final_elapsed() + upload,
            Target::Cpu => result.final_elapsed(),
        };
        // Not a search that ran quick links' kernels: the model estimates
        // the optimised ones, which replace them within a link's time.
        if !(result.target_used == Target::Gpu && ran.quick.get()) {
            s.model.learn(&op, result.target_used, learned);
        }
        Ok(Routed {
            neighbors: result.value?,
            target: result.target_used,
            reason: result.reason,
            fell_back: result.fell_back,
            seconds,
            upload_seconds: upload.as_secs_f64(),
            link_seconds,
            gpu_kernel: match result.target_used {
                Target::Gpu => ran.kernel.get(),
                Target::Cpu => None,
            },
            special_rows: match result.target_used {
                Target::Gpu => ran.special_rows.get(),
                Target::Cpu => 0,
            },
            special_queries: match result.target_used {
                Target::Gpu => ran.special_queries.get(),
                Target::Cpu => 0,
            },
            trace,
        })
    }
}

/// A configuration's place in [`Searcher`]'s background-link set, given up
/// when dropped.
struct Linking {
    set: Arc<Mutex<HashSet<Vec<&'static str>>>>,
    names: Vec<&'static str>,
}

impl Drop for Linking {
    fn drop(&mut self) {
        lock(&self.set).remove(&self.names);
    }
}

impl Vectors {
    /// Rows `rows` (each below [`rows`](Self::rows)), in that order, as new
    /// vectors.
    pub(crate) fn gather_rows(&self, rows: &[usize]) -> Vectors {
        fn pick<T: Clone>(m: &super::Matrix<T>, rows: &[usize]) -> super::Matrix<T> {
            let d = m.dim();
            let mut data = Vec::with_capacity(rows.len() * d);
            for &r in rows {
                data.extend_from_slice(m.row(r));
            }
            super::Matrix::new(data, rows.len(), d).expect("rows of a valid matrix are valid")
        }
        match self {
            Vectors::F32(m) => Vectors::F32(pick(m, rows)),
            Vectors::F16(m) => Vectors::F16(pick(m, rows)),
            Vectors::I8(m) => Vectors::I8(pick(m, rows)),
            Vectors::U8(m) => Vectors::U8(pick(m, rows)),
        }
    }

    /// Rows `start..end` as new vectors (query batches).
    ///
    /// # Panics
    ///
    /// If `start > end` or `end > self.rows()`, as slicing does.
    pub fn slice_rows(&self, start: usize, end: usize) -> Vectors {
        fn cut<T: Clone>(m: &super::Matrix<T>, start: usize, end: usize) -> super::Matrix<T> {
            let d = m.dim();
            super::Matrix::new(m.data()[start * d..end * d].to_vec(), end - start, d)
                .expect("a row range of a valid matrix is valid")
        }
        match self {
            Vectors::F32(m) => Vectors::F32(cut(m, start, end)),
            Vectors::F16(m) => Vectors::F16(cut(m, start, end)),
            Vectors::I8(m) => Vectors::I8(cut(m, start, end)),
            Vectors::U8(m) => Vectors::U8(cut(m, start, end)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::data::synthetic;
    use crate::search::DType;

    /// The batch sizes a search's kernels are decided for: all queries in
    /// one batch, or full batches plus a shorter last one; no queries, the
    /// search without queries.
    #[test]
    fn ready_keys_name_the_batches_a_search_runs() {
        let (base, _) = synthetic(100, 8, 1, DType::F32, 1);
        let p = SearchParams::new(5, Metric::L2);
        let key = |nq, max| ReadyKey::of(&base, nq, max, &p).batches;
        assert_eq!(key(40, usize::MAX), [40, 0]);
        assert_eq!(key(40, 16), [16, 8]);
        assert_eq!(key(48, 16), [16, 0]);
        assert_eq!(key(0, 16), [0, 0]);
        let a = ReadyKey::of(&base, 40, 16, &p);
        assert_ne!(
            a,
            ReadyKey::of(&base, 40, 16, &SearchParams::new(6, Metric::L2))
        );
        assert_ne!(
            a,
            ReadyKey::of(&base, 40, 16, &SearchParams::new(5, Metric::Cosine))
        );
        assert_eq!(a, ReadyKey::of(&base, 40, 16, &p));
    }

    /// A background link's place in the in-flight set goes however its
    /// thread ends, a panic included.
    #[test]
    fn the_in_flight_entry_leaves_even_on_a_panic() {
        let set: Arc<Mutex<HashSet<Vec<&'static str>>>> = Arc::default();
        for panics in [false, true] {
            lock(&set).insert(vec!["knn_tile_x"]);
            let entry = Linking {
                set: set.clone(),
                names: vec!["knn_tile_x"],
            };
            let joined = std::thread::spawn(move || {
                let _entry = entry;
                assert!(!panics, "a link that panics");
            })
            .join();
            assert_eq!(joined.is_err(), panics);
            assert!(lock(&set).is_empty());
        }
    }
}
