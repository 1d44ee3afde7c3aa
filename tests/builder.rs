//! The public builder as a GPU library author uses it (issue 14): keep-going
//! builds, option checks, standard-header stand-ins, `-default-device` per
//! family with the host-code warning, plain sources with `-D` defines, name
//! expressions, entries recorded per arch, and arch-specific targets. Real
//! NVRTC and nvFatbin (the toolkit fraglink was built with).

use std::path::Path;

use fraglink::build::toolkit::{Discovery, Origin, Toolkit};
use fraglink::build::{BuildError, BuildReport, Builder, Family};

/// The toolkit fraglink was built with, where it still is; else the one run-time
/// discovery finds (`FRAGLINK_CUDA_ROOT`, `CUDA_PATH`, `CUDA_HOME`,
/// /usr/local/cuda, Python's wheels; never a download). A GPU machine runs these
/// tests from an archive built elsewhere, without the build's toolkit.
fn toolkit() -> Toolkit {
    let baked = Toolkit {
        root: env!("FRAGLINK_BAKED_CUDA_ROOT").into(),
        nvrtc: env!("FRAGLINK_BAKED_NVRTC_PATH").into(),
        nvjitlink: env!("FRAGLINK_BAKED_NVJITLINK_PATH").into(),
        nvfatbin: env!("FRAGLINK_BAKED_NVFATBIN_PATH").into(),
        include_dirs: std::env::split_paths(env!("FRAGLINK_BAKED_CUDA_INCLUDES")).collect(),
        origin: Origin::Root("FRAGLINK_BAKED_CUDA_ROOT".into()),
    };
    if baked.nvrtc.is_file() && baked.nvfatbin.is_file() {
        return baked;
    }
    Discovery::from_env(None)
        .and_then(|d| d.find())
        .unwrap_or_else(|e| {
            panic!(
                "the build's toolkit is gone ({}) and none was found at run time: {e}",
                baked.root.display()
            )
        })
}

/// A crate directory with one matrix and the given sources.
fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("m.json"),
        r#"{"ctype": ["float", "double"]}"#,
    )
    .unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

fn builder(dir: &Path, archs: &[&str]) -> Builder {
    Builder::new()
        .manifest_dir(dir)
        .out_dir(dir.join("out"))
        .cache_dir(dir.join("cache"))
        .toolkit(toolkit())
        .archs(archs)
        .jobs(2)
        .cargo_directives(false)
}

fn family(name: &str, file: &str) -> Family {
    Family::new(name, format!("{}Fragment", name.to_uppercase()))
        .matrix("m.json")
        .template(file)
        .name_format(format!("{name}_{{{{ ctype }}}}"))
}

const GOOD: &str = r#"extern "C" __global__ void good_{{ ctype }}({{ ctype }}* x) { x[0] = 1; }"#;
const BAD: &str =
    r#"extern "C" __global__ void bad_{{ ctype }}({{ ctype }}* x) { x[0] = undefined_name; }"#;

