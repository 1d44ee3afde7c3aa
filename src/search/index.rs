//! A device-resident index: base vectors uploaded once into a
//! [`GpuSearcher`]'s memory pool, then searched any number of times, each
//! search moving only its queries (host → device) and its `nq × k` results
//! (device → host).
//!
//! The rows stay in their own dtype (f32, f16 as its 16 bits, i8, u8): the
//! kernels read them as they are, so nothing is converted per search. The
//! one addition: f32 rows get f16 copies, kept beside them (half their
//! bytes), which the f16copy candidate kernels (f32's default) read instead
//! ([`crate::search::knn::f16copy`]); the upload makes them from the host
//! rows where the device has those kernels (out of device memory then, the
//! first search that asks makes them).
//! Beside the rows the index holds their norms ([`KnnRows`]: squared norm,
//! norm and inverse norm per row, 12 bytes; the exact squared norm for
//! integers, 4 bytes), computed once on the host at upload, for the
//! tensor-core path: candidates from tensor-core dot products with a proven
//! margin, then an exact re-rank ([`crate::search::knn`]). A search takes
//! that path when the device, the workload and the data allow it
//! ([`crate::search::knn::choose`]: TF32 needs sm_80, k up to the largest
//! capacity the device's shared memory holds (1024 on an H100),
//! `FRAGLINK_GPU_KNN` not off) and the exact scan
//! otherwise (k ≤ 256; beyond it the two-pass select of
//! [`crate::search::knn::select`] up to its `MAX_SLICES` slices, else an error
//! that sends the search to the CPU path); all give the same results. Rows
//! the tensor-core bounds do not cover ("special": a non-finite element, a
//! huge norm, for cosine a tiny one) are copied aside at upload (up to
//! [`MAX_SPECIAL_BYTES`](crate::search::knn::special::MAX_SPECIAL_BYTES)):
//! the candidate kernel skips them and the scan searches that copy beside
//! it ([`crate::search::knn::special`]); queries it does not cover are
//! answered apart, by the scan (or the select) over every row. A bitset filter is a search parameter: it is
//! uploaded when it first appears and kept while the following searches pass
//! the same bits (query batches of one search do), replaced when they differ.
//!
//! Results are those of the CPU path bit for bit, as for
//! [`GpuSearcher::search`] (the same kernels on the same bytes).
//!
//! ```no_run
//! use fraglink::gpu::GpuContext;
//! use fraglink::search::{data::synthetic, gpu::GpuSearcher, DType, Metric, SearchParams};
//! let (base, queries) = synthetic(100_000, 128, 1000, DType::F32, 7);
//! let gpu = GpuSearcher::new(GpuContext::default()?)?;
//! let index = gpu.upload(&base)?; // the only time the base moves
//! println!("uploaded {} bytes in {:?}", index.device_bytes(), index.upload_time());
//! let params = SearchParams::new(10, Metric::L2);
//! for batch in [0..500, 500..1000] {
//!     let part = queries.slice_rows(batch.start, batch.end);
//!     let found = index.search(&part, &params)?; // queries and results only
//!     assert_eq!(found.neighbors.nq, 500);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gpu::launch::ScanArgError;
use crate::gpu::{GpuBuffer, GpuError};
use crate::link::LinkRuntime;

use super::gpu::{
    beyond_scan, upload_queries, upload_vectors, DeviceVectors, GpuSearch, GpuSearchError,
    GpuSearcher, MAX_QUERIES_PER_LAUNCH,
};
use super::knn::gpu::{enabled_by_env, f16copy_refused, variant_by_env, KnnRows, KnnSearch};
use super::knn::norms::Norms;
use super::knn::select::SelectSearch;
use super::knn::special::{self, SpecialRows};
use super::knn::{choose_fallback, choose_select, f16copy, Precision};
use super::plan::{plan, ScanPlan};
use super::resident_bits::ResidentBits;
use super::{trace, Bitset, DType, Filter, Neighbors, SearchError, SearchParams, Vectors};

/// What the special rows of an index add to one tensor-core search
/// ([`GpuIndex::special_scan`]).
enum SpecialPart<'a> {
    /// The filter allows none of them.
    Nothing,
    /// The scan over their copy.
    Scan(SpecialScan<'a>),
    /// The scan cannot take them: the search leaves the tensor-core path.
    Unable,
}

