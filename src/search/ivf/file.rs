//! The index file: versioned, checksummed, little-endian.
//!
//! | offset | bytes | field                                                   |
//! |--------|-------|---------------------------------------------------------|
//! | 0      | 8     | magic `FRAGLIVF`                                        |
//! | 8      | 4     | format version (u32, [`VERSION`])                       |
//! | 12     | 4     | index kind (u32, 1 = ivf-flat)                          |
//! | 16     | 1     | dtype (0 f32, 1 f16, 2 i8, 3 u8)                        |
//! | 17     | 1     | metric (0 l2, 1 inner product, 2 cosine)                |
//! | 18     | 1     | post-process (0 identity, 1 sqrt)                       |
//! | 19     | 1     | veclen                                                  |
//! | 20     | 4     | reserved, 0                                             |
//! | 24     | 8 × 4 | dim, rows, nlist, seed (u64)                            |
//! | 56     |       | centroids, `nlist × dim` f32                            |
//! |        |       | list lengths, `nlist` u64                               |
//! |        |       | per list: its ids (i64), then its interleaved vectors   |
//! |        |       | (`ceil(len / 32) · 32 · dim` elements)                  |
//! | end−32 | 32    | blake3 of every byte before it                          |
//!
//! Reading checks, in order: the magic (a foreign file), the version and kind,
//! the header's values, the length the header and list lengths imply (a
//! truncated file, or trailing bytes), the checksum (a corrupted file), then
//! that every id in `0..rows` occurs exactly once. Sizes are checked against
//! the bytes present before anything is allocated from them.

use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::f16;

use super::build::{with_lists, List};
use super::coarse::CoarseLanes;
use super::layout::{check_veclen, padded_rows};
use super::{IvfIndex, ListStore, MetricSpec, PostProcess};
use crate::search::data::{read_bytes, DataError};
use crate::search::{DType, Matrix, Metric};

pub const MAGIC: &[u8; 8] = b"FRAGLIVF";
pub const VERSION: u32 = 1;
const KIND_IVF_FLAT: u32 = 1;
const HEADER: usize = 56;
const SUM: usize = 32;

/// What is wrong with an index file.
#[derive(Debug, thiserror::Error)]
pub enum IndexFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{path}: not a fraglink index file (no `FRAGLIVF` magic)")]
    Foreign { path: PathBuf },
    #[error("{path}: index format version {found}, this fraglink reads version {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: truncated: the header and list lengths need {expected} bytes, the file has {actual}")]
    Truncated {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{path}: {actual} bytes where the header and list lengths need {expected}: trailing bytes"
    )]
    Trailing {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("{path}: exists and is not a regular file (a directory, device or FIFO): no index is written over it")]
    NotAFile { path: PathBuf },
    #[error("{path}: checksum mismatch: the file is corrupted")]
    Checksum { path: PathBuf },
    #[error("{path}: invalid {field}: {reason}")]
    Invalid {
        path: PathBuf,
        field: &'static str,
        reason: String,
    },
}

/// Little-endian element encoding.
trait Pod: Copy + Default {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

macro_rules! pod {
    ($t:ty, $n:expr, $to:expr, $from:expr) => {
        impl Pod for $t {
            const SIZE: usize = $n;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&$to(self));
            }
            fn get(b: &[u8]) -> Self {
                $from(b.try_into().expect("SIZE bytes"))
            }
        }
    };
}
pod!(f32, 4, f32::to_le_bytes, f32::from_le_bytes);
pod!(f16, 2, |v: f16| v.to_bits().to_le_bytes(), |b| {
    f16::from_bits(u16::from_le_bytes(b))
});
pod!(i8, 1, i8::to_le_bytes, i8::from_le_bytes);
pod!(u8, 1, u8::to_le_bytes, u8::from_le_bytes);
pod!(i64, 8, i64::to_le_bytes, i64::from_le_bytes);
pod!(u64, 8, u64::to_le_bytes, u64::from_le_bytes);

fn put_all<T: Pod>(v: &[T], out: &mut Vec<u8>) {
    out.reserve(v.len() * T::SIZE);
    v.iter().for_each(|&x| x.put(out));
}

fn dtype_code(d: DType) -> u8 {
    DType::ALL.iter().position(|&x| x == d).expect("in ALL") as u8
}

fn metric_code(m: Metric) -> u8 {
    Metric::ALL.iter().position(|&x| x == m).expect("in ALL") as u8
}

