//! Parameter matrices: expanding a JSON matrix into its product of entries.
//!
//! The semantics are exactly those of cuVS's `compute_matrix_product.py`
//! (see DESIGN.md, "Matrix semantics"):
//!
//! * Expansion works on a queue of `(path, key, value)` items, starting with the
//!   root value and no key.
//! * An **object** puts its items, in sorted key order, in front of the rest of
//!   the queue (so a nested object's keys are visited before its parent's
//!   remaining keys).
//! * An **array** is a set of alternatives: each element is processed in turn,
//!   with the nearest enclosing key, followed by the rest of the queue. Nested
//!   arrays therefore flatten, and an array of objects is a set of groups whose
//!   inner arrays expand only inside their group. An empty array yields nothing
//!   on its branch.
//! * A **scalar** (string, number, boolean, null) sets the nearest enclosing key
//!   in the entry (a later setting of the same key wins). A scalar with no key
//!   above it is an error.
//! * When the queue is exhausted, the entry is yielded. `{}` yields one empty
//!   entry; duplicate entries are kept.
//!
//! Naming warnings follow cuVS too: once an object key's item has been fully
//! iterated, the key counts as *used* if some entry yielded from it came through
//! a scalar (an object value never counts; an array counts if one of its
//! elements does; a scalar whose downstream yields no entry does not). A used key
//! that begins with `_` and an unused key that does not begin with `_` each
//! produce one warning (deduplicated, in first-emission order).
//!
//! Files are read as cuVS's Python reads them, within bounds ([`load_file`]):
//!
//! * at most [`MAX_FILE_BYTES`]; UTF-8 without a byte-order mark (Python's
//!   `json.load` rejects one too);
//! * numbers as Python's `json` reads them: the integer `-0` is 0, integers
//!   keep every digit, and those beyond 64 bits, which a `serde_json::Value`
//!   cannot hold exactly, are refused rather than rounded; so are numbers
//!   beyond ±1.8e308 (Python: infinities) and Python's `NaN`/`Infinity`
//!   extensions. Floats print as Python prints them ([`py_float_repr`],
//!   [`PyNumberFormatter`]);
//! * the product's size is computed from the document first ([`product_size`],
//!   checked arithmetic, nothing allocated per entry) and a product over the
//!   [`Limits`] (`FRAGLINK_MATRIX_MAX_ENTRIES`) is refused before expanding;
//! * entries can be streamed ([`MatrixFile::for_each_entry`], [`expand_each`])
//!   instead of collected.
//!
//! This file is also compiled into `build.rs` through `#[path]`, so it may only
//! use `std`, `serde`, `serde_json` and `thiserror`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde::ser::{Serialize, SerializeSeq, Serializer};
use serde_json::Value;

/// One entry of a matrix product: parameter name → JSON scalar.
pub type Entry = BTreeMap<String, Value>;

/// One step of a path from the root of a matrix document.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathSegment {
    /// An object key.
    Key(String),
    /// An array index.
    Index(usize),
}

impl fmt::Display for PathSegment {
    /// `["key"]` (quoted like Python's `json.dumps`) or `[0]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathSegment::Key(key) => write!(f, "[{}]", PyJsonStr(key)),
            PathSegment::Index(index) => write!(f, "[{index}]"),
        }
    }
}

impl Serialize for PathSegment {
    /// Keys as JSON strings, indices as JSON integers.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            PathSegment::Key(key) => serializer.serialize_str(key),
            PathSegment::Index(index) => serializer.serialize_u64(*index as u64),
        }
    }
}

/// A path from the root of a matrix document; displays as `root["_g"][0]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JsonPath(pub Vec<PathSegment>);

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("root")?;
        for segment in &self.0 {
            write!(f, "{segment}")?;
        }
        Ok(())
    }
}

impl Serialize for JsonPath {
    /// A JSON array of segments, e.g. `["_g", 0]`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for segment in &self.0 {
            seq.serialize_element(segment)?;
        }
        seq.end()
    }
}

/// Which naming convention a key breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WarningKind {
    /// The key never reached a leaf but does not begin with `_`.
    Unused,
    /// The key reached a leaf but begins with `_`.
    Used,
}

impl fmt::Display for WarningKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WarningKind::Unused => "unused",
            WarningKind::Used => "used",
        })
    }
}

/// A naming-convention warning about one object key of a matrix.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Warning {
    /// Which convention is broken.
    pub kind: WarningKind,
    /// The offending key.
    pub key: String,
    /// Path from the root to the object that holds `key`.
    pub path: JsonPath,
}

impl fmt::Display for Warning {
    /// cuVS's wording, word for word.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = PyJsonStr(&self.key);
        match self.kind {
            WarningKind::Used => {
                let rest = self.key.trim_start_matches('_');
                let underscores = &self.key[..self.key.len() - rest.len()];
                write!(
                    f,
                    "Key {key} at {} is used in a matrix product entry even though it \
                     begins with {}. Consider renaming it to {} to indicate this.",
                    self.path,
                    PyJsonStr(underscores),
                    PyJsonStr(rest),
                )
            }
            WarningKind::Unused => write!(
                f,
                "Key {key} at {} is never used in a matrix product entry and is used \
                 only for grouping. Consider renaming it to {} to indicate this.",
                self.path,
                PyJsonStr(&format!("_{}", self.key)),
            ),
        }
    }
}

/// The product of a matrix: its entries in generation order and its warnings.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Product {
    /// Entries in generation order.
    pub entries: Vec<Entry>,
    /// Unique warnings in first-emission order.
    pub warnings: Vec<Warning>,
}

/// Why a matrix value has no product.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MatrixError {
    /// A scalar leaf with no object key above it to set.
    #[error("leaf value at {path} has no object key above it")]
    NoKey {
        /// Where the leaf is.
        path: JsonPath,
    },
}

/// The environment variable that overrides [`DEFAULT_MAX_ENTRIES`].
pub const MAX_ENTRIES_VAR: &str = "FRAGLINK_MATRIX_MAX_ENTRIES";

/// The most entries a matrix file's product may have unless
/// [`MAX_ENTRIES_VAR`] says otherwise: about 460 times the largest cuVS matrix
/// (218 entries) and more fragments than a build compiles in hours, yet small
/// enough that the build, which holds the whole product in memory, stays
/// near 300 MB for entries of a dozen keys (a 10^6-entry product of 12 keys
/// took 2.7 GB). `fraglink expand` streams, so it may be raised freely there.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;

/// The expansion's work budget per allowed entry: a product is also refused
/// when its [`ProductSize::cost`] exceeds this many times the entry limit
/// (the cuVS matrices cost 2 to 35 per entry, 5,729 at most in all). This
/// bounds products of few entries with very many keys each, and matrices
/// whose product is small but whose expansion is not (`{"a": [1000 values], "b": [1000
/// values], "c": [1000 values], "z": []}` has no entry but a billion steps).
pub const COST_PER_ENTRY: u64 = 64;

/// The largest matrix file read, in bytes (16 MiB, over 2,000 times the
/// largest cuVS matrix, 7 KB). Parsed JSON takes up to about 16 bytes of
/// memory per input byte, and without a bound a device such as `/dev/zero`
/// would be read until memory runs out.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// How large a product a matrix file may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most entries; the expansion's cost may be [`COST_PER_ENTRY`] times this.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

impl Limits {
    /// [`DEFAULT_MAX_ENTRIES`], or [`MAX_ENTRIES_VAR`] when it is set (a
    /// whole number; an empty value means the default).
    pub fn from_env() -> Result<Limits, MatrixFileError> {
        let Some(raw) = std::env::var_os(MAX_ENTRIES_VAR) else {
            return Ok(Limits::default());
        };
        let text = raw.to_string_lossy();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(Limits::default());
        }
        match trimmed.parse::<u64>() {
            Ok(max_entries) => Ok(Limits { max_entries }),
            Err(_) => Err(MatrixFileError::BadLimit {
                value: text.into_owned(),
            }),
        }
    }

    /// The most [`ProductSize::cost`] allowed.
    pub fn max_cost(&self) -> u128 {
        u128::from(self.max_entries) * u128::from(COST_PER_ENTRY)
    }

    /// Whether a product of this size is allowed.
    pub fn allows(&self, size: &ProductSize) -> bool {
        size.entries <= u128::from(self.max_entries) && size.cost() <= self.max_cost()
    }
}

