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
//! Every error names the file and what is wrong with it ([`DataError`]).

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
pub fn synthetic(n: usize, dim: usize, nq: usize, dtype: DType, seed: u64) -> (Vectors, Vectors) {
    let mut rng = Rng::new(seed);
    let n_centers = (n / 64).clamp(1, 256);
    let centers: Vec<f64> = (0..n_centers * dim)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let draw = |count: usize, rng: &mut Rng| -> Vec<f64> {
        let mut out = Vec::with_capacity(count * dim);
        for _ in 0..count {
            let c = rng.below(n_centers as u64) as usize;
            for j in 0..dim {
                out.push(centers[c * dim + j] + 0.15 * rng.normal());
            }
        }
        out
    };
    let base = draw(n, &mut rng);
    let queries = draw(nq, &mut rng);
    (
        quantize(base, n, dim, dtype),
        quantize(queries, nq, dim, dtype),
    )
}

fn quantize(v: Vec<f64>, rows: usize, dim: usize, dtype: DType) -> Vectors {
    match dtype {
        DType::F32 => {
            Vectors::F32(Matrix::new(v.iter().map(|&x| x as f32).collect(), rows, dim).unwrap())
        }
        DType::F16 => Vectors::F16(
            Matrix::new(v.iter().map(|&x| f16::from_f64(x)).collect(), rows, dim).unwrap(),
        ),
        DType::I8 => Vectors::I8(
            Matrix::new(
                v.iter()
                    .map(|&x| (x * 100.0).round().clamp(-128.0, 127.0) as i8)
                    .collect(),
                rows,
                dim,
            )
            .unwrap(),
        ),
        DType::U8 => Vectors::U8(
            Matrix::new(
                v.iter()
                    .map(|&x| ((x + 1.0) * 110.0).round().clamp(0.0, 255.0) as u8)
                    .collect(),
                rows,
                dim,
            )
            .unwrap(),
        ),
    }
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
    #[error("{path}: unknown file type (expected .fvecs, .bvecs, .ivecs or .npy)")]
    UnknownFormat { path: PathBuf },
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

/// Parses records `i32 dim, dim × elem_size bytes`; returns (dim, rows, payload bytes).
fn parse_vecs(
    path: &Path,
    bytes: &[u8],
    elem_size: usize,
) -> Result<(usize, usize, Vec<u8>), DataError> {
    if bytes.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
        });
    }
    let mut off = 0usize;
    let mut record = 0usize;
    let mut dim0: Option<usize> = None;
    let mut payload = Vec::new();
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
        match dim0 {
            None => {
                dim0 = Some(d);
                payload.reserve((bytes.len() / (4 + d * elem_size) + 1) * d * elem_size);
            }
            Some(e) if e != d => {
                return Err(DataError::InconsistentDim {
                    path: path.to_path_buf(),
                    record,
                    expected: e,
                    found: d,
                })
            }
            _ => {}
        }
        let need = 4 + (d * elem_size) as u64;
        if avail < need {
            return Err(DataError::Truncated {
                path: path.to_path_buf(),
                record,
                offset: off as u64,
                needed: need,
                available: avail,
            });
        }
        payload.extend_from_slice(&bytes[off + 4..off + need as usize]);
        off += need as usize;
        record += 1;
    }
    Ok((dim0.unwrap(), record, payload))
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    fs::read(path).map_err(io_err(path))
}

/// Reads an `.fvecs` file as f32 vectors.
pub fn read_fvecs(path: impl AsRef<Path>) -> Result<Vectors, DataError> {
    let path = path.as_ref();
    let (dim, rows, p) = parse_vecs(path, &read_bytes(path)?, 4)?;
    let data = p
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Ok(Vectors::F32(Matrix::new(data, rows, dim).unwrap()))
}

/// Reads a `.bvecs` file as u8 vectors.
pub fn read_bvecs(path: impl AsRef<Path>) -> Result<Vectors, DataError> {
    let path = path.as_ref();
    let (dim, rows, p) = parse_vecs(path, &read_bytes(path)?, 1)?;
    Ok(Vectors::U8(Matrix::new(p, rows, dim).unwrap()))
}

/// Reads an `.ivecs` file (usually ground truth: one row of neighbour ids per query).
pub fn read_ivecs(path: impl AsRef<Path>) -> Result<Matrix<i32>, DataError> {
    let path = path.as_ref();
    let (dim, rows, p) = parse_vecs(path, &read_bytes(path)?, 4)?;
    let data = p
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Ok(Matrix::new(data, rows, dim).unwrap())
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
    let data = bytes[hstart + hlen..].to_vec();
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
    let expected = (rows as u64)
        .checked_mul(dim as u64)
        .and_then(|v| v.checked_mul(elem_size as u64))
        .unwrap_or(u64::MAX);
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
    let npy = parse_npy(path, read_bytes(path)?)?;
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
    let d = &npy.data;
    Ok(match dtype {
        DType::F32 => Vectors::F32(
            Matrix::new(
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                rows,
                dim,
            )
            .unwrap(),
        ),
        DType::F16 => Vectors::F16(
            Matrix::new(
                d.chunks_exact(2)
                    .map(|c| f16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                rows,
                dim,
            )
            .unwrap(),
        ),
        DType::I8 => {
            Vectors::I8(Matrix::new(d.iter().map(|&b| b as i8).collect(), rows, dim).unwrap())
        }
        DType::U8 => Vectors::U8(Matrix::new(d.clone(), rows, dim).unwrap()),
    })
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
/// of `<i4` / `<i8`.
pub fn read_ground_truth(path: impl AsRef<Path>) -> Result<Vec<Vec<i64>>, DataError> {
    let path = path.as_ref();
    match extension(path).as_str() {
        "ivecs" => {
            let m = read_ivecs(path)?;
            Ok((0..m.rows())
                .map(|r| m.row(r).iter().map(|&v| v as i64).collect())
                .collect())
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
            let (rows, dim) = npy_2d(path, &npy, size)?;
            let vals: Vec<i64> = if size == 4 {
                npy.data
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                    .collect()
            } else {
                npy.data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            };
            Ok((0..rows)
                .map(|r| vals[r * dim..(r + 1) * dim].to_vec())
                .collect())
        }
        _ => Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
        }),
    }
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
/// Panics when the query counts differ or `k` exceeds `found.k`.
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
        let f = &found.ids_of(q)[..k];
        let hits = t.iter().filter(|i| f.contains(i)).count();
        sum += hits as f64 / t.len() as f64;
    }
    sum / found.nq as f64
}

#[cfg(test)]
mod tests {
    use super::*;

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
