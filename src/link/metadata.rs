//! What a link produced, checked without a GPU (design decision 9).
//!
//! * [`parse_info_log`] / [`entry_resources`]: the ptxas resource usage that
//!   nvJitLink prints into its info log when the link is created with
//!   `-verbose` (registers, barriers, stack frame, spills, static shared and
//!   constant memory, compile time), per entry point.
//! * [`check_cubin`]: a hand-written, bounds-checked ELF64 reader that proves a
//!   linked cubin is a CUDA ELF (`e_machine == 190`) and that the entry point is
//!   a function symbol in it; it also decodes the SM from `e_flags`.
//! * [`KernelMetadata`]: the summary a cache entry / launcher keeps.
//!
//! Neither parser panics, whatever the input: every number that does not parse
//! is ignored (log) and every offset is checked against the buffer (cubin).

use std::collections::HashMap;
use std::fmt;

// ---------------------------------------------------------------------------
// Info log
// ---------------------------------------------------------------------------

/// The resource usage ptxas reported for one entry function.
///
/// Equality compares `ptxas_ms` bit for bit (so `Eq` holds even for a NaN).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct EntryResources {
    /// The entry function's (possibly mangled) name.
    pub entry: String,
    /// The target ptxas compiled for, as printed (`sm_80`, `sm_90a`).
    pub arch: String,
    /// `Used N registers`.
    pub registers: u32,
    /// `used N barriers` (absent in older formats).
    pub barriers: Option<u32>,
    /// `N bytes stack frame` (0 when the log has no "Function properties").
    pub stack_bytes: u32,
    /// `N bytes spill stores`.
    pub spill_stores: u32,
    /// `N bytes spill loads`.
    pub spill_loads: u32,
    /// Static shared memory, `N bytes smem` (printed only when non-zero).
    pub shared_bytes: Option<u32>,
    /// Kernel parameter bank, `N bytes cmem[0]` (not printed for sm_90+).
    pub cmem0_bytes: Option<u32>,
    /// `N bytes cumulative stack size` (entries that call functions with a frame).
    pub cumulative_stack_bytes: Option<u32>,
    /// The register limit from `Overriding maximum register limit … with N of …`
    /// (`-maxrregcount` or launch bounds).
    pub max_registers_override: Option<u32>,
    /// `Compile time = X ms`.
    pub ptxas_ms: Option<f64>,
}

impl PartialEq for EntryResources {
    fn eq(&self, other: &Self) -> bool {
        self.entry == other.entry
            && self.arch == other.arch
            && self.registers == other.registers
            && self.barriers == other.barriers
            && self.stack_bytes == other.stack_bytes
            && self.spill_stores == other.spill_stores
            && self.spill_loads == other.spill_loads
            && self.shared_bytes == other.shared_bytes
            && self.cmem0_bytes == other.cmem0_bytes
            && self.cumulative_stack_bytes == other.cumulative_stack_bytes
            && self.max_registers_override == other.max_registers_override
            && self.ptxas_ms.map(f64::to_bits) == other.ptxas_ms.map(f64::to_bits)
    }
}

// Sound: the float is compared by its bits, which is reflexive.
impl Eq for EntryResources {}

/// Why [`entry_resources`] found nothing usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The log holds no ptxas line at all.
    #[error(
        "no resource usage for entry `{entry}`: the info log has no ptxas output{}",
        if *.empty { " (it is empty)" } else { "" }
    )]
    NoPtxasOutput {
        entry: String,
        /// The log was empty (or whitespace only).
        empty: bool,
        /// Always true here: without `-verbose` nvJitLink prints no resource usage.
        verbose_missing: bool,
    },

    /// ptxas output is there, but no entry function of that name.
    #[error(
        "entry `{entry}` not found in the ptxas info log; entry functions found: {}{}",
        NameList(.found),
        if *.device_function { " (the name appears as a device function, not an entry)" } else { "" }
    )]
    EntryNotFound {
        entry: String,
        /// The entry functions the log does report, in order.
        found: Vec<String>,
        /// The name has "Function properties" but was never compiled as an entry.
        device_function: bool,
    },

    /// The entry was compiled but its "Used N registers" line is missing.
    #[error(
        "entry `{entry}` ({arch}) has no `Used N registers` line in the info log (truncated log?)"
    )]
    Incomplete { entry: String, arch: String },
}

impl MetadataError {
    /// True when the log looks like it came from a link without `-verbose`.
    pub fn verbose_missing(&self) -> bool {
        matches!(self, MetadataError::NoPtxasOutput { .. })
    }
}

struct NameList<'a>(&'a [String]);

impl fmt::Display for NameList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "`{n}`")?;
        }
        Ok(())
    }
}

/// One entry while parsing; `used` records whether its Used line was seen.
struct Partial {
    res: EntryResources,
    used: bool,
}

struct Parsed {
    entries: Vec<Partial>,
    any_ptxas: bool,
    /// Names seen in "Function properties for X" (entries and device functions).
    properties: Vec<String>,
}

/// Every entry function ptxas reported in `log`, in order. Entries whose
/// `Used N registers` line is missing (a truncated log) are left out; lines
/// that do not parse are ignored.
pub fn parse_info_log(log: &str) -> Vec<EntryResources> {
    parse(log)
        .entries
        .into_iter()
        .filter(|p| p.used)
        .map(|p| p.res)
        .collect()
}

/// The resources of entry function `entry` (the first one of that name).
///
/// The error names the entry and the entries the log does report, and says
/// when the log has no ptxas output at all (the link was created without
/// `-verbose`).
pub fn entry_resources(log: &str, entry: &str) -> Result<EntryResources, MetadataError> {
    let parsed = parse(log);
    if !parsed.any_ptxas {
        return Err(MetadataError::NoPtxasOutput {
            entry: entry.to_owned(),
            empty: log.trim().is_empty(),
            verbose_missing: true,
        });
    }
    if let Some(p) = parsed.entries.iter().find(|p| p.res.entry == entry) {
        return if p.used {
            Ok(p.res.clone())
        } else {
            Err(MetadataError::Incomplete {
                entry: entry.to_owned(),
                arch: p.res.arch.clone(),
            })
        };
    }
    let mut found: Vec<String> = Vec::new();
    for p in &parsed.entries {
        if !found.contains(&p.res.entry) {
            found.push(p.res.entry.clone());
        }
    }
    Err(MetadataError::EntryNotFound {
        entry: entry.to_owned(),
        device_function: parsed.properties.iter().any(|n| n == entry),
        found,
    })
}