/// The exact scan over an index's special rows that one tensor-core search
/// adds ([`GpuIndex::special_scan`]).
struct SpecialScan<'a> {
    rows: &'a SpecialRows,
    copy: &'a DeviceVectors,
    plan: ScanPlan,
    /// The filter over the copy: the rows special for the metric that the
    /// search's filter allows.
    bits: Bitset,
    /// The search's `k`, at most `allowed`.
    k: usize,
    /// How many of the rows the search's filter allows.
    allowed: usize,
}

/// What a search needs to know of the base: element type and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexShape {
    pub dtype: DType,
    pub rows: usize,
    pub dim: usize,
}

impl IndexShape {
    pub fn of(base: &Vectors) -> Self {
        IndexShape {
            dtype: base.dtype(),
            rows: base.rows(),
            dim: base.dim(),
        }
    }

    /// Bytes of the rows (`rows × dim × dtype size`), saturating.
    pub fn size_bytes(&self) -> u64 {
        (self.rows as u64)
            .saturating_mul(self.dim as u64)
            .saturating_mul(self.dtype.size() as u64)
    }

    /// Can a scan ever take these rows? The integer dtypes' exact range of
    /// `dim` ([`DType::max_dim`]) and the kernel's 32-bit `dim`; checked
    /// before an upload, so a base no search could use is never copied.
    pub fn check_searchable(&self) -> Result<(), GpuSearchError> {
        if let Some(max) = self.dtype.max_dim() {
            if self.dim > max {
                return Err(SearchError::DimTooLarge {
                    dtype: self.dtype,
                    dim: self.dim,
                    max,
                }
                .into());
            }
        }
        if u32::try_from(self.dim).is_err() {
            return Err(ScanArgError::TooLarge {
                argument: "dim",
                value: self.dim as u64,
                max: u64::from(u32::MAX),
            }
            .into());
        }
        Ok(())
    }

    /// The checks every search path makes (GPU and CPU alike): queries of
    /// this dtype and dim, `k ≥ 1`, a result size that fits, a filter
    /// covering exactly these rows, an integer dim in its exact range.
    pub fn validate(&self, queries: &Vectors, params: &SearchParams) -> Result<(), SearchError> {
        if self.dtype != queries.dtype() {
            return Err(SearchError::DTypeMismatch {
                base: self.dtype,
                queries: queries.dtype(),
            });
        }
        if self.dim != queries.dim() {
            return Err(SearchError::DimensionMismatch {
                base: self.dim,
                queries: queries.dim(),
            });
        }
        if params.k == 0 {
            return Err(SearchError::InvalidK { k: params.k });
        }
        super::check_result_size(queries.rows(), params.k)?;
        if let Filter::Bitset(b) = &params.filter {
            b.validate(self.rows)?;
        }
        if let Some(max) = self.dtype.max_dim() {
            if self.dim > max {
                return Err(SearchError::DimTooLarge {
                    dtype: self.dtype,
                    dim: self.dim,
                    max,
                });
            }
        }
        Ok(())
    }

    /// Everything decided before a byte moves: [`validate`](Self::validate),
    /// the scan variant ([`PlanError::KTooLarge`](super::plan::PlanError)
    /// when `k` exceeds every capacity), and the counts the kernel receives.
    pub fn plan(
        &self,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<ScanPlan, GpuSearchError> {
        self.validate(queries, params)?;
        let p = plan(
            self.dtype,
            params.metric,
            params.filter.fragment_name(),
            self.rows,
            self.dim,
            params.k,
        )?;
        // Checked, not cast; the launches take at most
        // MAX_QUERIES_PER_LAUNCH queries each.
        p.contract().scalars(
            self.rows as u64,
            self.dim as u64,
            queries.rows().min(MAX_QUERIES_PER_LAUNCH) as u64,
            params.k as u64,
        )?;
        Ok(p)
    }
}

/// Base vectors resident on a GPU ([`GpuSearcher::upload`]). Searches take
/// `&self` and may run from several threads; the rows go back to the pool
/// when the index is dropped.
pub struct GpuIndex {
    gpu: GpuSearcher,
    shape: IndexShape,
    data: DeviceVectors,
    /// Row norms for the tensor-core path (`None` for shapes it never takes).
    knn: Option<KnnRows>,
    upload: Duration,
    /// [`Self::device_bytes`] when the upload ended.
    uploaded_bytes: u64,
    /// The search's filter, and (two slots, so that a search using both
    /// does not upload each in turn) the candidate kernel's where special
    /// rows are skipped.
    bits: ResidentBits,
    skip_bits: ResidentBits,
}

impl std::fmt::Debug for GpuIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuIndex")
            .field("shape", &self.shape)
            .field("upload", &self.upload)
            .finish_non_exhaustive()
    }
}

