//! The GPU path of IVF-Flat, through the planner and the launcher.
//!
//! - **Plan** ([`ivf_plan`]): from the catalog, the `ivf_scan` fragment of the
//!   index's dtype and veclen with the smallest capacity holding `k` (32 …
//!   2048, faiss-gpu's largest k; beyond, [`PlanError::KTooLarge`]), plus the
//!   same `metric_<m>_<dtype>` and `filter_<f>_i64` fragments the brute-force
//!   scan links (fragments/README.md, "The IVF-Flat scan").
//! - **Coarse step**: the brute-force GPU scan over the resident centroids
//!   with `k = nprobe` ([`GpuIndex`]) — bit for bit the CPU's [`search_cpu`]
//!   over the centroids, so both paths probe the same lists.
//! - **Scan**: the lists, uploaded once ([`GpuIvfIndex::upload`]) back to back
//!   in the interleaved layout with their ids, offsets and sizes; one launch
//!   per search, its probes split over blocks where the queries are too few
//!   to fill the GPU (each query's splits merged on the host, [`crate::search::splits`]). Results equal [`search_ivf`](super::search_ivf) bit for bit
//!   (tests/ivf_gpu.rs, `#[ignore]`d without a GPU). A bitset filter's words
//!   go up when they differ from the last search's, as for [`GpuIndex`].
//!
//! [`search_cpu`]: crate::search::search_cpu

use crate::fragment::FragmentInfo;
use crate::fragments;
use crate::gpu::launch::ScanContract;
use crate::gpu::{GpuBuffer, KernelArgs, LaunchConfig};
use crate::link::Planner;
use crate::search::gpu::{
    upload_queries, upload_vectors, DeviceVectors, GpuSearchError, GpuSearcher,
};
use crate::search::index::GpuIndex;
use crate::search::plan::PlanError;
use crate::search::resident_bits::ResidentBits;
use crate::search::{DType, Filter, Metric, Neighbors, SearchParams, Vectors};

use super::build::List;
use super::kmeans::gather_f32;
use super::scan::{check_queries, IvfSearchParams};
use super::{IvfError, IvfIndex, ListStore, MetricSpec};
use crate::search::splits::{self, merge_splits, IVF_SPLITS_VAR, SPLITS_EXPECTED};

/// Threads per block of the IVF scan (FRAGLINK_SCAN_BLOCK).
const BLOCK: u32 = 128;

/// The fragments of one IVF-Flat scan.
#[derive(Debug, Clone)]
pub struct IvfGpuPlan {
    pub scan: &'static FragmentInfo,
    pub metric: &'static FragmentInfo,
    pub filter: &'static FragmentInfo,
    pub dtype: DType,
    pub veclen: u32,
    pub capacity: u32,
}

fn param_u32(f: &FragmentInfo, key: &str) -> Option<u32> {
    f.param(key)?.parse().ok()
}

fn named(name: String) -> Result<&'static FragmentInfo, PlanError> {
    fragments::catalog()
        .iter()
        .copied()
        .find(|f| f.name == name)
        .ok_or(PlanError::Missing(name))
}

/// The ascending IVF scans for `dtype` lists of `veclen`, one per capacity.
fn ascending_scans(dtype: DType, veclen: usize) -> Vec<&'static FragmentInfo> {
    fragments::catalog()
        .iter()
        .copied()
        .filter(|f| {
            f.family == "ivf_scan"
                && f.param("dtype") == Some(dtype.name())
                && f.param("order") == Some("asc")
                && param_u32(f, "veclen") == Some(veclen as u32)
        })
        .collect()
}

/// The largest `k` the IVF scans of `dtype` lists of `veclen` hold (2048
/// with the built-in matrix), or `None` when there is no such scan.
pub fn max_k(dtype: DType, veclen: usize) -> Option<usize> {
    largest_capacity(&ascending_scans(dtype, veclen))
}

fn largest_capacity(scans: &[&FragmentInfo]) -> Option<usize> {
    scans
        .iter()
        .filter_map(|f| param_u32(f, "capacity"))
        .max()
        .map(|c| c as usize)
}

