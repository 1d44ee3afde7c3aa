//! Real NVRTC → nvFatbin → nvJitLink round trips through `fraglink::sys`.
//!
//! No mocks: the libraries come from `Library::candidates()` (the
//! `FRAGLINK_*_PATH` variables, else the paths build.rs baked in). A missing
//! library fails the test with the loader's message; nothing is skipped.
//! No GPU is needed.

mod support;

use std::path::Path;
use std::sync::OnceLock;

use fraglink::sys::{
    nvfatbin, Compiled, InputType, Library, NvJitLink, Nvfatbin, Nvrtc, Output, SysError,
};

const DEVICE_FN: &str = r#"
extern "C" __device__ float fraglink_scale(float x) { return x * 2.0f + 1.0f; }
"#;

const KERNEL: &str = r#"
extern "C" __device__ float fraglink_scale(float x);
extern "C" __global__ void fraglink_roundtrip_kernel(float* p) {
    p[threadIdx.x] = fraglink_scale(p[threadIdx.x]);
}
"#;

const KERNEL_NAME: &str = "fraglink_roundtrip_kernel";

struct Libs {
    nvrtc: Nvrtc,
    fatbin: Nvfatbin,
    jitlink: NvJitLink,
}

fn libs() -> &'static Libs {
    static LIBS: OnceLock<Libs> = OnceLock::new();
    LIBS.get_or_init(|| {
        let open_err = |e: SysError| -> ! {
            panic!(
                "{e}\n(set FRAGLINK_NVRTC_PATH / FRAGLINK_NVJITLINK_PATH / FRAGLINK_NVFATBIN_PATH, \
                 or build with a toolkit build.rs can bake in)"
            )
        };
        Libs {
            nvrtc: Nvrtc::open(None).unwrap_or_else(|e| open_err(e)),
            fatbin: Nvfatbin::open(None).unwrap_or_else(|e| open_err(e)),
            jitlink: NvJitLink::open(None).unwrap_or_else(|e| open_err(e)),
        }
    })
}

fn opts(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The option forms that produce LTO-IR: `-dlto` plus a virtual or a real arch.
fn lto_options(arch: &str) -> Vec<String> {
    opts(&["-dlto", "-rdc=true", &format!("--gpu-architecture={arch}")])
}

fn compile_ltoir(source: &str, name: &str, arch: &str) -> Vec<u8> {
    let Compiled { bytes, log } = libs()
        .nvrtc
        .compile(source, name, &lto_options(arch), Output::LtoIr)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!bytes.is_empty());
    assert!(log.trim().is_empty(), "unexpected NVRTC log: {log}");
    bytes
}

/// One fatbin per program holding compute_75 and sm_90 LTO-IR, compressed.
fn fatbin_for(source: &str, name: &str) -> Vec<u8> {
    let l75 = compile_ltoir(source, name, "compute_75");
    let l90 = compile_ltoir(source, name, "sm_90");
    let mut b = libs()
        .fatbin
        .builder(&opts(&nvfatbin::COMPRESS_OPTIONS))
        .unwrap();
    b.add_ltoir(&l75, "compute_75", name, "").unwrap();
    b.add_ltoir(&l90, "90", name, "").unwrap();
    b.finish().unwrap()
}

fn fatbins() -> &'static (Vec<u8>, Vec<u8>) {
    static F: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    F.get_or_init(|| {
        (
            fatbin_for(KERNEL, "kernel.cu"),
            fatbin_for(DEVICE_FN, "device_fn.cu"),
        )
    })
}

