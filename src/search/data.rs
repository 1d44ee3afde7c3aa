//! Data for searches: a seeded synthetic generator, loaders and writers for the
//! usual benchmark formats (`.fvecs`, `.bvecs`, `.ivecs`, `.npy`), and recall.
//!
//! Formats:
//! - `.fvecs` / `.bvecs` / `.ivecs` (TEXMEX): per vector a little-endian `i32`
//!   dimension followed by that many `f32` / `u8` / `i32` values; every record of
//!   a file must have the same dimension.
//! - `.npy` version 1, 2 or 3: a C-order 2-D array of `<f4` (f32), `<f2` (f16),
//!   `|i1` (i8) or `|u1` (u8) for vectors, `<i4` or `<i8` for ground truth.
//!
//! Every error names the file (or the synthetic sizes) and what is wrong with it
//! ([`DataError`]); sizes are checked (checked arithmetic, [`memory_limit`])
//! before anything is allocated.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use half::f16;

use super::{DType, Matrix, Neighbors, Vectors};

// --------------------------------------------------------------------------------
// PRNG
// --------------------------------------------------------------------------------

/// A small, seeded PRNG (xoshiro256++, seeded through splitmix64). Stable across
/// platforms and releases, so seeds reproduce data sets.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
    spare: Option<f64>,
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        Rng { s, spare: None }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform integer in [0, n) (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
        self.spare = Some(r * s);
        r * c
    }
}

// --------------------------------------------------------------------------------
// Synthetic data
// --------------------------------------------------------------------------------

/// Seeded clustered data: `n` base vectors and `nq` queries of dimension `dim`,
/// drawn from Gaussian blobs (σ = 0.15) around `max(1, min(256, n / 64))` centres
/// uniform in [-1, 1]^dim; queries come from the same blobs. For i8 the values are
/// scaled by 100 and for u8 mapped by `(v + 1) * 110`, then rounded and clamped to
/// the type's range (so the extremes do occur); f16 rounds to nearest.
///
/// Panics with [`try_synthetic`]'s error when the data cannot be held.
pub fn synthetic(n: usize, dim: usize, nq: usize, dtype: DType, seed: u64) -> (Vectors, Vectors) {
    try_synthetic(n, dim, nq, dtype, seed).unwrap_or_else(|e| panic!("{e}"))
}

/// Bytes [`synthetic`] holds at its peak: the base and the queries in `dtype`
/// plus the f64 centres; `None` when that overflows 64 bits.
pub fn synthetic_bytes(n: usize, dim: usize, nq: usize, dtype: DType) -> Option<u64> {
    let centres = ((n / 64).clamp(1, 256) as u64).checked_mul(dim as u64)?;
    let rows = (n as u64).checked_add(nq as u64)?;
    let elems = rows.checked_mul(dim as u64)?;
    // Indexing needs every element count to fit in usize.
    usize::try_from(elems).ok()?;
    elems
        .checked_mul(dtype.size() as u64)?
        .checked_add(centres.checked_mul(8)?)
}

/// [`synthetic`], or an error when its size ([`synthetic_bytes`]) overflows,
/// exceeds the [`memory_limit`], or cannot be allocated. Checked before any
/// allocation; the same seed gives the same data as [`synthetic`].
pub fn try_synthetic(
    n: usize,
    dim: usize,
    nq: usize,
    dtype: DType,
    seed: u64,
) -> Result<(Vectors, Vectors), DataError> {
    try_synthetic_of(Synthetic::Clustered, n, dim, nq, dtype, seed)
}

/// The shape of synthetic data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synthetic {
    /// Gaussian blobs ([`synthetic`]): what approximate search needs for a
    /// meaningful recall.
    Clustered,
    /// One Gaussian blob (σ = 0.5) around the origin: no structure for an
    /// index to find. Quantized as [`synthetic`] quantizes.
    Gaussian,
}

impl std::str::FromStr for Synthetic {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "clustered" => Ok(Synthetic::Clustered),
            "gaussian" => Ok(Synthetic::Gaussian),
            other => Err(format!(
                "unknown data `{other}` (expected clustered or gaussian)"
            )),
        }
    }
}

/// [`try_synthetic`] for either [`Synthetic`] shape (same checks, same seed
/// discipline; `Clustered` is exactly [`try_synthetic`]).
pub fn try_synthetic_of(
    kind: Synthetic,
    n: usize,
    dim: usize,
    nq: usize,
    dtype: DType,
    seed: u64,
) -> Result<(Vectors, Vectors), DataError> {
    let too_large = |bytes: Option<u64>, limit: MemoryLimit| DataError::SyntheticTooLarge {
        n,
        dim,
        nq,
        dtype,
        bytes,
        limit,
    };
    let limit = memory_limit();
    match synthetic_bytes(n, dim, nq, dtype) {
        Some(b) if b <= limit.bytes => {}
        bytes => return Err(too_large(bytes, limit)),
    }
    let what = || format!("synthetic data (n = {n}, dim = {dim}, nq = {nq}, {dtype})");
    let mut rng = Rng::new(seed);
    let (n_centers, sigma) = match kind {
        Synthetic::Clustered => ((n / 64).clamp(1, 256), 0.15),
        Synthetic::Gaussian => (1, 0.5),
    };
    // Cannot overflow: synthetic_bytes checked these products.
    let mut centers: Vec<f64> = try_vec(n_centers * dim, what)?;
    match kind {
        Synthetic::Clustered => {
            centers.extend((0..n_centers * dim).map(|_| rng.uniform(-1.0, 1.0)))
        }
        Synthetic::Gaussian => centers.resize(dim, 0.0),
    }
    fn draw<T>(
        count: usize,
        dim: usize,
        centers: &[f64],
        sigma: f64,
        rng: &mut Rng,
        conv: impl Fn(f64) -> T,
        what: impl Fn() -> String,
    ) -> Result<Matrix<T>, DataError> {
        let n_centers = centers.len() / dim.max(1);
        let mut out = try_vec(count * dim, what)?;
        for _ in 0..count {
            let c = rng.below(n_centers as u64) as usize;
            for j in 0..dim {
                out.push(conv(centers[c * dim + j] + sigma * rng.normal()));
            }
        }
        Ok(Matrix::new(out, count, dim).expect("count × dim elements"))
    }
    // Values are quantized as they are drawn: the same sequence as drawing all
    // f64 values first, without holding them.
    macro_rules! both {
        ($variant:ident, $conv:expr) => {{
            let base = draw(n, dim, &centers, sigma, &mut rng, $conv, what)?;
            let queries = draw(nq, dim, &centers, sigma, &mut rng, $conv, what)?;
            (Vectors::$variant(base), Vectors::$variant(queries))
        }};
    }
    Ok(match dtype {
        DType::F32 => both!(F32, |x: f64| x as f32),
        DType::F16 => both!(F16, f16::from_f64),
        DType::I8 => both!(I8, |x: f64| (x * 100.0).round().clamp(-128.0, 127.0) as i8),
        DType::U8 => both!(U8, |x: f64| ((x + 1.0) * 110.0).round().clamp(0.0, 255.0)
            as u8),
    })
}