/// The size of a matrix's product, computed from the document without
/// expanding it. Every count saturates at `u128::MAX` (shown as "more than
/// 10^38"); below that it is exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProductSize {
    /// Entries of the product.
    pub entries: u128,
    /// Key settings summed over all entries (an entry's scalars along its
    /// branch, overridden ones included): the work of building the entries.
    pub values: u128,
    /// Items the expansion processes over all branches (objects, arrays and
    /// scalars, once per branch that reaches them), entries yielded included.
    pub steps: u128,
}

impl ProductSize {
    /// The expansion's work: `steps + values`.
    pub fn cost(&self) -> u128 {
        self.steps.saturating_add(self.values)
    }
}

/// A count for messages: exact, or "more than 10^38" once saturated.
struct Count(u128);

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == u128::MAX {
            f.write_str("more than 10^38")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

fn too_large_message(size: &ProductSize, max_entries: u64) -> String {
    let limits = Limits { max_entries };
    if size.entries > u128::from(max_entries) {
        format!(
            "the matrix product has {} entries, more than the limit of {max_entries} \
             (set {MAX_ENTRIES_VAR} to raise it)",
            Count(size.entries)
        )
    } else {
        format!(
            "expanding the matrix takes {} steps for its {} entries ({} values in all), \
             more than the limit of {} ({COST_PER_ENTRY} per allowed entry, \
             {MAX_ENTRIES_VAR}={max_entries}; set it to raise the limit)",
            Count(size.cost()),
            Count(size.entries),
            Count(size.values),
            limits.max_cost()
        )
    }
}

/// Why a matrix file has no product. Each message is one line naming the file
/// (or, for [`MatrixFileError::BadLimit`], the variable).
#[derive(Debug, thiserror::Error)]
pub enum MatrixFileError {
    /// The file could not be read.
    #[error("{}: cannot read matrix file: {source}", .path.display())]
    Read {
        /// The matrix file.
        path: PathBuf,
        /// The I/O failure.
        source: io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error(
        "{}: the matrix file is larger than {} bytes (16 MiB), the most fraglink reads{}",
        .path.display(),
        MAX_FILE_BYTES,
        .bytes.map(|b| format!(" (it has {b})")).unwrap_or_default()
    )]
    TooBig {
        /// The matrix file.
        path: PathBuf,
        /// Its size, when it is a regular file.
        bytes: Option<u64>,
    },
    /// The file is not valid JSON (a byte-order mark and invalid UTF-8
    /// included: Python's `json.load`, which cuVS uses, rejects both).
    #[error("{}:{line}:{column}: invalid JSON: {message}", .path.display())]
    Parse {
        /// The matrix file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// What is wrong, without the position.
        message: String,
    },
    /// Valid JSON that fraglink cannot represent as cuVS's Python does: an
    /// integer beyond 64 bits.
    #[error("{}:{line}:{column}: {message}", .path.display())]
    Unsupported {
        /// The matrix file.
        path: PathBuf,
        /// 1-based line of the value.
        line: usize,
        /// 1-based column (in characters) of the value.
        column: usize,
        /// What is wrong, without the position.
        message: String,
    },
    /// A scalar leaf with no object key above it.
    #[error("{}: leaf value at {json_path} has no object key above it", .path.display())]
    NoKey {
        /// The matrix file.
        path: PathBuf,
        /// Where the leaf is in the document.
        json_path: JsonPath,
    },
    /// The product is over the [`Limits`].
    #[error("{}: {}", .path.display(), too_large_message(.size, *.max_entries))]
    TooLarge {
        /// The matrix file.
        path: PathBuf,
        /// The product's size.
        size: ProductSize,
        /// The entry limit in force.
        max_entries: u64,
    },
    /// [`MAX_ENTRIES_VAR`] is not a whole number.
    #[error("{MAX_ENTRIES_VAR}={value:?}: expected a whole number of matrix entries")]
    BadLimit {
        /// The variable's value.
        value: String,
    },
}

/// A matrix file that has been read, parsed and checked: every leaf has a key
/// and its product is within the [`Limits`], so expanding it cannot fail.
#[derive(Clone, Debug)]
pub struct MatrixFile {
    path: PathBuf,
    value: Value,
    size: ProductSize,
}

impl MatrixFile {
    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed document.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Its product's size.
    pub fn size(&self) -> ProductSize {
        self.size
    }

    /// The product, materialised (at most the limit's entries).
    pub fn expand(&self) -> Result<Product, MatrixFileError> {
        // Reserve for the product, but never more than the default limit's worth.
        let reserve = self.size.entries.min(u128::from(DEFAULT_MAX_ENTRIES)) as usize;
        let mut entries = Vec::with_capacity(reserve);
        let warnings = self.for_each_entry(|entry| {
            entries.push(entry);
            ControlFlow::Continue(())
        })?;
        Ok(Product { entries, warnings })
    }

    /// Streams the product: `sink` gets each entry as it is generated and may
    /// stop the expansion with `ControlFlow::Break`. Returns the warnings (all
    /// of them unless stopped early).
    pub fn for_each_entry(
        &self,
        mut sink: impl FnMut(Entry) -> ControlFlow<()>,
    ) -> Result<Vec<Warning>, MatrixFileError> {
        Expander::new(&mut sink)
            .run(&self.value)
            .map_err(|err| self.file_error(err))
    }

    fn file_error(&self, err: MatrixError) -> MatrixFileError {
        match err {
            MatrixError::NoKey { path: json_path } => MatrixFileError::NoKey {
                path: self.path.clone(),
                json_path,
            },
        }
    }
}

/// Reads, parses and checks a matrix file under the [`Limits`] from the
/// environment ([`Limits::from_env`]).
pub fn load_file(path: &Path) -> Result<MatrixFile, MatrixFileError> {
    load_file_with(path, &Limits::from_env()?)
}

/// Reads, parses and checks a matrix file: at most [`MAX_FILE_BYTES`], UTF-8
/// without a byte-order mark, JSON whose integers fit in 64 bits, every leaf
/// under a key, and a product within `limits`. Nothing is expanded.
pub fn load_file_with(path: &Path, limits: &Limits) -> Result<MatrixFile, MatrixFileError> {
    let bytes = read_bytes(path)?;
    load_bytes_with(path, bytes, limits)
}

/// As [`load_file_with`] on a file's bytes already read (`path` names them
/// in errors); the fuzz target drives it directly.
pub fn load_bytes_with(
    path: &Path,
    bytes: Vec<u8>,
    limits: &Limits,
) -> Result<MatrixFile, MatrixFileError> {
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(MatrixFileError::TooBig {
            path: path.to_path_buf(),
            bytes: Some(bytes.len() as u64),
        });
    }
    let text = utf8_text(path, bytes)?;
    let value = parse_text(path, &text)?;
    drop(text);
    let size = product_size(&value).map_err(|err| match err {
        MatrixError::NoKey { path: json_path } => MatrixFileError::NoKey {
            path: path.to_path_buf(),
            json_path,
        },
    })?;
    if !limits.allows(&size) {
        return Err(MatrixFileError::TooLarge {
            path: path.to_path_buf(),
            size,
            max_entries: limits.max_entries,
        });
    }
    Ok(MatrixFile {
        path: path.to_path_buf(),
        value,
        size,
    })
}

/// Reads, parses, checks and expands a matrix file (see [`load_file`]).
pub fn expand_file(path: &Path) -> Result<Product, MatrixFileError> {
    load_file(path)?.expand()
}

/// Expands a matrix into its product (entries and naming warnings). There is
/// no size limit here: check [`product_size`] first for untrusted input, or
/// stream with [`expand_each`].
pub fn expand(matrix: &Value) -> Result<Product, MatrixError> {
    let mut entries = Vec::new();
    let warnings = Expander::new(&mut |entry| {
        entries.push(entry);
        ControlFlow::Continue(())
    })
    .run(matrix)?;
    Ok(Product { entries, warnings })
}