/// Writes `index` to `path` (through a temporary file of its own beside it,
/// renamed into place; removed if the write fails). A `path` that exists and
/// is not a regular file (a directory, a device, a FIFO) is refused: the
/// rename would have replaced `/dev/null` itself.
pub fn write_index(path: impl AsRef<Path>, index: &IvfIndex) -> Result<(), IndexFileError> {
    let path = path.as_ref();
    let io = |source| IndexFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    match fs::metadata(path) {
        Ok(m) if !m.is_file() => {
            return Err(IndexFileError::NotAFile {
                path: path.to_path_buf(),
            })
        }
        _ => {}
    }
    let mut head = Vec::with_capacity(HEADER);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&KIND_IVF_FLAT.to_le_bytes());
    head.push(dtype_code(index.dtype()));
    head.push(metric_code(index.metric.metric));
    head.push(match index.metric.post {
        PostProcess::Identity => 0,
        PostProcess::Sqrt => 1,
    });
    head.push(index.veclen as u8);
    head.extend_from_slice(&[0; 4]);
    for v in [index.dim, index.n, index.nlist(), 0] {
        head.extend_from_slice(&(v as u64).to_le_bytes());
    }
    head[48..56].copy_from_slice(&index.seed.to_le_bytes());
    let (tmp, file) = TempFile::beside(path).map_err(io)?;
    let mut w = BufWriter::new(file);
    let mut h = blake3::Hasher::new();
    let mut emit = |bytes: &[u8]| -> std::io::Result<()> {
        h.update(bytes);
        w.write_all(bytes)
    };
    let mut buf = Vec::new();
    emit(&head).map_err(io)?;
    put_all(index.centroids.data(), &mut buf);
    let lens: Vec<u64> = (0..index.nlist())
        .map(|l| index.list_len(l) as u64)
        .collect();
    put_all(&lens, &mut buf);
    emit(&buf).map_err(io)?;
    with_lists!(&index.lists, lists => {
        for l in lists {
            buf.clear();
            put_all(&l.ids, &mut buf);
            put_all(&l.data, &mut buf);
            emit(&buf).map_err(io)?;
        }
    });
    let sum = h.finalize();
    w.write_all(sum.as_bytes()).map_err(io)?;
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    tmp.rename_to(path).map_err(io)
}

/// A temporary file beside a destination, named for this process and call
/// (two writers, of one path or of two paths with the same stem, never
/// share one), removed on drop unless renamed into place.
struct TempFile(Option<PathBuf>);

