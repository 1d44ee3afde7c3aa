//! What a fragment defines, read from the PTX of the same source.
//!
//! LTO-IR is opaque (NVVM's bitcode, compressed), so the build also asks
//! NVRTC for PTX per architecture and records two lists from it:
//! the kernels (`.entry`, whatever their linkage: a `static` or templated
//! kernel is an entry too) and the strong external definitions (`.visible`
//! functions, kernels and variables), which two fragments of one link must
//! not share. Weak definitions (inline functions, template instances) may
//! repeat and are left out.

/// The symbols of one PTX module.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PtxSymbols {
    /// Kernel names, in PTX order.
    pub entries: Vec<String>,
    /// Strong external definitions (kernels, functions, variables).
    pub definitions: Vec<String>,
}

/// The identifier after a directive's optional return-parameter list:
/// `(.param .b32 func_retval0) helper(` → `helper`.
fn declared_name(rest: &str) -> Option<String> {
    let mut r = rest.trim_start();
    if r.starts_with('(') {
        let close = r.find(')')?;
        r = r[close + 1..].trim_start();
    }
    let name: String = r
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The name of a variable declaration `.global .align 4 .b8 name[16];`:
/// the last token before `[`, `=` or `;`.
fn variable_name(rest: &str) -> Option<String> {
    let end = rest.find(['[', '=', ';']).unwrap_or(rest.len());
    let name = rest[..end].split_whitespace().last()?;
    (!name.starts_with('.')).then(|| name.to_string())
}

/// Reads the entries and strong definitions of a PTX text.
pub fn parse(ptx: &str) -> PtxSymbols {
    let mut s = PtxSymbols::default();
    for line in ptx.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = words.first() else { continue };
        let line = line.trim_start();
        let (visible, body) = match *first {
            ".visible" => (true, line[".visible".len()..].trim_start()),
            ".weak" => (false, line[".weak".len()..].trim_start()),
            // Declarations of what another module defines.
            ".extern" => continue,
            _ => (false, line),
        };
        if let Some(rest) = body.strip_prefix(".entry") {
            if let Some(name) = declared_name(rest) {
                if visible {
                    s.definitions.push(name.clone());
                }
                if !s.entries.contains(&name) {
                    s.entries.push(name);
                }
            }
        } else if let Some(rest) = body.strip_prefix(".func") {
            if visible {
                if let Some(name) = declared_name(rest) {
                    s.definitions.push(name);
                }
            }
        } else if visible && (body.starts_with(".global") || body.starts_with(".const")) {
            if let Some(name) = variable_name(body) {
                s.definitions.push(name);
            }
        }
    }
    s.definitions.sort();
    s.definitions.dedup();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_strong_definitions() {
        let ptx = "
.extern .func  (.param .b64 func_retval0) __cudaCDP2GetParameterBufferV2
.entry _Z5quantIfEvPT_(
.visible .entry kern_a(
.visible .func  (.param .b32 func_retval0) helper_b(
.weak .func  (.param .b32 func_retval0) _Z6inlinei(
.weak .entry _Z4tmplIiEvPT_(
.visible .global .align 4 .b8 table[16];
.global .align 4 .u32 hidden;
.visible .entry guarded_bf16(
";
        let s = parse(ptx);
        assert_eq!(
            s.entries,
            [
                "_Z5quantIfEvPT_",
                "kern_a",
                "_Z4tmplIiEvPT_",
                "guarded_bf16"
            ]
        );
        assert_eq!(
            s.definitions,
            ["guarded_bf16", "helper_b", "kern_a", "table"]
        );
    }

    #[test]
    fn nothing_in_garbage() {
        assert_eq!(
            parse("not ptx\n.entry (\n.visible .func ("),
            PtxSymbols::default()
        );
    }
}
