//! The build report (`fraglink_build_report.txt` in the output directory):
//! what built and what did not, with every failure's NVRTC log. Written on
//! every build, so a keep-going build's gaps are on disk beside the registry.

use std::path::Path;

use super::compile::{CompileError, Compiled};
use super::render::Rendered;

/// Writes the report: one line per fragment, then each failure in full.
pub fn write(
    path: &Path,
    rendered: &[Rendered],
    built: &[(&Rendered, Compiled)],
    failures: &[CompileError],
) -> std::io::Result<()> {
    use std::fmt::Write as _;
    let mut text = format!(
        "fraglink build: {} of {} fragments built, {} failures\n\n",
        built.len(),
        rendered.len(),
        failures.len()
    );
    for r in rendered {
        let status = match built.iter().find(|(b, _)| b.name == r.name) {
            Some((_, c)) => format!("ok     {} bytes", c.fatbin_len),
            None => "FAILED".to_string(),
        };
        let _ = writeln!(text, "{status:<16} {} ({})", r.name, r.family);
    }
    for f in failures {
        let _ = write!(text, "\n{f}\n");
    }
    std::fs::write(path, text)
}

/// How many distinct fragments `failures` are about.
pub fn failed_fragments(failures: &[CompileError]) -> usize {
    let mut names: Vec<&str> = failures.iter().filter_map(|f| f.fragment()).collect();
    names.sort_unstable();
    names.dedup();
    names.len()
}