/// Streams a matrix's product: `sink` gets each entry as it is generated and
/// may stop the expansion with `ControlFlow::Break`. A keyless leaf is found
/// before any entry is produced. Returns the warnings.
pub fn expand_each(
    matrix: &Value,
    mut sink: impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<Vec<Warning>, MatrixError> {
    product_size(matrix)?;
    Expander::new(&mut sink).run(matrix)
}

// ---------------------------------------------------------------------------
// Reading and parsing.

fn read_bytes(path: &Path) -> Result<Vec<u8>, MatrixFileError> {
    use std::io::Read;
    let read_error = |source| MatrixFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let regular_len = file
        .metadata()
        .ok()
        .filter(|meta| meta.is_file())
        .map(|meta| meta.len());
    if let Some(len) = regular_len.filter(|&len| len > MAX_FILE_BYTES) {
        return Err(MatrixFileError::TooBig {
            path: path.to_path_buf(),
            bytes: Some(len),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(MatrixFileError::TooBig {
            path: path.to_path_buf(),
            bytes: None,
        });
    }
    Ok(bytes)
}

fn utf8_text(path: &Path, bytes: Vec<u8>) -> Result<String, MatrixFileError> {
    String::from_utf8(bytes).map_err(|err| {
        let valid = &err.as_bytes()[..err.utf8_error().valid_up_to()];
        let bad = err.as_bytes()[valid.len()];
        // `valid` is valid UTF-8 by construction.
        let (line, column) = line_column(std::str::from_utf8(valid).unwrap_or_default());
        MatrixFileError::Parse {
            path: path.to_path_buf(),
            line,
            column,
            message: format!("invalid UTF-8 (byte 0x{bad:02x}); matrix files are UTF-8"),
        }
    })
}

/// 1-based line and column (in characters) just after `before`.
fn line_column(before: &str) -> (usize, usize) {
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

fn parse_text(path: &Path, text: &str) -> Result<Value, MatrixFileError> {
    if text.starts_with('\u{feff}') {
        // Python's `json.loads` refuses it too ("Unexpected UTF-8 BOM").
        return Err(MatrixFileError::Parse {
            path: path.to_path_buf(),
            line: 1,
            column: 1,
            message: "unexpected UTF-8 byte-order mark (U+FEFF) at the start of the file; \
                      save it as UTF-8 without a BOM (cuVS's Python json.load rejects it too)"
                .to_owned(),
        });
    }
    let parse_error = |err: serde_json::Error| {
        let (line, column) = (err.line(), err.column());
        let full = err.to_string();
        let suffix = format!(" at line {line} column {column}");
        let mut message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
        if message == "number out of range" {
            message.push_str(
                " (beyond ±1.8e308; Python would read it as Infinity, \
                 which fraglink cannot represent)",
            );
        }
        MatrixFileError::Parse {
            path: path.to_path_buf(),
            line,
            column,
            message,
        }
    };
    let value: Value = serde_json::from_str(text).map_err(parse_error)?;
    let literals = scan_integer_literals(text);
    if let Some(range) = literals.too_wide {
        let (line, column) = line_column(&text[..range.start]);
        let literal = &text[range];
        let shown = if literal.len() > 40 {
            format!("{}… ({} characters)", &literal[..30], literal.len())
        } else {
            literal.to_owned()
        };
        return Err(MatrixFileError::Unsupported {
            path: path.to_path_buf(),
            line,
            column,
            message: format!(
                "integer {shown} does not fit in 64 bits; cuVS's Python keeps it exact but \
                 fraglink cannot (write it as a string)"
            ),
        });
    }
    if literals.negative_zeros.is_empty() {
        return Ok(value);
    }
    // Python reads the integer `-0` as 0; serde_json as the float -0.0. Blank
    // out the signs (same length, so positions are unchanged) and re-parse.
    let mut bytes = text.as_bytes().to_vec();
    for &at in &literals.negative_zeros {
        bytes[at] = b' ';
    }
    serde_json::from_slice(&bytes).map_err(parse_error)
}

/// Integer literals that Python's `json` reads differently from serde_json.
#[derive(Debug, Default, PartialEq, Eq)]
struct IntegerLiterals {
    /// Offsets of the `-` of each `-0` literal.
    negative_zeros: Vec<usize>,
    /// The first integer literal outside `i64`/`u64`, as a byte range.
    too_wide: Option<std::ops::Range<usize>>,
}

/// Scans valid JSON text for integer literals (numbers without `.`, `e`, `E`)
/// that are `-0` or do not fit in 64 bits.
fn scan_integer_literals(text: &str) -> IntegerLiterals {
    let bytes = text.as_bytes();
    let mut found = IntegerLiterals::default();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let literal = &text[start..i];
                if literal.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) {
                    continue;
                }
                let (negative, digits) = match literal.strip_prefix('-') {
                    Some(digits) => (true, digits),
                    None => (false, literal),
                };
                if negative && digits == "0" {
                    found.negative_zeros.push(start);
                    continue;
                }
                let limit = if negative {
                    u128::from(i64::MIN.unsigned_abs())
                } else {
                    u128::from(u64::MAX)
                };
                let fits = digits.len() <= 20 && digits.parse::<u128>().is_ok_and(|n| n <= limit);
                if !fits && found.too_wide.is_none() {
                    found.too_wide = Some(start..i);
                }
            }
            _ => i += 1,
        }
    }
    found
}

// ---------------------------------------------------------------------------
// The product's size, without expanding.
//
// For an item processed once with nothing behind it: `n` entries, `s` key
// settings over them, `w` processing steps. An item followed by the rest of
// the queue starts the rest once per entry of its own, so a chain of items
// x1..xk has N = Π n_i, S = Σ s_i · Π_{j≠i} n_j and
// W = w1 + n1·w2 + n1·n2·w3 + …; an object is the chain of its sorted
// values, an array the sum of its elements.

#[derive(Clone, Copy)]
struct Measure {
    n: u128,
    s: u128,
    w: u128,
}

enum Children<'a> {
    Array(&'a [Value]),
    Object(Vec<&'a Value>),
}

struct SizeFrame<'a> {
    children: Children<'a>,
    next: usize,
    /// Whether the children have no object key above them.
    keyless: bool,
    acc: Measure,
}

impl SizeFrame<'_> {
    fn fold(&mut self, m: Measure) {
        let acc = &mut self.acc;
        match self.children {
            Children::Array(_) => {
                acc.n = acc.n.saturating_add(m.n);
                acc.s = acc.s.saturating_add(m.s);
                acc.w = acc.w.saturating_add(m.w);
            }
            Children::Object(_) => {
                acc.w = acc.w.saturating_add(acc.n.saturating_mul(m.w));
                acc.s = acc
                    .s
                    .saturating_mul(m.n)
                    .saturating_add(m.s.saturating_mul(acc.n));
                acc.n = acc.n.saturating_mul(m.n);
            }
        }
    }
}

/// The size of a matrix's product, or the first leaf without a key (the one
/// the expansion would stop at), computed without expanding and without
/// recursion.
pub fn product_size(matrix: &Value) -> Result<ProductSize, MatrixError> {
    let mut stack: Vec<SizeFrame<'_>> = Vec::new();
    let mut value = matrix;
    let mut keyless = true;
    loop {
        let mut done = match value {
            Value::Object(map) => {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_by(|a, b| a.0.cmp(b.0));
                stack.push(SizeFrame {
                    children: Children::Object(members.into_iter().map(|(_, v)| v).collect()),
                    next: 0,
                    keyless: false,
                    acc: Measure { n: 1, s: 0, w: 1 },
                });
                None
            }
            Value::Array(elements) => {
                stack.push(SizeFrame {
                    children: Children::Array(elements),
                    next: 0,
                    keyless,
                    acc: Measure { n: 0, s: 0, w: 1 },
                });
                None
            }
            _ if keyless => {
                // Only arrays are on the stack: the path is their indices.
                let path = stack
                    .iter()
                    .map(|frame| PathSegment::Index(frame.next - 1))
                    .collect();
                return Err(MatrixError::NoKey {
                    path: JsonPath(path),
                });
            }
            _ => Some(Measure { n: 1, s: 1, w: 1 }),
        };
        loop {
            let Some(top) = stack.last_mut() else {
                let m = done.unwrap_or(Measure { n: 0, s: 0, w: 0 });
                return Ok(ProductSize {
                    entries: m.n,
                    values: m.s,
                    steps: m.w.saturating_add(m.n),
                });
            };
            if let Some(m) = done.take() {
                top.fold(m);
            }
            let child = match &top.children {
                Children::Array(elements) => elements.get(top.next),
                Children::Object(values) => values.get(top.next).copied(),
            };
            if let Some(child) = child {
                top.next += 1;
                value = child;
                keyless = top.keyless;
                break;
            }
            done = stack.pop().map(|frame| frame.acc);
        }
    }
}

// ---------------------------------------------------------------------------
// The engine.
//
// Queues, entries and paths are persistent cons lists borrowing from the
// matrix, so a branch shares everything with its siblings and nothing is
// cloned per alternative. The recursion of the reference algorithm is turned
// into an explicit stack of continuation frames, so deep or wide matrices
// cannot overflow the call stack.