fn parse(log: &str) -> Parsed {
    let mut entries: Vec<Partial> = Vec::new();
    let mut overrides: HashMap<String, u32> = HashMap::new();
    let mut properties: Vec<String> = Vec::new();
    let mut any_ptxas = false;
    // The entry that "Function properties" / Used / Compile time lines refer to;
    // None while ptxas talks about a device function.
    let mut target: Option<usize> = None;

    for raw in log.lines() {
        let line = raw.trim();
        let body = if let Some(rest) = line.strip_prefix("ptxas") {
            any_ptxas = true;
            line_body(rest)
        } else if line.contains("bytes stack frame") {
            // Older ptxas prints the "Function properties" continuation
            // without the "ptxas ." prefix.
            line
        } else {
            continue;
        };

        if let Some(r) = body.strip_prefix("Compiling entry function") {
            let (name, after) = quoted(r);
            let (arch, _) = after
                .trim_start()
                .strip_prefix("for")
                .map(quoted)
                .unwrap_or((None, ""));
            let (Some(name), arch) = (name, arch) else {
                target = None;
                continue;
            };
            entries.push(Partial {
                res: EntryResources {
                    entry: name.to_owned(),
                    arch: arch.unwrap_or_default().to_owned(),
                    registers: 0,
                    barriers: None,
                    stack_bytes: 0,
                    spill_stores: 0,
                    spill_loads: 0,
                    shared_bytes: None,
                    cmem0_bytes: None,
                    cumulative_stack_bytes: None,
                    max_registers_override: None,
                    ptxas_ms: None,
                },
                used: false,
            });
            target = Some(entries.len() - 1);
        } else if body.starts_with("Compiling") {
            // "Compiling function 'f' for …" (a non-entry function).
            target = None;
        } else if let Some(r) = body.strip_prefix("Function properties for") {
            let name = r.trim();
            properties.push(name.to_owned());
            target = target.filter(|&i| entries.get(i).is_some_and(|p| p.res.entry == name));
        } else if let Some(r) = body.strip_prefix("Overriding maximum register limit") {
            // "Overriding maximum register limit 256 for 'heavy' with  24 of maxrregcount option"
            let Some(r) = r.split_once("for").map(|(_, r)| r) else {
                continue;
            };
            let (Some(name), after) = quoted(r) else {
                continue;
            };
            if let Some(n) = after
                .trim_start()
                .strip_prefix("with")
                .and_then(|w| w.split_whitespace().next())
                .and_then(|w| w.parse::<u32>().ok())
            {
                overrides.insert(name.to_owned(), n);
            }
        } else if let Some(r) = body.strip_prefix("Used") {
            let Some(p) = target.and_then(|i| entries.get_mut(i)) else {
                continue;
            };
            apply_used(p, r);
        } else if body.contains("bytes stack frame") {
            let Some(p) = target.and_then(|i| entries.get_mut(i)) else {
                continue;
            };
            for item in body.split(',') {
                let Some((n, what)) = number_item(item) else {
                    continue;
                };
                if words_eq(what, "bytes stack frame") {
                    p.res.stack_bytes = n;
                } else if words_eq(what, "bytes spill stores") {
                    p.res.spill_stores = n;
                } else if words_eq(what, "bytes spill loads") {
                    p.res.spill_loads = n;
                }
            }
        } else if let Some(r) = body.strip_prefix("Compile time") {
            let Some(p) = target.and_then(|i| entries.get_mut(i)) else {
                continue;
            };
            let ms = r
                .trim_start()
                .trim_start_matches('=')
                .split_whitespace()
                .next()
                .and_then(|w| w.parse::<f64>().ok())
                .filter(|v| v.is_finite());
            if ms.is_some() {
                p.res.ptxas_ms = ms;
            }
        }
    }

    for p in &mut entries {
        if let Some(&n) = overrides.get(&p.res.entry) {
            p.res.max_registers_override = Some(n);
        }
    }
    Parsed {
        entries,
        any_ptxas,
        properties,
    }
}

/// What follows "ptxas": drops the tag of `ptxas info    : X` /
/// `ptxas warning : X` or the dot of a continuation line `ptxas    .    X`.
fn line_body(rest: &str) -> &str {
    let rest = rest.trim_start();
    if let Some(b) = rest.strip_prefix('.') {
        return b.trim();
    }
    match rest.split_once(':') {
        Some((tag, b)) if tag.trim().chars().all(|c| c.is_ascii_alphabetic()) => b.trim(),
        _ => rest.trim(),
    }
}

/// "Used 24 registers, used 1 barriers, 704 bytes cumulative stack size,
/// 1024 bytes smem, 372 bytes cmem[0]" (after "Used").
fn apply_used(p: &mut Partial, rest: &str) {
    let mut items = rest.split(',');
    let Some((regs, what)) = items.next().and_then(number_item) else {
        return;
    };
    if !words_eq(what, "registers") {
        return;
    }
    p.res.registers = regs;
    p.used = true;
    for item in items {
        let item = item.trim();
        if let Some(b) = item.strip_prefix("used") {
            match number_item(b) {
                Some((n, what)) if words_eq(what, "barriers") => p.res.barriers = Some(n),
                _ => {}
            }
            continue;
        }
        let Some((n, what)) = number_item(item) else {
            continue;
        };
        if words_eq(what, "bytes smem") {
            p.res.shared_bytes = Some(n);
        } else if words_eq(what, "bytes cmem[0]") {
            p.res.cmem0_bytes = Some(n);
        } else if words_eq(what, "bytes cumulative stack size") {
            p.res.cumulative_stack_bytes = Some(n);
        }
    }
}

/// "  704 bytes stack frame" → (704, "bytes stack frame").
fn number_item(item: &str) -> Option<(u32, &str)> {
    let item = item.trim();
    let end = item
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(item.len());
    let n = item.get(..end)?.parse::<u32>().ok()?;
    Some((n, item.get(end..)?.trim()))
}

/// `a` and `b` are the same words (ptxas pads with runs of spaces).
fn words_eq(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

/// The first `'…'` in `s` and what follows it.
fn quoted(s: &str) -> (Option<&str>, &str) {
    let Some((_, r)) = s.split_once('\'') else {
        return (None, s);
    };
    match r.split_once('\'') {
        Some((name, after)) if !name.is_empty() => (Some(name), after),
        _ => (None, ""),
    }
}

// ---------------------------------------------------------------------------
// Cubin (ELF64) checks
// ---------------------------------------------------------------------------

/// `e_machine` of CUDA ELF files.
pub const EM_CUDA: u16 = 190;

const ELF_HEADER_LEN: usize = 64;
const SECTION_HEADER_LEN: usize = 64;
const SYMBOL_LEN: usize = 24;
const SHT_SYMTAB: u32 = 2;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
/// `st_other` bit ptxas sets on kernels (`__global__` functions).
const STO_CUDA_ENTRY: u8 = 0x10;

/// What [`check_cubin`] learned about a cubin.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CubinInfo {
    /// Length of the cubin in bytes.
    pub size: usize,
    /// `e_machine` (always [`EM_CUDA`] on success).
    pub machine: u16,
    /// `e_flags`, raw.
    pub e_flags: u32,
    /// `EI_ABIVERSION` (byte 8): 7 for the CUDA 12 layout up to sm_90a, 8 for
    /// the layout used from sm_100 on.
    pub abi_version: u8,
    /// The SM the code was compiled for, decoded from `e_flags` (see
    /// [`sm_from_e_flags`]); `None` for an unknown ABI version.
    pub sm: Option<u32>,
    /// Every `STT_FUNC` symbol name, in symbol-table order.
    pub functions: Vec<String>,
    /// The entry symbol has global binding.
    pub entry_global: bool,
    /// The entry symbol carries `STO_CUDA_ENTRY` (it is a kernel, not a device
    /// function).
    pub entry_is_kernel: bool,
}