#[test]
fn a_failing_fragment_is_reported_with_every_arch_and_keep_going_writes_the_rest() {
    let dir = project(&[("good.cu.j2", GOOD), ("bad.cu.j2", BAD)]);
    let b = builder(dir.path(), &["compute_75", "compute_80"])
        .family(family("good", "good.cu.j2"))
        .family(family("bad", "bad.cu.j2"));
    let e = b.clone().compile().unwrap_err();
    let msg = e.to_string();
    let BuildError::Fragments {
        failures, total, ..
    } = &e
    else {
        panic!("{msg}")
    };
    assert_eq!(
        (failures.len(), *total),
        (4, 4),
        "two fragments × two archs: {msg}"
    );
    assert!(msg.starts_with("2 of 4 fragments failed"), "{msg}");
    for want in [
        "bad_float",
        "bad_double",
        "compute_75",
        "compute_80",
        "undefined_name",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    assert!(!dir.path().join("out/fraglink_registry.rs").exists());

    let report: BuildReport = b.keep_going(true).compile().unwrap();
    assert_eq!(report.fragments.len(), 2);
    assert_eq!(report.failures.len(), 4);
    let registry = std::fs::read_to_string(&report.registry).unwrap();
    assert!(registry.contains("\"good_float\"") && !registry.contains("\"bad_float\""));
    let text = std::fs::read_to_string(&report.report_file).unwrap();
    assert!(text.contains("FAILED           bad_double (bad)"), "{text}");
    assert!(text.contains("undefined_name"), "{text}");
}

#[test]
fn options_are_checked_up_front() {
    let dir = project(&[("good.cu.j2", GOOD)]);
    let e = builder(dir.path(), &["compute_75"])
        .nvrtc_option("--expt-relaxed-constexpr")
        .family(family("good", "good.cu.j2"))
        .compile()
        .unwrap_err();
    assert!(matches!(e, BuildError::Option(_)), "{e}");
    assert!(e.to_string().contains("__host__ __device__"), "{e}");
    let e = builder(dir.path(), &["compute_75"])
        .family(family("good", "good.cu.j2").nvrtc_option("-Xcompiler=-fPIC"))
        .compile()
        .unwrap_err();
    assert!(e.to_string().contains("family `good`"), "{e}");
    // nvcc's -O3 is translated, with a note.
    let r = builder(dir.path(), &["compute_75"])
        .nvrtc_option("-O3")
        .family(family("good", "good.cu.j2"))
        .compile()
        .unwrap();
    assert!(
        r.warnings.iter().any(|w| w.contains("`-dopt=on`")),
        "{:?}",
        r.warnings
    );
}

const STD: &str = r#"#include <stdint.h>
#include <cmath>
#include <type_traits>
#include <climits>
extern "C" __global__ void std_{{ ctype }}({{ ctype }}* x, int32_t n) {
  static_assert(std::is_floating_point<{{ ctype }}>::value, "");
  x[0] = std::round(x[1]) + INFINITY + (n == INT_MAX ? M_PI : 0.0);
}"#;

#[test]
fn standard_headers_are_on_by_default_and_switchable() {
    let dir = project(&[("std.cu.j2", STD)]);
    builder(dir.path(), &["compute_75"])
        .family(family("std", "std.cu.j2"))
        .compile()
        .unwrap();
    let e = builder(dir.path(), &["compute_75"])
        .family(family("std", "std.cu.j2").std_headers(false))
        .compile()
        .unwrap_err()
        .to_string();
    assert!(e.contains("stdint.h"), "{e}");
}

const LAUNCHER: &str = r#"#include <cuda_runtime.h>
template <typename T> static __global__ void fill(T* x) { x[0] = T(1); }
extern "C" void launch_fill_{{ ctype }}(cudaStream_t s, {{ ctype }}* x) { fill<{{ ctype }}><<<1, 1, 0, s>>>(x); }
"#;

#[test]
fn host_launchers_warn_under_default_device_and_fail_without_it() {
    let dir = project(&[("l.cu.j2", LAUNCHER)]);
    let r = builder(dir.path(), &["compute_75"])
        .family(family("launch", "l.cu.j2"))
        .compile()
        .unwrap();
    let w = r
        .warnings
        .iter()
        .find(|w| w.contains("host-looking"))
        .expect("a warning");
    assert!(
        w.contains("`launch_float`") && w.contains("<<<") && w.contains("__CUDACC_RTC__"),
        "{w}"
    );
    let e = builder(dir.path(), &["compute_75"])
        .family(family("launch", "l.cu.j2").default_device(false))
        .compile()
        .unwrap_err()
        .to_string();
    assert!(e.contains("host function"), "{e}");
}

const PLAIN: &str = r#"#include <stdint.h>
template <typename T> static __global__ void quantize(const T* x, int8_t* q) { q[0] = (int8_t)x[0]; }
#ifndef __CUDACC_RTC__
void launch() { quantize<float><<<1, 1>>>(nullptr, nullptr); }
#endif
extern "C" __global__ void zero_fill(float* y) { float z[1] = {{0.0f}}; y[0] = z[0] + WIDTH; }
#if __CUDA_ARCH__ >= 800
extern "C" __global__ void only_ampere(float* y) { y[0] = 2; }
#endif
"#;

#[test]
fn plain_sources_name_expressions_and_entries_per_arch() {
    let dir = project(&[("plain.cu", PLAIN)]);
    std::fs::write(
        dir.path().join("m.json"),
        r#"{"ctype": ["float"], "width": [4]}"#,
    )
    .unwrap();
    let r = builder(dir.path(), &["compute_75", "compute_80"])
        .family(
            Family::new("plain", "PlainFragment")
                .matrix("m.json")
                .source("plain.cu")
                .name_format("plain_{{ ctype }}_w{{ width }}")
                .name_expression("quantize<{{ ctype }}>"),
        )
        .compile()
        .unwrap();
    let rec = &r.fragments[0].recorded;
    let lowered = &rec.lowered[0];
    assert_eq!(lowered.0, "quantize<float>");
    assert!(lowered.1.starts_with("_Z8quantizeIfE"), "{lowered:?}");
    let (a75, e75) = &rec.entries[0];
    let (a80, e80) = &rec.entries[1];
    assert_eq!((a75.as_str(), a80.as_str()), ("compute_75", "compute_80"));
    assert!(e75.contains(&lowered.1) && e75.contains(&"zero_fill".to_string()));
    assert!(!e75.contains(&"only_ampere".to_string()));
    assert!(e80.contains(&"only_ampere".to_string()));
    assert_eq!(
        rec.definitions,
        ["only_ampere", "zero_fill"],
        "static kernels are not external"
    );
    let registry = std::fs::read_to_string(&r.registry).unwrap();
    assert!(
        registry.contains("lowered: &[(\"quantize<float>\", \"_Z8quantizeIfE"),
        "{registry}"
    );
}

#[test]
fn arch_specific_targets_build() {
    let dir = project(&[("good.cu.j2", GOOD)]);
    let r = builder(dir.path(), &["sm_90a", "compute_100f"])
        .family(family("good", "good.cu.j2"))
        .compile()
        .unwrap();
    let archs: Vec<String> = r.archs.iter().map(|a| a.to_string()).collect();
    assert_eq!(archs, ["sm_90a", "compute_100f"]);
    assert_eq!(r.fragments[0].recorded.entries[0].0, "sm_90a");
    assert_eq!(r.fragments[0].recorded.entries[1].1, ["good_float"]);
}

#[test]
fn a_name_expression_that_names_nothing_is_a_fragment_error() {
    let dir = project(&[("good.cu.j2", GOOD)]);
    let e = builder(dir.path(), &["compute_75"])
        .family(family("good", "good.cu.j2").name_expression("missing<{{ ctype }}>"))
        .compile()
        .unwrap_err()
        .to_string();
    assert!(e.contains("good_float") && e.contains("missing"), "{e}");
}

/// A matrix key with each entry's minimum arch (`Family::min_arch_key`)
/// and a family-wide minimum (`Family::min_arch`): each fragment is
/// compiled and recorded for the build's archs from its minimum on, and a
/// minimum above every arch of the build is an error naming the fragment.
#[test]
fn minimum_archs_filter_each_fragments_archs() {
    let dir = project(&[("good.cu.j2", GOOD)]);
    std::fs::write(
        dir.path().join("m.json"),
        r#"{"_v": [{"ctype": "float", "min_arch": "80"}, {"ctype": "double"}]}"#,
    )
    .unwrap();
    let r = builder(dir.path(), &["compute_75", "compute_80", "sm_90"])
        .family(family("good", "good.cu.j2").min_arch_key("min_arch"))
        .compile()
        .unwrap();
    let archs_of = |name: &str| -> Vec<String> {
        let f = r.fragments.iter().find(|f| f.name == name).unwrap();
        f.recorded.entries.iter().map(|(a, _)| a.clone()).collect()
    };
    assert_eq!(archs_of("good_float"), ["compute_80", "sm_90"]);
    assert_eq!(
        archs_of("good_double"),
        ["compute_75", "compute_80", "sm_90"]
    );
    let registry = std::fs::read_to_string(&r.registry).unwrap();
    assert!(
        registry.contains("archs: &[\"compute_80\", \"sm_90\"]"),
        "{registry}"
    );

    // A family minimum above every arch of the build.
    let e = builder(dir.path(), &["compute_75", "compute_80"])
        .family(family("good", "good.cu.j2").min_arch(90))
        .compile()
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, BuildError::MinArch(_)), "{msg}");
    for want in ["good_float", "sm_90", "compute_75, compute_80"] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    // A value that is no compute capability.
    std::fs::write(
        dir.path().join("m.json"),
        r#"{"ctype": "float", "min_arch": "ampere"}"#,
    )
    .unwrap();
    let e = builder(dir.path(), &["compute_75"])
        .family(family("good", "good.cu.j2").min_arch_key("min_arch"))
        .compile()
        .unwrap_err();
    assert!(e.to_string().contains("`min_arch` = \"ampere\""), "{e}");
}