// --------------------------------------------------------------------------------
// Memory
// --------------------------------------------------------------------------------

/// The most bytes of data this process can hold, and what sets that limit.
///
/// Sizes are refused before anything is allocated when the data they need
/// exceeds this: the smallest of the machine's physical memory, the soft
/// address-space limit (`RLIMIT_AS`, `ulimit -v`) and the cgroup memory limit
/// (v2 `memory.max`, v1 `memory.limit_in_bytes`). Data beyond any of them can
/// never be held (the allocation fails or the kernel's OOM killer ends the
/// process), so this is a bound, not a promise: data under it may still not
/// fit beside everything else running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: u64,
    /// `physical memory`, `RLIMIT_AS`, `cgroup memory limit` or `none found`.
    pub source: &'static str,
}

impl std::fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes ({})", self.bytes, self.source)
    }
}

/// The [`MemoryLimit`] in force now (read afresh on every call).
pub fn memory_limit() -> MemoryLimit {
    let mut best = MemoryLimit {
        bytes: u64::MAX,
        source: "none found",
    };
    let mut consider = |bytes: Option<u64>, source: &'static str| {
        if let Some(b) = bytes.filter(|&b| b < best.bytes) {
            best = MemoryLimit { bytes: b, source };
        }
    };
    #[cfg(unix)]
    {
        // SAFETY: sysconf and getrlimit only read process/system state; the
        // rlimit struct is fully initialised and outlives the call.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && page > 0 {
            consider((pages as u64).checked_mul(page as u64), "physical memory");
        }
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0
            && r.rlim_cur != libc::RLIM_INFINITY
        {
            #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every unix
            consider(Some(r.rlim_cur as u64), "RLIMIT_AS");
        }
    }
    for file in [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ] {
        let v = fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        consider(v, "cgroup memory limit");
    }
    best
}

