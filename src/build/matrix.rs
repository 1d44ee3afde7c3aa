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
//! This file is also compiled into `build.rs` through `#[path]`, so it may only
//! use `std`, `serde`, `serde_json` and `thiserror`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io;
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

/// Why a matrix file has no product. Each message is one line naming the file.
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
    /// The file is not valid JSON.
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
    /// A scalar leaf with no object key above it.
    #[error("{}: leaf value at {json_path} has no object key above it", .path.display())]
    NoKey {
        /// The matrix file.
        path: PathBuf,
        /// Where the leaf is in the document.
        json_path: JsonPath,
    },
}

/// Reads, parses and expands a matrix file.
pub fn expand_file(path: &Path) -> Result<Product, MatrixFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| MatrixFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let matrix: Value = serde_json::from_str(&text).map_err(|err| {
        let (line, column) = (err.line(), err.column());
        let full = err.to_string();
        let suffix = format!(" at line {line} column {column}");
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
        MatrixFileError::Parse {
            path: path.to_path_buf(),
            line,
            column,
            message,
        }
    })?;
    expand(&matrix).map_err(|err| match err {
        MatrixError::NoKey { path: json_path } => MatrixFileError::NoKey {
            path: path.to_path_buf(),
            json_path,
        },
    })
}

/// Expands a matrix into its product (entries and naming warnings).
pub fn expand(matrix: &Value) -> Result<Product, MatrixError> {
    Expander::default().run(matrix)
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
    Scalar { entries_before: usize },
}

#[derive(Default)]
struct Expander<'a> {
    entries: Vec<Entry>,
    warnings: Vec<Warning>,
    /// (kind, identity of the key's value node): a node has exactly one path,
    /// so this dedupes exactly like (kind, key, path).
    warned: HashSet<(WarningKind, *const Value)>,
    stack: Vec<Frame<'a>>,
}

impl<'a> Expander<'a> {
    fn run(mut self, matrix: &'a Value) -> Result<Product, MatrixError> {
        let mut step = Step::Process {
            item: Item {
                path: None,
                key: None,
                value: matrix,
            },
            rest: None,
            settings: None,
        };
        loop {
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
        Ok(Product {
            entries: self.entries,
            warnings: self.warnings,
        })
    }

    fn next(&mut self, queue: Queue<'a>, settings: Settings<'a>) -> Step<'a> {
        let Some(node) = queue else {
            self.entries.push(build_entry(&settings));
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
                    entries_before: self.entries.len(),
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
                used: self.entries.len() > entries_before,
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
}