/// Why a buffer is not a usable cubin for an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CubinError {
    #[error("cubin too short: {len} bytes, an ELF64 header needs 64")]
    TooShort { len: usize },
    #[error("not an ELF file (magic {found:02x?}, expected 7f 45 4c 46)")]
    NotElf { found: [u8; 4] },
    #[error("not a 64-bit ELF (EI_CLASS {found}, expected 2)")]
    Not64Bit { found: u8 },
    #[error("not a little-endian ELF (EI_DATA {found}, expected 1)")]
    NotLittleEndian { found: u8 },
    #[error("ELF e_machine is {found}, expected {EM_CUDA} (EM_CUDA): not a cubin")]
    WrongMachine { found: u16 },
    #[error("truncated or malformed cubin: {what}")]
    Truncated { what: String },
    #[error("the cubin has no symbol table (.symtab)")]
    NoSymbolTable,
    #[error(
        "entry `{entry}` is not a function symbol of the cubin; functions: {}",
        NameList(.functions)
    )]
    EntryMissing {
        entry: String,
        functions: Vec<String>,
    },
}

/// The SM number in a cubin's `e_flags`, by `EI_ABIVERSION`.
///
/// * ABI version 7 (sm_20 … sm_90a, CUDA 12): bits 0–7 are the SM
///   (`EF_CUDA_SM`), bits 16–23 the virtual (PTX) SM, 0x100 / 0x400 are
///   `EF_CUDA_TEXMODE_UNIFIED` / `EF_CUDA_64BIT_ADDRESS`, 0x800 marks an
///   arch-specific (`a`) target. Seen: sm_75 `0x4b054b`, sm_80 `0x500550`,
///   sm_90 `0x5a055a`, sm_90a `0x5a0d5a`.
/// * ABI version 8 (sm_100 and later): bits 8–15 are the SM. Seen: sm_100
///   `0x6006402`, sm_120 `0x6007802`.
///
/// Any other version: `None`.
pub fn sm_from_e_flags(abi_version: u8, e_flags: u32) -> Option<u32> {
    let sm = match abi_version {
        7 => e_flags & 0xff,
        8 => (e_flags >> 8) & 0xff,
        _ => return None,
    };
    (sm != 0).then_some(sm)
}

/// Checks that `bytes` is a 64-bit little-endian CUDA ELF whose symbol table
/// holds `entry` as a function symbol, and lists its functions.
pub fn check_cubin(bytes: &[u8], entry: &str) -> Result<CubinInfo, CubinError> {
    let elf = Elf::parse(bytes)?;
    let symtab = elf.symtab()?.ok_or(CubinError::NoSymbolTable)?;
    let mut functions = Vec::new();
    let mut entry_sym: Option<(bool, bool)> = None;
    for i in 0..symtab.count {
        let sym = symtab.symbol(i)?;
        if sym.info & 0xf != STT_FUNC {
            continue;
        }
        let name = symtab.name(sym.name)?;
        if entry_sym.is_none() && name == entry {
            entry_sym = Some((sym.info >> 4 == STB_GLOBAL, sym.other & STO_CUDA_ENTRY != 0));
        }
        functions.push(name);
    }
    let Some((entry_global, entry_is_kernel)) = entry_sym else {
        return Err(CubinError::EntryMissing {
            entry: entry.to_owned(),
            functions,
        });
    };
    Ok(CubinInfo {
        size: bytes.len(),
        machine: elf.machine,
        e_flags: elf.e_flags,
        abi_version: elf.abi_version,
        sm: sm_from_e_flags(elf.abi_version, elf.e_flags),
        functions,
        entry_global,
        entry_is_kernel,
    })
}

/// A kernel's resource usage read from the cubin itself, for when the info
/// log carries no ptxas output. That happens on every machine with an NVIDIA
/// driver: nvJitLink then keeps linked cubins in the driver's compute cache
/// (`~/.nv/ComputeCache`, `CUDA_CACHE_PATH`), and a link served from there
/// (about 5 ms instead of 100+, also across processes) runs no ptxas and
/// returns an empty info log even with `-verbose` (seen on an H100 with
/// nvJitLink 12.9 and 13.0; `CUDA_CACHE_DISABLE=1` brings the log back).
///
/// * registers: `EIATTR_REGCOUNT` for the entry in `.nv.info`
///   (`EIFMT_SVAL`: symbol index, value);
/// * stack frame: `EIATTR_FRAME_SIZE`, likewise; spills live in the stack
///   frame, so a frame of 0 proves there are none;
/// * static shared memory: the size of `.nv.shared.<entry>` (0 if absent).
///   When the cubin has a `.nv.shared.reserved.*` section (sm_90 here), that
///   section size includes the 1 KiB the hardware reserves per block, which
///   ptxas's `smem` figure leaves out; it is subtracted so both agree (seen
///   with nvJitLink 12.9 and 13.0; checked against ptxas by a test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubinResources {
    pub registers: u32,
    pub stack_bytes: u32,
    pub shared_bytes: u32,
}

const EIFMT_NVAL: u8 = 1;
const EIFMT_BVAL: u8 = 2;
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_REGCOUNT: u8 = 0x2f;
const EIATTR_KPARAM_INFO: u8 = 0x17;
/// Shared memory the hardware reserves per block from sm_80 on.
const RESERVED_SHARED_BYTES: u32 = 1024;