fn e_machine(elf: &[u8]) -> u16 {
    u16::from_le_bytes([elf[18], elf[19]])
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn assert_cubin(cubin: &[u8]) {
    assert_eq!(&cubin[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(cubin[4], 2, "not ELFCLASS64");
    assert_eq!(e_machine(cubin), 190, "e_machine is not EM_CUDA");
    assert!(
        contains(cubin, KERNEL_NAME.as_bytes()),
        "kernel symbol missing from cubin"
    );
}

/// Links both fatbins with `-lto -arch=<arch> -O3 -verbose`: (cubin, info log).
fn link_fatbins(arch: &str) -> (Vec<u8>, String) {
    // The round trip reads ptxas's lines in the info log.
    support::without_driver_compute_cache();
    let (k, f) = fatbins();
    let jl = &libs().jitlink;
    let mut h = jl
        .create(&opts(&[
            "-lto",
            &format!("-arch={arch}"),
            "-O3",
            "-verbose",
        ]))
        .unwrap();
    h.add(InputType::Fatbin, k, "kernel.fatbin").unwrap();
    h.add(InputType::Fatbin, f, "device_fn.fatbin").unwrap();
    h.complete().unwrap_or_else(|e| panic!("{e}"));
    let cubin = h.cubin().unwrap();
    let info = h.info_log().unwrap();
    assert_eq!(h.error_log().unwrap(), "");
    (cubin, info)
}

#[test]
fn versions_are_compatible() {
    let l = libs();
    let (rmaj, rmin) = l.nvrtc.version().unwrap();
    let (jmaj, jmin) = l.jitlink.version().unwrap();
    let (fmaj, _) = l.fatbin.version().unwrap();
    println!("NVRTC {rmaj}.{rmin}, nvJitLink {jmaj}.{jmin}, nvFatbin {fmaj}");
    assert!(rmaj >= 12);
    // DESIGN decision 10: same major, nvJitLink minor >= NVRTC minor.
    assert_eq!(rmaj as u32, jmaj);
    assert!(jmin >= rmin as u32);
    assert_eq!(fmaj, jmaj);
    let archs = l.nvrtc.supported_archs().unwrap();
    assert!(archs.contains(&75) && archs.contains(&90), "{archs:?}");
    for lib in Library::ALL {
        assert!(!lib.candidates().is_empty(), "{lib}: no candidate path");
    }
    assert!(l.nvrtc.path().is_absolute());
}

#[test]
fn lto_option_forms() {
    let nvrtc = &libs().nvrtc;
    // All of these produce LTO-IR.
    for o in [
        &["-dlto", "-rdc=true", "--gpu-architecture=compute_75"][..],
        &["-dlto", "-rdc=true", "--gpu-architecture=sm_90"],
        &["-dlto", "-rdc=true", "-arch=compute_90"],
        &["-dlto", "-arch=compute_75"],
        &["-dlto", "-rdc=true", "-arch=sm_90a"],
    ] {
        let c = nvrtc
            .compile(KERNEL, "kernel.cu", &opts(o), Output::LtoIr)
            .unwrap_or_else(|e| panic!("{o:?}: {e}"));
        assert!(!c.bytes.is_empty(), "{o:?}");
    }
    // Without -dlto there is no LTO-IR: a typed error with a hint.
    let e = nvrtc
        .compile(
            KERNEL,
            "kernel.cu",
            &opts(&["-rdc=true", "-arch=compute_75"]),
            Output::LtoIr,
        )
        .unwrap_err();
    assert!(
        matches!(e, SysError::EmptyOutput { what: "LTO-IR", .. }),
        "{e}"
    );
    // `--dlto` is not an NVRTC option.
    let e = nvrtc
        .compile(
            KERNEL,
            "kernel.cu",
            &opts(&["--dlto", "-arch=sm_90"]),
            Output::LtoIr,
        )
        .unwrap_err();
    assert!(e.to_string().contains("NVRTC_ERROR_INVALID_OPTION"), "{e}");
}

/// The builder's option probe: a refused option is `Ok(false)` (the build
/// goes on without it, with a warning), a known one `Ok(true)`.
#[test]
fn the_option_probe_tells_a_refused_option_from_a_taken_one() {
    use fraglink::build::compile::{supports_pre_optimize, takes_option};
    use fraglink::build::Arch;
    let nvrtc = &libs().nvrtc;
    for arch in [Arch::compute(75), Arch::sm(90)] {
        assert!(supports_pre_optimize(nvrtc, arch).unwrap(), "{arch}");
        assert!(takes_option(nvrtc, arch, "-lineinfo").unwrap(), "{arch}");
        assert!(
            !takes_option(nvrtc, arch, "--fraglink-no-such-option").unwrap(),
            "{arch}"
        );
    }
}

#[test]
fn fatbin_lto_link_roundtrip() {
    for arch in ["sm_80", "sm_90", "sm_75"] {
        let (cubin, info) = link_fatbins(arch);
        assert_cubin(&cubin);
        println!("--- -verbose info log for {arch} ---\n{info}---");
        assert!(info.contains("registers"), "{info}");
        assert!(
            info.contains(&format!(
                "Compiling entry function '{KERNEL_NAME}' for '{arch}'"
            )),
            "{info}"
        );
        assert!(info.contains("bytes spill stores"), "{info}");
    }
}

#[test]
fn ltoir_inputs_link_directly() {
    let jl = &libs().jitlink;
    let mut h = jl.create(&opts(&["-lto", "-arch=sm_86"])).unwrap();
    h.add(
        InputType::LtoIr,
        &compile_ltoir(KERNEL, "kernel.cu", "compute_75"),
        "kernel",
    )
    .unwrap();
    h.add(
        InputType::LtoIr,
        &compile_ltoir(DEVICE_FN, "device_fn.cu", "compute_75"),
        "device_fn",
    )
    .unwrap();
    h.complete().unwrap();
    assert_cubin(&h.cubin().unwrap());
    // No -ptx: asking for PTX is an error, not a crash.
    assert!(h.ptx().is_err());
}

#[test]
fn any_input_type_and_add_file() {
    let (k, f) = fatbins();
    let dir = tempfile::tempdir().unwrap();
    let fpath = dir.path().join("device_fn.fatbin");
    std::fs::write(&fpath, f).unwrap();
    let jl = &libs().jitlink;
    let mut h = jl.create(&opts(&["-lto", "-arch=sm_89"])).unwrap();
    h.add(InputType::Any, k, "kernel.fatbin").unwrap();
    h.add_file(InputType::Fatbin, &fpath).unwrap();
    h.complete().unwrap();
    assert_cubin(&h.cubin().unwrap());
}

#[test]
fn lto_link_to_ptx() {
    let (k, f) = fatbins();
    let mut h = libs()
        .jitlink
        .create(&opts(&["-lto", "-arch=sm_80", "-ptx"]))
        .unwrap();
    h.add(InputType::Fatbin, k, "kernel.fatbin").unwrap();
    h.add(InputType::Fatbin, f, "device_fn.fatbin").unwrap();
    h.complete().unwrap();
    let ptx = h.ptx().unwrap();
    assert!(ptx.contains(".entry fraglink_roundtrip_kernel"), "{ptx}");
}

#[test]
fn ptx_and_cubin_outputs() {
    let nvrtc = &libs().nvrtc;
    let ptx = nvrtc
        .compile(
            DEVICE_FN,
            "device_fn.cu",
            &opts(&["-rdc=true", "-arch=compute_75"]),
            Output::Ptx,
        )
        .unwrap();
    assert_eq!(ptx.bytes.last(), Some(&0), "PTX keeps NVRTC's NUL");
    assert!(contains(&ptx.bytes, b".visible .func"));
    let cubin = nvrtc
        .compile(
            KERNEL,
            "kernel.cu",
            &opts(&["-rdc=true", "-arch=sm_80"]),
            Output::Cubin,
        )
        .unwrap();
    assert_eq!(e_machine(&cubin.bytes), 190);
    // A cubin needs a real arch.
    let e = nvrtc
        .compile(
            KERNEL,
            "kernel.cu",
            &opts(&["-arch=compute_80"]),
            Output::Cubin,
        )
        .unwrap_err();
    assert!(
        matches!(e, SysError::EmptyOutput { what: "cubin", .. }),
        "{e}"
    );
    // Non-LTO link: PTX + relocatable cubin.
    let mut h = libs().jitlink.create(&opts(&["-arch=sm_80"])).unwrap();
    h.add(InputType::Cubin, &cubin.bytes, "kernel.cubin")
        .unwrap();
    h.add(InputType::Ptx, &ptx.bytes, "device_fn.ptx").unwrap();
    h.complete().unwrap_or_else(|e| panic!("{e}"));
    assert_cubin(&h.cubin().unwrap());
}

#[test]
fn in_memory_headers() {
    let src = "#include \"scale.cuh\"\nextern \"C\" __global__ void fraglink_roundtrip_kernel(float* p) { p[0] = twice(p[0]); }";
    let c = libs()
        .nvrtc
        .compile_with_headers(
            src,
            "with_header.cu",
            &[(
                "scale.cuh",
                "__device__ inline float twice(float x) { return 2.0f * x; }",
            )],
            &lto_options("compute_75"),
            Output::LtoIr,
        )
        .unwrap();
    assert!(!c.bytes.is_empty());
}

#[test]
fn compile_error_carries_log_and_program_name() {
    let src = "extern \"C\" __global__ void broken(float* p) { p[0] = undeclared_thing; }";
    for _ in 0..3 {
        let e = libs()
            .nvrtc
            .compile(src, "broken.cu", &lto_options("compute_75"), Output::LtoIr)
            .unwrap_err();
        match &e {
            SysError::Compile {
                program,
                code_name,
                log,
            } => {
                assert_eq!(program, "broken.cu");
                assert_eq!(code_name, "NVRTC_ERROR_COMPILATION");
                assert!(log.contains("undeclared_thing"), "{log}");
                assert!(log.contains("broken.cu("), "{log}");
                assert!(log.contains("error"), "{log}");
            }
            other => panic!("unexpected: {other}"),
        }
        assert!(e.to_string().contains("undeclared_thing"));
    }
    let e = libs()
        .nvrtc
        .compile(KERNEL, "kernel.cu", &opts(&["-bogus"]), Output::Ptx)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("NVRTC_ERROR_INVALID_OPTION: nvrtc: error: unrecognized option -bogus"),
        "{e}"
    );
    let e = libs()
        .nvrtc
        .compile(KERNEL, "kernel.cu", &opts(&["-arch=sm_999"]), Output::Ptx)
        .unwrap_err();
    assert!(e.to_string().contains("--gpu-architecture"), "{e}");
}

#[test]
fn interior_nul_is_a_typed_error() {
    let e = libs()
        .nvrtc
        .compile(KERNEL, "kernel.cu", &opts(&["-O3\0x"]), Output::Ptx)
        .unwrap_err();
    assert!(
        matches!(
            e,
            SysError::InvalidString {
                what: "NVRTC option",
                ..
            }
        ),
        "{e}"
    );
    let e = libs()
        .jitlink
        .create(&opts(&["-arch=sm_80\0"]))
        .unwrap_err();
    assert!(matches!(e, SysError::InvalidString { .. }), "{e}");
}

#[test]
fn undefined_symbol_link_error() {
    let (k, _) = fatbins();
    for _ in 0..3 {
        let mut h = libs()
            .jitlink
            .create(&opts(&["-lto", "-arch=sm_80", "-O3"]))
            .unwrap();
        h.add(InputType::Fatbin, k, "kernel.fatbin").unwrap();
        let e = h.complete().unwrap_err();
        match &e {
            SysError::Link {
                code_name,
                error_log,
                ..
            } => {
                assert_eq!(code_name, "NVJITLINK_ERROR_PTX_COMPILE");
                assert!(
                    error_log.contains("Unresolved extern function 'fraglink_scale'"),
                    "{error_log}"
                );
            }
            other => panic!("unexpected: {other}"),
        }
        let s = e.to_string();
        assert!(
            s.contains("NVJITLINK_ERROR_PTX_COMPILE") && s.contains("fraglink_scale"),
            "{s}"
        );
        // Dropping `h` destroys the handle after the failure.
    }
}

#[test]
fn unknown_arch_errors_cleanly() {
    // Complete one link first: that is the state in which nvJitLink 12.9
    // itself would crash on `-arch=sm_999`.
    let _ = link_fatbins("sm_80");
    let major = libs().jitlink.version().unwrap().0;
    for arch in ["sm_999", "sm_122", "compute_1000"] {
        let e = libs()
            .jitlink
            .create(&opts(&["-lto", &format!("-arch={arch}"), "-O3"]))
            .unwrap_err();
        if major == 12 {
            // Checked by fraglink before the call (12.x would crash).
            assert!(
                matches!(&e, SysError::UnsupportedArch { arch: a, .. } if a == arch),
                "{e}"
            );
            assert!(e.to_string().contains(arch), "{e}");
        } else {
            // nvJitLink 13 rejects unknown architectures itself, by name.
            let s = e.to_string();
            assert!(
                s.contains("NVJITLINK_ERROR_UNRECOGNIZED_ARCH")
                    || s.contains("NVJITLINK_ERROR_UNSUPPORTED_ARCH"),
                "{s}"
            );
        }
    }
    // Malformed values are rejected by nvJitLink itself, with its log.
    let e = libs()
        .jitlink
        .create(&opts(&["-lto", "-arch=sm_abc"]))
        .unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("NVJITLINK_ERROR_UNRECOGNIZED_OPTION") && s.contains("sm_abc"),
        "{s}"
    );
    let e = libs()
        .jitlink
        .create(&opts(&["-lto", "-bogus", "-arch=sm_80"]))
        .unwrap_err();
    assert!(e.to_string().contains("unrecognized option: -bogus"), "{e}");
    // No -arch at all.
    let e = libs().jitlink.create(&opts(&["-lto"])).unwrap_err();
    assert!(
        e.to_string().contains("NVJITLINK_ERROR_MISSING_ARCH"),
        "{e}"
    );
    if major > 12 {
        // CUDA 13 dropped sm_70 altogether: nothing left of the check below.
        return;
    }
    // A known arch the fatbin has no entry for (sm_70 < compute_75).
    let (k, _) = fatbins();
    let mut h = libs()
        .jitlink
        .create(&opts(&["-lto", "-arch=sm_70"]))
        .unwrap();
    let e = h.add(InputType::Fatbin, k, "kernel.fatbin").unwrap_err();
    assert!(
        e.to_string().contains("NVJITLINK_ERROR_INVALID_INPUT"),
        "{e}"
    );
    assert!(e.to_string().contains("kernel.fatbin"), "{e}");
}

#[test]
fn fatbin_options_and_compression() {
    let fb = &libs().fatbin;
    for o in [
        &["-compress-all"][..],
        &["-compress-mode=size"],
        &["-compress-all", "-compress-mode=size"],
        &["-compress=true"],
        &["-compress=false"],
        &["-compress-mode=default"],
        &["-compress-mode=speed"],
        &["-compress-mode=balance"],
        &["-compress-mode=none"],
        &["-64", "-host=linux", "-cuda"],
    ] {
        fb.builder(&opts(o))
            .unwrap_or_else(|e| panic!("{o:?}: {e}"));
    }
    for o in [&["-compress-mode=bogus"][..], &["-bogus"]] {
        let e = fb.builder(&opts(o)).unwrap_err();
        assert!(
            e.to_string().contains("NVFATBIN_ERROR_UNRECOGNIZED_OPTION"),
            "{e}"
        );
    }
    let l75 = compile_ltoir(KERNEL, "kernel.cu", "compute_75");
    let l90 = compile_ltoir(KERNEL, "kernel.cu", "compute_90");
    let build = |o: &[&str]| {
        let mut b = fb.builder(&opts(o)).unwrap();
        b.add_ltoir(&l75, "sm_75", "kernel", "").unwrap();
        b.add_ltoir(&l90, "compute_90", "kernel", "").unwrap();
        b.finish().unwrap()
    };
    let plain = build(&["-compress=false"]);
    let default = build(&[]);
    let small = build(&nvfatbin::COMPRESS_OPTIONS);
    println!(
        "fatbin sizes: uncompressed {} default {} -compress-all -compress-mode=size {}",
        plain.len(),
        default.len(),
        small.len()
    );
    assert!(small.len() < plain.len());
    assert!(small.len() <= default.len());
}

#[test]
fn fatbin_input_errors() {
    let fb = &libs().fatbin;
    let mut b = fb.builder(&[]).unwrap();
    let e = b.add_ltoir(&[], "75", "empty", "").unwrap_err();
    assert!(e.to_string().contains("NVFATBIN_ERROR_EMPTY_INPUT"), "{e}");
    // Garbage is rejected (INVALID_NVVM or INTERNAL, depending on the bytes).
    let e = b.add_ltoir(b"not LTO-IR", "75", "junk", "").unwrap_err();
    let s = e.to_string();
    assert!(s.contains("NVFATBIN_ERROR_") && s.contains("`junk`"), "{s}");
    let e = b.add_ltoir(b"x", "", "noarch", "").unwrap_err();
    assert!(matches!(e, SysError::InvalidArgument(_)), "{e}");
    // The builder is still usable after errors, and dropped without finish().
}

#[test]
fn missing_libraries_name_path_and_variable() {
    let p = Path::new("/nonexistent/fraglink-test/libnvJitLink.so.12");
    for (lib, r) in [
        (Library::Nvrtc, Nvrtc::open_path(p).map(|_| ())),
        (Library::NvJitLink, NvJitLink::open_path(p).map(|_| ())),
        (Library::NvFatbin, Nvfatbin::open_path(p).map(|_| ())),
    ] {
        let e = r.unwrap_err();
        match &e {
            SysError::LibraryNotFound {
                library,
                tried,
                env_var,
            } => {
                assert_eq!(*library, lib.name());
                assert_eq!(tried, &vec![p.to_path_buf()]);
                assert_eq!(*env_var, lib.env_var());
            }
            other => panic!("unexpected: {other}"),
        }
        let s = e.to_string();
        assert!(
            s.contains(&*p.to_string_lossy()) && s.contains(lib.env_var()),
            "{s}"
        );
    }
    // The wrong library at a real path: the symbol error names everything tried.
    let nvrtc_path = libs().nvrtc.path().to_path_buf();
    let e = NvJitLink::open_path(&nvrtc_path).unwrap_err();
    match &e {
        SysError::SymbolMissing {
            library,
            symbol,
            tried,
            path,
        } => {
            assert_eq!(*library, "nvJitLink");
            assert_eq!(path, &nvrtc_path);
            assert!(tried.contains(&symbol.to_string()));
            assert!(tried.iter().any(|t| t.ends_with("_12_9")));
        }
        other => panic!("unexpected: {other}"),
    }
}

#[test]
fn parallel_compiles_and_links() {
    let l = libs();
    let (k, f) = fatbins();
    std::thread::scope(|s| {
        let compiles: Vec<_> = (0..8)
            .map(|i| {
                s.spawn(move || {
                    let src = format!(
                        "extern \"C\" __device__ float g{i}(float x) {{ return x + {i}.0f; }}"
                    );
                    l.nvrtc
                        .compile(
                            &src,
                            &format!("g{i}.cu"),
                            &lto_options("compute_80"),
                            Output::LtoIr,
                        )
                        .unwrap()
                        .bytes
                        .len()
                })
            })
            .collect();
        let links: Vec<_> = ["sm_75", "sm_80", "sm_86", "sm_90"]
            .into_iter()
            .map(|arch| {
                s.spawn(move || {
                    let mut h = l
                        .jitlink
                        .create(&opts(&["-lto", &format!("-arch={arch}")]))
                        .unwrap();
                    h.add(InputType::Fatbin, k, "kernel.fatbin").unwrap();
                    h.add(InputType::Fatbin, f, "device_fn.fatbin").unwrap();
                    h.complete().unwrap();
                    h.cubin().unwrap()
                })
            })
            .collect();
        for c in compiles {
            assert!(c.join().unwrap() > 0);
        }
        for l in links {
            assert_cubin(&l.join().unwrap());
        }
    });
}

#[test]
fn handles_move_across_threads() {
    let (k, f) = fatbins();
    let mut h = libs()
        .jitlink
        .create(&opts(&["-lto", "-arch=sm_80"]))
        .unwrap();
    h.add(InputType::Fatbin, k, "kernel.fatbin").unwrap();
    let h = std::thread::spawn(move || {
        let mut h = h;
        h.add(InputType::Fatbin, f, "device_fn.fatbin").unwrap();
        h.complete().unwrap();
        h
    })
    .join()
    .unwrap();
    assert_cubin(&h.cubin().unwrap());
}