/// An empty vector with room for `count` elements, or an error naming `what`
/// (instead of the abort of a failed allocation).
fn try_vec<T>(count: usize, what: impl Fn() -> String) -> Result<Vec<T>, DataError> {
    let mut v = Vec::new();
    v.try_reserve_exact(count)
        .map_err(|_| DataError::OutOfMemory {
            what: what(),
            bytes: (count as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        })?;
    Ok(v)
}

// --------------------------------------------------------------------------------
// Errors
// --------------------------------------------------------------------------------

/// What is wrong with a data file.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: unknown file type (expected {expected})")]
    UnknownFormat {
        path: PathBuf,
        /// The extensions the reader takes.
        expected: &'static str,
    },
    #[error("{path}: file holds no vectors")]
    Empty { path: PathBuf },
    #[error("{path}: record {record} at byte {offset} is truncated: needs {needed} bytes, {available} left")]
    Truncated {
        path: PathBuf,
        record: usize,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("{path}: record {record} has dimension {found}, but the first record has {expected}")]
    InconsistentDim {
        path: PathBuf,
        record: usize,
        expected: usize,
        found: usize,
    },
    #[error("{path}: record {record} declares an invalid dimension {dim}")]
    BadDim {
        path: PathBuf,
        record: usize,
        dim: i64,
    },
    #[error("{path}: not a .npy file: {reason}")]
    NotNpy { path: PathBuf, reason: String },
    #[error("{path}: malformed .npy header: {reason}")]
    NpyHeader { path: PathBuf, reason: String },
    #[error("{path}: unsupported dtype '{descr}' (supported here: {supported})")]
    UnsupportedDType {
        path: PathBuf,
        descr: String,
        supported: &'static str,
    },
    #[error("{path}: array is in Fortran (column-major) order; save it in C order (np.ascontiguousarray)")]
    FortranOrder { path: PathBuf },
    #[error("{path}: expected a 2-D array, found shape {shape:?}")]
    NotTwoD { path: PathBuf, shape: Vec<usize> },
    #[error("{path}: data section has {found} bytes, shape {shape:?} of {descr} needs {expected}")]
    SizeMismatch {
        path: PathBuf,
        descr: String,
        shape: Vec<usize>,
        expected: u64,
        found: u64,
    },
    #[error(
        "base {base} has dimension {base_dim} but queries {queries} have dimension {query_dim}"
    )]
    DimMismatch {
        base: PathBuf,
        queries: PathBuf,
        base_dim: usize,
        query_dim: usize,
    },
    #[error("base {base} is {base_dtype} but queries {queries} are {query_dtype}")]
    DTypeMismatch {
        base: PathBuf,
        queries: PathBuf,
        base_dtype: DType,
        query_dtype: DType,
    },
    #[error("{path}: cannot write {dtype} vectors as {format}")]
    CannotWrite {
        path: PathBuf,
        dtype: DType,
        format: &'static str,
    },
    #[error("{path}: the first record declares dimension {dim} ({record_bytes} bytes a record), but the file has only {file_bytes} bytes")]
    DimExceedsFile {
        path: PathBuf,
        dim: usize,
        record_bytes: u64,
        file_bytes: u64,
    },
    #[error("{path}: shape {shape:?} has rows of no elements (dim 0)")]
    ZeroDim { path: PathBuf, shape: Vec<usize> },
    #[error(
        "{path}: shape {shape:?} of {descr} is too large: its size in bytes overflows 64 bits"
    )]
    ShapeOverflow {
        path: PathBuf,
        descr: String,
        shape: Vec<usize>,
    },
    #[error("{path}: reading it needs {bytes} bytes (the file and its decoded copy), more than the {limit} this process may use")]
    FileTooLarge {
        path: PathBuf,
        bytes: u64,
        limit: MemoryLimit,
    },
    #[error("synthetic data of n = {n}, dim = {dim}, nq = {nq} ({dtype}) {}", match .bytes {
        Some(b) => format!("needs {b} bytes, more than the {limit} this process may use"),
        None => "overflows: its size in bytes does not fit in 64 bits".to_string(),
    })]
    SyntheticTooLarge {
        n: usize,
        dim: usize,
        nq: usize,
        dtype: DType,
        bytes: Option<u64>,
        limit: MemoryLimit,
    },
    #[error("{what}: cannot allocate {bytes} bytes")]
    OutOfMemory { what: String, bytes: u64 },
    #[error(
        "{path}: ground truth has {rows} rows but there are {queries} queries (one row per query)"
    )]
    TruthRows {
        path: PathBuf,
        rows: usize,
        queries: usize,
    },
    #[error("{path}: ground-truth row {row} has {columns} columns, fewer than k = {k}")]
    TruthColumns {
        path: PathBuf,
        row: usize,
        columns: usize,
        k: usize,
    },
    #[error("{path}: ground-truth row {row}, column {column} holds id {id}, not a row of the base (0..{n})")]
    TruthId {
        path: PathBuf,
        row: usize,
        column: usize,
        id: i64,
        n: usize,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// --------------------------------------------------------------------------------
// TEXMEX (.fvecs, .bvecs, .ivecs)
// --------------------------------------------------------------------------------

/// Checks the records `i32 dim, dim × elem_size bytes` of a TEXMEX file and
/// returns (dim, rows). The first record's header is checked against the file
/// length (checked arithmetic) before anything is allocated.
fn parse_vecs(path: &Path, bytes: &[u8], elem_size: usize) -> Result<(usize, usize), DataError> {
    if bytes.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
        });
    }
    let file_bytes = bytes.len() as u64;
    let mut dim0: Option<(usize, usize)> = None; // (dim, record bytes)
    let mut off = 0usize;
    let mut record = 0usize;
    while off < bytes.len() {
        let avail = (bytes.len() - off) as u64;
        if avail < 4 {
            return Err(DataError::Truncated {
                path: path.to_path_buf(),
                record,
                offset: off as u64,
                needed: 4,
                available: avail,
            });
        }
        let d = i32::from_le_bytes(bytes[off..off + 4].try_into().unwrap());
        if d <= 0 {
            return Err(DataError::BadDim {
                path: path.to_path_buf(),
                record,
                dim: d as i64,
            });
        }
        let d = d as usize;
        let rec = match dim0 {
            None => {
                let rec = (d as u64)
                    .checked_mul(elem_size as u64)
                    .and_then(|v| v.checked_add(4))
                    .filter(|&r| r <= file_bytes)
                    .ok_or_else(|| DataError::DimExceedsFile {
                        path: path.to_path_buf(),
                        dim: d,
                        record_bytes: (d as u64)
                            .saturating_mul(elem_size as u64)
                            .saturating_add(4),
                        file_bytes,
                    })? as usize;
                dim0 = Some((d, rec));
                rec
            }
            Some((e, _)) if e != d => {
                return Err(DataError::InconsistentDim {
                    path: path.to_path_buf(),
                    record,
                    expected: e,
                    found: d,
                })
            }
            Some((_, rec)) => rec,
        };
        if avail < rec as u64 {
            return Err(DataError::Truncated {
                path: path.to_path_buf(),
                record,
                offset: off as u64,
                needed: rec as u64,
                available: avail,
            });
        }
        off += rec;
        record += 1;
    }
    Ok((dim0.expect("at least one record").0, record))
}

/// The elements of a checked TEXMEX file ([`parse_vecs`]), converted by `conv`
/// from `elem_size` bytes each.
fn decode_vecs<T>(
    path: &Path,
    bytes: &[u8],
    elem_size: usize,
    conv: impl Fn(&[u8]) -> T,
) -> Result<Matrix<T>, DataError> {
    let (dim, rows) = parse_vecs(path, bytes, elem_size)?;
    // rows × dim × elem_size ≤ the file length: no overflow.
    let mut data = try_vec(rows * dim, || path.display().to_string())?;
    for rec in bytes.chunks_exact(4 + dim * elem_size) {
        data.extend(rec[4..].chunks_exact(elem_size).map(&conv));
    }
    Ok(Matrix::new(data, rows, dim).expect("rows × dim elements"))
}

/// The file's bytes, after checking that it and a decoded copy of the same
/// size fit in the [`memory_limit`].
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    read_bytes_within(path, memory_limit())
}