const LOOP: &str = r#"extern "C" __global__ void sum_{{ ctype }}(const {{ ctype }}* x, {{ ctype }}* out, int n) {
  {{ ctype }} s = 0;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  out[threadIdx.x] = s;
}
"#;

#[test]
fn fragments_are_pre_optimized_by_default_and_switchable() {
    let dir = project(&[("loop.cu.j2", LOOP)]);
    let build = |fam: Family, out: &str| {
        builder(dir.path(), &["compute_75", "sm_90"])
            .out_dir(dir.path().join(out))
            .family(fam)
            .compile()
            .unwrap()
    };
    let on = build(family("loop", "loop.cu.j2"), "on");
    let off = build(family("loop", "loop.cu.j2").pre_optimize(false), "off");
    // The build's NVRTC (12.9 or 13.0) takes --gen-opt-lto: no warning
    // that it was left out.
    for r in [&on, &off] {
        assert!(
            !r.warnings.iter().any(|w| w.contains("--gen-opt-lto")),
            "{:?}",
            r.warnings
        );
    }
    // The option is part of each fragment's cache key (the second build
    // compiled, it did not take the first one's fatbins), and it changes
    // the LTO-IR NVRTC writes.
    assert_eq!(on.fragments.len(), 2);
    for (a, b) in on.fragments.iter().zip(&off.fragments) {
        assert_eq!(a.name, b.name);
        assert!(!a.cached && !b.cached, "{}", a.name);
        assert_ne!(a.hash, b.hash, "{}", a.name);
        assert_eq!(a.recorded, b.recorded, "{}", a.name);
    }
}