/// Reads [`CubinResources`] of `entry` from `bytes` (see there).
pub fn cubin_resources(bytes: &[u8], entry: &str) -> Result<CubinResources, CubinError> {
    let elf = Elf::parse(bytes)?;
    let symtab = elf.symtab()?.ok_or(CubinError::NoSymbolTable)?;
    let mut entry_index = None;
    let mut functions = Vec::new();
    for i in 0..symtab.count {
        let sym = symtab.symbol(i)?;
        if sym.info & 0xf == STT_FUNC {
            let name = symtab.name(sym.name)?;
            if name == entry && entry_index.is_none() {
                entry_index = Some(i as u32);
            }
            functions.push(name);
        }
    }
    let Some(entry_index) = entry_index else {
        return Err(CubinError::EntryMissing {
            entry: entry.to_owned(),
            functions,
        });
    };
    let names = elf.section(u64::from(elf.shstrndx))?;
    let names = range(elf.bytes, names.offset, names.size)
        .ok_or_else(|| truncated("section name table"))?;
    let name_of = |off: u32| -> Option<&[u8]> {
        let tail = names.get(usize::try_from(off).ok()?..)?;
        Some(&tail[..tail.iter().position(|&b| b == 0)?])
    };
    let text = format!(".text.{entry}");
    let shared = format!(".nv.shared.{entry}");
    let mut res = CubinResources {
        registers: 0,
        stack_bytes: 0,
        shared_bytes: 0,
    };
    let mut found_text = false;
    let mut reserved = false;
    for i in 0..elf.shnum {
        let sec = elf.section(i)?;
        let Some(name) = name_of(sec.name) else {
            continue;
        };
        if name == text.as_bytes() {
            found_text = true;
        } else if name.starts_with(b".nv.shared.reserved.") {
            reserved = true;
        } else if name == shared.as_bytes() {
            res.shared_bytes = u32::try_from(sec.size).unwrap_or(u32::MAX);
        } else if name == b".nv.info" {
            let data =
                range(elf.bytes, sec.offset, sec.size).ok_or_else(|| truncated(".nv.info"))?;
            if let Some(v) = nv_info_value(data, EIATTR_FRAME_SIZE, entry_index) {
                res.stack_bytes = v;
            }
            if let Some(v) = nv_info_value(data, EIATTR_REGCOUNT, entry_index) {
                res.registers = v;
            }
        }
    }
    if !found_text {
        return Err(truncated(format!("no {text} section")));
    }
    if reserved {
        res.shared_bytes = res.shared_bytes.saturating_sub(RESERVED_SHARED_BYTES);
    }
    Ok(res)
}

/// The value of attribute `attr` for symbol `sym` in an `.nv.info` section.
fn nv_info_value(data: &[u8], attr: u8, sym: u32) -> Option<u32> {
    let mut found = None;
    nv_info_svals(data, |a, body| {
        if found.is_none() && a == attr && body.len() >= 8 && read_u32(body, 0) == Some(sym) {
            found = read_u32(body, 4);
        }
    });
    found
}

/// Calls `f(attribute, body)` for each sized (`EIFMT_SVAL`) record of an
/// `.nv.info` section, in order, until the records end or one is malformed.
fn nv_info_svals(data: &[u8], mut f: impl FnMut(u8, &[u8])) {
    let mut at = 0usize;
    while at + 2 <= data.len() {
        let (fmt, a) = (data[at], data[at + 1]);
        at += 2;
        match fmt {
            // Records are padded to 4 bytes: a format and attribute byte,
            // then 2 bytes of value (or padding) for these three.
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => at += 2,
            EIFMT_SVAL => {
                let Some(len) = read_u16(data, at) else {
                    return;
                };
                at += 2;
                let Some(body) = at
                    .checked_add(usize::from(len))
                    .and_then(|end| data.get(at..end))
                else {
                    return;
                };
                f(a, body);
                at += usize::from(len);
            }
            _ => return,
        }
    }
}

/// The sizes in bytes of `entry`'s parameters, in declaration order, from the
/// `EIATTR_KPARAM_INFO` records of its `.nv.info.<entry>` section (ordinal at
/// byte 4 of a record, size in bits 18..32 of its last word; tests check it
/// against the kernels' declarations). `None` when the cubin has no such
/// section, or its records do not number the parameters 0, 1, … without gaps.
///
/// The launcher asks the driver for exactly this many parameters: probing
/// `cuFuncGetParamInfo` until it fails made compute-sanitizer's memcheck
/// report the expected `CUDA_ERROR_INVALID_VALUE` as an error at every load.
pub fn kernel_param_sizes(bytes: &[u8], entry: &str) -> Result<Option<Vec<usize>>, CubinError> {
    let elf = Elf::parse(bytes)?;
    let Some(data) = elf.section_named(format!(".nv.info.{entry}").as_bytes())? else {
        return Ok(None);
    };
    let mut by_ordinal: Vec<Option<usize>> = Vec::new();
    let mut malformed = false;
    nv_info_svals(data, |attr, body| {
        if attr != EIATTR_KPARAM_INFO {
            return;
        }
        let (Some(ordinal), Some(word)) = (read_u16(body, 4), read_u32(body, 8)) else {
            malformed = true;
            return;
        };
        let ordinal = usize::from(ordinal);
        if by_ordinal.len() <= ordinal {
            by_ordinal.resize(ordinal + 1, None);
        }
        malformed |= by_ordinal[ordinal].replace((word >> 18) as usize).is_some();
    });
    if malformed {
        return Ok(None);
    }
    Ok(by_ordinal.into_iter().collect())
}

struct Elf<'a> {
    bytes: &'a [u8],
    machine: u16,
    e_flags: u32,
    abi_version: u8,
    shoff: u64,
    shnum: u64,
    shstrndx: u16,
}

struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

struct Symtab<'a> {
    data: &'a [u8],
    strtab: &'a [u8],
    entsize: usize,
    count: usize,
}

struct Symbol {
    name: u32,
    info: u8,
    other: u8,
}