fn read_bytes_within(path: &Path, limit: MemoryLimit) -> Result<Vec<u8>, DataError> {
    use std::io::Read;
    let f = fs::File::open(path).map_err(io_err(path))?;
    let meta = f.metadata().map_err(io_err(path))?;
    let len = meta.len();
    let too_large = |bytes: u64| DataError::FileTooLarge {
        path: path.to_path_buf(),
        bytes,
        limit,
    };
    let need = len.saturating_mul(2);
    if need > limit.bytes {
        return Err(too_large(need));
    }
    // A regular file is read up to the length checked above. A pipe or a
    // device says 0 and may never end (`/dev/zero`): it is read up to what
    // the limit allows, one byte more telling that it went on.
    let most = if meta.is_file() { len } else { limit.bytes / 2 };
    let start = usize::try_from(len).map_err(|_| too_large(need))?;
    let mut buf = try_vec(start, || path.display().to_string())?;
    f.take(most.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(io_err(path))?;
    if buf.len() as u64 > most {
        return Err(too_large((buf.len() as u64).saturating_mul(2)));
    }
    Ok(buf)
}

/// Reads an `.fvecs` file as f32 vectors.
pub fn read_fvecs(path: impl AsRef<Path>) -> Result<Vectors, DataError> {
    let path = path.as_ref();
    fvecs_from_bytes(path, &read_bytes(path)?)
}

fn fvecs_from_bytes(path: &Path, bytes: &[u8]) -> Result<Vectors, DataError> {
    let m = decode_vecs(path, bytes, 4, |c| {
        f32::from_le_bytes(c.try_into().unwrap())
    })?;
    Ok(Vectors::F32(m))
}

/// Reads a `.bvecs` file as u8 vectors.
pub fn read_bvecs(path: impl AsRef<Path>) -> Result<Vectors, DataError> {
    let path = path.as_ref();
    bvecs_from_bytes(path, &read_bytes(path)?)
}

fn bvecs_from_bytes(path: &Path, bytes: &[u8]) -> Result<Vectors, DataError> {
    Ok(Vectors::U8(decode_vecs(path, bytes, 1, |c| c[0])?))
}

/// Reads an `.ivecs` file (usually ground truth: one row of neighbour ids per query).
pub fn read_ivecs(path: impl AsRef<Path>) -> Result<Matrix<i32>, DataError> {
    let path = path.as_ref();
    ivecs_from_bytes(path, &read_bytes(path)?)
}

/// Decodes `.ivecs` bytes (`path` names them in errors), as [`read_ivecs`]
/// does after reading the file; the fuzz targets drive it directly.
pub fn ivecs_from_bytes(path: &Path, bytes: &[u8]) -> Result<Matrix<i32>, DataError> {
    decode_vecs(path, bytes, 4, |c| {
        i32::from_le_bytes(c.try_into().unwrap())
    })
}

/// Decodes vector-file bytes in the format `path`'s extension names
/// (`.fvecs`, `.bvecs`, `.npy`), as [`read_vectors`] does after reading the
/// file; the fuzz targets drive it directly.
pub fn vectors_from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Vectors, DataError> {
    match extension(path).as_str() {
        "fvecs" => fvecs_from_bytes(path, &bytes),
        "bvecs" => bvecs_from_bytes(path, &bytes),
        "npy" => npy_from_bytes(path, bytes),
        _ => Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
            expected: ".fvecs, .bvecs or .npy",
        }),
    }
}

fn write_vecs(
    path: &Path,
    rows: usize,
    dim: usize,
    elem_bytes: &[u8],
    elem_size: usize,
) -> Result<(), DataError> {
    let mut out = Vec::with_capacity(rows * (4 + dim * elem_size));
    for r in 0..rows {
        out.extend_from_slice(&(dim as i32).to_le_bytes());
        out.extend_from_slice(&elem_bytes[r * dim * elem_size..(r + 1) * dim * elem_size]);
    }
    fs::write(path, out).map_err(io_err(path))
}

/// Writes f32 vectors as `.fvecs` or u8 vectors as `.bvecs` (by the extension).
pub fn write_vecs_file(path: impl AsRef<Path>, v: &Vectors) -> Result<(), DataError> {
    let path = path.as_ref();
    let ext = extension(path);
    match (ext.as_str(), v) {
        ("fvecs", Vectors::F32(m)) => {
            let bytes: Vec<u8> = m.data().iter().flat_map(|x| x.to_le_bytes()).collect();
            write_vecs(path, m.rows(), m.dim(), &bytes, 4)
        }
        ("bvecs", Vectors::U8(m)) => write_vecs(path, m.rows(), m.dim(), m.data(), 1),
        ("fvecs" | "bvecs", _) => Err(DataError::CannotWrite {
            path: path.to_path_buf(),
            dtype: v.dtype(),
            format: if ext == "fvecs" { ".fvecs" } else { ".bvecs" },
        }),
        _ => Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
            expected: ".fvecs or .bvecs",
        }),
    }
}

/// Writes rows of i32 as `.ivecs`.
pub fn write_ivecs(path: impl AsRef<Path>, m: &Matrix<i32>) -> Result<(), DataError> {
    let bytes: Vec<u8> = m.data().iter().flat_map(|x| x.to_le_bytes()).collect();
    write_vecs(path.as_ref(), m.rows(), m.dim(), &bytes, 4)
}

// --------------------------------------------------------------------------------
// .npy
// --------------------------------------------------------------------------------

/// A parsed `.npy` file: element type string, shape and raw data bytes.
struct Npy {
    descr: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn npy_header_err(path: &Path, reason: impl Into<String>) -> DataError {
    DataError::NpyHeader {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The value text following `'key':` in a Python dict literal.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat_s = format!("'{key}'");
    let pat_d = format!("\"{key}\"");
    let at = header
        .find(&pat_s)
        .map(|i| i + pat_s.len())
        .or_else(|| header.find(&pat_d).map(|i| i + pat_d.len()))?;
    let rest = header[at..].trim_start();
    let rest = rest.strip_prefix(':')?;
    Some(rest.trim_start())
}

fn parse_npy(path: &Path, bytes: Vec<u8>) -> Result<Npy, DataError> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(DataError::NotNpy {
            path: path.to_path_buf(),
            reason: "missing the \\x93NUMPY magic".into(),
        });
    }
    let major = bytes[6];
    let (hlen, hstart) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(DataError::NotNpy {
                    path: path.to_path_buf(),
                    reason: "file ends inside the header length".into(),
                });
            }
            (
                u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
                12,
            )
        }
        v => {
            return Err(DataError::NotNpy {
                path: path.to_path_buf(),
                reason: format!("unsupported format version {v}.{}", bytes[7]),
            })
        }
    };
    if bytes.len() < hstart + hlen {
        return Err(npy_header_err(
            path,
            format!(
                "header declares {hlen} bytes but the file ends after {}",
                bytes.len() - hstart
            ),
        ));
    }
    let header = std::str::from_utf8(&bytes[hstart..hstart + hlen])
        .map_err(|_| npy_header_err(path, "header is not text"))?;
    // descr
    let descr_v =
        dict_value(header, "descr").ok_or_else(|| npy_header_err(path, "no 'descr' key"))?;
    let quote = descr_v.chars().next().filter(|c| *c == '\'' || *c == '"');
    let descr = match quote {
        Some(q) => {
            let inner = &descr_v[1..];
            let end = inner
                .find(q)
                .ok_or_else(|| npy_header_err(path, "unterminated 'descr'"))?;
            inner[..end].to_string()
        }
        None => {
            return Err(npy_header_err(
                path,
                "'descr' is not a simple type string (structured dtypes are not supported)",
            ))
        }
    };
    // fortran_order
    let fo = dict_value(header, "fortran_order")
        .ok_or_else(|| npy_header_err(path, "no 'fortran_order' key"))?;
    let fortran = if fo.starts_with("True") {
        true
    } else if fo.starts_with("False") {
        false
    } else {
        return Err(npy_header_err(
            path,
            "'fortran_order' is neither True nor False",
        ));
    };
    // shape
    let sv = dict_value(header, "shape").ok_or_else(|| npy_header_err(path, "no 'shape' key"))?;
    let sv = sv
        .strip_prefix('(')
        .ok_or_else(|| npy_header_err(path, "'shape' is not a tuple"))?;
    let end = sv
        .find(')')
        .ok_or_else(|| npy_header_err(path, "unterminated 'shape'"))?;
    let mut shape = Vec::new();
    for part in sv[..end].split(',') {
        let p = part.trim().trim_end_matches('L');
        if p.is_empty() {
            continue;
        }
        shape.push(
            p.parse::<usize>()
                .map_err(|_| npy_header_err(path, format!("bad shape entry '{p}'")))?,
        );
    }
    if fortran {
        return Err(DataError::FortranOrder {
            path: path.to_path_buf(),
        });
    }
    // The data section, moved to the front in place (no second copy).
    let mut data = bytes;
    data.drain(..hstart + hlen);
    Ok(Npy { descr, shape, data })
}