impl GpuIndex {
    /// Uploads `base` into `gpu`'s pool (see [`GpuSearcher::upload`]).
    pub fn upload(gpu: &GpuSearcher, base: &Vectors) -> Result<Self, GpuSearchError> {
        let shape = IndexShape::of(base);
        shape.check_searchable()?;
        let started = Instant::now();
        let data = upload_vectors(gpu.transfer(), gpu.pool(), base)?;
        let arch = gpu.context().arch();
        let knn = KnnRows::upload(gpu.transfer(), gpu.pool(), base, arch)?;
        if let Some(rows) = &knn {
            rows.copy_f16_at_upload(gpu.transfer(), gpu.pool(), &data, base, arch)?;
        }
        let mut index = GpuIndex {
            gpu: gpu.clone(),
            shape,
            data,
            knn,
            upload: started.elapsed(),
            uploaded_bytes: 0,
            bits: ResidentBits::default(),
            skip_bits: ResidentBits::default(),
        };
        index.uploaded_bytes = index.device_bytes();
        Ok(index)
    }

    pub fn shape(&self) -> IndexShape {
        self.shape
    }

    pub fn dtype(&self) -> DType {
        self.shape.dtype
    }

    pub fn rows(&self) -> usize {
        self.shape.rows
    }

    pub fn dim(&self) -> usize {
        self.shape.dim
    }

    /// Bytes of the resident rows, their norms and, for f32 rows on a
    /// device with the f16copy variants, their f16 copies (made at upload,
    /// or by the first search that asks where the device had no room then).
    pub fn device_bytes(&self) -> u64 {
        self.shape.size_bytes() + self.knn.as_ref().map_or(0, KnnRows::device_bytes)
    }

    /// Bytes the one-time upload moved: [`Self::device_bytes`] as the
    /// upload left it.
    pub fn upload_bytes(&self) -> u64 {
        self.uploaded_bytes
    }

    /// Wall time of the one-time upload (norms on the host, allocation and
    /// copies, synchronised).
    pub fn upload_time(&self) -> Duration {
        self.upload
    }

    /// The searcher (device, pool, transfers, kernels) the index lives on.
    pub fn searcher(&self) -> &GpuSearcher {
        &self.gpu
    }

