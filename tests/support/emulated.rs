//! Programs that run fraglink's kernels on the host under the SIMT emulator
//! (tests/support/simt/simt.h): one C++ program per combination of linked
//! fragments (a program has one metric and one filter, as a link does),
//! built from the rendered fragment sources of this build and a driver
//! header (tests/support/simt/*_driver.h) that reads the inputs from files,
//! launches and writes the outputs.

use std::path::{Path, PathBuf};
use std::process::Command;

use fraglink::search::{Bitset, DType, Filter, Metric, Neighbors, SearchParams, Vectors};

use super::host_cxx;

/// The C++ element type of `d` in the fragments.
pub fn c_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 => "__half",
        DType::I8 => "int8_t",
        DType::U8 => "uint8_t",
    }
}

/// `static const simt_io::entry<fn_type> name[] = {...};` for kernels
/// `(fragment name, capacity)`: how a driver finds a kernel by name.
pub fn table(fn_type: &str, name: &str, kernels: &[(String, u32)]) -> String {
    let rows: Vec<String> = kernels
        .iter()
        .map(|(n, c)| format!("{{\"{n}\", {n}, {c}}}"))
        .collect();
    format!(
        "static const simt_io::entry<{fn_type}> {name}[] = {{{}}};\n",
        rows.join(", ")
    )
}

/// `(name, capacity)` of the catalog's fragments of `family` that `keep` accepts.
pub fn kernels(
    family: &str,
    keep: impl Fn(&fraglink::fragment::FragmentInfo) -> bool,
) -> Vec<(String, u32)> {
    fraglink::fragments::catalog()
        .iter()
        .filter(|f| f.family == family && keep(f))
        .map(|f| {
            let cap = f.param("capacity").and_then(|c| c.parse().ok());
            (
                f.name.to_string(),
                cap.expect("a kernel fragment has a capacity"),
            )
        })
        .collect()
}

/// Writes `<dir>/<name>.cpp` — simt.h, the rendered `fragments`, the
/// `driver` header, then `rest` (tables and `main`) — and compiles it into
/// `<dir>/<name>`.
pub fn build(dir: &Path, name: &str, fragments: &[String], driver: &str, rest: &str) -> PathBuf {
    let gen = host_cxx::gen_dir();
    let mut src = String::from("#include \"simt.h\"\n");
    for f in fragments {
        let p = gen.join(format!("{f}.cu"));
        assert!(p.exists(), "rendered fragment {} is missing", p.display());
        src.push_str(&format!("#include \"{}\"\n", p.display()));
    }
    src.push_str(&format!("#include \"{driver}\"\n{rest}"));
    let cpp = dir.join(format!("{name}.cpp"));
    std::fs::write(&cpp, src).unwrap();
    let exe = dir.join(name);
    let simt = super::manifest_dir().join("tests/support/simt");
    // -Wno-unknown-pragmas: `#pragma unroll` is for NVRTC.
    host_cxx::compile(
        &exe,
        &[simt],
        &["-O2", "-fno-strict-aliasing", "-Wno-unknown-pragmas"],
        &[cpp],
    );
    exe
}

/// Runs a program; panics with `what`, the command and its stderr unless it
/// succeeds.
pub fn run(exe: &Path, args: &[String], what: &str) {
    run_with(exe, args, &[], what);
}

/// [`run`] with environment variables set (the drivers' test modes).
pub fn run_with(exe: &Path, args: &[String], env: &[(&str, String)], what: &str) {
    let out = Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {} {} failed ({}): {}",
        exe.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Little-endian bytes of plain numbers.
pub fn bytes_of<T: Copy, const N: usize>(v: &[T], to: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| to(x)).collect()
}

/// The values of a little-endian file of `N`-byte numbers.
pub fn read_of<T, const N: usize>(path: &Path, from: impl Fn([u8; N]) -> T) -> Vec<T> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    b.chunks_exact(N)
        .map(|c| from(c.try_into().unwrap()))
        .collect()
}

/// u32 result ids as the search API gives them: the padding id (all ones)
/// becomes [`Neighbors::PAD_ID`].
pub fn read_u32_ids(path: &Path) -> Vec<i64> {
    read_of(path, |b| match u32::from_le_bytes(b) {
        u32::MAX => Neighbors::PAD_ID,
        i => i64::from(i),
    })
}

/// A filter's words as the kernels read them (bit r % 32 of word r / 32).
pub fn filter_words(b: &Bitset, n_rows: usize) -> Vec<u8> {
    let words: Vec<u32> = (0..n_rows.div_ceil(32))
        .map(|w| {
            (0..32)
                .filter(|bit| w * 32 + bit < n_rows && b.get(w * 32 + bit))
                .fold(0u32, |word, bit| word | 1 << bit)
        })
        .collect();
    bytes_of(&words, u32::to_le_bytes)
}

/// Writes a search's inputs into `dir` as the drivers read them
/// (dataset.bin, queries.bin, and filter.bin when there is a filter) and
/// returns the CPU path's parameters for the same search.
pub fn write_search(
    dir: &Path,
    base: &Vectors,
    queries: &Vectors,
    k: usize,
    metric: Metric,
    filter: Option<Bitset>,
) -> SearchParams {
    write(&dir.join("dataset.bin"), base.as_bytes());
    write(&dir.join("queries.bin"), queries.as_bytes());
    let params = SearchParams::new(k, metric);
    match filter {
        Some(b) => {
            write(&dir.join("filter.bin"), &filter_words(&b, base.rows()));
            params.with_filter(Filter::Bitset(b))
        }
        None => params,
    }
}

/// The `nq × k` results a driver wrote into `dir`: ids.bin (u32, or i64
/// where `wide_ids`) and dists.bin (f32).
pub fn read_results(dir: &Path, nq: usize, k: usize, wide_ids: bool) -> Neighbors {
    let ids = if wide_ids {
        read_of(&dir.join("ids.bin"), i64::from_le_bytes)
    } else {
        read_u32_ids(&dir.join("ids.bin"))
    };
    Neighbors {
        nq,
        k,
        ids,
        distances: read_of(&dir.join("dists.bin"), f32::from_le_bytes),
    }
}

/// Asserts that `found` equals the CPU path's answer bit for bit, naming
/// `what` and the first difference.
pub fn assert_equals_cpu(
    found: &Neighbors,
    base: &Vectors,
    queries: &Vectors,
    params: &SearchParams,
    what: &str,
) {
    let want = fraglink::search::cpu::search_cpu(base, queries, params).unwrap();
    assert!(
        found.bitwise_eq(&want),
        "{what}: first difference at {:?}",
        found.first_difference(&want)
    );
}

/// Runs `job` over `jobs` on a thread per core, two at least (each job
/// compiles one program, then runs it): CI's two cores, and the sixteen of a
/// GPU machine, where these tests are the longest of the run and yield the
/// CPU to the GPU tests beside them ([`super::yield_cpu_to_other_tests`]).
pub fn in_parallel<J: Sync>(jobs: &[J], job: impl Fn(&J) + Sync) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    super::yield_cpu_to_other_tests();
    std::thread::scope(|s| {
        for _ in 0..super::threads_at_least(2) {
            s.spawn(|| {
                while let Some(j) =
                    jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    job(j);
                }
            });
        }
    });
}
