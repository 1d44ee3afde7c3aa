//! The IVF-Flat index: centroids, and per list the dataset ids and the vectors
//! in the interleaved layout ([`super::layout`]).

use half::f16;
use rayon::prelude::*;

use super::coarse::CoarseLanes;
use super::kmeans::{self, KMeansParams};
use super::layout::{check_veclen, default_veclen, pack, padded_rows, unpack_row};
use super::{IvfError, MetricSpec};
use crate::search::{DType, Matrix, SearchError, Vectors};

/// One inverted list: `ids.len()` rows, `data` their interleaved vectors
/// (padded to whole groups of 32 rows).
#[derive(Debug, Clone, PartialEq)]
pub struct List<T> {
    pub ids: Vec<i64>,
    pub data: Vec<T>,
}

/// The lists, in the base's element type.
#[derive(Debug, Clone, PartialEq)]
pub enum ListStore {
    F32(Vec<List<f32>>),
    F16(Vec<List<f16>>),
    I8(Vec<List<i8>>),
    U8(Vec<List<u8>>),
}

/// Runs `$body` with `$lists` bound to the typed lists of a [`ListStore`].
macro_rules! with_lists {
    ($store:expr, $lists:ident => $body:expr) => {
        match $store {
            $crate::search::ivf::ListStore::F32($lists) => $body,
            $crate::search::ivf::ListStore::F16($lists) => $body,
            $crate::search::ivf::ListStore::I8($lists) => $body,
            $crate::search::ivf::ListStore::U8($lists) => $body,
        }
    };
}
pub(crate) use with_lists;

/// Runs `$body` with `$lists` and `$q` bound to the typed lists of a
/// [`ListStore`] and the typed matrix of queries of the same dtype (the
/// caller has checked that they agree).
macro_rules! with_lists_and_queries {
    ($store:expr, $queries:expr, $lists:ident, $q:ident => $body:expr) => {{
        use $crate::search::ivf::ListStore as S;
        use $crate::search::Vectors as V;
        match ($store, $queries) {
            (S::F32($lists), V::F32($q)) => $body,
            (S::F16($lists), V::F16($q)) => $body,
            (S::I8($lists), V::I8($q)) => $body,
            (S::U8($lists), V::U8($q)) => $body,
            _ => unreachable!("the caller checked that the dtypes agree"),
        }
    }};
}
pub(crate) use with_lists_and_queries;

impl ListStore {
    pub fn dtype(&self) -> DType {
        match self {
            ListStore::F32(_) => DType::F32,
            ListStore::F16(_) => DType::F16,
            ListStore::I8(_) => DType::I8,
            ListStore::U8(_) => DType::U8,
        }
    }

    pub fn nlist(&self) -> usize {
        with_lists!(self, l => l.len())
    }

    /// The dataset ids of list `l`, in storage order.
    pub fn ids(&self, l: usize) -> &[i64] {
        with_lists!(self, lists => &lists[l].ids)
    }
}

/// How an index is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IvfBuildParams {
    pub nlist: usize,
    pub metric: MetricSpec,
    pub seed: u64,
    /// Lloyd iterations at most (default 10, as faiss).
    pub iterations: usize,
    /// k-means training rows per list at most (default 256, faiss's default).
    /// Fewer build faster and cost recall: on 200k × 128 blobs (sigma 1.0,
    /// nlist 1024, 2 threads, BENCHMARKS.md's data) 64 per list built in 4.4 s
    /// with recall@10 0.560 / 0.625 / 0.701 / 0.823 at nprobe 1 / 4 / 16 / 64,
    /// 128 in 7.0 s with 0.587 / 0.650 / 0.723 / 0.835, 256 in 9.7 s with
    /// 0.598 / 0.661 / 0.733 / 0.842 (faiss: 0.598 / 0.660 / 0.730 / 0.838).
    pub max_points_per_list: usize,
    /// Elements per lane of the interleaved layout; `None`:
    /// [`default_veclen`] (1 for f32, else cuVS's rule).
    pub veclen: Option<usize>,
}

impl IvfBuildParams {
    pub fn new(nlist: usize, metric: MetricSpec) -> Self {
        IvfBuildParams {
            nlist,
            metric,
            seed: 0,
            iterations: 10,
            max_points_per_list: 256,
            veclen: None,
        }
    }

    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// An IVF-Flat index (see the module docs of [`super`] for its search).
#[derive(Debug, Clone, PartialEq)]
pub struct IvfIndex {
    pub(crate) metric: MetricSpec,
    pub(crate) dim: usize,
    pub(crate) n: usize,
    pub(crate) veclen: usize,
    pub(crate) seed: u64,
    /// `nlist × dim`, f32 whatever the element type.
    pub(crate) centroids: Matrix<f32>,
    pub(crate) lists: ListStore,
    /// The centroids laid out for the coarse step's lane folds (on first use).
    pub(crate) coarse: CoarseLanes,
}

impl IvfIndex {
    pub fn metric(&self) -> MetricSpec {
        self.metric
    }
    pub fn dtype(&self) -> DType {
        self.lists.dtype()
    }
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Rows indexed.
    pub fn rows(&self) -> usize {
        self.n
    }
    pub fn nlist(&self) -> usize {
        self.centroids.rows()
    }
    pub fn veclen(&self) -> usize {
        self.veclen
    }
    /// The seed the index was built with.
    pub fn seed(&self) -> u64 {
        self.seed
    }
    pub fn centroids(&self) -> &Matrix<f32> {
        &self.centroids
    }
    pub fn lists(&self) -> &ListStore {
        &self.lists
    }
    /// Rows in list `l`.
    pub fn list_len(&self, l: usize) -> usize {
        self.lists.ids(l).len()
    }