/// A path segment borrowed from the matrix.
#[derive(Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// A path, innermost segment first.
type PathLink<'a> = Option<Rc<PathNode<'a>>>;

struct PathNode<'a> {
    segment: Seg<'a>,
    parent: PathLink<'a>,
}

fn child_path<'a>(parent: &PathLink<'a>, segment: Seg<'a>) -> PathLink<'a> {
    Some(Rc::new(PathNode {
        segment,
        parent: parent.clone(),
    }))
}

fn materialize_path(mut link: &PathLink<'_>) -> JsonPath {
    let mut segments = Vec::new();
    while let Some(node) = link {
        segments.push(match node.segment {
            Seg::Key(key) => PathSegment::Key(key.to_owned()),
            Seg::Index(index) => PathSegment::Index(index),
        });
        link = &node.parent;
    }
    segments.reverse();
    JsonPath(segments)
}

/// One queued dimension.
#[derive(Clone)]
struct Item<'a> {
    /// Path of `value`, including its own last segment.
    path: PathLink<'a>,
    /// The nearest enclosing object key.
    key: Option<&'a str>,
    value: &'a Value,
}

type Queue<'a> = Option<Rc<QueueNode<'a>>>;

struct QueueNode<'a> {
    item: Item<'a>,
    rest: Queue<'a>,
}

impl Drop for QueueNode<'_> {
    // Unlink iteratively: a long queue must not recurse on drop.
    fn drop(&mut self) {
        let mut next = self.rest.take();
        while let Some(node) = next {
            match Rc::try_unwrap(node) {
                Ok(mut node) => next = node.rest.take(),
                Err(_) => break,
            }
        }
    }
}

fn push_front<'a>(item: Item<'a>, rest: Queue<'a>) -> Queue<'a> {
    Some(Rc::new(QueueNode { item, rest }))
}

/// The settings made so far on a branch, newest first.
type Settings<'a> = Option<Rc<Setting<'a>>>;

struct Setting<'a> {
    key: &'a str,
    value: &'a Value,
    older: Settings<'a>,
}

impl Drop for Setting<'_> {
    fn drop(&mut self) {
        let mut next = self.older.take();
        while let Some(node) = next {
            match Rc::try_unwrap(node) {
                Ok(mut node) => next = node.older.take(),
                Err(_) => break,
            }
        }
    }
}

fn build_entry(mut settings: &Settings<'_>) -> Entry {
    let mut entry = Entry::new();
    while let Some(setting) = settings {
        // Newest first, so the first setting seen for a key is the one that wins.
        if !entry.contains_key(setting.key) {
            entry.insert(setting.key.to_owned(), setting.value.clone());
        }
        settings = &setting.older;
    }
    entry
}

/// What the machine does next.
enum Step<'a> {
    /// Take the next item off `queue`, or yield the entry if it is empty.
    Next {
        queue: Queue<'a>,
        settings: Settings<'a>,
    },
    /// Process one item with the rest of the queue behind it.
    Process {
        item: Item<'a>,
        rest: Queue<'a>,
        settings: Settings<'a>,
    },
    /// The current computation finished; `used` = some entry it yielded came
    /// through a scalar (as the reference's `(entry, used)` pairs).
    Return { used: bool },
}

/// Continuations: what to do when the computation started after them returns.
enum Frame<'a> {
    /// An object key's item has been fully iterated: check its naming.
    KeyDone {
        key: &'a str,
        value: &'a Value,
        holder: PathLink<'a>,
    },
    /// An object's items were processed: objects never count as used.
    Object,
    /// An array: process the element at `next` once the previous one returns.
    Array {
        path: PathLink<'a>,
        key: Option<&'a str>,
        elements: &'a [Value],
        next: usize,
        rest: Queue<'a>,
        settings: Settings<'a>,
        used: bool,
    },
    /// A scalar: used iff its downstream yielded at least one entry.
    Scalar { entries_before: u64 },
}

struct Expander<'a, 's> {
    /// Receives each entry; `Break` stops the expansion.
    sink: &'s mut dyn FnMut(Entry) -> ControlFlow<()>,
    /// Entries yielded so far.
    yielded: u64,
    /// The sink asked to stop.
    stopped: bool,
    warnings: Vec<Warning>,
    /// (kind, identity of the key's value node): a node has exactly one path,
    /// so this dedupes exactly like (kind, key, path).
    warned: HashSet<(WarningKind, *const Value)>,
    stack: Vec<Frame<'a>>,
}

impl<'a, 's> Expander<'a, 's> {
    fn new(sink: &'s mut dyn FnMut(Entry) -> ControlFlow<()>) -> Self {
        Expander {
            sink,
            yielded: 0,
            stopped: false,
            warnings: Vec::new(),
            warned: HashSet::new(),
            stack: Vec::new(),
        }
    }

    /// Expands `matrix`, handing each entry to the sink; returns the warnings.
    fn run(mut self, matrix: &'a Value) -> Result<Vec<Warning>, MatrixError> {
        let mut step = Step::Process {
            item: Item {
                path: None,
                key: None,
                value: matrix,
            },
            rest: None,
            settings: None,
        };
        while !self.stopped {
            step = match step {
                Step::Next { queue, settings } => self.next(queue, settings),
                Step::Process {
                    item,
                    rest,
                    settings,
                } => self.process(item, rest, settings)?,
                Step::Return { used } => match self.stack.pop() {
                    None => break,
                    Some(frame) => self.resume(frame, used),
                },
            };
        }
        Ok(self.warnings)
    }

    fn next(&mut self, queue: Queue<'a>, settings: Settings<'a>) -> Step<'a> {
        let Some(node) = queue else {
            self.yielded += 1;
            if (self.sink)(build_entry(&settings)).is_break() {
                self.stopped = true;
            }
            return Step::Return { used: false };
        };
        let item = node.item.clone();
        let rest = node.rest.clone();
        if let Some(path) = &item.path {
            if let Seg::Key(key) = path.segment {
                self.stack.push(Frame::KeyDone {
                    key,
                    value: item.value,
                    holder: path.parent.clone(),
                });
            }
        }
        Step::Process {
            item,
            rest,
            settings,
        }
    }

    fn process(
        &mut self,
        item: Item<'a>,
        rest: Queue<'a>,
        settings: Settings<'a>,
    ) -> Result<Step<'a>, MatrixError> {
        Ok(match item.value {
            Value::Object(map) => {
                let mut members: Vec<(&'a String, &'a Value)> = map.iter().collect();
                // serde_json's map is already sorted unless `preserve_order` is on
                // somewhere in the build; sort to be independent of that.
                members.sort_by(|a, b| a.0.cmp(b.0));
                let mut queue = rest;
                for (key, value) in members.into_iter().rev() {
                    let path = child_path(&item.path, Seg::Key(key));
                    let key = Some(key.as_str());
                    queue = push_front(Item { path, key, value }, queue);
                }
                self.stack.push(Frame::Object);
                Step::Next { queue, settings }
            }
            Value::Array(elements) => {
                if elements.is_empty() {
                    Step::Return { used: false }
                } else {
                    let first = Item {
                        path: child_path(&item.path, Seg::Index(0)),
                        key: item.key,
                        value: &elements[0],
                    };
                    let queue = push_front(first, rest.clone());
                    self.stack.push(Frame::Array {
                        path: item.path,
                        key: item.key,
                        elements,
                        next: 1,
                        rest,
                        settings: settings.clone(),
                        used: false,
                    });
                    Step::Next { queue, settings }
                }
            }
            scalar => {
                let Some(key) = item.key else {
                    return Err(MatrixError::NoKey {
                        path: materialize_path(&item.path),
                    });
                };
                self.stack.push(Frame::Scalar {
                    entries_before: self.yielded,
                });
                let settings = Some(Rc::new(Setting {
                    key,
                    value: scalar,
                    older: settings,
                }));
                Step::Next {
                    queue: rest,
                    settings,
                }
            }
        })
    }

    fn resume(&mut self, frame: Frame<'a>, used: bool) -> Step<'a> {
        match frame {
            Frame::KeyDone { key, value, holder } => {
                self.check_naming(key, value, &holder, used);
                Step::Return { used }
            }
            Frame::Object => Step::Return { used: false },
            Frame::Array {
                path,
                key,
                elements,
                next,
                rest,
                settings,
                used: used_before,
            } => {
                let used = used_before || used;
                if next == elements.len() {
                    return Step::Return { used };
                }
                let element = Item {
                    path: child_path(&path, Seg::Index(next)),
                    key,
                    value: &elements[next],
                };
                let queue = push_front(element, rest.clone());
                self.stack.push(Frame::Array {
                    path,
                    key,
                    elements,
                    next: next + 1,
                    rest,
                    settings: settings.clone(),
                    used,
                });
                Step::Next { queue, settings }
            }
            Frame::Scalar { entries_before } => Step::Return {
                used: self.yielded > entries_before,
            },
        }
    }

    fn check_naming(&mut self, key: &str, value: &'a Value, holder: &PathLink<'a>, used: bool) {
        let kind = match (used, key.starts_with('_')) {
            (true, true) => WarningKind::Used,
            (false, false) => WarningKind::Unused,
            _ => return,
        };
        if self.warned.insert((kind, value as *const Value)) {
            self.warnings.push(Warning {
                kind,
                key: key.to_owned(),
                path: materialize_path(holder),
            });
        }
    }
}

