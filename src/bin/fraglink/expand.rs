//! `fraglink expand`: a matrix file's product, as a table or as JSON.
//!
//! The file is checked before anything is written (size, JSON, keyless
//! leaves, the product limit of `FRAGLINK_MATRIX_MAX_ENTRIES`), then the
//! product is streamed: memory stays bounded by the document, whatever the
//! number of entries. The table needs its column widths first, so it expands
//! the matrix twice (once to measure, once to write).

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

use fraglink::build::matrix::{self, load_file, Entry, MatrixFile, MatrixFileError, Warning};
use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct ExpandArgs {
    /// Matrix JSON file.
    pub file: PathBuf,
    /// Print machine-readable JSON: `{"entries":[...],"warnings":[...]}`.
    #[arg(long)]
    pub json: bool,
}

/// Why writing the product stopped.
enum Failure {
    Matrix(MatrixFileError),
    Output(io::Error),
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Self {
        Failure::Output(err)
    }
}

impl From<MatrixFileError> for Failure {
    fn from(err: MatrixFileError) -> Self {
        Failure::Matrix(err)
    }
}

/// Exit codes: 0 success (warnings included), 1 output failure, 2 bad input.
pub fn run(args: &ExpandArgs) -> ExitCode {
    let matrix = match load_file(&args.file) {
        Ok(matrix) => matrix,
        Err(err) => {
            // The error names the file itself, and the JSON path or line:column.
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let written = if args.json {
        write_json(&matrix)
    } else {
        write_table(&matrix)
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not worth a message.
        Err(Failure::Output(err)) if err.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(Failure::Output(err)) => {
            eprintln!("error: writing output: {err}");
            ExitCode::from(1)
        }
        Err(Failure::Matrix(err)) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

/// Generates the entries into `write`, stopping at the first write error,
/// which is returned; otherwise the matrix's warnings.
fn write_each(
    matrix: &MatrixFile,
    mut write: impl FnMut(Entry) -> io::Result<()>,
) -> Result<Vec<Warning>, Failure> {
    let mut failed = None;
    let warnings = matrix.for_each_entry(|entry| match write(entry) {
        Ok(()) => ControlFlow::Continue(()),
        Err(err) => {
            failed = Some(err);
            ControlFlow::Break(())
        }
    })?;
    match failed {
        Some(err) => Err(err.into()),
        None => Ok(warnings),
    }
}

/// Streams `{"entries":[...],"warnings":[...]}` on one line, floats written
/// as Python's `json` writes them.
fn write_json(matrix: &MatrixFile) -> Result<(), Failure> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    out.write_all(b"{\"entries\":[")?;
    let mut first = true;
    let warnings = write_each(matrix, |entry| {
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        matrix::to_writer_py(&mut out, &entry).map_err(io::Error::from)
    })?;
    out.write_all(b"],\"warnings\":")?;
    matrix::to_writer_py(&mut out, &warnings).map_err(io::Error::from)?;
    out.write_all(b"}\n")?;
    out.flush()?;
    Ok(())
}

fn write_table(matrix: &MatrixFile) -> Result<(), Failure> {
    // First pass: the columns and their widths.
    let mut table = Table::default();
    let warnings = matrix.for_each_entry(|entry| {
        table.measure(&entry);
        ControlFlow::Continue(())
    })?;
    for warning in &warnings {
        eprintln!("warning: {warning}");
    }
    // Second pass: the rows, as they are generated.
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut line = String::new();
    table.write_header(&mut out, &mut line)?;
    write_each(matrix, |entry| table.write_row(&mut out, &mut line, &entry))?;
    table.write_footer(&mut out)?;
    out.flush()?;
    Ok(())
}

/// The table's layout. Columns are the union of keys in first-seen order
/// (each entry's keys are sorted); strings print bare, other scalars as JSON
/// (floats as Python writes them), absent keys as blanks. Cells are padded
/// to the widest cell of their column, counted in chars; lines lose their
/// trailing whitespace.
#[derive(Default)]
struct Table {
    columns: Vec<String>,
    index: HashMap<String, usize>,
    widths: Vec<usize>,
    entries: u64,
}

impl Table {
    fn measure(&mut self, entry: &Entry) {
        self.entries += 1;
        for (key, value) in entry {
            let column = match self.index.get(key.as_str()) {
                Some(&column) => column,
                None => {
                    let column = self.columns.len();
                    self.index.insert(key.clone(), column);
                    self.columns.push(key.clone());
                    self.widths.push(key.chars().count());
                    column
                }
            };
            let width = cell(value).chars().count();
            if width > self.widths[column] {
                self.widths[column] = width;
            }
        }
    }

    fn write_header(&self, out: &mut impl Write, line: &mut String) -> io::Result<()> {
        if self.columns.is_empty() {
            return Ok(());
        }
        let cells = self.columns.iter().map(|c| Cow::Borrowed(c.as_str()));
        self.write_line(out, line, cells.enumerate())
    }

    fn write_row(&self, out: &mut impl Write, line: &mut String, entry: &Entry) -> io::Result<()> {
        if self.columns.is_empty() {
            return Ok(());
        }
        // Every key was seen by `measure`; the same expansion runs again.
        let mut cells: Vec<(usize, Cow<'_, str>)> = entry
            .iter()
            .filter_map(|(key, value)| Some((*self.index.get(key.as_str())?, cell(value))))
            .collect();
        cells.sort_unstable_by_key(|&(column, _)| column);
        self.write_line(out, line, cells.into_iter())
    }

    /// Writes one line from `(column, text)` cells in column order; missing
    /// columns are blank. Padding is pushed as spaces, never with a format
    /// width (those stop at 65,535), and costs only what is written.
    fn write_line<'c>(
        &self,
        out: &mut impl Write,
        line: &mut String,
        cells: impl Iterator<Item = (usize, Cow<'c, str>)>,
    ) -> io::Result<()> {
        line.clear();
        let mut next = 0;
        // Spaces the last cell written still needs to reach its width.
        let mut owed = 0;
        for (column, text) in cells {
            push_spaces(line, owed);
            for blank in next..column {
                if blank > 0 {
                    line.push_str("  ");
                }
                push_spaces(line, self.widths.get(blank).copied().unwrap_or(0));
            }
            if column > 0 {
                line.push_str("  ");
            }
            line.push_str(&text);
            let width = self.widths.get(column).copied().unwrap_or(0);
            owed = width.saturating_sub(text.chars().count());
            next = column + 1;
        }
        // The last cell's padding would be trimmed: it is never pushed.
        out.write_all(line.trim_end().as_bytes())?;
        out.write_all(b"\n")
    }

    fn write_footer(&self, out: &mut impl Write) -> io::Result<()> {
        let n = self.entries;
        writeln!(out, "{n} {}", if n == 1 { "entry" } else { "entries" })
    }
}

fn push_spaces(line: &mut String, n: usize) {
    line.extend(std::iter::repeat_n(' ', n));
}

fn cell(value: &Value) -> Cow<'_, str> {
    match value {
        Value::String(s) if !s.is_empty() && !s.chars().any(char::is_control) => Cow::Borrowed(s),
        // Empty or control-character strings would break the table: quote them.
        other => Cow::Owned(matrix::to_string_py(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    /// The table of `entries`, as `write_table` writes it.
    fn render_table(entries: &[Entry]) -> String {
        let mut table = Table::default();
        for entry in entries {
            table.measure(entry);
        }
        let mut out = Vec::new();
        let mut line = String::new();
        table.write_header(&mut out, &mut line).unwrap();
        for entry in entries {
            table.write_row(&mut out, &mut line, entry).unwrap();
        }
        table.write_footer(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn table_aligns_union_of_columns() {
        let entries = vec![
            entry(json!({"b": "float", "a": 1})),
            entry(json!({"c": null, "a": 22})),
        ];
        assert_eq!(
            render_table(&entries),
            "a   b      c\n1   float\n22         null\n2 entries\n"
        );
    }

    #[test]
    fn table_of_empty_products() {
        assert_eq!(render_table(&[]), "0 entries\n");
        assert_eq!(render_table(&[Entry::new()]), "1 entry\n");
        // An empty entry among others is an empty line.
        assert_eq!(
            render_table(&[entry(json!({"a": "x"})), Entry::new()]),
            "a\nx\n\n2 entries\n"
        );
    }

    #[test]
    fn table_blank_cells_and_trailing_whitespace() {
        // Blank columns before a cell are padded; trailing whitespace goes,
        // a whitespace-only last cell included.
        let entries = vec![
            entry(json!({"a": "1", "b": "22", "c": "333"})),
            entry(json!({"c": "x"})),
            entry(json!({"a": "y ", "b": " "})),
            entry(json!({"b": "", "c": "\t"})),
        ];
        assert_eq!(
            render_table(&entries),
            "a   b   c\n1   22  333\n        x\ny\n    \"\"  \"\\t\"\n4 entries\n"
        );
    }

    #[test]
    fn table_cells_wider_than_a_format_width() {
        // Format widths stop at 65,535 (a panic beyond); padding does not.
        let long = "v".repeat(70_000);
        let key = "k".repeat(66_000);
        let entries = vec![
            entry(json!({"a": long, &key: "1"})),
            entry(json!({"a": "short", &key: "2"})),
        ];
        let table = render_table(&entries);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], format!("a{}  {key}", " ".repeat(69_999)));
        assert_eq!(lines[1], format!("{long}  1"));
        assert_eq!(lines[2], format!("short{}  2", " ".repeat(69_995)));
    }

    #[test]
    fn table_is_linear_in_the_number_of_keys() {
        // 100,000 keys: one column each. Quadratic column bookkeeping took
        // tens of seconds here; this takes a fraction of a second.
        let wide: serde_json::Map<String, Value> = (0..100_000)
            .map(|i| (format!("k{i:06}"), json!(i)))
            .collect();
        let entries = vec![
            entry(Value::Object(wide.clone())),
            entry(Value::Object(wide)),
        ];
        let started = std::time::Instant::now();
        let table = render_table(&entries);
        assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("k000000  k000001  "));
        assert!(lines[1].starts_with("0        1        2  "));
        assert!(lines[1].ends_with("  99999"));
    }

    #[test]
    fn table_numbers_render_like_python() {
        let entries: Vec<Entry> = serde_json::from_str(
            r#"[{"v": 1.5e-7}, {"v": 1e16}, {"v": 0.00001}, {"v": -0.0}, {"v": 12345678901234567890}]"#,
        )
        .unwrap();
        assert_eq!(
            render_table(&entries),
            "v\n1.5e-07\n1e+16\n1e-05\n-0.0\n12345678901234567890\n5 entries\n"
        );
    }
}
