//! Build warnings about source that NVRTC compiles, but not as meant.
//!
//! With `-default-device` (a family's default), NVRTC treats every
//! unannotated function as a device function: a host launcher
//! `extern "C" void launch_x(cudaStream_t s, ...) { x<<<g, b, 0, s>>>(...); }`
//! silently becomes a device function that launches from the GPU. Libraries
//! that keep launchers in their `.cu` files should guard them with
//! `#ifndef __CUDACC_RTC__` (and name templated kernels by a name
//! expression), or turn `-default-device` off for the family.

/// One finding: 1-based line and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub line: usize,
    pub what: String,
}

/// Host runtime API names: an unannotated function using one is a host
/// function, not a device function that happens to lack `__device__`
/// (fraglink's own fragments rely on `-default-device` for those).
const HOST_MARKERS: &[&str] = &[
    "cudaStream_t",
    "cudaError_t",
    "cudaMalloc",
    "cudaMemcpy",
    "cudaLaunchKernel",
    "cudaGetLastError",
    "<<<",
];

/// The text of the definition starting at `from`: up to the brace that
/// closes its body (or the end of the source).
fn definition(source: &str, from: usize) -> &str {
    let rest = &source[from..];
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth <= 1 => return &rest[..=i],
            '}' => depth -= 1,
            ';' if depth == 0 => return &rest[..=i],
            _ => {}
        }
    }
    rest
}

/// `source` with every `#ifndef __CUDACC_RTC__` / `#if !defined(__CUDACC_RTC__)`
/// block blanked (newlines kept, so line numbers stay): NVRTC never sees
/// what is inside, which is how host launchers should be kept.
fn without_host_only_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    // Nesting depth inside a host-only block (0: outside).
    let mut depth = 0usize;
    for line in source.split_inclusive('\n') {
        let t = line.trim_start();
        let directive = t.strip_prefix('#').map(str::trim_start);
        if depth == 0 {
            let host_only = directive.is_some_and(|d| {
                let d: String = d.split_whitespace().collect::<Vec<_>>().join(" ");
                d == "ifndef __CUDACC_RTC__"
                    || d.starts_with("if !defined(__CUDACC_RTC__)")
                    || d.starts_with("if !defined __CUDACC_RTC__")
            });
            if host_only {
                depth = 1;
                out.push('\n');
            } else {
                out.push_str(line);
            }
            continue;
        }
        match directive {
            Some(d) if d.starts_with("if") => depth += 1,
            Some(d) if d.starts_with("endif") => depth -= 1,
            // `#else` of the host-only block: device code again.
            Some(d) if depth == 1 && (d.starts_with("else") || d.starts_with("elif")) => {
                depth = 0;
            }
            _ => {}
        }
        out.push('\n');
    }
    out
}

/// Kernel launches (`<<<`), and unannotated `extern "C"` functions (no
/// `__global__` or `__device__` before the parameter list) that use the
/// host runtime API, outside `#ifndef __CUDACC_RTC__` blocks. Comments are
/// not parsed, other preprocessor conditions are not evaluated.
pub fn host_code(source: &str) -> Vec<Finding> {
    let stripped = without_host_only_blocks(source);
    let source = stripped.as_str();
    let line_of = |at: usize| source[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (at, _) in source.match_indices("<<<") {
        out.push(Finding {
            line: line_of(at),
            what: "a kernel launch (`<<<`)".into(),
        });
    }
    for (at, _) in source.match_indices("extern \"C\"") {
        let def = definition(source, at);
        let rest = def["extern \"C\"".len()..].trim_start();
        // `extern "C" {` opens a block; no parameter list: a variable.
        let Some(paren) = rest.find('(') else {
            continue;
        };
        let head = &rest[..paren];
        if head.contains("__global__") || head.contains("__device__") || head.contains('{') {
            continue;
        }
        if let Some(marker) = HOST_MARKERS.iter().find(|m| def.contains(**m)) {
            let name = head.split_whitespace().last().unwrap_or("?");
            out.push(Finding {
                line: line_of(at),
                what: format!(
                    "`extern \"C\"` function `{name}` without __global__ or __device__ uses `{marker}`"
                ),
            });
        }
    }
    out.sort_by_key(|f| f.line);
    out
}

/// The warning for a fragment's findings, `None` when there are none.
pub fn host_code_warning(
    fragment: &str,
    source_path: &str,
    findings: &[Finding],
) -> Option<String> {
    let first = findings.first()?;
    Some(format!(
        "fragment `{fragment}` ({source_path}:{}) has host-looking code: {}{}; under \
         -default-device it becomes device code. Guard host launchers with \
         `#ifndef __CUDACC_RTC__`, name templated kernels with Family::name_expression, \
         or use Family::default_device(false)",
        first.line,
        first.what,
        match findings.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_and_launches_are_found() {
        let src = r#"
extern "C" __global__ void k(float* x) {}
extern "C" __device__ int helper(int x) { return x; }
extern "C" float fraglink_metric_finalize_f32(const state* s) { return s->a; }
extern "C" void launch_quantize(cudaStream_t s, float* x) {
  quantize<float><<<1, 1, 0, s>>>(x);
}
"#;
        let f = host_code(src);
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].line, 5);
        assert!(f[0].what.contains("`launch_quantize`"), "{f:?}");
        assert_eq!(f[1].line, 6);
        assert!(f[1].what.contains("<<<"));
        let guarded = format!("#ifndef __CUDACC_RTC__\n#if 1\n{src}#endif\n#endif\n<<<");
        let g = host_code(&guarded);
        assert_eq!(g.len(), 1, "only the launch after the block: {g:?}");
        assert_eq!(g[0].line, guarded.lines().count());
        let w = host_code_warning("q", "gen/q.cu", &f).unwrap();
        assert!(
            w.contains("gen/q.cu:5") && w.contains("1 more") && w.contains("__CUDACC_RTC__"),
            "{w}"
        );
        assert!(host_code_warning("q", "x", &[]).is_none());
    }
}