fn npy_2d(path: &Path, npy: &Npy, elem_size: usize) -> Result<(usize, usize), DataError> {
    if npy.shape.len() != 2 {
        return Err(DataError::NotTwoD {
            path: path.to_path_buf(),
            shape: npy.shape.clone(),
        });
    }
    let (rows, dim) = (npy.shape[0], npy.shape[1]);
    // Rows of no elements: no vectors (the readers' dim ≥ 1), no ground truth
    // (k ≥ 1), and a shape that costs nothing to claim: (10^12, 0) passed
    // the size check below and readers then allocated per row.
    if dim == 0 {
        return Err(DataError::ZeroDim {
            path: path.to_path_buf(),
            shape: npy.shape.clone(),
        });
    }
    let expected = (rows as u64)
        .checked_mul(dim as u64)
        .and_then(|v| v.checked_mul(elem_size as u64))
        .ok_or_else(|| DataError::ShapeOverflow {
            path: path.to_path_buf(),
            descr: npy.descr.clone(),
            shape: npy.shape.clone(),
        })?;
    if expected != npy.data.len() as u64 {
        return Err(DataError::SizeMismatch {
            path: path.to_path_buf(),
            descr: npy.descr.clone(),
            shape: npy.shape.clone(),
            expected,
            found: npy.data.len() as u64,
        });
    }
    Ok((rows, dim))
}

const NPY_VECTOR_DTYPES: &str = "<f4, <f2, |i1, |u1";
const NPY_TRUTH_DTYPES: &str = "<i4, <i8";

/// Reads a `.npy` file of vectors (`<f4`, `<f2`, `|i1`, `|u1`; 2-D, C order).
pub fn read_npy(path: impl AsRef<Path>) -> Result<Vectors, DataError> {
    let path = path.as_ref();
    npy_from_bytes(path, read_bytes(path)?)
}

fn npy_from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Vectors, DataError> {
    let npy = parse_npy(path, bytes)?;
    let unsupported = || DataError::UnsupportedDType {
        path: path.to_path_buf(),
        descr: npy.descr.clone(),
        supported: NPY_VECTOR_DTYPES,
    };
    let dtype = match npy.descr.as_str() {
        "<f4" => DType::F32,
        "<f2" => DType::F16,
        "|i1" | "<i1" | "i1" => DType::I8,
        "|u1" | "<u1" | "u1" => DType::U8,
        _ => return Err(unsupported()),
    };
    let (rows, dim) = npy_2d(path, &npy, dtype.size())?;
    let what = || path.display().to_string();
    Ok(match dtype {
        DType::F32 => Vectors::F32(decode(&npy.data, rows, dim, 4, what, |c| {
            f32::from_le_bytes(c.try_into().unwrap())
        })?),
        DType::F16 => Vectors::F16(decode(&npy.data, rows, dim, 2, what, |c| {
            f16::from_le_bytes(c.try_into().unwrap())
        })?),
        DType::I8 => Vectors::I8(decode(&npy.data, rows, dim, 1, what, |c| c[0] as i8)?),
        DType::U8 => {
            Vectors::U8(Matrix::new(npy.data, rows, dim).expect("npy_2d checked the size"))
        }
    })
}

/// `rows × dim` elements of `size` bytes each from `data` (whose length
/// [`npy_2d`] checked), into a fallibly allocated matrix.
fn decode<T>(
    data: &[u8],
    rows: usize,
    dim: usize,
    size: usize,
    what: impl Fn() -> String,
    conv: impl Fn(&[u8]) -> T,
) -> Result<Matrix<T>, DataError> {
    let mut out = try_vec(data.len() / size, what)?;
    out.extend(data.chunks_exact(size).map(conv));
    Ok(Matrix::new(out, rows, dim).expect("npy_2d checked the size"))
}

fn npy_bytes(descr: &str, rows: usize, dim: usize, data: &[u8]) -> Vec<u8> {
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    // Pad so that magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Writes vectors as a version-1 `.npy` file (C order).
pub fn write_npy(path: impl AsRef<Path>, v: &Vectors) -> Result<(), DataError> {
    let path = path.as_ref();
    let descr = match v.dtype() {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
    };
    // Elements are stored little-endian on every supported target.
    let data: Vec<u8> = match v {
        Vectors::F32(m) => m.data().iter().flat_map(|x| x.to_le_bytes()).collect(),
        Vectors::F16(m) => m.data().iter().flat_map(|x| x.to_le_bytes()).collect(),
        Vectors::I8(m) => m.data().iter().map(|&x| x as u8).collect(),
        Vectors::U8(m) => m.data().to_vec(),
    };
    let mut f = fs::File::create(path).map_err(io_err(path))?;
    f.write_all(&npy_bytes(descr, v.rows(), v.dim(), &data))
        .map_err(io_err(path))
}

/// Writes neighbour ids as a `<i8` `.npy` file (`nq × k`).
pub fn write_npy_ids(path: impl AsRef<Path>, ids: &Matrix<i64>) -> Result<(), DataError> {
    let path = path.as_ref();
    let data: Vec<u8> = ids.data().iter().flat_map(|x| x.to_le_bytes()).collect();
    fs::write(path, npy_bytes("<i8", ids.rows(), ids.dim(), &data)).map_err(io_err(path))
}

fn extension(path: &Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Reads vectors by extension: `.fvecs` (f32), `.bvecs` (u8) or `.npy`.
pub fn read_vectors(path: impl AsRef<Path>) -> Result<Vectors, DataError> {
    let path = path.as_ref();
    match extension(path).as_str() {
        "fvecs" => read_fvecs(path),
        "bvecs" => read_bvecs(path),
        "npy" => read_npy(path),
        _ => Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
            expected: ".fvecs, .bvecs or .npy",
        }),
    }
}

