//! `fraglink expand`: a matrix file's product, as a table or as JSON.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use fraglink::build::matrix::{expand_file, Entry, Product};
use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct ExpandArgs {
    /// Matrix JSON file.
    pub file: PathBuf,
    /// Print machine-readable JSON: `{"entries":[...],"warnings":[...]}`.
    #[arg(long)]
    pub json: bool,
}

/// Exit codes: 0 success (warnings included), 1 output failure, 2 bad input.
pub fn run(args: &ExpandArgs) -> ExitCode {
    let product = match expand_file(&args.file) {
        Ok(product) => product,
        Err(err) => {
            // The error names the file itself, and the JSON path or line:column.
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let written = if args.json {
        write_json(&product)
    } else {
        for warning in &product.warnings {
            eprintln!("warning: {warning}");
        }
        write_table(&product.entries)
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is not worth a message.
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: writing output: {err}");
            ExitCode::from(1)
        }
    }
}

fn write_json(product: &Product) -> io::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer(&mut out, product)?;
    writeln!(out)?;
    out.flush()
}

fn write_table(entries: &[Entry]) -> io::Result<()> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    out.write_all(render_table(entries).as_bytes())?;
    out.flush()
}

/// Columns are the union of keys in first-seen order (each entry's keys are
/// sorted); strings print bare, other scalars as JSON, absent keys as blanks.
fn render_table(entries: &[Entry]) -> String {
    let mut columns: Vec<&str> = Vec::new();
    for entry in entries {
        for key in entry.keys() {
            if !columns.contains(&key.as_str()) {
                columns.push(key);
            }
        }
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|entry| {
            columns
                .iter()
                .map(|column| entry.get(*column).map(cell).unwrap_or_default())
                .collect()
        })
        .collect();
    let header: Vec<String> = columns.iter().map(|c| (*c).to_owned()).collect();
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            std::iter::once(&header)
                .chain(&rows)
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();

    let mut text = String::new();
    if !columns.is_empty() {
        for row in std::iter::once(&header).chain(&rows) {
            let mut line = String::new();
            for (i, value) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                // Padding counts chars, as the widths do.
                line.push_str(&format!("{value:<width$}", width = widths[i]));
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
    }
    let n = entries.len();
    text.push_str(&format!(
        "{n} {}\n",
        if n == 1 { "entry" } else { "entries" }
    ));
    text
}

fn cell(value: &Value) -> String {
    match value {
        Value::String(s) if !s.is_empty() && !s.chars().any(char::is_control) => s.clone(),
        // Empty or control-character strings would break the table: quote them.
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(value: Value) -> Entry {
        serde_json::from_value(value).unwrap()
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
    }
}