/// The IVF scan for `dtype` lists of `veclen`, the smallest capacity holding
/// `k`, ascending order (every built-in metric: smaller is closer).
pub fn ivf_plan(
    dtype: DType,
    metric: Metric,
    filter: &str,
    veclen: usize,
    k: usize,
) -> Result<IvfGpuPlan, PlanError> {
    let scans = ascending_scans(dtype, veclen);
    let Some(max) = largest_capacity(&scans) else {
        return Err(PlanError::NoIvfScan { dtype, veclen });
    };
    let scan = scans
        .iter()
        .copied()
        .filter(|f| param_u32(f, "capacity").is_some_and(|c| c as usize >= k))
        .min_by_key(|f| param_u32(f, "capacity"))
        .ok_or(PlanError::KTooLarge {
            k,
            max: max as u32,
            dtype,
            idx: "i64",
        })?;
    Ok(IvfGpuPlan {
        scan,
        metric: named(format!(
            "metric_{}_{}",
            metric.fragment_name(),
            dtype.name()
        ))?,
        filter: named(format!("filter_{filter}_i64"))?,
        dtype,
        veclen: veclen as u32,
        capacity: param_u32(scan, "capacity").unwrap_or(0),
    })
}

impl IvfGpuPlan {
    /// The planner linking this scan; its entry is the scan fragment.
    pub fn planner(&self) -> Planner {
        Planner::kept(&[self.scan, self.metric, self.filter])
    }
}

/// Every plan [`ivf_plan`] can produce: each ascending `ivf_scan` variant
/// of the catalog (any veclen is some index's layout, any capacity some
/// `k`'s bucket) with each built-in metric of its dtype and each filter.
/// Descending variants serve only run-time user metrics, whose sources a
/// prelink cannot know.
pub fn all_ivf_plans() -> Vec<IvfGpuPlan> {
    crate::search::plan::scan_triples(
        "ivf_scan",
        |s| s.param("order") == Some("asc"),
        |_| Some("i64"),
    )
    .into_iter()
    .map(|t| IvfGpuPlan {
        scan: t.scan,
        metric: t.metric,
        filter: t.filter,
        dtype: t.dtype,
        veclen: t.veclen,
        capacity: t.capacity,
    })
    .collect()
}

/// The IVF-Flat scan family, for prelinking (`fraglink prelink --family ivf_scan`).
pub const IVF_SCAN_FAMILY: crate::link::prelink::PlanFamily = crate::link::prelink::PlanFamily::new(
    "ivf_scan",
    "IVF-Flat list scans: scan variant x metric x filter, as `fraglink search --index` plans them",
    || all_ivf_plans().iter().map(IvfGpuPlan::planner).collect(),
);