    /// Row `r` of list `l`, de-interleaved, widened to f32.
    pub fn list_row_f32(&self, l: usize, r: usize) -> Vec<f32> {
        let (dim, v) = (self.dim, self.veclen);
        match &self.lists {
            ListStore::F32(x) => unpack_row(&x[l].data, r, dim, v),
            ListStore::F16(x) => unpack_row(&x[l].data, r, dim, v)
                .iter()
                .map(|h| h.to_f32())
                .collect(),
            ListStore::I8(x) => unpack_row(&x[l].data, r, dim, v)
                .iter()
                .map(|&e| e as f32)
                .collect(),
            ListStore::U8(x) => unpack_row(&x[l].data, r, dim, v)
                .iter()
                .map(|&e| e as f32)
                .collect(),
        }
    }

    /// The indexed vectors in dataset-id order, de-interleaved (the base the
    /// index was built from, bit for bit).
    pub fn reconstruct(&self) -> Vectors {
        fn rows<T: Copy + Default>(
            lists: &[List<T>],
            n: usize,
            dim: usize,
            veclen: usize,
        ) -> Vec<T> {
            let mut out = vec![T::default(); n * dim];
            for l in lists {
                for (r, &id) in l.ids.iter().enumerate() {
                    let dst = &mut out[id as usize * dim..(id as usize + 1) * dim];
                    dst.copy_from_slice(&unpack_row(&l.data, r, dim, veclen));
                }
            }
            out
        }
        let (n, d, v) = (self.n, self.dim, self.veclen);
        match &self.lists {
            ListStore::F32(l) => {
                Vectors::F32(Matrix::new(rows(l, n, d, v), n, d).expect("n × dim"))
            }
            ListStore::F16(l) => {
                Vectors::F16(Matrix::new(rows(l, n, d, v), n, d).expect("n × dim"))
            }
            ListStore::I8(l) => Vectors::I8(Matrix::new(rows(l, n, d, v), n, d).expect("n × dim")),
            ListStore::U8(l) => Vectors::U8(Matrix::new(rows(l, n, d, v), n, d).expect("n × dim")),
        }
    }

    /// Bytes of vectors the lists hold, padding included.
    pub fn list_bytes(&self) -> usize {
        with_lists!(&self.lists, ls => ls
            .iter()
            .map(|l| padded_rows(l.ids.len()) * self.dim * self.dtype().size())
            .sum())
    }
}

/// Rows of each list, ascending, from the assignment.
fn members(assign: &[u32], nlist: usize) -> Vec<Vec<usize>> {
    let mut m = vec![Vec::new(); nlist];
    for (i, &a) in assign.iter().enumerate() {
        m[a as usize].push(i);
    }
    m
}

fn pack_lists<T: Copy + Default + Send + Sync>(
    base: &Matrix<T>,
    members: &[Vec<usize>],
    veclen: usize,
) -> Vec<List<T>> {
    members
        .par_iter()
        .map(|rows| List {
            ids: rows.iter().map(|&r| r as i64).collect(),
            data: pack(rows.iter().map(|&r| base.row(r)), base.dim(), veclen),
        })
        .collect()
}

/// Rows assigned per call of the exact nearest-centroid search (bounds the f32
/// copy of non-f32 bases).
const ASSIGN_CHUNK: usize = 65_536;

/// Nearest centroid of every base row.
fn assign_all(
    base: &Vectors,
    centroids: &Matrix<f32>,
    spec: MetricSpec,
) -> Result<Vec<u32>, IvfError> {
    if let Vectors::F32(m) = base {
        return kmeans::assign(centroids, m, spec.metric);
    }
    let mut out = Vec::with_capacity(base.rows());
    for start in (0..base.rows()).step_by(ASSIGN_CHUNK) {
        let idx: Vec<usize> = (start..(start + ASSIGN_CHUNK).min(base.rows())).collect();
        let chunk = kmeans::gather_f32(base, &idx);
        out.extend(kmeans::assign(centroids, &chunk, spec.metric)?);
    }
    Ok(out)
}

/// Builds an IVF-Flat index over `base`: k-means on a sample ([`kmeans`]),
/// every row assigned to its exactly nearest centroid, lists interleaved.
pub fn build_index(base: &Vectors, p: &IvfBuildParams) -> Result<IvfIndex, IvfError> {
    let (n, dim, dtype) = (base.rows(), base.dim(), base.dtype());
    if let Some(max) = dtype.max_dim().filter(|&m| dim > m) {
        return Err(SearchError::DimTooLarge { dtype, dim, max }.into());
    }
    let veclen = p.veclen.unwrap_or_else(|| default_veclen(dtype, dim));
    check_veclen(veclen, dim)?;
    let kp = KMeansParams {
        nlist: p.nlist,
        metric: p.metric.metric,
        seed: p.seed,
        iterations: p.iterations,
        max_points_per_list: p.max_points_per_list,
    };
    let centroids = kmeans::train(base, &kp)?;
    let assign = assign_all(base, &centroids, p.metric)?;
    let m = members(&assign, p.nlist);
    let lists = match base {
        Vectors::F32(b) => ListStore::F32(pack_lists(b, &m, veclen)),
        Vectors::F16(b) => ListStore::F16(pack_lists(b, &m, veclen)),
        Vectors::I8(b) => ListStore::I8(pack_lists(b, &m, veclen)),
        Vectors::U8(b) => ListStore::U8(pack_lists(b, &m, veclen)),
    };
    Ok(IvfIndex {
        metric: p.metric,
        dim,
        n,
        veclen,
        seed: p.seed,
        centroids,
        lists,
        coarse: CoarseLanes::default(),
    })
}