impl TempFile {
    fn beside(dest: &Path) -> std::io::Result<(TempFile, fs::File)> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut name = dest.file_name().unwrap_or_default().to_os_string();
        name.push(format!(
            ".{}.{}.fraglink-tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let path = dest.with_file_name(name);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok((TempFile(Some(path)), file))
    }

    fn rename_to(mut self, dest: &Path) -> std::io::Result<()> {
        let tmp = self.0.take().expect("renamed once");
        fs::rename(&tmp, dest).inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// A bounds-checked reader over the verified bytes.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        s
    }
    fn vec<T: Pod>(&mut self, count: usize) -> Vec<T> {
        self.take(count * T::SIZE)
            .chunks_exact(T::SIZE)
            .map(T::get)
            .collect()
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads and verifies an index file (module docs).
pub fn read_index(path: impl AsRef<Path>) -> Result<IvfIndex, IndexFileError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    index_from_bytes(path, &bytes)
}

/// Verifies and decodes an index file's bytes, as [`read_index`] does after
/// reading the file (`path` only names it in errors); the fuzz targets drive
/// it directly.
pub fn index_from_bytes(path: &Path, b: &[u8]) -> Result<IvfIndex, IndexFileError> {
    let p = || path.to_path_buf();
    let invalid = |field: &'static str, reason: String| IndexFileError::Invalid {
        path: p(),
        field,
        reason,
    };
    let actual = b.len() as u64;
    if b.len() < MAGIC.len() || &b[..8] != MAGIC {
        return Err(IndexFileError::Foreign { path: p() });
    }
    let truncated = |expected: u64| IndexFileError::Truncated {
        path: p(),
        expected,
        actual,
    };
    if b.len() < HEADER {
        return Err(truncated((HEADER + SUM) as u64));
    }
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(IndexFileError::Version {
            path: p(),
            found: version,
        });
    }
    let kind = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    if kind != KIND_IVF_FLAT {
        return Err(invalid("index kind", format!("{kind} (1 = ivf-flat)")));
    }
    let dtype = *DType::ALL
        .get(b[16] as usize)
        .ok_or_else(|| invalid("dtype", format!("code {}", b[16])))?;
    let metric = *Metric::ALL
        .get(b[17] as usize)
        .ok_or_else(|| invalid("metric", format!("code {}", b[17])))?;
    let post = match b[18] {
        0 => PostProcess::Identity,
        1 if metric == Metric::L2 => PostProcess::Sqrt,
        c => {
            return Err(invalid(
                "post-process",
                format!("code {c} with metric {metric}"),
            ))
        }
    };
    if b[20..24] != [0; 4] {
        return Err(invalid(
            "reserved header bytes",
            format!("{:?} (must be zero)", &b[20..24]),
        ));
    }
    let veclen = b[19] as usize;
    let (dim, n, nlist, seed) = (u64_at(b, 24), u64_at(b, 32), u64_at(b, 40), u64_at(b, 48));
    if dim == 0 || dtype.max_dim().is_some_and(|m| dim > m as u64) {
        return Err(invalid("dim", format!("{dim} for {dtype}")));
    }
    if nlist == 0 || nlist > n {
        return Err(invalid(
            "nlist",
            format!("{nlist} for {n} rows (needs 1 ≤ nlist ≤ rows)"),
        ));
    }
    check_veclen(veclen, dim as usize).map_err(|e| invalid("veclen", e.to_string()))?;
    // Every size below is bounded by the file's length before it is used;
    // the header's counts are the file's word until then, so the sizes they
    // imply saturate (a crafted dim or nlist near 2^64 reads as truncated,
    // never as a wrapped small size).
    let lens_at = nlist
        .saturating_mul(dim)
        .saturating_mul(4)
        .saturating_add(HEADER as u64);
    let lens_end = lens_at.saturating_add(nlist.saturating_mul(8));
    if lens_end > actual {
        return Err(truncated(lens_end.saturating_add(SUM as u64)));
    }
    let (dim, nlist) = (dim as usize, nlist as usize);
    let lens: Vec<u64> = (0..nlist)
        .map(|l| u64_at(b, lens_at as usize + 8 * l))
        .collect();
    let mut expected = lens_end;
    let mut total = 0u64;
    for &len in &lens {
        total = total.saturating_add(len);
        let padded = len.div_ceil(32).saturating_mul(32);
        let list = len.saturating_mul(8).saturating_add(
            padded
                .saturating_mul(dim as u64)
                .saturating_mul(dtype.size() as u64),
        );
        expected = expected.saturating_add(list);
    }
    let expected = expected.saturating_add(SUM as u64);
    if actual < expected {
        return Err(truncated(expected));
    }
    if actual > expected {
        return Err(IndexFileError::Trailing {
            path: p(),
            expected,
            actual,
        });
    }
    let body = b.len() - SUM;
    if blake3::hash(&b[..body]).as_bytes() != &b[body..] {
        return Err(IndexFileError::Checksum { path: p() });
    }
    if total != n {
        return Err(invalid(
            "list lengths",
            format!("they sum to {total}, the header says {n} rows"),
        ));
    }
    let n = n as usize;
    let mut c = Cursor { b, at: HEADER };
    let centroids = Matrix::new(c.vec::<f32>(nlist * dim), nlist, dim).expect("nlist × dim");
    c.at = lens_end as usize;
    fn lists<T: Pod>(c: &mut Cursor<'_>, lens: &[u64], dim: usize) -> Vec<List<T>> {
        lens.iter()
            .map(|&len| {
                let ids = c.vec::<i64>(len as usize);
                let data = c.vec::<T>(padded_rows(len as usize) * dim);
                List { ids, data }
            })
            .collect()
    }
    let store = match dtype {
        DType::F32 => ListStore::F32(lists(&mut c, &lens, dim)),
        DType::F16 => ListStore::F16(lists(&mut c, &lens, dim)),
        DType::I8 => ListStore::I8(lists(&mut c, &lens, dim)),
        DType::U8 => ListStore::U8(lists(&mut c, &lens, dim)),
    };
    let mut seen = vec![false; n];
    for l in 0..nlist {
        for &id in store.ids(l) {
            let ok = usize::try_from(id).ok().filter(|&i| i < n && !seen[i]);
            match ok {
                Some(i) => seen[i] = true,
                None => {
                    return Err(invalid(
                        "ids",
                        format!("list {l} holds id {id}: ids must be 0..{n}, each once"),
                    ))
                }
            }
        }
    }
    Ok(IvfIndex {
        metric: MetricSpec { metric, post },
        dim,
        n,
        veclen,
        seed,
        centroids,
        lists: store,
        coarse: CoarseLanes::default(),
    })
}