/// Why a GPU IVF search could not run.
#[derive(Debug, thiserror::Error)]
pub enum IvfGpuError {
    #[error(transparent)]
    Ivf(#[from] IvfError),
    #[error(transparent)]
    Gpu(#[from] GpuSearchError),
    #[error("{what} = {value} exceeds the IVF scan kernel's 32-bit argument")]
    TooLarge { what: &'static str, value: usize },
    /// A caller's planner ([`GpuIvfIndex::search_with`]) that does not fit
    /// the index or the search: the kernel would read the lists as another
    /// type (out of bounds), refuse its capacity (results never written) or
    /// filter the wrong way.
    #[error("the planner of `{entry}` does not fit this search: {reason}")]
    PlannerMismatch { entry: String, reason: String },
    #[error("the coarse step returned list {list}, but the index has {nlist} lists")]
    BadProbe { list: i64, nlist: usize },
    /// An environment variable with a value it does not take.
    #[error("{variable} = `{value}`: expected {expected}")]
    Env {
        variable: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// What [`GpuIvfIndex::search_with`] can check of a caller's planner (its
/// static fragments, the entry first) against the index and the search:
/// the entry's dtype and capacity (its matrix parameters), and that a filter
/// fragment of the search's kind is linked. Fragments added as run-time
/// sources are not checked. `None` when nothing is wrong.
fn planner_mismatch(
    fragments: &[&FragmentInfo],
    dtype: DType,
    capacity: u32,
    filter: &Filter,
) -> Option<String> {
    let entry = fragments.first()?;
    if let Some(d) = entry.param("dtype").filter(|&d| d != dtype.name()) {
        return Some(format!(
            "it reads {d} lists, the index stores {}",
            dtype.name()
        ));
    }
    if let Some(c) = entry
        .param("capacity")
        .filter(|&c| c != capacity.to_string())
    {
        return Some(format!(
            "its capacity is {c}, the capacity passed is {capacity}"
        ));
    }
    let want = filter.fragment_name();
    let filters: Vec<&str> = fragments
        .iter()
        .filter(|f| f.family == "filter")
        .filter_map(|f| f.param("filter"))
        .collect();
    (!filters.is_empty() && !filters.contains(&want)).then(|| {
        format!(
            "it links filter {}, the search asks for filter {want}",
            filters.join(", ")
        )
    })
}

/// [`IVF_SPLITS_VAR`]: `None` (automatic) unless it fixes the probe splits.
fn splits_from_env() -> Result<Option<usize>, IvfGpuError> {
    splits::splits_from_env(IVF_SPLITS_VAR).map_err(|value| IvfGpuError::Env {
        variable: IVF_SPLITS_VAR,
        value,
        expected: SPLITS_EXPECTED,
    })
}

fn u32_arg(what: &'static str, value: usize) -> Result<u32, IvfGpuError> {
    u32::try_from(value).map_err(|_| IvfGpuError::TooLarge { what, value })
}

fn dev_err<E: Into<GpuSearchError>>(e: E) -> IvfGpuError {
    IvfGpuError::Gpu(e.into())
}

/// An index's lists as the IVF scan kernel reads them
/// (fragments/ivf_scan.cuh): back to back in the interleaved layout, each a
/// whole number of 32-row groups, with each stored row's dataset id (-1 for
/// padding rows, which are never read as rows), each list's first stored row
/// and its size. What [`GpuIvfIndex::upload`] uploads.
#[derive(Debug, Clone)]
pub struct KernelLists {
    /// Stored rows (padding included) × dim, the index's dtype.
    pub data: Vectors,
    pub ids: Vec<i64>,
    pub offsets: Vec<u64>,
    pub sizes: Vec<u32>,
}

impl KernelLists {
    pub fn of(index: &IvfIndex) -> Result<Self, IvfGpuError> {
        let dim = index.dim();
        let mut offsets = Vec::with_capacity(index.nlist());
        let mut sizes = Vec::with_capacity(index.nlist());
        let mut ids = Vec::new();
        let mut at = 0usize;
        for l in 0..index.nlist() {
            let list = index.lists().ids(l);
            offsets.push(at as u64);
            // The kernel walks a list in u32 tiles of 128 rows: a size
            // within 128 of 2^32 would wrap the tile counter and never end.
            let size = u32_arg("list size", list.len())?;
            if size > u32::MAX - 128 {
                return Err(IvfGpuError::TooLarge {
                    what: "list size",
                    value: list.len(),
                });
            }
            sizes.push(size);
            ids.extend_from_slice(list);
            let padded = super::layout::padded_rows(list.len());
            ids.resize(ids.len() + padded - list.len(), -1);
            at += padded;
        }
        fn concat<T: Copy>(ls: &[List<T>]) -> Vec<T> {
            ls.iter().flat_map(|l| l.data.iter().copied()).collect()
        }
        // Rows of 32-row groups, not dataset rows: only the shape is borrowed.
        let shaped = |e| IvfGpuError::Ivf(IvfError::Search(e));
        let data = match index.lists() {
            ListStore::F32(ls) => Vectors::f32(concat(ls), dim),
            ListStore::F16(ls) => Vectors::f16(concat(ls), dim),
            ListStore::I8(ls) => Vectors::i8(concat(ls), dim),
            ListStore::U8(ls) => Vectors::u8(concat(ls), dim),
        }
        .map_err(shaped)?;
        Ok(KernelLists {
            data,
            ids,
            offsets,
            sizes,
        })
    }
}

/// An IVF-Flat index resident on the device.
pub struct GpuIvfIndex {
    gpu: GpuSearcher,
    metric: MetricSpec,
    dtype: DType,
    dim: usize,
    n: usize,
    nlist: usize,
    veclen: usize,
    centroids: GpuIndex,
    data: DeviceVectors,
    ids: GpuBuffer<i64>,
    offsets: GpuBuffer<u64>,
    sizes: GpuBuffer<u32>,
    /// The last filter's bits, kept while searches pass the same ones.
    bits: ResidentBits,
}

impl GpuIvfIndex {
    /// Uploads the centroids and the lists ([`KernelLists`]).
    pub fn upload(gpu: &GpuSearcher, index: &IvfIndex) -> Result<Self, IvfGpuError> {
        let lists = KernelLists::of(index)?;
        let t = gpu.transfer();
        let cents = Vectors::F32(index.centroids().clone());
        Ok(GpuIvfIndex {
            gpu: gpu.clone(),
            metric: index.metric(),
            dtype: index.dtype(),
            dim: index.dim(),
            n: index.rows(),
            nlist: index.nlist(),
            veclen: index.veclen(),
            centroids: GpuIndex::upload(gpu, &cents).map_err(dev_err)?,
            data: upload_vectors(t, gpu.pool(), &lists.data).map_err(dev_err)?,
            ids: t.upload_new(gpu.pool(), &lists.ids).map_err(dev_err)?,
            offsets: t.upload_new(gpu.pool(), &lists.offsets).map_err(dev_err)?,
            sizes: t.upload_new(gpu.pool(), &lists.sizes).map_err(dev_err)?,
            bits: ResidentBits::default(),
        })
    }

    /// IVF-Flat search on the device; equal bit for bit to
    /// [`search_ivf`](super::search_ivf) on the same index.
    pub fn search(&self, queries: &Vectors, p: &IvfSearchParams) -> Result<Neighbors, IvfGpuError> {
        let plan = ivf_plan(
            self.dtype,
            self.metric.metric,
            p.filter.fragment_name(),
            self.veclen,
            p.k,
        )
        .map_err(dev_err)?;
        self.search_with(&plan.planner(), plan.capacity, queries, p)
    }

    /// The caller's planner against the index and the search, before
    /// anything is uploaded or linked: the entry must read the layout the
    /// lists were stored in (their veclen), and [`planner_mismatch`].
    fn check_planner(
        &self,
        planner: &Planner,
        capacity: u32,
        p: &IvfSearchParams,
    ) -> Result<(), IvfGpuError> {
        let fragments = planner.static_fragments();
        let entry_veclen = fragments
            .first()
            .and_then(|f| f.param("veclen"))
            .and_then(|v| v.parse::<usize>().ok());
        if let Some(v) = entry_veclen.filter(|&v| v != self.veclen) {
            return Err(IvfGpuError::Ivf(IvfError::VeclenMismatch {
                entry: v,
                index: self.veclen,
            }));
        }
        match planner_mismatch(fragments, self.dtype, capacity, &p.filter) {
            Some(reason) => Err(IvfGpuError::PlannerMismatch {
                entry: fragments.first().map_or("?", |f| f.name).to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// The search with a planner of the caller's: an `ivf_scan_<dtype>_v<veclen>_k<capacity>_<order>`
    /// entry (the index's dtype and veclen, `capacity ≥ k`), a metric for the dtype
    /// — a run-time source through [`Planner::add_source`] included — and a
    /// `filter_<f>_i64` matching `p.filter`. The coarse step keeps the index's
    /// metric; the index's post-processing (`l2sqrt`'s sqrt) applies only
    /// where the planner links the index's own metric fragment. Example:
    /// examples/ivf_user_metric.rs.
    pub fn search_with(
        &self,
        planner: &Planner,
        capacity: u32,
        queries: &Vectors,
        p: &IvfSearchParams,
    ) -> Result<Neighbors, IvfGpuError> {
        self.validate(queries, p)?;
        self.check_planner(planner, capacity, p)?;
        let fixed = splits_from_env()?;
        if p.k > capacity as usize {
            return Err(dev_err(PlanError::KTooLarge {
                k: p.k,
                max: capacity,
                dtype: self.dtype,
                idx: "i64",
            }));
        }
        if queries.rows() == 0 {
            // Nothing to launch (the brute-force path skips it the same way).
            return Ok(Neighbors {
                nq: 0,
                k: p.k,
                ids: Vec::new(),
                distances: Vec::new(),
            });
        }
        let (nq, k, dim) = (queries.rows(), p.k, self.dim);
        let nprobe = p.nprobe.min(self.nlist);
        // Coarse step: the brute-force GPU scan over the centroids (f32), by
        // the planner's pick: FRAGLINK_KNN_VARIANT names a variant for the
        // searches of the base, which the centroids' need not fit.
        let converted;
        let qf = match queries {
            Vectors::F32(_) => queries,
            _ => {
                converted = Vectors::F32(gather_f32(queries, &(0..nq).collect::<Vec<_>>()));
                &converted
            }
        };
        let coarse = self
            .centroids
            .search_with_variant(qf, &SearchParams::new(nprobe, self.metric.metric), None)
            .map_err(dev_err)?;
        // The kernel indexes the list tables with these ids unchecked: a
        // padding id (-1) would read gigabytes past them.
        let probes = coarse
            .neighbors
            .ids
            .iter()
            .map(|&l| match usize::try_from(l) {
                Ok(i) if i < self.nlist => Ok(i as u32),
                _ => Err(IvfGpuError::BadProbe {
                    list: l,
                    nlist: self.nlist,
                }),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let linked = planner
            .link_tiered_for(self.gpu.context().arch())
            .map_err(dev_err)?;
        let launcher = self.gpu.launcher(&linked).map_err(dev_err)?;
        let t = self.gpu.transfer();
        let pool = self.gpu.pool();
        let d_queries = upload_queries(t, pool, queries).map_err(dev_err)?;
        let d_probes = t.upload_new_queued(pool, &probes).map_err(dev_err)?;
        let d_bits = self.bits.of_filter(t, pool, &p.filter).map_err(dev_err)?;
        // Probe splits where the queries alone leave SMs idle (splits.rs),
        // or as many as FRAGLINK_IVF_SPLITS fixes; only for an entry whose
        // key order is known (the launched entry's `order`), which the
        // host's merge follows.
        let ascending = planner
            .static_fragments()
            .iter()
            .find(|f| f.name == planner.entry())
            .and_then(|f| f.param("order"))
            .and_then(|o| match o {
                "asc" => Some(true),
                "desc" => Some(false),
                _ => None,
            });
        let splits = match (ascending, fixed) {
            (None, _) => 1,
            (Some(_), Some(n)) => splits::fixed_splits(n, nprobe, k),
            (Some(_), None) => splits::splits(
                nq,
                nprobe,
                k,
                splits::two_per_sm(self.gpu.context().info().sm_count),
            ),
        };
        let (nq32, k32) = (u32_arg("n_queries", nq)?, u32_arg("k", k)?);
        let (nprobe32, dim32) = (u32_arg("nprobe", nprobe)?, u32_arg("dim", dim)?);
        let outputs = nq
            .checked_mul(splits)
            .and_then(|n| n.checked_mul(k))
            .ok_or(IvfGpuError::TooLarge {
                what: "n_queries x probe splits x k",
                value: usize::MAX,
            })?;
        let mut d_ids = pool.alloc::<i64>(outputs).map_err(dev_err)?;
        let mut d_dists = pool.alloc::<f32>(outputs).map_err(dev_err)?;
        t.fill_nan(&mut d_dists).map_err(dev_err)?;
        let contract = ScanContract {
            elem_bytes: self.dtype.size() as u32,
            veclen: self.veclen as u32,
            id_bytes: 8,
            capacity,
        };
        let rows = self.data_rows();
        let mut args = KernelArgs::new();
        self.data
            .push_rows(&mut args, &contract, "data", 0..rows * dim)
            .map_err(IvfGpuError::Gpu)?;
        args.input(&self.ids)
            .map_err(dev_err)?
            .require_alignment(8, "ids");
        args.input(&self.offsets)
            .map_err(dev_err)?
            .require_alignment(8, "list_offsets");
        args.input(&self.sizes)
            .map_err(dev_err)?
            .require_alignment(4, "list_sizes");
        args.input(&d_probes)
            .map_err(dev_err)?
            .require_alignment(4, "probes");
        args.value(nprobe32);
        d_queries
            .push_rows(&mut args, &contract, "queries", 0..nq * dim)
            .map_err(IvfGpuError::Gpu)?;
        match &d_bits {
            Some(b) => args
                .input(&**b)
                .map_err(dev_err)?
                .require_alignment(4, "filter_bits"),
            None => args.null_ptr(),
        };
        args.value(dim32).value(nq32).value(k32);
        args.output(d_ids.subview_mut(0, outputs).map_err(dev_err)?)
            .map_err(dev_err)?
            .require_alignment(8, "out_ids");
        args.output(d_dists.subview_mut(0, outputs).map_err(dev_err)?)
            .map_err(dev_err)?
            .require_alignment(4, "out_dists");
        // splits ≤ max(nprobe, 1) and ≤ MAX_SPLITS (65535, grid.y's limit).
        let cfg = LaunchConfig::new(
            (nq32.clamp(1, i32::MAX as u32), splits as u32, 1),
            (BLOCK, 1, 1),
        );
        // SAFETY: arguments in the order and types of templates/ivf_scan.cu.j2;
        // counts fit the kernel's 32-bit parameters (checked above); probes are
        // list numbers < nlist (the coarse scan's ids over nlist ≥ nprobe rows);
        // the outputs hold nq × grid.y × k entries; sizes and alignments are
        // checked by the launcher.
        unsafe { launcher.launch(&cfg, &mut args).map_err(dev_err)? };
        let mut ids = t.download_vec(&d_ids).map_err(dev_err)?;
        let mut distances = t.download_vec(&d_dists).map_err(dev_err)?;
        crate::search::gpu::check_written(launcher.entry(), &distances)?;
        if splits > 1 {
            (ids, distances) =
                merge_splits(&ids, &distances, nq, splits, k, ascending.unwrap_or(true));
        }
        // The index's post-processing (sqrt of an l2sqrt index) belongs to
        // its own metric: a caller's metric's distances come back as it
        // computes them (sqrt of a similarity would make NaN).
        let own_metric = format!(
            "metric_{}_{}",
            self.metric.metric.fragment_name(),
            self.dtype.name()
        );
        if planner
            .static_fragments()
            .iter()
            .any(|f| f.name == own_metric)
        {
            distances
                .iter_mut()
                .for_each(|d| *d = self.metric.post.apply(*d));
        }
        Ok(Neighbors {
            nq,
            k,
            ids,
            distances,
        })
    }

    /// The resident index's metric (the coarse step's).
    pub fn metric(&self) -> MetricSpec {
        self.metric
    }

    fn data_rows(&self) -> usize {
        self.ids.len()
    }

    fn validate(&self, queries: &Vectors, p: &IvfSearchParams) -> Result<(), IvfError> {
        check_queries(self.dtype, self.dim, self.n, queries, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planner_that_does_not_fit_the_index_is_named() {
        let f = |n: &str| crate::fragments::find(n).unwrap();
        let plan = [
            f("ivf_scan_f32_v4_k32_asc"),
            f("metric_l2_f32"),
            f("filter_none_i64"),
        ];
        assert_eq!(planner_mismatch(&plan, DType::F32, 32, &Filter::None), None);
        let e = planner_mismatch(&plan, DType::U8, 32, &Filter::None).unwrap();
        assert!(e.contains("reads f32 lists, the index stores u8"), "{e}");
        let e = planner_mismatch(&plan, DType::F32, 64, &Filter::None).unwrap();
        assert!(
            e.contains("capacity is 32, the capacity passed is 64"),
            "{e}"
        );
        let bits = Filter::Bitset(crate::search::Bitset::all(10));
        let e = planner_mismatch(&plan, DType::F32, 32, &bits).unwrap();
        assert!(
            e.contains("links filter none") && e.contains("asks for filter bitset"),
            "{e}"
        );
        assert_eq!(planner_mismatch(&[], DType::F32, 32, &bits), None);
    }

    /// The enumerator and the planner rules agree both ways.
    #[test]
    fn all_ivf_plans_are_exactly_the_reachable_plans() {
        let mut reached = Vec::new();
        for dtype in DType::ALL {
            for metric in Metric::ALL {
                for filter in crate::search::plan::FILTERS {
                    for veclen in [1, 2, 4, 8, 16] {
                        for k in [1, 10, 32, 33, 64, 65, 100, 128, 129, 256, 257, 1000, 2048] {
                            if let Ok(p) = ivf_plan(dtype, metric, filter, veclen, k) {
                                reached.push(p.planner());
                            }
                        }
                    }
                }
            }
        }
        IVF_SCAN_FAMILY.check_against(reached).unwrap();
        assert!(crate::families::find("ivf_scan").is_some());
    }

    #[test]
    fn lists_no_scan_reads_are_named_by_their_veclen() {
        // The built-in matrix reads f32 lists of veclen 1 and 4; an index may
        // lay them out in pairs (any power of two dividing dim).
        assert_eq!(max_k(DType::F32, 2), None);
        let e = ivf_plan(DType::F32, Metric::L2, "none", 2, 10).unwrap_err();
        assert!(matches!(e, PlanError::NoIvfScan { veclen: 2, .. }), "{e}");
        assert!(e.to_string().contains("f32 lists of veclen 2"), "{e}");
        assert_eq!(max_k(DType::F32, 4), Some(2048));
    }
}