/// Writes vectors by extension: `.fvecs` (f32 only), `.bvecs` (u8 only) or `.npy`.
pub fn write_vectors(path: impl AsRef<Path>, v: &Vectors) -> Result<(), DataError> {
    let path = path.as_ref();
    match extension(path).as_str() {
        "npy" => write_npy(path, v),
        _ => write_vecs_file(path, v),
    }
}

/// Reads a base set and a query set and checks that they agree in dtype and dim.
pub fn read_dataset(
    base: impl AsRef<Path>,
    queries: impl AsRef<Path>,
) -> Result<(Vectors, Vectors), DataError> {
    let (bp, qp) = (base.as_ref(), queries.as_ref());
    let b = read_vectors(bp)?;
    let q = read_vectors(qp)?;
    if b.dtype() != q.dtype() {
        return Err(DataError::DTypeMismatch {
            base: bp.to_path_buf(),
            queries: qp.to_path_buf(),
            base_dtype: b.dtype(),
            query_dtype: q.dtype(),
        });
    }
    if b.dim() != q.dim() {
        return Err(DataError::DimMismatch {
            base: bp.to_path_buf(),
            queries: qp.to_path_buf(),
            base_dim: b.dim(),
            query_dim: q.dim(),
        });
    }
    Ok((b, q))
}

/// Reads ground truth (one row of neighbour ids per query): `.ivecs`, or `.npy`
/// of `<i4` / `<i8`. Check it against the search with [`check_ground_truth`].
pub fn read_ground_truth(path: impl AsRef<Path>) -> Result<Vec<Vec<i64>>, DataError> {
    let path = path.as_ref();
    let what = || path.display().to_string();
    let i4 = |c: &[u8]| i32::from_le_bytes(c.try_into().unwrap()) as i64;
    let i8 = |c: &[u8]| i64::from_le_bytes(c.try_into().unwrap());
    // Rows of `dim` ids of `size` bytes each, every row's own allocation fallible.
    fn rows_of(
        chunks: impl ExactSizeIterator<Item = impl AsRef<[u8]>>,
        dim: usize,
        size: usize,
        conv: impl Fn(&[u8]) -> i64,
        what: impl Fn() -> String,
    ) -> Result<Vec<Vec<i64>>, DataError> {
        let mut out = try_vec(chunks.len(), &what)?;
        for c in chunks {
            let mut row = try_vec(dim, &what)?;
            row.extend(c.as_ref().chunks_exact(size).map(&conv));
            out.push(row);
        }
        Ok(out)
    }
    match extension(path).as_str() {
        "ivecs" => {
            let bytes = read_bytes(path)?;
            let (dim, _) = parse_vecs(path, &bytes, 4)?;
            let records = bytes.chunks_exact(4 + dim * 4).map(|r| &r[4..]);
            rows_of(records, dim, 4, i4, what)
        }
        "npy" => {
            let npy = parse_npy(path, read_bytes(path)?)?;
            let size = match npy.descr.as_str() {
                "<i4" => 4,
                "<i8" => 8,
                _ => {
                    return Err(DataError::UnsupportedDType {
                        path: path.to_path_buf(),
                        descr: npy.descr.clone(),
                        supported: NPY_TRUTH_DTYPES,
                    })
                }
            };
            let (_, dim) = npy_2d(path, &npy, size)?;
            let chunks = npy.data.chunks_exact(dim * size);
            if size == 4 {
                rows_of(chunks, dim, 4, i4, what)
            } else {
                rows_of(chunks, dim, 8, i8, what)
            }
        }
        _ => Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
            expected: ".ivecs or .npy",
        }),
    }
}

/// Checks ground truth read from `path` against a search of `queries`
/// queries over a base of `n` rows at `k`: exactly one row per query, at
/// least `k` columns in every row, and every id among a row's first `k` a row
/// of the base (`0..n`; the padding id -1 included, which no file of true
/// neighbours holds when `k ≤ n`). [`recall_at_k`] may then not panic.
pub fn check_ground_truth<T: Truth + ?Sized>(
    path: &Path,
    truth: &T,
    queries: usize,
    n: usize,
    k: usize,
) -> Result<(), DataError> {
    if truth.n_queries() != queries {
        return Err(DataError::TruthRows {
            path: path.to_path_buf(),
            rows: truth.n_queries(),
            queries,
        });
    }
    for r in 0..truth.n_queries() {
        let row = truth.row(r);
        if row.len() < k {
            return Err(DataError::TruthColumns {
                path: path.to_path_buf(),
                row: r,
                columns: row.len(),
                k,
            });
        }
        if let Some((column, &id)) = row[..k]
            .iter()
            .enumerate()
            .find(|&(_, &id)| id < 0 || id as u64 >= n as u64)
        {
            return Err(DataError::TruthId {
                path: path.to_path_buf(),
                row: r,
                column,
                id,
                n,
            });
        }
    }
    Ok(())
}

// --------------------------------------------------------------------------------
// Recall
// --------------------------------------------------------------------------------

/// Rows of true neighbour ids, one per query (ground truth).
pub trait Truth {
    fn n_queries(&self) -> usize;
    fn row(&self, q: usize) -> &[i64];
}

impl Truth for [Vec<i64>] {
    fn n_queries(&self) -> usize {
        self.len()
    }
    fn row(&self, q: usize) -> &[i64] {
        &self[q]
    }
}