fn truncated(what: impl Into<String>) -> CubinError {
    CubinError::Truncated { what: what.into() }
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// `bytes[offset .. offset + len]`, or `None` when it does not fit.
fn range(bytes: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    bytes.get(start..end)
}

impl<'a> Elf<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Self, CubinError> {
        if bytes.len() < ELF_HEADER_LEN {
            // Say "not ELF" rather than "too short" for short non-ELF input.
            if bytes.len() >= 4 && bytes[..4] != *b"\x7fELF" {
                let mut found = [0u8; 4];
                found.copy_from_slice(&bytes[..4]);
                return Err(CubinError::NotElf { found });
            }
            return Err(CubinError::TooShort { len: bytes.len() });
        }
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&bytes[..4]);
        if magic != *b"\x7fELF" {
            return Err(CubinError::NotElf { found: magic });
        }
        if bytes[4] != 2 {
            return Err(CubinError::Not64Bit { found: bytes[4] });
        }
        if bytes[5] != 1 {
            return Err(CubinError::NotLittleEndian { found: bytes[5] });
        }
        let header = |at, what: &str| truncated(format!("ELF header field {what} at {at}"));
        let machine = read_u16(bytes, 18).ok_or_else(|| header(18, "e_machine"))?;
        if machine != EM_CUDA {
            return Err(CubinError::WrongMachine { found: machine });
        }
        let shoff = read_u64(bytes, 40).ok_or_else(|| header(40, "e_shoff"))?;
        let e_flags = read_u32(bytes, 48).ok_or_else(|| header(48, "e_flags"))?;
        let shentsize = read_u16(bytes, 58).ok_or_else(|| header(58, "e_shentsize"))?;
        let mut shnum = u64::from(read_u16(bytes, 60).ok_or_else(|| header(60, "e_shnum"))?);
        let shstrndx = read_u16(bytes, 62).ok_or_else(|| header(62, "e_shstrndx"))?;
        if shoff == 0 {
            return Err(CubinError::NoSymbolTable);
        }
        if usize::from(shentsize) != SECTION_HEADER_LEN {
            return Err(truncated(format!(
                "section headers of {shentsize} bytes (ELF64 uses {SECTION_HEADER_LEN})"
            )));
        }
        let mut elf = Elf {
            bytes,
            machine,
            e_flags,
            abi_version: bytes[8],
            shoff,
            shnum,
            shstrndx,
        };
        if shnum == 0 {
            // Extended numbering: the count is section 0's sh_size.
            shnum = elf.section(0)?.size;
            elf.shnum = shnum;
        }
        let table_len = shnum
            .checked_mul(SECTION_HEADER_LEN as u64)
            .ok_or_else(|| truncated(format!("{shnum} section headers")))?;
        if range(bytes, shoff, table_len).is_none() {
            return Err(truncated(format!(
                "section header table ({shnum} x {SECTION_HEADER_LEN} bytes at offset {shoff}) ends past the end of the file ({} bytes)",
                bytes.len()
            )));
        }
        Ok(elf)
    }

    fn section(&self, index: u64) -> Result<Section, CubinError> {
        let bad = || {
            truncated(format!(
                "section header {index} (table at offset {})",
                self.shoff
            ))
        };
        let at = index
            .checked_mul(SECTION_HEADER_LEN as u64)
            .and_then(|o| o.checked_add(self.shoff))
            .ok_or_else(bad)?;
        let h = range(self.bytes, at, SECTION_HEADER_LEN as u64).ok_or_else(bad)?;
        // In bounds by construction: `h` is 64 bytes.
        let field32 = |o| read_u32(h, o).ok_or_else(bad);
        let field64 = |o| read_u64(h, o).ok_or_else(bad);
        Ok(Section {
            name: field32(0)?,
            kind: field32(4)?,
            offset: field64(24)?,
            size: field64(32)?,
            link: field32(40)?,
            entsize: field64(56)?,
        })
    }

    /// The contents of the first section called `name`, if any.
    fn section_named(&self, name: &[u8]) -> Result<Option<&'a [u8]>, CubinError> {
        let names = self.section(u64::from(self.shstrndx))?;
        let names = range(self.bytes, names.offset, names.size)
            .ok_or_else(|| truncated("section name table"))?;
        for i in 0..self.shnum {
            let sec = self.section(i)?;
            let Some(tail) = usize::try_from(sec.name).ok().and_then(|o| names.get(o..)) else {
                continue;
            };
            if tail
                .strip_prefix(name)
                .is_some_and(|rest| rest.first() == Some(&0))
            {
                return range(self.bytes, sec.offset, sec.size)
                    .map(Some)
                    .ok_or_else(|| truncated(String::from_utf8_lossy(name).into_owned()));
            }
        }
        Ok(None)
    }

    fn symtab(&self) -> Result<Option<Symtab<'a>>, CubinError> {
        for i in 0..self.shnum {
            let s = self.section(i)?;
            if s.kind != SHT_SYMTAB {
                continue;
            }
            let entsize = match s.entsize {
                0 => SYMBOL_LEN,
                n if n >= SYMBOL_LEN as u64 => usize::try_from(n)
                    .map_err(|_| truncated(format!("symbol entries of {n} bytes")))?,
                n => {
                    return Err(truncated(format!(
                        "symbol entries of {n} bytes (ELF64 uses {SYMBOL_LEN})"
                    )))
                }
            };
            let data = range(self.bytes, s.offset, s.size).ok_or_else(|| {
                truncated(format!(
                    ".symtab ({} bytes at offset {}) ends past the end of the file ({} bytes)",
                    s.size,
                    s.offset,
                    self.bytes.len()
                ))
            })?;
            let link = u64::from(s.link);
            if link == 0 || link >= self.shnum {
                return Err(truncated(format!(
                    ".symtab links to section {link}, but there are {} sections",
                    self.shnum
                )));
            }
            let st = self.section(link)?;
            let strtab = range(self.bytes, st.offset, st.size).ok_or_else(|| {
                truncated(format!(
                    "string table ({} bytes at offset {}) ends past the end of the file ({} bytes)",
                    st.size,
                    st.offset,
                    self.bytes.len()
                ))
            })?;
            return Ok(Some(Symtab {
                data,
                strtab,
                entsize,
                count: data.len() / entsize,
            }));
        }
        Ok(None)
    }
}

impl Symtab<'_> {
    fn symbol(&self, index: usize) -> Result<Symbol, CubinError> {
        let bad = || truncated(format!("symbol {index}"));
        let at = index.checked_mul(self.entsize).ok_or_else(bad)?;
        let s = self
            .data
            .get(at..at.checked_add(SYMBOL_LEN).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        Ok(Symbol {
            name: read_u32(s, 0).ok_or_else(bad)?,
            info: *s.get(4).ok_or_else(bad)?,
            other: *s.get(5).ok_or_else(bad)?,
        })
    }

    fn name(&self, offset: u32) -> Result<String, CubinError> {
        let bad = |why: &str| {
            truncated(format!(
                "symbol name at string-table offset {offset} {why} (table is {} bytes)",
                self.strtab.len()
            ))
        };
        let start = usize::try_from(offset).map_err(|_| bad("is out of range"))?;
        let tail = self
            .strtab
            .get(start..)
            .ok_or_else(|| bad("is out of range"))?;
        let len = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| bad("has no terminating NUL"))?;
        Ok(String::from_utf8_lossy(&tail[..len]).into_owned())
    }
}

// ---------------------------------------------------------------------------
// Kernel metadata
// ---------------------------------------------------------------------------

/// What a linked kernel costs: the summary kept next to a cached cubin.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KernelMetadata {
    pub entry: String,
    pub arch: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
    pub shared_bytes: Option<u32>,
    pub barriers: Option<u32>,
    pub cubin_bytes: usize,
    pub link_ms: f64,
}

