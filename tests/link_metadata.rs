//! Resource usage and cubin checks on real links: the embedded fragments,
//! linked by the real nvJitLink for sm_75, sm_80 and sm_90. No GPU needed.

mod support;

use fraglink::link::metadata::{
    check_cubin, cubin_resources, entry_resources, kernel_param_sizes, parse_info_log,
    sm_from_e_flags, CubinError, KernelMetadata, MetadataError, EM_CUDA,
};
use fraglink::sys::{InputType, NvJitLink};

const SCAN: &str = "scan_f32_u32_v4_k128";
const METRIC: &str = "metric_l2_f32";
const FILTER: &str = "filter_bitset_u32";

const ARCHS: [(&str, u32); 3] = [("sm_75", 75), ("sm_80", 80), ("sm_90", 90)];

/// Links `fragments` (the first one the kernel) for `arch`; returns (cubin,
/// info log).
fn link(arch: &str, fragments: &[&str], verbose: bool) -> (Vec<u8>, String) {
    // These tests read ptxas's output in the info log.
    support::without_driver_compute_cache();
    let nvjitlink = NvJitLink::open(None).expect("nvJitLink (paths baked at build time)");
    let mut options: Vec<String> = vec![
        "-lto".into(),
        format!("-arch={arch}"),
        "-O3".into(),
        format!("-kernels-used={}", fragments[0]),
    ];
    if verbose {
        options.push("-verbose".into());
    }
    let mut h = nvjitlink.create(&options).expect("nvJitLinkCreate");
    for &name in fragments {
        let info = fraglink::fragments::find(name)
            .unwrap_or_else(|| panic!("fragment {name} is not embedded"));
        h.add(InputType::Fatbin, info.fatbin, info.name)
            .unwrap_or_else(|e| panic!("adding {name}: {e}"));
    }
    h.complete()
        .unwrap_or_else(|e| panic!("link for {arch}: {e}"));
    (h.cubin().expect("cubin"), h.info_log().expect("info log"))
}

fn default_link(arch: &str) -> (Vec<u8>, String) {
    link(arch, &[SCAN, METRIC, FILTER], true)
}

/// Small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn real_links_have_the_entry_and_sane_resources() {
    for (arch, sm) in ARCHS {
        let (cubin, log) = default_link(arch);

        let info = check_cubin(&cubin, SCAN).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(info.machine, EM_CUDA, "{arch}");
        assert_eq!(info.machine, 190, "{arch}");
        assert_eq!(info.size, cubin.len());
        assert!(info.functions.iter().any(|f| f == SCAN), "{arch}: {info:?}");
        assert!(info.entry_global, "{arch}: the kernel symbol is global");
        assert!(
            info.entry_is_kernel,
            "{arch}: the kernel has STO_CUDA_ENTRY"
        );
        assert_eq!(info.sm, Some(sm), "{arch}: e_flags {:#x}", info.e_flags);

        let res = entry_resources(&log, SCAN).unwrap_or_else(|e| panic!("{arch}: {e}\n{log}"));
        assert_eq!(res.entry, SCAN);
        assert_eq!(res.arch, arch);
        assert!((1..=255).contains(&res.registers), "{arch}: {res:?}");
        assert_eq!(
            (res.spill_stores, res.spill_loads),
            (0, 0),
            "{arch}: {res:?}"
        );
        assert_eq!(res.stack_bytes, 0, "{arch}: {res:?}");
        // fragments/README.md: capacity 128 → S = 256 slots × (4 + 4) bytes,
        // and from sm_80 two stages of 128 row chunks of 128 + 16 bytes
        // (scan.cuh's RowStage).
        if let Some(smem) = res.shared_bytes {
            let stages = if sm >= 80 { 2 * 128 * 144 } else { 0 };
            assert_eq!(smem, 2048 + stages, "{arch}: {res:?}");
        }
        // The block-wide top-k synchronises.
        assert!(res.barriers.unwrap_or(1) >= 1, "{arch}: {res:?}");
        // 128 threads × registers must fit the 64K register file.
        assert!(128 * res.registers <= 65536, "{arch}: {res:?}");
        assert!(res.ptxas_ms.is_some_and(|ms| ms >= 0.0), "{arch}: {res:?}");
        eprintln!(
            "{arch}: {} registers, smem {:?}, cmem[0] {:?}, cubin {} bytes, e_flags {:#x}",
            res.registers,
            res.shared_bytes,
            res.cmem0_bytes,
            cubin.len(),
            info.e_flags
        );

        // parse_info_log sees exactly this one entry (-kernels-used).
        assert_eq!(parse_info_log(&log), vec![res.clone()], "{arch}");

        let meta = KernelMetadata::new(&res, cubin.len(), 1.0);
        assert_eq!(
            (meta.registers, meta.cubin_bytes),
            (res.registers, cubin.len())
        );
        assert!(meta.spill_free());
        let json = serde_json::to_string(&meta).unwrap();
        let back: KernelMetadata = serde_json::from_str(&json).unwrap();
        assert_eq!(back, meta);
    }
}