/// Set (to `build` or `discovery`) in a child of [`run_env_child`]: the
/// test [`ENV_TEST`] then runs one build step reading the environment its
/// parent gave it, and prints its outcome.
const ENV_CHILD: &str = "FRAGLINK_BUILDER_ENV_CHILD";
const ENV_TEST: &str = "env_child";
/// The variables the children read, each removed unless a test sets it.
const BUILD_VARS: &[&str] = &[
    "FRAGLINK_ARCHS",
    "FRAGLINK_BUILD_CACHE_DIR",
    "FRAGLINK_CUDA_VERSION",
    "FRAGLINK_PYTHON",
];

/// Child mode of the tests below, a test of its own that does nothing in
/// a normal run. `build`: a build of one fragment in the current directory
/// (given the toolkit and no cache directory, so only the environment can
/// name one); `discovery`: the toolkit discovery's reading of the
/// environment. Prints `outcome: ok` or `outcome: error: …`.
#[test]
fn env_child() {
    let Some(mode) = std::env::var_os(ENV_CHILD) else {
        return;
    };
    let outcome = match mode.to_str() {
        Some("build") => {
            let dir = std::env::current_dir().unwrap();
            Builder::new()
                .manifest_dir(&dir)
                .out_dir(dir.join("out"))
                .toolkit(toolkit())
                .archs(&["compute_75"])
                .jobs(1)
                .cargo_directives(false)
                .family(family("good", "good.cu.j2"))
                .compile()
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        Some("discovery") => Discovery::from_env(None)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        other => panic!("{ENV_CHILD}={other:?}"),
    };
    match outcome {
        Ok(()) => println!("outcome: ok"),
        Err(e) => println!("outcome: error: {e}"),
    }
}

/// Runs [`env_child`] in `mode` with `vars` set (the other build variables
/// removed) in a fresh project directory; its outcome line and the
/// directory.
fn run_env_child(mode: &str, vars: &[(&str, &std::ffi::OsStr)]) -> (String, tempfile::TempDir) {
    let dir = project(&[("good.cu.j2", GOOD)]);
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([ENV_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .current_dir(dir.path())
        .env(ENV_CHILD, mode);
    for v in BUILD_VARS {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("outcome: ").map(|(_, o)| o))
        .unwrap_or_else(|| {
            panic!(
                "no outcome from the child: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (line.to_string(), dir)
}

/// An empty `FRAGLINK_BUILD_CACHE_DIR` is unset, as every other variable's
/// empty value: it was `PathBuf::from("")`, and the cache's fatbins and
/// sidecars were written into the build's working directory.
#[test]
fn an_empty_build_cache_dir_is_unset() {
    let (outcome, dir) = run_env_child("build", &[("FRAGLINK_BUILD_CACHE_DIR", "".as_ref())]);
    assert_eq!(outcome, "ok");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["good.cu.j2", "m.json", "out"]);
}

/// Build variables read as the library reads its own: a value that is not
/// Unicode is an error naming the variable (`FRAGLINK_ARCHS`,
/// `FRAGLINK_CUDA_VERSION` and `FRAGLINK_PYTHON` took it for unset), and
/// `FRAGLINK_CUDA_VERSION` takes what README lists (`12`, `13`, `12.9`,
/// `13.0`), no longer any `12.x`/`13.x` (`12.junk` was 12).
#[cfg(unix)]
#[test]
fn build_variables_refuse_what_they_do_not_take_naming_the_variable() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let refused = |mode: &str, var: &str, value: &OsStr| {
        let (outcome, _dir) = run_env_child(mode, &[(var, value)]);
        assert!(
            outcome.starts_with("error: ") && outcome.contains(var),
            "{var}={value:?}: {outcome}"
        );
    };
    refused("build", "FRAGLINK_ARCHS", OsStr::from_bytes(b"sm_90\xff"));
    refused("discovery", "FRAGLINK_PYTHON", OsStr::from_bytes(b"py\xff"));
    let version = "FRAGLINK_CUDA_VERSION";
    refused("discovery", version, OsStr::from_bytes(b"12\xff"));
    for bad in ["12.junk", "12.4", "13.1", "14", "012", "12.9.0"] {
        refused("discovery", version, bad.as_ref());
    }
    for good in ["12", " 13 ", "12.9", "13.0", ""] {
        let (outcome, _dir) = run_env_child("discovery", &[(version, good.as_ref())]);
        assert_eq!(outcome, "ok", "{version}={good:?}");
    }
}

/// A cache entry whose fatbin no longer has the blake3 its sidecar
/// records (truncated by a crash, corrupted) is compiled again and
/// overwritten, with a warning naming it; it was embedded as it was.
#[test]
fn a_damaged_cache_entry_is_compiled_again_with_a_warning() {
    let dir = project(&[("good.cu.j2", GOOD)]);
    let build = |out: &str| {
        builder(dir.path(), &["compute_75"])
            .out_dir(dir.path().join(out))
            .family(family("good", "good.cu.j2"))
            .compile()
            .unwrap()
    };
    let first = build("a");
    assert!(first.fragments.iter().all(|f| !f.cached));
    let fatbins: Vec<_> = std::fs::read_dir(dir.path().join("cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "fatbin"))
        .collect();
    assert_eq!(fatbins.len(), first.fragments.len());
    // One truncated, one corrupted in place (same length).
    let bytes = std::fs::read(&fatbins[0]).unwrap();
    std::fs::write(&fatbins[0], &bytes[..bytes.len() / 2]).unwrap();
    let mut other = std::fs::read(&fatbins[1]).unwrap();
    let mid = other.len() / 2;
    other[mid] ^= 0xff;
    std::fs::write(&fatbins[1], &other).unwrap();

    let second = build("b");
    let cached = |r: &BuildReport| -> Vec<bool> { r.fragments.iter().map(|f| f.cached).collect() };
    assert_eq!(cached(&second), [false, false]);
    for (a, b) in first.fragments.iter().zip(&second.fragments) {
        assert_eq!(a.hash, b.hash, "{}", a.name);
    }
    let warned = second
        .warnings
        .iter()
        .filter(|w| w.contains("build cache entry") && w.contains("blake3"))
        .count();
    assert_eq!(warned, 2, "{:?}", second.warnings);
    // Overwritten: the next build takes both from the cache, silently.
    let third = build("c");
    assert_eq!(cached(&third), [true, true]);
    assert!(
        !third
            .warnings
            .iter()
            .any(|w| w.contains("build cache entry")),
        "{:?}",
        third.warnings
    );
}