/// A float written as Python's `repr` (and so `json.dumps`) writes it: the
/// shortest digits that read back to the same value, in positional notation
/// with at least one decimal (`100.0`, `0.0001`, `-0.0`) when the decimal
/// exponent is in `-4..16`, else as `1e-05`, `1.5e+16` (a sign and at least
/// two exponent digits). Non-finite values (which JSON values never hold) are
/// `NaN`, `Infinity` and `-Infinity`, as `json.dumps` writes them.
pub fn py_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits (`-1.5e-7`), but
    // breaks an exact tie between two such strings upwards where Python's
    // dtoa rounds to even (2^50 + 0.25: Python ...2.2, Rust ...2.3). The
    // correctly rounded string of that length, which `{:.Ne}` gives with ties
    // to even, round-trips whenever one of that length does.
    let shortest = format!("{value:e}");
    let length = shortest
        .split('e')
        .next()
        .map_or(1, |m| m.bytes().filter(u8::is_ascii_digit).count());
    let rounded = format!("{value:.*e}", length.saturating_sub(1));
    let sci = if rounded.parse::<f64>() == Ok(value) {
        rounded
    } else {
        shortest
    };
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let mut digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    while digits.len() > 1 && digits.ends_with('0') {
        digits.pop();
    }
    let mut out = String::from(sign);
    if (-4..16).contains(&exponent) {
        if exponent < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exponent as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        out.push_str(&format!("e{exp_sign}{:02}", exponent.unsigned_abs()));
    }
    out
}

/// A `serde_json` formatter that writes floats as Python's `json` does (see
/// [`py_float_repr`]); everything else is compact JSON as usual. Integers
/// already agree.
#[derive(Clone, Copy, Debug, Default)]
pub struct PyNumberFormatter;

impl serde_json::ser::Formatter for PyNumberFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(py_float_repr(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(writer, f64::from(value))
    }
}

/// Writes `value` as compact JSON with Python's float rendering.
pub fn to_writer_py<W: io::Write, T: ?Sized + Serialize>(
    writer: W,
    value: &T,
) -> serde_json::Result<()> {
    let mut serializer = serde_json::Serializer::with_formatter(writer, PyNumberFormatter);
    value.serialize(&mut serializer)
}

/// A JSON value as Python's `json.dumps` renders a number (strings, booleans
/// and null as compact JSON).
pub fn to_string_py(value: &Value) -> String {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => py_float_repr(f),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A string quoted exactly like Python's `json.dumps` (ASCII-only output).
struct PyJsonStr<'s>(&'s str);