#[test]
fn e_flags_layout_of_real_cubins() {
    for (arch, sm) in ARCHS {
        let (cubin, _) = default_link(arch);
        let info = check_cubin(&cubin, SCAN).unwrap();
        match info.abi_version {
            // CUDA 12 ELF ABI version 7: SM in bits 0-7, virtual SM in bits
            // 16-23, 0x500 = EF_CUDA_TEXMODE_UNIFIED | EF_CUDA_64BIT_ADDRESS.
            7 => {
                assert_eq!(info.e_flags & 0xff, sm, "{arch}: {:#x}", info.e_flags);
                assert_eq!(
                    (info.e_flags >> 16) & 0xff,
                    sm,
                    "{arch}: {:#x}",
                    info.e_flags
                );
                assert_eq!(info.e_flags, (sm << 16) | 0x500 | sm, "{arch}");
            }
            // CUDA 13 writes ABI version 8 for every SM: the SM in bits 8-15.
            8 => assert_eq!(
                (info.e_flags >> 8) & 0xff,
                sm,
                "{arch}: {:#x}",
                info.e_flags
            ),
            v => panic!("{arch}: unexpected CUDA ELF ABI version {v}"),
        }
        assert_eq!(sm_from_e_flags(info.abi_version, info.e_flags), Some(sm));
    }
}

#[test]
fn device_functions_are_listed_but_are_not_kernels() {
    // f16 cosine pulls in libdevice slow paths (sqrt, division) as device functions.
    let (cubin, log) = link(
        "sm_80",
        &[
            "scan_f16_i64_v8_k256",
            "metric_cosine_f16",
            "filter_none_i64",
        ],
        true,
    );
    let info = check_cubin(&cubin, "scan_f16_i64_v8_k256").unwrap();
    assert!(info.entry_is_kernel && info.entry_global);
    for f in info
        .functions
        .iter()
        .filter(|f| *f != "scan_f16_i64_v8_k256")
    {
        let other = check_cubin(&cubin, f).unwrap();
        assert!(!other.entry_is_kernel, "{f} is a device function");
    }
    let res = entry_resources(&log, "scan_f16_i64_v8_k256").unwrap();
    // capacity 256 → S = 512 slots × (4 + 8) bytes, and (sm_80) the row
    // stages.
    if let Some(smem) = res.shared_bytes {
        assert_eq!(smem, 6144 + 2 * 128 * 144, "{res:?}");
    }
    assert_eq!(
        (res.spill_stores, res.spill_loads, res.stack_bytes),
        (0, 0, 0)
    );
    eprintln!("sm_80 scan_f16_i64_v8_k256: {} registers", res.registers);
}