impl Truth for Vec<Vec<i64>> {
    fn n_queries(&self) -> usize {
        self.len()
    }
    fn row(&self, q: usize) -> &[i64] {
        &self[q]
    }
}

impl Truth for Neighbors {
    fn n_queries(&self) -> usize {
        self.nq
    }
    fn row(&self, q: usize) -> &[i64] {
        self.ids_of(q)
    }
}

/// Recall@k: the mean over queries of |found[..k] ∩ truth[..k]| / |truth[..k]|,
/// ignoring padding ids (negative) on both sides; a query whose truth has no
/// valid id among its first `k` counts as 1. Returns 1.0 for zero queries.
///
/// Panics when the query counts differ or `k` exceeds `found.k`; check ground
/// truth read from a file with [`check_ground_truth`] first.
pub fn recall_at_k<T: Truth + ?Sized>(found: &Neighbors, truth: &T, k: usize) -> f64 {
    assert_eq!(
        found.nq,
        truth.n_queries(),
        "recall_at_k: {} result rows but {} ground-truth rows",
        found.nq,
        truth.n_queries()
    );
    assert!(
        k <= found.k,
        "recall_at_k: k = {k} exceeds the result's k = {}",
        found.k
    );
    if found.nq == 0 {
        return 1.0;
    }
    let mut sum = 0.0;
    for q in 0..found.nq {
        let t: Vec<i64> = truth
            .row(q)
            .iter()
            .take(k)
            .copied()
            .filter(|&i| i >= 0)
            .collect();
        if t.is_empty() {
            sum += 1.0;
            continue;
        }
        // A set, not `contains` on the slice: k can be as large as n, and a
        // scan per truth id made recall O(k²) (88 s at k = n = 10⁶).
        let f: std::collections::HashSet<i64> = found.ids_of(q)[..k].iter().copied().collect();
        let hits = t.iter().filter(|i| f.contains(i)).count();
        sum += hits as f64 / t.len() as f64;
    }
    sum / found.nq as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device or pipe (its length 0) is read up to the limit, not to its
    /// end: `/dev/zero` as a data file had the process read until memory ran
    /// out.
    #[cfg(unix)]
    #[test]
    fn endless_files_are_read_up_to_the_limit() {
        let limit = MemoryLimit {
            bytes: 1 << 20,
            source: "test",
        };
        let e = read_bytes_within(Path::new("/dev/zero"), limit).unwrap_err();
        assert!(
            matches!(e, DataError::FileTooLarge { bytes, .. } if bytes > limit.bytes),
            "{e}"
        );
        assert!(e.to_string().contains("/dev/zero"), "{e}");
        // An empty device is read as what it holds.
        assert!(read_bytes_within(Path::new("/dev/null"), limit)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn rng_is_reproducible_and_uniformish() {
        let mut a = Rng::new(1);
        let mut b = Rng::new(1);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(9);
        let n = 100_000;
        let mean: f64 = (0..n).map(|_| r.normal()).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.02, "{mean}");
        assert!((0..1000).all(|_| r.below(7) < 7));
    }

    #[test]
    fn synthetic_shapes_and_ranges() {
        for dt in DType::ALL {
            let (b, q) = synthetic(300, 24, 7, dt, 5);
            assert_eq!((b.rows(), b.dim(), q.rows(), q.dim()), (300, 24, 7, 24));
            assert_eq!(b.dtype(), dt);
            let (b2, _) = synthetic(300, 24, 7, dt, 5);
            assert_eq!(b, b2);
        }
        let (b, _) = synthetic(5000, 32, 1, DType::I8, 1);
        if let Vectors::I8(m) = b {
            assert!(m.data().contains(&127) && m.data().contains(&-128));
        }
    }

    /// The generator before it quantized as it drew: all f64 values first.
    fn synthetic_f64(n: usize, dim: usize, nq: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let mut rng = Rng::new(seed);
        let n_centers = (n / 64).clamp(1, 256);
        let centers: Vec<f64> = (0..n_centers * dim)
            .map(|_| rng.uniform(-1.0, 1.0))
            .collect();
        let mut draw = |count: usize| -> Vec<f64> {
            let mut out = Vec::new();
            for _ in 0..count {
                let c = rng.below(n_centers as u64) as usize;
                for j in 0..dim {
                    out.push(centers[c * dim + j] + 0.15 * rng.normal());
                }
            }
            out
        };
        let b = draw(n);
        (b, draw(nq))
    }

    #[test]
    fn synthetic_data_is_unchanged_by_the_fallible_generator() {
        let (b, q) = synthetic_f64(200, 9, 5, 3);
        let (vb, vq) = synthetic(200, 9, 5, DType::F32, 3);
        let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
        assert_eq!(vb, Vectors::F32(Matrix::new(f32s(&b), 200, 9).unwrap()));
        assert_eq!(vq, Vectors::F32(Matrix::new(f32s(&q), 5, 9).unwrap()));
        let (vb, _) = synthetic(200, 9, 5, DType::U8, 3);
        let u8s: Vec<u8> = b
            .iter()
            .map(|&x| ((x + 1.0) * 110.0).round().clamp(0.0, 255.0) as u8)
            .collect();
        assert_eq!(vb, Vectors::U8(Matrix::new(u8s, 200, 9).unwrap()));
    }

    #[test]
    fn synthetic_sizes_are_checked_before_allocating() {
        // n × dim wraps in u64/usize: refused as an overflow, not allocated.
        assert_eq!(synthetic_bytes(1 << 62, 8, 200, DType::F32), None);
        let e = try_synthetic(1 << 62, 8, 200, DType::F32, 1).unwrap_err();
        assert!(
            matches!(e, DataError::SyntheticTooLarge { bytes: None, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("overflows"), "{e}");
        // Representable but beyond any machine here.
        let e = try_synthetic(1_000_000_000_000, 128, 200, DType::F32, 1).unwrap_err();
        let DataError::SyntheticTooLarge {
            bytes: Some(b),
            limit,
            ..
        } = e
        else {
            panic!("{e}")
        };
        assert_eq!(b, (1_000_000_000_200u64 * 128 * 4) + 256 * 128 * 8);
        assert!(b > limit.bytes);
        assert!(e.to_string().contains("n = 1000000000000"), "{e}");
        // The centres count too (dim huge, n tiny).
        assert_eq!(synthetic_bytes(1, 10, 1, DType::U8), Some(20 + 80));
        let limit = memory_limit();
        assert!(limit.bytes > 0 && !limit.source.is_empty());
    }

    fn fvecs_header(dim: i32, extra: usize) -> Vec<u8> {
        let mut v = dim.to_le_bytes().to_vec();
        v.extend(std::iter::repeat_n(0u8, extra));
        v
    }

    #[test]
    fn vecs_headers_are_checked_against_the_file_length() {
        let p = Path::new("big.fvecs");
        // 12 bytes claiming dim 2^31 - 1: refused before any allocation.
        let e = parse_vecs(p, &fvecs_header(i32::MAX, 8), 4).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::DimExceedsFile {
                    dim: 2147483647,
                    record_bytes: 8589934592,
                    file_bytes: 12,
                    ..
                }
            ),
            "{e}"
        );
        let s = e.to_string();
        assert!(
            s.contains("big.fvecs") && s.contains("2147483647") && s.contains("12 bytes"),
            "{s}"
        );
        // The same through the file reader.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("big.fvecs");
        fs::write(&f, fvecs_header(i32::MAX, 8)).unwrap();
        assert!(matches!(
            read_fvecs(&f),
            Err(DataError::DimExceedsFile { .. })
        ));
        // A first record that fits, a later one that does not: truncated.
        let mut two = fvecs_header(2, 8);
        two.extend(fvecs_header(2, 4));
        assert!(matches!(
            parse_vecs(p, &two, 4),
            Err(DataError::Truncated {
                record: 1,
                needed: 12,
                available: 8,
                ..
            })
        ));
        two.extend([0u8; 4]);
        assert_eq!(parse_vecs(p, &two, 4).unwrap(), (2, 2));
        // .bvecs records of one byte per element.
        assert_eq!(parse_vecs(p, &fvecs_header(3, 3), 1).unwrap(), (3, 1));
    }

    fn npy_file(dir: &Path, name: &str, descr: &str, shape: &str, data: &[u8]) -> PathBuf {
        let p = dir.join(name);
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        fs::write(&p, out).unwrap();
        p
    }

    #[test]
    fn npy_shapes_that_overflow_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = npy_file(
            dir.path(),
            "huge.npy",
            "<f4",
            "(4611686018427387904, 8)",
            &[0; 8],
        );
        let e = read_npy(&p).unwrap_err();
        assert!(matches!(e, DataError::ShapeOverflow { .. }), "{e}");
        let s = e.to_string();
        assert!(
            s.contains("huge.npy") && s.contains("[4611686018427387904, 8]"),
            "{s}"
        );
        assert!(!s.contains("18446744073709551615"), "{s}");
        let p = npy_file(dir.path(), "gt.npy", "<i8", "(3, 6148914691236517206)", &[]);
        assert!(matches!(
            read_ground_truth(&p),
            Err(DataError::ShapeOverflow { .. })
        ));
        // Zero columns: rows of nothing, which no k ≥ 1 can use, refused
        // when read.
        let p = npy_file(dir.path(), "gt0.npy", "<i4", "(2, 0)", &[]);
        assert!(matches!(
            read_ground_truth(&p),
            Err(DataError::ZeroDim { .. })
        ));
        // Still decodes what it should.
        let data: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let p = npy_file(dir.path(), "ok.npy", "<f4", "(1, 2)", &data);
        assert_eq!(
            read_npy(&p).unwrap(),
            Vectors::F32(Matrix::new(vec![1.5, -2.0], 1, 2).unwrap())
        );
    }

    #[test]
    fn ground_truth_is_checked_against_the_search() {
        let p = Path::new("gt.ivecs");
        let gt = vec![vec![0i64, 1, 2], vec![3, 4, 5]];
        check_ground_truth(p, &gt, 2, 6, 3).unwrap();
        check_ground_truth(p, &gt, 2, 6, 2).unwrap();
        // More rows than queries (used to panic in recall_at_k), and fewer.
        for queries in [1, 3] {
            let e = check_ground_truth(p, &gt, queries, 6, 3).unwrap_err();
            assert!(
                matches!(e, DataError::TruthRows { rows: 2, queries: q, .. } if q == queries),
                "{e}"
            );
            let s = e.to_string();
            assert!(
                s.contains("gt.ivecs")
                    && s.contains("2 rows")
                    && s.contains(&format!("{queries} queries")),
                "{s}"
            );
        }
        // Fewer columns than k.
        let e = check_ground_truth(p, &gt, 2, 6, 4).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::TruthColumns {
                    row: 0,
                    columns: 3,
                    k: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("gt.ivecs"));
        // Ids outside the base, -1 included, within the first k columns.
        let bad = vec![vec![0i64, 1, 2], vec![3, 6, 5]];
        let e = check_ground_truth(p, &bad, 2, 6, 3).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::TruthId {
                    row: 1,
                    column: 1,
                    id: 6,
                    n: 6,
                    ..
                }
            ),
            "{e}"
        );
        let s = e.to_string();
        assert!(
            s.contains("gt.ivecs") && s.contains("row 1") && s.contains("id 6"),
            "{s}"
        );
        let pad = vec![vec![0i64, -1, 2], vec![3, 4, 5]];
        assert!(matches!(
            check_ground_truth(p, &pad, 2, 6, 3),
            Err(DataError::TruthId { row: 0, id: -1, .. })
        ));
        // Past column k nothing is compared, so nothing is checked.
        check_ground_truth(p, &bad, 2, 6, 1).unwrap();
    }

    #[test]
    fn recall_counts() {
        let found = Neighbors {
            nq: 2,
            k: 3,
            ids: vec![1, 2, 3, 4, 5, -1],
            distances: vec![0.0; 6],
        };
        let truth = vec![vec![1, 2, 9], vec![4, -1, -1]];
        let r = recall_at_k(&found, &truth, 3);
        assert!((r - (2.0 / 3.0 + 1.0) / 2.0).abs() < 1e-12);
        assert_eq!(recall_at_k(&found, &found, 3), 1.0);
    }
}