impl KernelMetadata {
    /// Combines parsed resource usage with the cubin size and link time.
    pub fn new(res: &EntryResources, cubin_bytes: usize, link_ms: f64) -> Self {
        KernelMetadata {
            entry: res.entry.clone(),
            arch: res.arch.clone(),
            registers: res.registers,
            spill_stores: res.spill_stores,
            spill_loads: res.spill_loads,
            stack_bytes: res.stack_bytes,
            shared_bytes: res.shared_bytes,
            barriers: res.barriers,
            cubin_bytes,
            link_ms,
        }
    }

    /// From resources read off the cubin ([`cubin_resources`]): spills are
    /// not recorded there, so they are reported as the whole stack frame
    /// (exact when the frame is 0, an upper bound otherwise).
    pub fn from_cubin(
        entry: &str,
        arch: &str,
        res: &CubinResources,
        cubin_bytes: usize,
        link_ms: f64,
    ) -> Self {
        KernelMetadata {
            entry: entry.to_owned(),
            arch: arch.to_owned(),
            registers: res.registers,
            spill_stores: res.stack_bytes,
            spill_loads: res.stack_bytes,
            stack_bytes: res.stack_bytes,
            shared_bytes: Some(res.shared_bytes),
            barriers: None,
            cubin_bytes,
            link_ms,
        }
    }