    /// Exact k-NN of `queries` against the resident rows. Moves the queries
    /// to the device, a bitset filter when it differs from the last one, and
    /// the results back; never the rows (nor their f16 copies, made at upload;
    /// where the device had no room for them then, the first f16copy search
    /// makes them, reading the rows back: `elapsed` includes it). Bad input (a dtype or dim other than
    /// the index's, `k` = 0, `k` beyond the scan capacities where neither the
    /// tensor-core path nor the two-pass select can serve it, a filter of another
    /// length) is a typed error naming the value, found before anything
    /// moves. `elapsed` covers the query upload, the launches and the download
    /// (and, on the tensor-core path, the queries' norms on the host).
    ///
    /// `FRAGLINK_KNN_VARIANT` names the candidate kernel instead of the
    /// planner ([`Self::search_with_variant`]).
    pub fn search(
        &self,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<GpuSearch, GpuSearchError> {
        self.search_with_variant(queries, params, variant_by_env().as_deref())
    }

    /// As [`Self::search`], with the tensor-core candidate kernel named
    /// (a `knn_tile_*` fragment) instead of the planner's pick, for
    /// benchmarks and tests that compare variants. Where the tensor-core
    /// path serves the search at all (module docs: shape, k and device in
    /// its range, some query it covers), a variant that cannot (another
    /// dtype, a capacity below k, more shared memory than the device has)
    /// is an error naming it; elsewhere the scan (or, beyond its k of 256,
    /// the two-pass select) serves the search as without a variant. `None`:
    /// the planner decides.
    pub fn search_with_variant(
        &self,
        queries: &Vectors,
        params: &SearchParams,
        variant: Option<&str>,
    ) -> Result<GpuSearch, GpuSearchError> {
        self.search_uploaded_from(queries, params, variant, None)
    }

    /// [`Self::search_with_variant`], given the host rows the index was just
    /// uploaded from (`base`, by [`GpuSearcher::search`]): an f16copy search
    /// whose upload could not make the rows' f16 copies (out of device
    /// memory then) makes them from these instead of reading the rows back
    /// from the device.
    pub(crate) fn search_uploaded_from(
        &self,
        queries: &Vectors,
        params: &SearchParams,
        variant: Option<&str>,
        base: Option<&Vectors>,
    ) -> Result<GpuSearch, GpuSearchError> {
        let started = Instant::now();
        // Bad input fails here; a `k` beyond every scan capacity only if the
        // tensor-core path cannot serve the search either.
        let scan = match self.shape.plan(queries, params) {
            Err(e) if !beyond_scan(&e) => return Err(e),
            other => other,
        };
        if queries.rows() > 0 || scan.is_err() {
            let plan = scan.as_ref().ok();
            if let Some(found) = self.search_knn(queries, params, plan, variant, base)? {
                return Ok(GpuSearch {
                    elapsed: started.elapsed(),
                    ..found
                });
            }
        }
        self.search_exact(queries, params, scan, started)
    }

    /// The scan `scan` (validated for `queries`) or, beyond its capacities,
    /// the two-pass select where it serves the shape; else the scan
    /// planner's error, and the router takes the search to the CPU.
    fn search_exact(
        &self,
        queries: &Vectors,
        params: &SearchParams,
        scan: Result<ScanPlan, GpuSearchError>,
        started: Instant,
    ) -> Result<GpuSearch, GpuSearchError> {
        if scan.is_err() {
            if let Some(found) = self.search_select(queries, params)? {
                return Ok(GpuSearch {
                    elapsed: started.elapsed(),
                    ..found
                });
            }
        }
        self.scan_with(queries, params, scan?, started)
    }

    /// Exact k-NN of `queries` through the scan kernel, whatever path
    /// [`Self::search`] would take: the reference the tensor-core path and
    /// the select equal bit for bit, for tests and benchmarks that compare
    /// them (`FRAGLINK_GPU_KNN=0` does the same for a whole process). `k`
    /// up to the scan's largest capacity (256); bad input is the scan
    /// planner's error, naming the value.
    pub fn search_scan(
        &self,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<GpuSearch, GpuSearchError> {
        let started = Instant::now();
        let p = self.shape.plan(queries, params)?;
        self.scan_with(queries, params, p, started)
    }

    /// The scan `p` over the resident rows (module docs); `elapsed` from
    /// `started`.
    fn scan_with(
        &self,
        queries: &Vectors,
        params: &SearchParams,
        p: ScanPlan,
        started: Instant,
    ) -> Result<GpuSearch, GpuSearchError> {
        let (nq, k) = (queries.rows(), params.k);
        let linked = p.planner().link_tiered_for(self.gpu.context().arch())?;
        let launcher = self.gpu.launcher(&linked)?;
        let neighbors = if nq == 0 {
            Neighbors {
                nq,
                k,
                ids: Vec::new(),
                distances: Vec::new(),
            }
        } else {
            trace::mark("plan");
            let d_queries = upload_queries(self.gpu.transfer(), self.gpu.pool(), queries)?;
            trace::mark_device("upload queries", self.gpu.transfer().stream());
            let bits = self.resident_bits(&params.filter)?;
            self.gpu.scan(
                &p,
                &launcher,
                &self.data,
                self.shape.rows,
                self.shape.dim,
                &d_queries,
                nq,
                bits.as_deref(),
                k,
            )?
        };
        Ok(GpuSearch {
            neighbors,
            plan: Some(p),
            linked,
            knn: None,
            select: None,
            special_rows: 0,
            special_queries: 0,
            elapsed: started.elapsed(),
        })
    }

    /// The two-pass select ([`crate::search::knn::select`]) when the device
    /// can serve this search with it: `None` otherwise. An empty query set
    /// links and loads its kernels and moves nothing.
    fn search_select(
        &self,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<Option<GpuSearch>, GpuSearchError> {
        let nq = queries.rows();
        let request = self.gpu.knn_request(&self.shape, params, nq);
        let Some(sp) = choose_select(&request) else {
            return Ok(None);
        };
        let (neighbors, linked) = if nq == 0 {
            let [first, second] = sp.kernels();
            let linked = self.gpu.load_kernels(&first, &[second], true)?;
            let empty = Neighbors {
                nq,
                k: params.k,
                ids: Vec::new(),
                distances: Vec::new(),
            };
            (empty, linked)
        } else {
            let bits = self.resident_bits(&params.filter)?;
            SelectSearch {
                gpu: &self.gpu,
                plan: &sp,
                data: &self.data,
                n_rows: self.shape.rows,
                dim: self.shape.dim,
                bits: bits.as_deref(),
                k: params.k,
            }
            .run(queries)?
        };
        Ok(Some(GpuSearch {
            neighbors,
            plan: None,
            linked,
            knn: None,
            select: Some(sp),
            special_rows: 0,
            special_queries: 0,
            elapsed: Duration::ZERO,
        }))
    }

    /// The tensor-core path, when it can serve this search (module docs):
    /// `None` leaves it to the scan or the select. `plan` is the validated
    /// scan plan.
    /// Rows special for the metric are skipped by the candidate kernel and
    /// searched by the scan beside it, queries special for it answered
    /// apart by the scan or the select ([`crate::search::knn::special`]).
    fn search_knn(
        &self,
        queries: &Vectors,
        params: &SearchParams,
        plan: Option<&ScanPlan>,
        variant: Option<&str>,
        base: Option<&Vectors>,
    ) -> Result<Option<GpuSearch>, GpuSearchError> {
        let Some(rows) = self.knn.as_ref() else {
            return Ok(None);
        };
        let Some(rows_for) = rows.rows_for(params.metric) else {
            return Ok(None);
        };
        if !enabled_by_env()? {
            return Ok(None);
        }
        // Everything that can send the search elsewhere is decided before
        // anything launches: special queries, then special rows.
        let qnorms = Norms::of(queries);
        let (normal, special_q) = special::split_queries(&qnorms, params.metric);
        let apart = match special_q.len() {
            0 => None,
            n if n == queries.rows() => return Ok(None),
            _ => {
                let q = queries.gather_rows(&special_q);
                let Some(scan) = self.exact_plan(&q, params) else {
                    return Ok(None);
                };
                Some((q, scan))
            }
        };
        // What this path searches: every query, or those the bounds cover.
        let gathered;
        let gathered_norms;
        let (tq, tq_norms) = match &apart {
            None => (queries, &qnorms),
            Some(_) => {
                gathered = queries.gather_rows(&normal);
                gathered_norms = qnorms.gather(&normal);
                (&gathered, &gathered_norms)
            }
        };
        let (special_scan, skip) = match rows_for.special {
            None => (None, None),
            Some((s, copy)) => match self.special_scan(s, copy, tq, params)? {
                SpecialPart::Unable => return Ok(None),
                // The search's filter already leaves them out.
                SpecialPart::Nothing => (None, None),
                SpecialPart::Scan(part) => (
                    Some(part),
                    Some(s.tensor_filter(self.shape.rows, params.metric, &params.filter)),
                ),
            },
        };
        // The candidate kernel's filter: the search's, less the special rows.
        let skipping = skip.is_some();
        let tensor_params;
        let tensor_params = match skip {
            None => params,
            Some(bits) => {
                tensor_params = SearchParams {
                    k: params.k,
                    metric: params.metric,
                    filter: Filter::Bitset(bits),
                };
                &tensor_params
            }
        };
        let request = self.gpu.knn_request(&self.shape, tensor_params, tq.rows());
        let kp = super::knn::choose_named(&request, variant).map_err(|reason| {
            GpuSearchError::KnnVariant {
                value: variant.unwrap_or_default().to_owned(),
                reason,
            }
        })?;
        let Some(kp) = kp else {
            return Ok(None);
        };
        // f16copy: the copies, or (where an element has no finite f16) the
        // named variant's error, or for the default plain TF32 instead.
        let (kp, staged) = if kp.precision == Precision::F16Copy {
            match self.f16_copies(rows, tq, base)? {
                Ok(copies) => (kp, Some(copies)),
                Err(what) if variant.is_some() => return Err(f16copy_refused(&kp, what)),
                Err(_) => match choose_fallback(&request) {
                    Some(tf32) => (tf32, None),
                    None => return Ok(None),
                },
            }
        } else {
            (kp, None)
        };
        if let Some(part) = &special_scan {
            // The scan of the special rows links with the pair, all three at
            // once when cold (the launches below then find them in memory).
            let plans = [kp.tile_planner(), kp.rerank_planner(), part.plan.planner()];
            LinkRuntime::global()?.link_all_tiered(&plans.each_ref(), self.gpu.context().arch())?;
        }
        let bits = match &tensor_params.filter {
            Filter::Bitset(b) if skipping => {
                Some(self.skip_bits.of(self.gpu.transfer(), self.gpu.pool(), b)?)
            }
            f => self.resident_bits(f)?,
        };
        let search = KnnSearch {
            gpu: &self.gpu,
            plan: &kp,
            data: &self.data,
            staged: staged.as_ref().map(|(r, q)| (&**r, &q[..])),
            rows: rows_for.aux,
            n_rows: self.shape.rows,
            dim: self.shape.dim,
            bits: bits.as_deref(),
            k: params.k,
        };
        let (mut neighbors, linked) = search.run(tq, tq_norms, params.metric)?;
        let mut special_rows = 0;
        if let Some(part) = special_scan {
            neighbors = self.run_special_scan(&part, tq, &neighbors)?;
            special_rows = part.allowed;
        }
        let mut select = None;
        if let Some((q, scan)) = apart {
            let found = self.search_exact(&q, params, scan, Instant::now())?;
            neighbors =
                special::join_queries([(&normal, &neighbors), (&special_q, &found.neighbors)]);
            select = found.select;
        }
        Ok(Some(GpuSearch {
            neighbors,
            plan: plan.cloned(),
            linked,
            knn: Some(kp),
            select,
            special_rows,
            special_queries: special_q.len(),
            elapsed: Duration::ZERO,
        }))
    }

    /// The scan's plan for `queries` over every row, for
    /// [`Self::search_exact`], where the scan or the select can answer them
    /// (bad input included: the search names it); `None` where neither can.
    fn exact_plan(
        &self,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Option<Result<ScanPlan, GpuSearchError>> {
        let scan = self.shape.plan(queries, params);
        match &scan {
            Err(e) if beyond_scan(e) => {
                let request = self.gpu.knn_request(&self.shape, params, queries.rows());
                choose_select(&request).map(|_| scan)
            }
            _ => Some(scan),
        }
    }

    /// The scan over the rows `special` (copied aside as `copy`) that a
    /// tensor-core search of `queries` adds, as many as the search's filter
    /// allows: nothing to add where it allows none, unable where the scan
    /// cannot take them (more allowed than its largest capacity, with `k`
    /// beyond it too: the whole search then takes the scan or the select).
    fn special_scan<'s>(
        &self,
        special: &'s SpecialRows,
        copy: &'s DeviceVectors,
        queries: &Vectors,
        params: &SearchParams,
    ) -> Result<SpecialPart<'s>, GpuSearchError> {
        let (bits, allowed) = special.local_filter(params.metric, &params.filter);
        if allowed == 0 {
            return Ok(SpecialPart::Nothing);
        }
        let k = params.k.min(allowed);
        // The planner checks the filter's length: a copy of the few words.
        let p = SearchParams::new(k, params.metric).with_filter(Filter::Bitset(bits.clone()));
        let shape = IndexShape {
            rows: special.ids().len(),
            ..self.shape
        };
        match shape.plan(queries, &p) {
            Ok(plan) => Ok(SpecialPart::Scan(SpecialScan {
                rows: special,
                copy,
                plan,
                bits,
                k,
                allowed,
            })),
            Err(e) if beyond_scan(&e) => Ok(SpecialPart::Unable),
            Err(e) => Err(e),
        }
    }

    /// Runs `part` for `queries` and merges its results into `main` (the
    /// tensor-core path's over the other rows).
    fn run_special_scan(
        &self,
        part: &SpecialScan<'_>,
        queries: &Vectors,
        main: &Neighbors,
    ) -> Result<Neighbors, GpuSearchError> {
        let linked = part
            .plan
            .planner()
            .link_tiered_for(self.gpu.context().arch())?;
        let launcher = self.gpu.launcher(&linked)?;
        let (t, pool) = (self.gpu.transfer(), self.gpu.pool());
        let d_queries = upload_queries(t, pool, queries)?;
        let d_bits = t.upload_new_queued(pool, &part.bits.words)?;
        let found = self.gpu.scan(
            &part.plan,
            &launcher,
            part.copy,
            part.rows.ids().len(),
            self.shape.dim,
            &d_queries,
            queries.rows(),
            Some(&d_bits),
            part.k,
        )?;
        Ok(special::merge(main, &found, part.rows.ids()))
    }

    /// An f16copy plan's operands: the queries' f16 bits (rounded here, on
    /// the host) and the rows' f16 copies (made at upload, else by the first
    /// search that asks: [`KnnRows::f16_copy`], from `base` where given). `Err(what)`,
    /// "the queries" or "the rows", where they hold an element without a
    /// finite f16 (|v| > 65504, NaN or infinite); the queries are checked
    /// first, so a refused search makes no copy of the rows.
    #[allow(clippy::type_complexity)]
    fn f16_copies(
        &self,
        rows: &KnnRows,
        queries: &Vectors,
        base: Option<&Vectors>,
    ) -> Result<Result<(Arc<DeviceVectors>, Vec<u16>), &'static str>, GpuSearchError> {
        let Some(query_bits) = (match queries {
            Vectors::F32(m) => f16copy::to_f16_bits(m.data()),
            _ => None,
        }) else {
            return Ok(Err("the queries"));
        };
        let host = match base {
            Some(Vectors::F32(m)) => Some(m.data()),
            _ => None,
        };
        let Some(row_copies) = rows.f16_copy(
            self.gpu.transfer(),
            self.gpu.pool(),
            &self.data,
            self.shape.dim,
            host,
        )?
        else {
            return Ok(Err("the rows"));
        };
        Ok(Ok((row_copies, query_bits)))
    }

    /// The device copy of `filter`'s bits (`None` without a bitset), kept
    /// for the next search ([`ResidentBits`]).
    fn resident_bits(&self, filter: &Filter) -> Result<Option<Arc<GpuBuffer<u32>>>, GpuError> {
        self.bits
            .of_filter(self.gpu.transfer(), self.gpu.pool(), filter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::plan::PlanError;
    use crate::search::{Bitset, Matrix, Metric};

    fn shape(dtype: DType, rows: usize, dim: usize) -> IndexShape {
        IndexShape { dtype, rows, dim }
    }

    #[test]
    fn shape_of_vectors_and_bytes() {
        let v = Vectors::f16(vec![half::f16::ZERO; 30], 6).unwrap();
        let s = IndexShape::of(&v);
        assert_eq!(s, shape(DType::F16, 5, 6));
        assert_eq!(s.size_bytes(), 60);
        assert_eq!(s.size_bytes(), v.size_bytes() as u64);
        assert_eq!(shape(DType::F32, usize::MAX, 2).size_bytes(), u64::MAX);
    }

    #[test]
    fn bad_queries_are_typed_errors_naming_the_values() {
        let idx = shape(DType::F32, 100, 16);
        let q = Vectors::f32(vec![0.0; 32], 16).unwrap();
        let p = SearchParams::new(10, Metric::L2);
        assert!(idx.plan(&q, &p).is_ok());

        let e = idx
            .plan(&Vectors::u8(vec![0; 32], 16).unwrap(), &p)
            .unwrap_err();
        assert!(
            matches!(
                e,
                GpuSearchError::Search(SearchError::DTypeMismatch {
                    base: DType::F32,
                    queries: DType::U8
                })
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("f32") && e.to_string().contains("u8"),
            "{e}"
        );

        let e = idx
            .plan(&Vectors::f32(vec![0.0; 24], 12).unwrap(), &p)
            .unwrap_err();
        assert!(
            matches!(
                e,
                GpuSearchError::Search(SearchError::DimensionMismatch {
                    base: 16,
                    queries: 12
                })
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("16") && e.to_string().contains("12"),
            "{e}"
        );

        let e = idx.plan(&q, &SearchParams::new(0, Metric::L2)).unwrap_err();
        assert!(
            matches!(e, GpuSearchError::Search(SearchError::InvalidK { k: 0 })),
            "{e:?}"
        );

        let e = idx
            .plan(&q, &SearchParams::new(300, Metric::L2))
            .unwrap_err();
        match &e {
            GpuSearchError::Plan(PlanError::KTooLarge { k, max, .. }) => {
                assert_eq!((*k, *max), (300, 256))
            }
            other => panic!("expected KTooLarge, got {other:?}"),
        }
        assert!(e.to_string().contains("k = 300"), "{e}");
        // Only this error lets a search go on to the tensor-core path
        // (capacities up to 1024); bad input never does.
        assert!(beyond_scan(&e));
        let bad_k = idx.plan(&q, &SearchParams::new(0, Metric::L2)).unwrap_err();
        assert!(!beyond_scan(&bad_k));

        let p = SearchParams::new(5, Metric::Cosine).with_filter(Filter::Bitset(Bitset::all(99)));
        let e = idx.plan(&q, &p).unwrap_err();
        match &e {
            GpuSearchError::Search(SearchError::FilterLength {
                dataset_rows,
                filter_rows,
                ..
            }) => assert_eq!((*dataset_rows, *filter_rows), (100, 99)),
            other => panic!("expected FilterLength, got {other:?}"),
        }
    }

    #[test]
    fn every_dtype_metric_filter_plans_against_its_shape() {
        for dtype in DType::ALL {
            for metric in Metric::ALL {
                for filter in [Filter::None, Filter::Bitset(Bitset::random(500, 0.5, 1))] {
                    for (dim, k) in [(64, 1), (33, 10), (8, 256)] {
                        let idx = shape(dtype, 500, dim);
                        let (_, q) = crate::search::data::synthetic(1, dim, 3, dtype, 5);
                        let params = SearchParams::new(k, metric).with_filter(filter.clone());
                        let p = idx.plan(&q, &params).unwrap();
                        assert_eq!(p.dtype, dtype);
                        assert!(p.capacity as usize >= k);
                        assert_eq!(dim % p.veclen as usize, 0);
                        let want = format!("filter_{}_", filter.fragment_name());
                        assert!(p.filter.name.starts_with(&want), "{}", p.filter.name);
                    }
                }
            }
        }
    }

    #[test]
    fn bases_no_scan_can_take_are_refused_before_the_upload() {
        assert!(shape(DType::I8, 10, 33025).check_searchable().is_ok());
        let e = shape(DType::I8, 10, 33026).check_searchable().unwrap_err();
        assert!(
            matches!(
                e,
                GpuSearchError::Search(SearchError::DimTooLarge {
                    dtype: DType::I8,
                    dim: 33026,
                    max: 33025
                })
            ),
            "{e:?}"
        );
        let e = shape(DType::F32, 1, u32::MAX as usize + 1)
            .check_searchable()
            .unwrap_err();
        assert!(e.to_string().contains("`dim` = 4294967296"), "{e}");
        // An empty base is searchable (every result is padding).
        assert!(shape(DType::U8, 0, 4).check_searchable().is_ok());
        let empty = Vectors::U8(Matrix::new(vec![], 0, 4).unwrap());
        let q = Vectors::u8(vec![1, 2, 3, 4], 4).unwrap();
        assert!(IndexShape::of(&empty)
            .plan(&q, &SearchParams::new(3, Metric::L2))
            .is_ok());
    }
}