#[test]
fn missing_entry_is_named_with_what_exists() {
    let (cubin, log) = default_link("sm_80");
    match check_cubin(&cubin, "scan_nope") {
        Err(CubinError::EntryMissing { entry, functions }) => {
            assert_eq!(entry, "scan_nope");
            assert!(functions.iter().any(|f| f == SCAN), "{functions:?}");
        }
        other => panic!("expected EntryMissing, got {other:?}"),
    }
    let e = entry_resources(&log, "scan_nope").unwrap_err();
    assert_eq!(
        e,
        MetadataError::EntryNotFound {
            entry: "scan_nope".into(),
            found: vec![SCAN.into()],
            device_function: false,
        }
    );
    let s = e.to_string();
    assert!(s.contains("scan_nope") && s.contains(SCAN), "{s}");
}

#[test]
fn link_without_verbose_says_so() {
    let (cubin, log) = link("sm_80", &[SCAN, METRIC, FILTER], false);
    assert!(check_cubin(&cubin, SCAN).is_ok());
    let e = entry_resources(&log, SCAN).unwrap_err();
    assert!(e.verbose_missing(), "{e}");
    assert!(matches!(
        e,
        MetadataError::NoPtxasOutput {
            verbose_missing: true,
            ..
        }
    ));
    assert!(parse_info_log(&log).is_empty());
}

#[test]
fn every_truncation_of_a_real_cubin_is_rejected_without_panic() {
    let (cubin, _) = default_link("sm_80");
    let shoff = u64::from_le_bytes(cubin[40..48].try_into().unwrap()) as usize;
    let shnum = u16::from_le_bytes(cubin[60..62].try_into().unwrap()) as usize;
    let table_end = shoff + shnum * 64;
    for len in 0..cubin.len() {
        let r = check_cubin(&cubin[..len], SCAN);
        if len < 64 {
            assert_eq!(r, Err(CubinError::TooShort { len }));
        } else if len < table_end {
            assert!(
                matches!(r, Err(CubinError::Truncated { .. })),
                "len {len}: {r:?}"
            );
        }
    }
    assert!(check_cubin(&cubin, SCAN).is_ok());
}

#[test]
fn random_corruption_of_real_cubins_never_panics() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (arch, _) in ARCHS {
        let (cubin, _) = default_link(arch);
        // Random bit flips anywhere.
        for _ in 0..4000 {
            let mut b = cubin.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            let _ = check_cubin(&b, SCAN);
        }
        // Extreme values in the fields the reader follows: header offsets and
        // counts, and every section header's offset/size/link/entsize.
        let shoff = u64::from_le_bytes(cubin[40..48].try_into().unwrap()) as usize;
        let shnum = u16::from_le_bytes(cubin[60..62].try_into().unwrap()) as usize;
        let mut fields: Vec<(usize, usize)> = vec![(40, 8), (58, 2), (60, 2), (62, 2)];
        for s in 0..shnum {
            let h = shoff + s * 64;
            fields.extend([
                (h + 4, 4),
                (h + 24, 8),
                (h + 32, 8),
                (h + 40, 4),
                (h + 56, 8),
            ]);
        }
        for (at, len) in fields {
            for fill in [0x00u8, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = cubin.clone();
                b[at..at + len].fill(fill);
                let _ = check_cubin(&b, SCAN);
            }
            for _ in 0..20 {
                let mut b = cubin.clone();
                for byte in &mut b[at..at + len] {
                    *byte = rng.next() as u8;
                }
                let _ = check_cubin(&b, SCAN);
            }
        }
    }
    // And plain noise, with and without a valid-looking header.
    for _ in 0..2000 {
        let len = rng.below(512);
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if len >= 64 && rng.below(2) == 0 {
            b[..6].copy_from_slice(b"\x7fELF\x02\x01");
            b[18..20].copy_from_slice(&190u16.to_le_bytes());
            b[58..60].copy_from_slice(&64u16.to_le_bytes());
        }
        let _ = check_cubin(&b, SCAN);
    }
}