    /// No spill stores or loads and no stack frame.
    pub fn spill_free(&self) -> bool {
        self.spill_stores == 0 && self.spill_loads == 0 && self.stack_bytes == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.nv.info` records are 4-byte units: a byte, half-word or absent
    /// value still takes 2 bytes, so a register count after them is found.
    #[test]
    fn nv_info_records_without_a_size_take_four_bytes() {
        let mut data = vec![EIFMT_HVAL, 0x1b, 0x34, 0x12];
        data.extend([EIFMT_BVAL, 0x07, 0x01, 0x00]);
        data.extend([EIFMT_NVAL, 0x01, 0x00, 0x00]);
        data.extend([EIFMT_SVAL, EIATTR_REGCOUNT, 8, 0]);
        data.extend(3u32.to_le_bytes());
        data.extend(40u32.to_le_bytes());
        assert_eq!(nv_info_value(&data, EIATTR_REGCOUNT, 3), Some(40));
        assert_eq!(nv_info_value(&data, EIATTR_REGCOUNT, 4), None);
    }

    /// nvJitLink 12.9, `-lto -arch=sm_80 -O3 -verbose -maxrregcount=24`.
    const SAMPLE: &str = "\
ptxas info    : Overriding maximum register limit 256 for 'heavy' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'light' for 'sm_80'
ptxas info    : Function properties for light
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.958 ms
ptxas info    : Compiling entry function 'heavy' for 'sm_80'
ptxas info    : Function properties for heavy
ptxas         .     704 bytes stack frame, 356 bytes spill stores, 356 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 704 bytes cumulative stack size, 1024 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 163.595 ms
ptxas info    : Function properties for helper
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";

    #[test]
    fn sample_both_entries() {
        let all = parse_info_log(SAMPLE);
        assert_eq!(all.len(), 2, "{all:#?}");
        assert_eq!(
            all[0],
            EntryResources {
                entry: "light".into(),
                arch: "sm_80".into(),
                registers: 8,
                barriers: Some(0),
                stack_bytes: 0,
                spill_stores: 0,
                spill_loads: 0,
                shared_bytes: None,
                cmem0_bytes: Some(360),
                cumulative_stack_bytes: None,
                max_registers_override: None,
                ptxas_ms: Some(1.958),
            }
        );
        assert_eq!(
            all[1],
            EntryResources {
                entry: "heavy".into(),
                arch: "sm_80".into(),
                registers: 24,
                barriers: Some(1),
                stack_bytes: 704,
                spill_stores: 356,
                spill_loads: 356,
                shared_bytes: Some(1024),
                cmem0_bytes: Some(372),
                cumulative_stack_bytes: Some(704),
                max_registers_override: Some(24),
                ptxas_ms: Some(163.595),
            }
        );
        assert_eq!(entry_resources(SAMPLE, "heavy").unwrap(), all[1]);
        assert_eq!(entry_resources(SAMPLE, "light").unwrap(), all[0]);
    }

    #[test]
    fn device_function_is_not_an_entry() {
        let e = entry_resources(SAMPLE, "helper").unwrap_err();
        assert_eq!(
            e,
            MetadataError::EntryNotFound {
                entry: "helper".into(),
                found: vec!["light".into(), "heavy".into()],
                device_function: true,
            }
        );
        let s = e.to_string();
        assert!(
            s.contains("`helper`") && s.contains("`light`, `heavy`"),
            "{s}"
        );
        assert!(s.contains("device function"), "{s}");
        assert!(!e.verbose_missing());
    }

    #[test]
    fn unknown_entry_lists_found() {
        let e = entry_resources(SAMPLE, "nope").unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("`nope`") && s.contains("`light`, `heavy`"),
            "{s}"
        );
        assert!(!s.contains("device function"), "{s}");
    }

    #[test]
    fn sm90_short_form() {
        // sm_90+: no cmem[0]; no smem when there is no static shared memory.
        let log = "\
ptxas info    : 14 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
ptxas info    : Compile time = 66.075 ms
";
        let r = entry_resources(log, "k").unwrap();
        assert_eq!(
            (r.arch.as_str(), r.registers, r.barriers),
            ("sm_90", 40, Some(0))
        );
        assert_eq!((r.shared_bytes, r.cmem0_bytes), (None, None));
        assert_eq!(r.cumulative_stack_bytes, None);
        assert_eq!(r.max_registers_override, None);
    }

    #[test]
    fn real_sm90a_with_smem() {
        let log = "\
ptxas info    : 15 bytes gmem
ptxas info    : Compiling entry function 'scan_f16_i64_v8_k256' for 'sm_90a'
ptxas info    : Function properties for scan_f16_i64_v8_k256
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 6144 bytes smem
ptxas info    : Compile time = 111.935 ms
";
        let r = entry_resources(log, "scan_f16_i64_v8_k256").unwrap();
        assert_eq!(r.arch, "sm_90a");
        assert_eq!(
            (r.registers, r.barriers, r.shared_bytes),
            (40, Some(1), Some(6144))
        );
    }

    #[test]
    fn old_format_without_barriers() {
        let log = "\
ptxas info    : Compiling entry function '_Z3addPiS_S_' for 'sm_52'
ptxas info    : Function properties for _Z3addPiS_S_
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 6 registers, 344 bytes cmem[0]
";
        let r = entry_resources(log, "_Z3addPiS_S_").unwrap();
        assert_eq!(
            (r.registers, r.barriers, r.cmem0_bytes),
            (6, None, Some(344))
        );
        assert_eq!((r.stack_bytes, r.spill_stores, r.spill_loads), (16, 4, 8));
        assert_eq!(r.ptxas_ms, None);
    }

    #[test]
    fn crlf_and_padding() {
        let log = SAMPLE.replace('\n', "\r\n").replace(" bytes", "   bytes");
        assert_eq!(parse_info_log(&log), parse_info_log(SAMPLE));
    }

    #[test]
    fn no_ptxas_output_means_no_verbose() {
        for log in ["", "   \n", "nvJitLink info: something else\n"] {
            let e = entry_resources(log, "k").unwrap_err();
            assert!(e.verbose_missing(), "{e}");
            assert!(matches!(
                e,
                MetadataError::NoPtxasOutput {
                    verbose_missing: true,
                    ..
                }
            ));
            assert!(e.to_string().contains("`k`"), "{e}");
        }
        assert!(entry_resources("", "k")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(parse_info_log("").is_empty());
    }

    #[test]
    fn truncated_log_reports_incomplete_entry() {
        let cut = SAMPLE.find("ptxas info    : Used 24").unwrap();
        let log = &SAMPLE[..cut];
        assert_eq!(parse_info_log(log).len(), 1);
        let e = entry_resources(log, "heavy").unwrap_err();
        assert_eq!(
            e,
            MetadataError::Incomplete {
                entry: "heavy".into(),
                arch: "sm_80".into()
            }
        );
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    #[test]
    fn garbage_never_panics() {
        // Every prefix of the sample, at every char boundary.
        for (i, _) in SAMPLE.char_indices() {
            let log = &SAMPLE[..i];
            let all = parse_info_log(log);
            assert!(all.len() <= 2);
            let _ = entry_resources(log, "heavy");
        }
        // Lines recombined and mangled by a small deterministic generator.
        let pieces: Vec<&str> = SAMPLE
            .split([' ', '\n', ',', '\''])
            .chain([
                "ptxas",
                "'",
                ",",
                "\n",
                "Used",
                "99999999999",
                "-1",
                "NaN",
                "inf",
                "=",
                ":",
                ".",
                "é",
                "\u{0}",
                "registers",
                "for",
                "with",
                "'sm_90'",
            ])
            .collect();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let n = (next() % 60) as usize;
            let mut log = String::new();
            for _ in 0..n {
                log.push_str(pieces[(next() % pieces.len() as u64) as usize]);
                log.push(if next() % 3 == 0 { '\n' } else { ' ' });
            }
            for r in parse_info_log(&log) {
                assert!(r.ptxas_ms.is_none_or(f64::is_finite));
            }
            let _ = entry_resources(&log, "heavy");
        }
        // Arbitrary bytes.
        for _ in 0..500 {
            let bytes: Vec<u8> = (0..(next() % 400)).map(|_| next() as u8).collect();
            let log = String::from_utf8_lossy(&bytes);
            let _ = parse_info_log(&log);
            let _ = entry_resources(&log, "x");
        }
    }

    #[test]
    fn overflowing_numbers_are_ignored() {
        let log = "\
ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
ptxas         .     99999999999 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 99999999999 registers, used 1 barriers
ptxas info    : Used 12 registers, used 99999999999 barriers
ptxas info    : Compile time = NaN ms
";
        let r = entry_resources(log, "k").unwrap();
        assert_eq!(
            (r.registers, r.barriers, r.stack_bytes, r.ptxas_ms),
            (12, None, 0, None)
        );
    }

    #[test]
    fn kernel_metadata_from_resources() {
        let heavy = entry_resources(SAMPLE, "heavy").unwrap();
        let m = KernelMetadata::new(&heavy, 4096, 12.5);
        assert_eq!((m.entry.as_str(), m.arch.as_str()), ("heavy", "sm_80"));
        assert_eq!(
            (m.registers, m.spill_stores, m.spill_loads, m.stack_bytes),
            (24, 356, 356, 704)
        );
        assert_eq!((m.shared_bytes, m.barriers), (Some(1024), Some(1)));
        assert_eq!((m.cubin_bytes, m.link_ms), (4096, 12.5));
        assert!(!m.spill_free());
        let light = KernelMetadata::new(&entry_resources(SAMPLE, "light").unwrap(), 1, 0.0);
        assert!(light.spill_free());
        let json = serde_json::to_string(&m).unwrap();
        let back: KernelMetadata = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m);
        let json = serde_json::to_value(&heavy).unwrap();
        assert_eq!(json["max_registers_override"], 24);
        assert_eq!(json["cumulative_stack_bytes"], 704);
    }

    // ---- ELF ----

    struct Sym<'a> {
        name: &'a str,
        info: u8,
        other: u8,
    }

    /// A minimal CUDA-like ELF64: null section, .shstrtab, .strtab, .symtab.
    fn fake_elf(machine: u16, abi: u8, e_flags: u32, syms: &[Sym<'_>]) -> Vec<u8> {
        let shstr = b"\0.shstrtab\0.strtab\0.symtab\0".to_vec();
        let mut strtab = vec![0u8];
        let mut symtab = vec![0u8; SYMBOL_LEN]; // symbol 0 is null
        for s in syms {
            let off = strtab.len() as u32;
            strtab.extend_from_slice(s.name.as_bytes());
            strtab.push(0);
            let mut e = [0u8; SYMBOL_LEN];
            e[0..4].copy_from_slice(&off.to_le_bytes());
            e[4] = s.info;
            e[5] = s.other;
            symtab.extend_from_slice(&e);
        }
        let mut out = vec![0u8; ELF_HEADER_LEN];
        let shstr_off = out.len();
        out.extend_from_slice(&shstr);
        let str_off = out.len();
        out.extend_from_slice(&strtab);
        while !out.len().is_multiple_of(8) {
            out.push(0);
        }
        let sym_off = out.len();
        out.extend_from_slice(&symtab);
        let shoff = out.len();
        let sh = |name: u32, kind: u32, off: usize, size: usize, link: u32, entsize: u64| {
            let mut h = [0u8; SECTION_HEADER_LEN];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            h
        };
        out.extend_from_slice(&[0u8; SECTION_HEADER_LEN]);
        out.extend_from_slice(&sh(1, 3, shstr_off, shstr.len(), 0, 0));
        out.extend_from_slice(&sh(11, 3, str_off, strtab.len(), 0, 0));
        out.extend_from_slice(&sh(19, SHT_SYMTAB, sym_off, symtab.len(), 2, 24));
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[6] = 1;
        out[7] = 0x33;
        out[8] = abi;
        out[16..18].copy_from_slice(&2u16.to_le_bytes());
        out[18..20].copy_from_slice(&machine.to_le_bytes());
        out[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
        out[48..52].copy_from_slice(&e_flags.to_le_bytes());
        out[52..54].copy_from_slice(&64u16.to_le_bytes());
        out[58..60].copy_from_slice(&64u16.to_le_bytes());
        out[60..62].copy_from_slice(&4u16.to_le_bytes());
        out[62..64].copy_from_slice(&1u16.to_le_bytes());
        out
    }

    fn sample_elf() -> Vec<u8> {
        fake_elf(
            EM_CUDA,
            7,
            0x0050_0550,
            &[
                Sym {
                    name: "helper",
                    info: 0x22,
                    other: 0,
                },
                Sym {
                    name: "data",
                    info: 0x11,
                    other: 0,
                },
                Sym {
                    name: "kern",
                    info: 0x12,
                    other: STO_CUDA_ENTRY,
                },
            ],
        )
    }

    #[test]
    fn fake_elf_is_accepted() {
        let b = sample_elf();
        let info = check_cubin(&b, "kern").unwrap();
        assert_eq!(info.size, b.len());
        assert_eq!(
            (info.machine, info.e_flags, info.abi_version),
            (190, 0x0050_0550, 7)
        );
        assert_eq!(info.sm, Some(80));
        assert_eq!(
            info.functions,
            vec!["helper".to_string(), "kern".to_string()]
        );
        assert!(info.entry_global && info.entry_is_kernel);
        let h = check_cubin(&b, "helper").unwrap();
        assert!(!h.entry_global && !h.entry_is_kernel);
        // An object symbol is not a function.
        let e = check_cubin(&b, "data").unwrap_err();
        assert_eq!(
            e,
            CubinError::EntryMissing {
                entry: "data".into(),
                functions: vec!["helper".into(), "kern".into()]
            }
        );
        assert!(e.to_string().contains("`helper`, `kern`"), "{e}");
    }

    #[test]
    fn e_flags_decoding() {
        assert_eq!(sm_from_e_flags(7, 0x004b_054b), Some(75));
        assert_eq!(sm_from_e_flags(7, 0x0050_0550), Some(80));
        assert_eq!(sm_from_e_flags(7, 0x005a_055a), Some(90));
        assert_eq!(sm_from_e_flags(7, 0x005a_0d5a), Some(90));
        assert_eq!(sm_from_e_flags(8, 0x0600_6402), Some(100));
        assert_eq!(sm_from_e_flags(8, 0x0600_7802), Some(120));
        assert_eq!(sm_from_e_flags(6, 0x0050_0550), None);
        assert_eq!(sm_from_e_flags(7, 0), None);
    }

    #[test]
    fn header_errors() {
        let good = sample_elf();
        assert_eq!(check_cubin(&[], "k"), Err(CubinError::TooShort { len: 0 }));
        assert_eq!(
            check_cubin(&good[..63], "k"),
            Err(CubinError::TooShort { len: 63 })
        );
        assert!(matches!(
            check_cubin(b"MZ\x90\x00", "k"),
            Err(CubinError::NotElf { .. })
        ));
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(
            check_cubin(&b, "k"),
            Err(CubinError::NotElf { .. })
        ));
        let mut b = good.clone();
        b[4] = 1;
        assert_eq!(check_cubin(&b, "k"), Err(CubinError::Not64Bit { found: 1 }));
        let mut b = good.clone();
        b[5] = 2;
        assert_eq!(
            check_cubin(&b, "k"),
            Err(CubinError::NotLittleEndian { found: 2 })
        );
        let b = fake_elf(62, 7, 0, &[]);
        let e = check_cubin(&b, "k").unwrap_err();
        assert_eq!(e, CubinError::WrongMachine { found: 62 });
        assert!(e.to_string().contains("190"), "{e}");
    }

    #[test]
    fn structural_errors() {
        let good = sample_elf();
        let shoff = read_u64(&good, 40).unwrap() as usize;
        let symtab_hdr = shoff + 3 * SECTION_HEADER_LEN;

        // No SHT_SYMTAB.
        let mut b = good.clone();
        b[symtab_hdr + 4..symtab_hdr + 8].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(check_cubin(&b, "kern"), Err(CubinError::NoSymbolTable));
        // No section headers at all.
        let mut b = good.clone();
        b[40..48].fill(0);
        assert_eq!(check_cubin(&b, "kern"), Err(CubinError::NoSymbolTable));
        // Section header table past the end.
        let mut b = good.clone();
        b[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            check_cubin(&b, "kern"),
            Err(CubinError::Truncated { .. })
        ));
        // Bad sh_link.
        let mut b = good.clone();
        b[symtab_hdr + 40..symtab_hdr + 44].copy_from_slice(&99u32.to_le_bytes());
        let e = check_cubin(&b, "kern").unwrap_err();
        assert!(e.to_string().contains("links to section 99"), "{e}");
        // Symbol table past the end.
        let mut b = good.clone();
        b[symtab_hdr + 32..symtab_hdr + 40].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(
            check_cubin(&b, "kern"),
            Err(CubinError::Truncated { .. })
        ));
        // Symbol entry size too small.
        let mut b = good.clone();
        b[symtab_hdr + 56..symtab_hdr + 64].copy_from_slice(&8u64.to_le_bytes());
        assert!(matches!(
            check_cubin(&b, "kern"),
            Err(CubinError::Truncated { .. })
        ));
        // A name offset past the string table.
        let mut b = good.clone();
        let sym_off = read_u64(&good, symtab_hdr + 24).unwrap() as usize;
        b[sym_off + SYMBOL_LEN..sym_off + SYMBOL_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = check_cubin(&b, "kern").unwrap_err();
        assert!(e.to_string().contains("string-table offset"), "{e}");
        // Wrong section header size.
        let mut b = good.clone();
        b[58..60].copy_from_slice(&40u16.to_le_bytes());
        assert!(matches!(
            check_cubin(&b, "kern"),
            Err(CubinError::Truncated { .. })
        ));
    }

    #[test]
    fn extended_section_count() {
        let mut b = sample_elf();
        let shoff = read_u64(&b, 40).unwrap() as usize;
        b[60..62].fill(0);
        b[shoff + 32..shoff + 40].copy_from_slice(&4u64.to_le_bytes());
        assert!(check_cubin(&b, "kern").is_ok());
        // An absurd extended count fails cleanly.
        b[shoff + 32..shoff + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            check_cubin(&b, "kern"),
            Err(CubinError::Truncated { .. })
        ));
    }

    #[test]
    fn every_truncation_and_byte_corruption_is_safe() {
        let good = sample_elf();
        for len in 0..good.len() {
            assert!(check_cubin(&good[..len], "kern").is_err(), "len {len}");
        }
        for i in 0..good.len() {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] = v;
                let _ = check_cubin(&b, "kern");
            }
        }
    }
}