impl fmt::Display for PyJsonStr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                '\u{8}' => f.write_str("\\b")?,
                '\u{c}' => f.write_str("\\f")?,
                ' '..='~' => f.write_char(c)?,
                _ => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        write!(f, "\\u{unit:04x}")?;
                    }
                }
            }
        }
        f.write_char('"')
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entries(matrix: Value) -> Vec<Value> {
        expand(&matrix)
            .expect("matrix expands")
            .entries
            .into_iter()
            .map(|e| Value::Object(e.into_iter().collect()))
            .collect()
    }

    fn warnings(matrix: Value) -> Vec<(WarningKind, String, String)> {
        expand(&matrix)
            .expect("matrix expands")
            .warnings
            .into_iter()
            .map(|w| (w.kind, w.key, w.path.to_string()))
            .collect()
    }

    fn no_key_path(matrix: Value) -> String {
        match expand(&matrix) {
            Err(MatrixError::NoKey { path }) => path.to_string(),
            Ok(p) => panic!("expected a NoKey error, got {p:?}"),
        }
    }

    fn key(k: &str) -> PathSegment {
        PathSegment::Key(k.to_owned())
    }

    #[test]
    fn keys_are_dimensions_in_sorted_order() {
        // The first sorted key varies slowest; "B" < "_" < "a" by code point.
        let got = entries(json!({"b": ["1", "2"], "a": ["x", "y"], "B": ["k"]}));
        assert_eq!(
            got,
            vec![
                json!({"B": "k", "a": "x", "b": "1"}),
                json!({"B": "k", "a": "x", "b": "2"}),
                json!({"B": "k", "a": "y", "b": "1"}),
                json!({"B": "k", "a": "y", "b": "2"}),
            ]
        );
    }

    #[test]
    fn code_point_order_not_utf16_order() {
        // U+FF5E (fullwidth tilde) < U+1F600 (emoji) by code point, although the
        // emoji's UTF-16 surrogates would sort first.
        let got = entries(json!({"\u{1F600}": ["1", "2"], "\u{FF5E}": ["a", "b"]}));
        assert_eq!(got[1], json!({"\u{FF5E}": "a", "\u{1F600}": "2"}));
    }

    #[test]
    fn nested_object_before_parents_remaining_keys() {
        // "a" holds an object; its keys come before the parent's "b", so "a.x"
        // varies slower than "b".
        let got = entries(json!({"_a": {"y": ["1", "2"], "x": ["p", "q"]}, "b": ["u", "v"]}));
        let order: Vec<(String, String, String)> = got
            .iter()
            .map(|e| {
                (
                    e["x"].as_str().unwrap().to_owned(),
                    e["y"].as_str().unwrap().to_owned(),
                    e["b"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let expected: Vec<(String, String, String)> = [
            ("p", "1", "u"),
            ("p", "1", "v"),
            ("p", "2", "u"),
            ("p", "2", "v"),
            ("q", "1", "u"),
            ("q", "1", "v"),
            ("q", "2", "u"),
            ("q", "2", "v"),
        ]
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
        assert_eq!(order, expected);
    }

    #[test]
    fn array_elements_are_alternatives_for_the_key() {
        assert_eq!(
            entries(json!({"t": ["float", "half", "int8_t"]})),
            vec![
                json!({"t": "float"}),
                json!({"t": "half"}),
                json!({"t": "int8_t"})
            ]
        );
    }

    #[test]
    fn nested_arrays_flatten() {
        assert_eq!(
            entries(json!({"v": [["1", ["2", "3"]], [], "4"]})),
            vec![
                json!({"v": "1"}),
                json!({"v": "2"}),
                json!({"v": "3"}),
                json!({"v": "4"})
            ]
        );
    }

    #[test]
    fn groups_expand_only_inside_the_group() {
        let got = entries(json!({
            "_data": [
                {"data_type": "float", "_out": [{"out": "f"}, {"out": "d"}]},
                {"data_type": "half", "_out": [{"out": "f"}]}
            ],
            "cap": ["1", "2"]
        }));
        assert_eq!(
            got,
            vec![
                json!({"cap": "1", "data_type": "float", "out": "f"}),
                json!({"cap": "2", "data_type": "float", "out": "f"}),
                json!({"cap": "1", "data_type": "float", "out": "d"}),
                json!({"cap": "2", "data_type": "float", "out": "d"}),
                json!({"cap": "1", "data_type": "half", "out": "f"}),
                json!({"cap": "2", "data_type": "half", "out": "f"}),
            ]
        );
    }

    #[test]
    fn later_setting_wins() {
        // "_g" is visited first and sets "k" = "inner"; the root's own "k" comes
        // later in sorted order and overrides it.
        assert_eq!(
            entries(json!({"_g": {"k": "inner"}, "k": ["outer"]})),
            vec![json!({"k": "outer"})]
        );
        // Within one array, each alternative sets the key afresh.
        assert_eq!(
            entries(json!({"_a": {"k": "first"}, "_b": {"k": ["second", "third"]}})),
            vec![json!({"k": "second"}), json!({"k": "third"})]
        );
    }

    #[test]
    fn empty_array_yields_nothing() {
        assert!(entries(json!({"a": ["1", "2"], "b": []})).is_empty());
        assert!(entries(json!([])).is_empty());
        // Only the branch with the empty array is empty.
        assert_eq!(
            entries(json!({"_g": [{"a": "1", "b": []}, {"a": "2"}]})),
            vec![json!({"a": "2"})]
        );
    }

    #[test]
    fn empty_object_yields_one_empty_entry() {
        assert_eq!(entries(json!({})), vec![json!({})]);
        assert_eq!(entries(json!([{}, {}])), vec![json!({}), json!({})]);
    }

    #[test]
    fn duplicates_are_kept() {
        assert_eq!(
            entries(json!({"a": ["x", "x"], "b": ["y"]})),
            vec![json!({"a": "x", "b": "y"}), json!({"a": "x", "b": "y"})]
        );
    }

    #[test]
    fn scalar_types_are_kept() {
        let matrix: Value =
            serde_json::from_str(r#"{"v": [1, 1.0, -2, 2.5, true, false, null, "1"]}"#).unwrap();
        let product = expand(&matrix).unwrap();
        let values: Vec<&Value> = product.entries.iter().map(|e| &e["v"]).collect();
        let expected: Vec<Value> =
            serde_json::from_str(r#"[1, 1.0, -2, 2.5, true, false, null, "1"]"#).unwrap();
        assert_eq!(values, expected.iter().collect::<Vec<_>>());
        assert!(values[0].is_u64());
        assert!(values[1].is_f64());
        assert!(values[2].is_i64());
        assert_eq!(
            serde_json::to_string(&product.entries).unwrap(),
            r#"[{"v":1},{"v":1.0},{"v":-2},{"v":2.5},{"v":true},{"v":false},{"v":null},{"v":"1"}]"#
        );
    }

    #[test]
    fn no_key_error_names_the_path() {
        assert_eq!(no_key_path(json!("x")), "root");
        assert_eq!(no_key_path(json!(null)), "root");
        assert_eq!(no_key_path(json!([1])), "root[0]");
        assert_eq!(no_key_path(json!([[1]])), "root[0][0]");
        // Reached even after a successful branch and after an empty one.
        assert_eq!(no_key_path(json!([{"a": "1"}, [], [[], 3]])), "root[2][1]");
        let err = expand(&json!([[1]])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "leaf value at root[0][0] has no object key above it"
        );
    }

    #[test]
    fn used_warning_for_underscore_key_that_reaches_a_leaf() {
        assert_eq!(
            warnings(json!({"a": {"_x": ["1", "2"]}, "__b": "3"})),
            vec![
                (WarningKind::Used, "_x".to_owned(), "root[\"a\"]".to_owned()),
                // "a" holds only an object: it is unused and unprefixed.
                (WarningKind::Unused, "a".to_owned(), "root".to_owned()),
                // "__b" sorts first, so its item finishes last.
                (WarningKind::Used, "__b".to_owned(), "root".to_owned()),
            ]
        );
    }

    #[test]
    fn unused_warning_for_grouping_key_without_underscore() {
        assert_eq!(
            warnings(json!({"g": [{"y": "1"}, {"y": "2"}], "_h": [{"z": "3"}]})),
            vec![(WarningKind::Unused, "g".to_owned(), "root".to_owned())]
        );
        // An array counts as used if any element reached a leaf.
        assert!(warnings(json!({"g": [{"y": "1"}, "2"]})).is_empty());
        // Keys inside groups carry the path of their object.
        assert_eq!(
            warnings(json!({"_g": [{"_y": "1"}]})),
            vec![(
                WarningKind::Used,
                "_y".to_owned(),
                "root[\"_g\"][0]".to_owned()
            )]
        );
    }

    #[test]
    fn scalar_with_empty_downstream_counts_as_unused() {
        // "a" reaches a leaf, but the later empty array "b" makes its downstream
        // yield nothing, so the reference counts "a" (and "b") as unused; "_c"
        // is then not reported as used either.
        assert_eq!(
            warnings(json!({"a": "1", "b": [], "_c": "2"})),
            vec![
                (WarningKind::Unused, "b".to_owned(), "root".to_owned()),
                (WarningKind::Unused, "a".to_owned(), "root".to_owned()),
            ]
        );
        // Per object: "a" in the first group only feeds an empty branch, the
        // "a" in the second group is used.
        assert_eq!(
            warnings(json!({"_g": [{"a": "1", "b": []}, {"a": "2"}]})),
            vec![
                (
                    WarningKind::Unused,
                    "b".to_owned(),
                    "root[\"_g\"][0]".to_owned()
                ),
                (
                    WarningKind::Unused,
                    "a".to_owned(),
                    "root[\"_g\"][0]".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn warnings_are_deduplicated_in_first_emission_order() {
        // "g" and "h" are reached once per alternative of "_a" (emitted each
        // time by the reference); each appears once. Later items finish first,
        // so "h" (sorted after "g") is emitted before "g".
        let got = warnings(json!({"_a": ["1", "2", "3"], "g": {"_k": "x"}, "h": {"m": "y"}}));
        assert_eq!(
            got,
            vec![
                (WarningKind::Unused, "h".to_owned(), "root".to_owned()),
                (WarningKind::Used, "_k".to_owned(), "root[\"g\"]".to_owned()),
                (WarningKind::Unused, "g".to_owned(), "root".to_owned()),
                (WarningKind::Used, "_a".to_owned(), "root".to_owned()),
            ]
        );
        // The same key name in different objects is reported per object.
        let got = warnings(json!({"_g": [{"x": {"_k": "1"}}, {"x": {"_k": "2"}}]}));
        assert_eq!(
            got,
            vec![
                (
                    WarningKind::Used,
                    "_k".to_owned(),
                    "root[\"_g\"][0][\"x\"]".to_owned()
                ),
                (
                    WarningKind::Unused,
                    "x".to_owned(),
                    "root[\"_g\"][0]".to_owned()
                ),
                (
                    WarningKind::Used,
                    "_k".to_owned(),
                    "root[\"_g\"][1][\"x\"]".to_owned()
                ),
                (
                    WarningKind::Unused,
                    "x".to_owned(),
                    "root[\"_g\"][1]".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn used_warning_wording() {
        let w = Warning {
            kind: WarningKind::Used,
            key: "__x".to_owned(),
            path: JsonPath(vec![key("a")]),
        };
        assert_eq!(
            w.to_string(),
            "Key \"__x\" at root[\"a\"] is used in a matrix product entry even though it \
             begins with \"__\". Consider renaming it to \"x\" to indicate this."
        );
    }

    #[test]
    fn unused_warning_wording() {
        let w = Warning {
            kind: WarningKind::Unused,
            key: "y".to_owned(),
            path: JsonPath(vec![key("_g"), PathSegment::Index(0)]),
        };
        assert_eq!(
            w.to_string(),
            "Key \"y\" at root[\"_g\"][0] is never used in a matrix product entry and is \
             used only for grouping. Consider renaming it to \"_y\" to indicate this."
        );
        assert_eq!(
            serde_json::to_string(&w).unwrap(),
            r#"{"kind":"unused","key":"y","path":["_g",0]}"#
        );
    }

    #[test]
    fn path_display_quotes_like_python_json_dumps() {
        assert_eq!(JsonPath::default().to_string(), "root");
        let path = JsonPath(vec![
            key("_g"),
            PathSegment::Index(12),
            key("q\"b\\s\n\t\u{1}\u{7f}é\u{1F600}"),
        ]);
        assert_eq!(
            path.to_string(),
            r#"root["_g"][12]["q\"b\\s\n\t\u0001\u007f\u00e9\ud83d\ude00"]"#
        );
        assert_eq!(PathSegment::Index(3).to_string(), "[3]");
        assert_eq!(key("a").to_string(), "[\"a\"]");
        assert_eq!(serde_json::to_string(&path.0[..2]).unwrap(), r#"["_g",12]"#);
    }

    #[test]
    fn product_serializes_as_entries_and_warnings() {
        let product = expand(&json!({"_a": "1"})).unwrap();
        assert_eq!(
            serde_json::to_string(&product).unwrap(),
            r#"{"entries":[{"_a":"1"}],"warnings":[{"kind":"used","key":"_a","path":[]}]}"#
        );
    }

    #[test]
    fn file_errors_are_one_line_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("fraglink-matrix-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ok = write("ok.json", r#"{"a": ["1", "2"]}"#);
        assert_eq!(expand_file(&ok).unwrap().entries.len(), 2);

        let bad = write("bad.json", "{\n  \"a\": [1,\n}");
        let err = expand_file(&bad).unwrap_err();
        assert!(
            matches!(
                err,
                MatrixFileError::Parse {
                    line: 3,
                    column: 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("{}:3:1: invalid JSON: expected value", bad.display())
        );

        let no_key = write("nokey.json", r#"[{"a": "1"}, ["x"]]"#);
        let err = expand_file(&no_key).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: leaf value at root[1][0] has no object key above it",
                no_key.display()
            )
        );

        let missing = dir.join("missing.json");
        let err = expand_file(&missing).unwrap_err();
        assert!(matches!(err, MatrixFileError::Read { .. }));
        assert!(err
            .to_string()
            .starts_with(&format!("{}: cannot read matrix file: ", missing.display())));

        for err in [
            expand_file(&bad),
            expand_file(&no_key),
            expand_file(&missing),
        ] {
            assert!(!err.unwrap_err().to_string().contains('\n'));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn large_products_expand_without_deep_recursion() {
        // 3^10 entries, and a 20_000-key object (a long queue).
        let dims: serde_json::Map<String, Value> = (0..10)
            .map(|i| (format!("k{i}"), json!(["a", "b", "c"])))
            .collect();
        assert_eq!(expand(&Value::Object(dims)).unwrap().entries.len(), 59_049);
        let wide: serde_json::Map<String, Value> = (0..20_000)
            .map(|i| (format!("k{i:05}"), json!("v")))
            .collect();
        let product = expand(&Value::Object(wide)).unwrap();
        assert_eq!(product.entries.len(), 1);
        assert_eq!(product.entries[0].len(), 20_000);
    }

    // -- Limits, streaming, reading and numbers (issue 12). --

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "fraglink-matrix-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn size(matrix: Value) -> ProductSize {
        product_size(&matrix).expect("sized")
    }

    #[test]
    fn product_size_counts_entries_values_and_steps() {
        assert_eq!(size(json!({})).entries, 1);
        assert_eq!(size(json!([])).entries, 0);
        let s = size(json!({"a": ["1", "2", "3"], "b": ["x", "y"]}));
        assert_eq!((s.entries, s.values), (6, 12));
        // Overridden settings count as values: "k" is set twice per entry.
        let s = size(json!({"_g": {"k": "inner"}, "k": ["a", "b"]}));
        assert_eq!((s.entries, s.values), (2, 4));
        // Every matrix of the engine tests: the count is the product's length
        // and bounds its key/value pairs.
        for matrix in [
            json!({"b": ["1", "2"], "a": ["x", "y"], "B": ["k"]}),
            json!({"_a": {"y": ["1", "2"], "x": ["p", "q"]}, "b": ["u", "v"]}),
            json!({"v": [["1", ["2", "3"]], [], "4"]}),
            json!({"_data": [
                {"data_type": "float", "_out": [{"out": "f"}, {"out": "d"}]},
                {"data_type": "half", "_out": [{"out": "f"}]}
            ], "cap": ["1", "2"]}),
            json!({"_g": [{"a": "1", "b": []}, {"a": "2"}]}),
            json!([{}, {}, {"a": [1, 2, [3, {"b": [4, 5]}]]}]),
        ] {
            let product = expand(&matrix).unwrap();
            let s = size(matrix.clone());
            assert_eq!(s.entries, product.entries.len() as u128, "{matrix}");
            let pairs: usize = product.entries.iter().map(Entry::len).sum();
            assert!(s.values >= pairs as u128, "{matrix}");
            assert!(s.steps > s.entries, "{matrix}");
        }
    }

    #[test]
    fn product_size_saturates_instead_of_overflowing() {
        // 2^200 entries: far past u128, computed without allocating.
        let dims: serde_json::Map<String, Value> = (0..200)
            .map(|i| (format!("k{i:03}"), json!([0, 1])))
            .collect();
        let s = size(Value::Object(dims.clone()));
        assert_eq!(
            (s.entries, s.values, s.steps),
            (u128::MAX, u128::MAX, u128::MAX)
        );
        // A zero factor still makes the product empty.
        let mut with_empty = dims;
        with_empty.insert("zz".into(), json!([]));
        assert_eq!(size(Value::Object(with_empty)).entries, 0);
    }

    #[test]
    fn product_size_finds_the_keyless_leaf_the_expansion_would() {
        for matrix in [
            json!("x"),
            json!([1]),
            json!([[1]]),
            json!([{"a": "1"}, [], [[], 3]]),
            json!([{"a": ["1", "2"]}, [{"b": "2"}, "x"]]),
        ] {
            let MatrixError::NoKey { path } = product_size(&matrix).unwrap_err();
            assert_eq!(path.to_string(), no_key_path(matrix.clone()), "{matrix}");
        }
    }

    #[test]
    fn expand_each_streams_and_stops_on_request() {
        let matrix = json!({"a": ["1", "2", "3"], "b": ["x", "y"]});
        let mut seen = Vec::new();
        let warnings = expand_each(&matrix, |entry| {
            seen.push(entry);
            if seen.len() == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert!(warnings.is_empty());
        assert_eq!(seen, expand(&matrix).unwrap().entries[..4]);
        // A keyless leaf after a yielding branch: an error before any entry.
        let mut count = 0;
        let err = expand_each(&json!([{"a": "1"}, "x"]), |_| {
            count += 1;
            ControlFlow::Continue(())
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "leaf value at root[1] has no object key above it"
        );
        assert_eq!(count, 0);
    }

    #[test]
    fn products_over_the_limit_are_refused_before_expanding() {
        let dir = temp_dir("limit");
        let path = dir.join("m.json");
        // 12 keys x 10 values: 10^12 entries, which used to grow until OOM.
        let dims: serde_json::Map<String, Value> = (0..12)
            .map(|i| (format!("k{i:02}"), json!((0..10).collect::<Vec<_>>())))
            .collect();
        std::fs::write(&path, Value::Object(dims).to_string()).unwrap();
        let err = load_file_with(&path, &Limits::default()).unwrap_err();
        assert!(matches!(err, MatrixFileError::TooLarge { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "{}: the matrix product has 1000000000000 entries, more than the limit of \
                 100000 (set FRAGLINK_MATRIX_MAX_ENTRIES to raise it)",
                path.display()
            )
        );

        // Exactly at the limit is fine; one over is not.
        std::fs::write(&path, r#"{"a": [1, 2, 3], "b": [1, 2]}"#).unwrap();
        let at = load_file_with(&path, &Limits { max_entries: 6 }).unwrap();
        assert_eq!(at.size().entries, 6);
        assert_eq!(at.expand().unwrap().entries.len(), 6);
        let err = load_file_with(&path, &Limits { max_entries: 5 }).unwrap_err();
        assert!(
            err.to_string()
                .contains("has 6 entries, more than the limit of 5"),
            "{err}"
        );

        // Beyond u128: the size is still reported.
        let dims: serde_json::Map<String, Value> = (0..200)
            .map(|i| (format!("k{i:03}"), json!([0, 1])))
            .collect();
        std::fs::write(&path, Value::Object(dims).to_string()).unwrap();
        let err = load_file_with(&path, &Limits::default()).unwrap_err();
        assert!(
            err.to_string().contains("has more than 10^38 entries"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn expansions_that_cost_too_much_are_refused() {
        let dir = temp_dir("cost");
        let path = dir.join("m.json");
        // No entry at all, but 10^9 branches before the empty array.
        let thousand: Vec<u32> = (0..1000).collect();
        let matrix = json!({"a": thousand, "b": thousand, "c": thousand, "z": []});
        std::fs::write(&path, matrix.to_string()).unwrap();
        let err = load_file_with(&path, &Limits::default()).unwrap_err();
        let MatrixFileError::TooLarge { size, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(size.entries, 0);
        assert!(size.steps > 1_000_000_000, "{size:?}");
        assert!(
            err.to_string().contains(
                "steps for its 0 entries (0 values in all), more than the limit of 6400000 \
                 (64 per allowed entry, FRAGLINK_MATRIX_MAX_ENTRIES=100000"
            ),
            "{err}"
        );
        // Few entries, very many keys each: 10 x 10,000 values.
        let wide: serde_json::Map<String, Value> = (0..10_000)
            .map(|i| (format!("k{i:05}"), json!("v")))
            .collect();
        let matrix = json!({"_w": wide, "n": (0..10).collect::<Vec<_>>()});
        std::fs::write(&path, matrix.to_string()).unwrap();
        assert!(load_file_with(&path, &Limits::default()).is_ok());
        let err = load_file_with(&path, &Limits { max_entries: 1_000 }).unwrap_err();
        assert!(err.to_string().contains("(100010 values in all)"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cuvs_matrices_are_far_below_the_limits() {
        // The real matrices: at most 218 entries and a cost of a few thousand,
        // against 10^5 entries and 64 * 10^5 by default.
        let dir = std::env::var_os("FRAGLINK_TESTDATA")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata"))
            .join("cuvs-matrices");
        let Ok(files) = std::fs::read_dir(&dir) else {
            return; // no test data here: tests/matrix_conformance.rs reports it
        };
        for file in files {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let m = load_file_with(&path, &Limits::default()).unwrap();
                let size = m.size();
                assert!(
                    size.entries * 400 <= u128::from(DEFAULT_MAX_ENTRIES),
                    "{size:?}"
                );
                assert!(
                    size.cost() * 1000 <= Limits::default().max_cost(),
                    "{size:?}"
                );
            }
        }
    }

    #[test]
    fn oversized_files_are_not_read() {
        let dir = temp_dir("big");
        let path = dir.join("big.json");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap(); // sparse: no disk used
        drop(file);
        let err = load_file_with(&path, &Limits::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: the matrix file is larger than 16777216 bytes (16 MiB), the most fraglink \
                 reads (it has 16777217)",
                path.display()
            )
        );
        // A device of endless zeros is cut off at the limit, not read to the end.
        if Path::new("/dev/zero").exists() {
            let err = load_file_with(Path::new("/dev/zero"), &Limits::default()).unwrap_err();
            assert!(
                matches!(err, MatrixFileError::TooBig { bytes: None, .. }),
                "{err:?}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn load_text(text: &[u8]) -> Result<MatrixFile, MatrixFileError> {
        let dir = temp_dir("text");
        let path = dir.join("m.json");
        std::fs::write(&path, text).unwrap();
        let result = load_file_with(&path, &Limits::default());
        std::fs::remove_dir_all(&dir).unwrap();
        result
    }

    fn message_after_path(err: MatrixFileError) -> String {
        let text = err.to_string();
        text.split_once("m.json")
            .map(|(_, rest)| rest.to_owned())
            .unwrap_or(text)
    }

    #[test]
    fn byte_order_mark_is_rejected_by_name_as_python_does() {
        let err = load_text(b"\xef\xbb\xbf{\"a\": \"1\"}").unwrap_err();
        assert!(matches!(
            err,
            MatrixFileError::Parse {
                line: 1,
                column: 1,
                ..
            }
        ));
        assert_eq!(
            message_after_path(err),
            ":1:1: invalid JSON: unexpected UTF-8 byte-order mark (U+FEFF) at the start of the \
             file; save it as UTF-8 without a BOM (cuVS's Python json.load rejects it too)"
        );
        // Anywhere else, U+FEFF is an ordinary character of a string.
        let m = load_text("{\"a\": \"\u{feff}x\"}".as_bytes()).unwrap();
        assert_eq!(m.expand().unwrap().entries[0]["a"], json!("\u{feff}x"));
    }

    #[test]
    fn invalid_utf8_names_its_position() {
        let err = load_text(b"{\n  \"a\": \"\xff\"}").unwrap_err();
        assert_eq!(
            message_after_path(err),
            ":2:9: invalid JSON: invalid UTF-8 (byte 0xff); matrix files are UTF-8"
        );
    }

    #[test]
    fn numbers_are_read_as_python_reads_them() {
        let m = load_text(br#"{"v": [-0, -0.0, 0, -0e0, -1, 12345678901234567890, 18446744073709551615, -9223372036854775808, "-0"]}"#)
            .unwrap();
        let values: Vec<Value> = m
            .expand()
            .unwrap()
            .entries
            .into_iter()
            .map(|e| e["v"].clone())
            .collect();
        // `-0` is Python's int 0; `-0.0` and `-0e0` stay floats.
        assert!(values[0].is_u64() && values[0] == json!(0));
        assert!(values[1].is_f64() && values[1].as_f64().unwrap().is_sign_negative());
        assert!(values[3].is_f64());
        assert_eq!(values[5], json!(12345678901234567890u64));
        assert_eq!(values[6], json!(u64::MAX));
        assert_eq!(values[7], json!(i64::MIN));
        assert_eq!(values[8], json!("-0"));
        let mut out = Vec::new();
        to_writer_py(&mut out, &values).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"[0,-0.0,0,-0.0,-1,12345678901234567890,18446744073709551615,-9223372036854775808,"-0"]"#
        );
    }

    #[test]
    fn integers_beyond_64_bits_are_refused_not_rounded() {
        for (text, column) in [
            (r#"{"v": 18446744073709551616}"#, 7),
            (r#"{"v": [1, -9223372036854775809]}"#, 11),
            (
                r#"{"s": "123456789012345678901234567890", "v": 123456789012345678901234567890}"#,
                46,
            ),
        ] {
            let err = load_text(text.as_bytes()).unwrap_err();
            assert!(
                matches!(err, MatrixFileError::Unsupported { line: 1, .. }),
                "{err:?}"
            );
            let message = message_after_path(err);
            assert!(
                message.starts_with(&format!(":1:{column}: integer ")),
                "{message}"
            );
            assert!(
                message.ends_with(
                    "does not fit in 64 bits; cuVS's Python keeps it exact but fraglink \
                     cannot (write it as a string)"
                ),
                "{message}"
            );
        }
        // A huge literal is shortened in the message.
        let digits = "9".repeat(300);
        let err = load_text(format!("{{\"v\": {digits}}}").as_bytes()).unwrap_err();
        assert!(message_after_path(err)
            .contains(&format!("integer {}… (300 characters)", &digits[..30])));
    }

    #[test]
    fn infinite_numbers_are_refused_with_a_reason() {
        let err = load_text(br#"{"v": 1e400}"#).unwrap_err();
        let message = message_after_path(err);
        assert!(message.starts_with(":1:"), "{message}");
        assert!(
            message.ends_with(
                "invalid JSON: number out of range (beyond ±1.8e308; Python would read it as \
                 Infinity, which fraglink cannot represent)"
            ),
            "{message}"
        );
    }

    #[test]
    fn integer_literal_scan_skips_strings_and_floats() {
        let text =
            r#"{"a\"-0": "-0 99999999999999999999", "b": [-0, -0.5, 1e30, -00.0, 3], "c": -0}"#;
        let found = scan_integer_literals(text);
        assert_eq!(found.too_wide, None);
        assert_eq!(found.negative_zeros.len(), 2);
        for at in found.negative_zeros {
            assert_eq!(&text[at..at + 2], "-0");
        }
        let found =
            scan_integer_literals(r#"[1, "x", 99999999999999999999, 99999999999999999999]"#);
        assert_eq!(found.too_wide, Some(9..29));
    }

    #[test]
    fn floats_render_like_python_repr() {
        // Expected strings from Python 3.11: json.dumps(float(x)).
        for (value, python) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1234567890123456.7, "1234567890123456.8"),
            (0.0001, "0.0001"),
            (0.00012345, "0.00012345"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (5e-324, "5e-324"),
            (2.2250738585072014e-308, "2.2250738585072014e-308"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-1.7976931348623157e308, "-1.7976931348623157e+308"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (-2.5e-5, "-2.5e-05"),
            (9007199254740993.0, "9007199254740992.0"),
            (1e22, "1e+22"),
            (1e100, "1e+100"),
            (123.456, "123.456"),
            (-0.000123, "-0.000123"),
            // Ties between two shortest strings go to even, as in Python.
            (-(2f64.powi(50) + 0.25), "-1125899906842624.2"),
            (2f64.powi(46) + 0.125, "70368744177664.12"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(py_float_repr(value), python, "{value:e}");
        }
        assert_eq!(to_string_py(&json!(1.5e-7)), "1.5e-07");
        assert_eq!(to_string_py(&json!(7)), "7");
        assert_eq!(to_string_py(&json!("s")), "\"s\"");
    }
}