#[test]
fn truncated_and_mangled_real_logs_never_panic() {
    let (_, log) = default_link("sm_90");
    assert!(
        !log.trim().is_empty(),
        "nvJitLink returned an empty info log for a -verbose link"
    );
    for (i, _) in log.char_indices() {
        let _ = entry_resources(&log[..i], SCAN);
    }
    let mut rng = Rng(7);
    let bytes = log.as_bytes();
    for _ in 0..2000 {
        let mut b = bytes.to_vec();
        for _ in 0..1 + rng.below(6) {
            let i = rng.below(b.len());
            b[i] = rng.next() as u8;
        }
        let s = String::from_utf8_lossy(&b);
        for r in parse_info_log(&s) {
            assert!(r.ptxas_ms.is_none_or(f64::is_finite));
        }
        let _ = entry_resources(&s, SCAN);
    }
}

/// The cubin's own record of registers, stack frame and static shared memory
/// (the fallback when nvJitLink's info log has no ptxas output) agrees with
/// what ptxas printed, for every scan variant and arch.
#[test]
fn cubin_resources_agree_with_ptxas() {
    let scans: Vec<_> = fraglink::fragments::catalog()
        .iter()
        .filter(|f| f.family == "scan")
        .collect();
    assert!(!scans.is_empty());
    let mut checked = 0;
    for f in scans {
        let param = |k: &str| {
            f.params
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("{} has no {k}", f.name))
        };
        let (dtype, idx) = (param("dtype"), param("idx"));
        let metric = format!("metric_l2_{dtype}");
        let filter = format!("filter_bitset_{idx}");
        for (arch, _) in ARCHS {
            let (cubin, log) = link(arch, &[f.name, &metric, &filter], true);
            let Ok(from_log) = entry_resources(&log, f.name) else {
                // nvJitLink printed nothing (the case the fallback exists for).
                continue;
            };
            let from_cubin = cubin_resources(&cubin, f.name).unwrap();
            assert_eq!(
                from_cubin.registers, from_log.registers,
                "{} {arch}",
                f.name
            );
            assert_eq!(
                from_cubin.stack_bytes, from_log.stack_bytes,
                "{} {arch}",
                f.name
            );
            assert_eq!(
                from_cubin.shared_bytes,
                from_log.shared_bytes.unwrap_or(0),
                "{} {arch}",
                f.name
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no link printed ptxas output to compare with");
    let e = cubin_resources(&default_link("sm_90").0, "nope").unwrap_err();
    assert!(matches!(e, CubinError::EntryMissing { .. }), "{e}");
}

/// The parameter sizes the launcher takes from the cubin (so that it asks
/// `cuFuncGetParamInfo` for exactly that many) are the kernels' declared
/// parameters, in order: templates/scan.cu.j2 (three pointers, a u64, three
/// u32, two pointers) and templates/knn_select.cu.j2 (two pointers, five u32,
/// two pointers), on every arch.
#[test]
fn parameter_sizes_come_from_the_cubin_in_declaration_order() {
    let scan = [8, 8, 8, 8, 4, 4, 4, 8, 8];
    let select = [8, 8, 4, 4, 4, 4, 4, 8, 8];
    for (arch, _) in ARCHS {
        let (cubin, _) = default_link(arch);
        assert_eq!(
            kernel_param_sizes(&cubin, SCAN).unwrap().as_deref(),
            Some(&scan[..]),
            "{SCAN} {arch}"
        );
        // No `.nv.info.<entry>` for a name the cubin does not define.
        assert_eq!(kernel_param_sizes(&cubin, "nope").unwrap(), None);
        let (cubin, _) = link(arch, &["knn_select_b256"], false);
        assert_eq!(
            kernel_param_sizes(&cubin, "knn_select_b256")
                .unwrap()
                .as_deref(),
            Some(&select[..]),
            "knn_select_b256 {arch}"
        );
    }
    assert!(kernel_param_sizes(b"not a cubin", SCAN).is_err());
}
