#!/usr/bin/env python3
"""Writes BENCHMARKS.md from the JSON results benches/run.sh collected.

    report.py --results DIR --out BENCHMARKS.md --cu13 DIR --seconds S --jobs N --reps "k=v ..." \
        [--only build,size,link,search,small,ivf]

With --only (run.sh's BENCH_ONLY), only those sections are regenerated: the
other sections, their summary rows and their machine are kept from the
existing --out file, and the header says which sections come from which run.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import statistics
import subprocess
from importlib import metadata


# --------------------------------------------------------------------------- helpers

def load_json(path):
    with open(path) as f:
        return json.load(f)


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summary(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def cmd_out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "n/a"


def fmt(x, digits=2):
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}"


def mmm(s, scale=1.0, digits=2):
    """min / median / max."""
    return " / ".join(fmt(s[k] * scale, digits) for k in ("min", "median", "max"))


def ratio(a, b, digits=2):
    if not a or not b:
        return "n/a"
    return f"{a / b:.{digits}f}×"


def ns_human(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.0f} ns"


def mmm_ns(e):
    return " / ".join(ns_human(e[k]) for k in ("min_ns", "median_ns", "max_ns"))


def threads(n):
    return f"{n} thread" + ("s" if n != 1 else "")


def kib(n):
    return f"{n:,} B ({n / 1024:,.0f} KiB)"


# --------------------------------------------------------------------------- machine

def machine(cu13, toolkit129):
    cpu = "n/a"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "n/a"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    osname = platform.platform()
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as f:
            m = re.search(r'^PRETTY_NAME="?([^"\n]*)', f.read(), re.M)
            if m:
                osname = m.group(1)
    wheels = []
    for name in ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime",
                 "nvidia-cuda-cccl", "nvidia-cuda-nvrtc", "nvidia-nvfatbin", "nvidia-nvjitlink"):
        try:
            wheels.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            wheels.append(f"{name} missing")
    cuda12 = "n/a"
    if toolkit129:
        root = toolkit129
        while root != "/" and not glob.glob(os.path.join(root, "*.dist-info")):
            root = os.path.dirname(root)
        infos = sorted(os.path.basename(p)[:-len(".dist-info")] for p in glob.glob(os.path.join(root, "*.dist-info")))
        cuda12 = ", ".join(i.replace("_", "-").replace("-cu12-", "-cu12 ") for i in infos) or toolkit129
    others = []
    for name in ("faiss-cpu", "numpy"):
        try:
            others.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            others.append(f"{name} missing")
    return [
        ("CPU", cpu),
        ("cores (nproc)", str(os.cpu_count())),
        ("memory", mem),
        ("OS", f"{osname}, kernel {platform.release()}"),
        ("rustc", cmd_out(["rustc", "--version"])),
        ("gcc (nvcc's host compiler)", cmd_out(["gcc", "--version"]).splitlines()[0] if cmd_out(["gcc", "--version"]) != "n/a" else "n/a"),
        ("python", platform.python_version()),
        ("CUDA 13 wheels (target/bench-env)", ", ".join(wheels)),
        ("nvcc", cmd_out([os.path.join(cu13, "bin", "nvcc"), "--version"]).splitlines()[-1]),
        ("CUDA 12.9 wheels (the crate's build)", cuda12),
        ("CPU peers", ", ".join(others)),
    ]


# --------------------------------------------------------------------------- sections

def section_build(res, jobs, lines, headline):
    ours = load_jsonl(os.path.join(res, "build_fraglink13.jsonl"))
    nvcc = load_jsonl(os.path.join(res, "build_nvcc.jsonl"))
    ours129 = load_jsonl(os.path.join(res, "build_fraglink129.jsonl"))
    rebuild = load_json(os.path.join(res, "rebuild.json"))
    o = summary([r["wall_s"] for r in ours])
    n = summary([r["wall_s"] for r in nvcc])
    o129 = summary([r["wall_s"] for r in ours129]) if ours129 else None
    tk = ours[0]["toolkit"]
    frags = ours[0]["fragments"]
    targets = nvcc[0].get("targets")
    per_arch = (f"each from its minimum arch on: {targets} (fragment, arch) targets"
                if targets else "each from its minimum arch on")
    lines += [
        "## 1. Fragment build",
        "",
        f"The crate's whole fragment set — {frags} fragments (families, matrices and templates exactly as "
        f"`build.rs` declares them), LTO-IR for {', '.join(tk['archs'])} ({per_arch}) — built from "
        f"scratch with {jobs} parallel jobs. Both sides use the CUDA 13.0 wheels and compile the "
        "identical rendered sources (`<out>/gen/<name>.cu`, written by the builder) for the same "
        "targets; the nvcc side runs right after a builder run, on that run's sources. The builder "
        "passes NVRTC `--gen-opt-lto` (LTO-IR run through NVRTC's optimizer, so every cold link "
        "skips that work: `Family::pre_optimize`, on by default except for knn_select); nvcc runs "
        "with its defaults.",
        "",
        "| side | runs | wall time min / median / max (s) | median vs fraglink | output bytes |",
        "| --- | ---: | --- | ---: | ---: |",
        f"| fraglink `Builder` (NVRTC {tk['nvrtc_version']} in-process, {jobs} threads, fresh cache dir) "
        f"| {o['n']} | {mmm(o)} | 1.00× | {ours[0]['bytes']:,} |",
        f"| cuVS way: one `nvcc -fatbin` process per fragment, `xargs -P {jobs}` (nvcc 13.0) "
        f"| {n['n']} | {mmm(n)} | {ratio(n['median'], o['median'])} | {nvcc[0]['bytes']:,} |",
    ]
    if o129:
        lines.append(
            f"| (reference) fraglink `Builder` with the crate's CUDA 12.9 (what `cargo build` runs) "
            f"| {o129['n']} | {mmm(o129)} | {ratio(o129['median'], o['median'])} | {ours129[0]['bytes']:,} |")
    sum_nvrtc = statistics.median([r["sum_fragment_s"] for r in ours])
    lines += [
        "",
        f"nvcc takes **{ratio(n['median'], o['median'])}** the builder's time (medians; fastest runs: "
        f"{ratio(n['min'], o['min'])}). Per fragment (all its architectures) the builder spends "
        f"{sum_nvrtc / frags * 1e3:.0f} ms of thread time (median run), nvcc "
        f"{n['median'] * jobs / frags * 1e3:.0f} ms of wall × jobs. Output bytes differ because "
        "fraglink packs with nvFatbin `-compress-all -compress-mode=size` and nvcc uses its default "
        "fatbin compression.",
        "",
        f"nvcc command: `{nvcc[0]['command']}` (in the work directory; `-I` points at `fragments/`).",
        "",
    ]
    headline.append((f"Fragment build, cold ({frags} fragments, {targets or '?'} targets)",
                     f"fraglink {fmt(o['median'])} s vs nvcc+xargs {fmt(n['median'])} s",
                     f"nvcc / fraglink = {ratio(n['median'], o['median'])}"))

    # Rebuild
    cold_ref = o["median"]
    first = rebuild["cold_with_cache"]
    unchanged = summary([r["wall_s"] for r in rebuild["unchanged"]])
    lines += [
        "### Rebuild after touching one template",
        "",
        "A copy of `matrices/`, `templates/` and `fragments/`, built once with the content cache on, "
        "then rebuilt unchanged and after appending a comment line to one family's template (a "
        "different line each run, so each run misses the cache for exactly that family). "
        "`recompiled` is what the builder reports as not taken from the cache.",
        "",
        "| build | runs | wall time min / median / max (s) | recompiled | vs full cold build |",
        "| --- | ---: | --- | --- | ---: |",
        f"| full cold build (no cache; section above) | {o['n']} | {mmm(o)} | {ours[0]['compiled']} | 1.00× |",
        f"| cold build filling the cache | 1 | {fmt(first['wall_s'])} | {first['compiled']} | "
        f"{ratio(first['wall_s'], cold_ref)} |",
        f"| nothing changed | {unchanged['n']} | {mmm(unchanged, digits=3)} | "
        f"{rebuild['unchanged'][0]['compiled']} | {ratio(unchanged['median'], cold_ref, 3)} |",
    ]
    for fam, runs in rebuild["touched_template"].items():
        s = summary([r["wall_s"] for r in runs])
        fams = ", ".join(f"{k} {v}" for k, v in runs[0]["compiled_families"].items()) or "none"
        lines.append(
            f"| `templates/{fam}.cu.j2` touched | {s['n']} | {mmm(s, digits=3)} | {fams} | "
            f"{ratio(s['median'], cold_ref)} |")
        if fam == "metric":
            headline.append(("Rebuild after touching the metric template",
                             f"{fmt(s['median'])} s vs {fmt(cold_ref)} s full cold build",
                             f"{ratio(s['median'], cold_ref)} of a cold build"))
    lines.append("")


def section_size(res, lines, headline):
    cat = load_json(os.path.join(res, "catalog.json"))
    aot = load_json(os.path.join(res, "aot.json"))
    t = cat["totals"]
    fam = ", ".join(f"{k} {v['fragments']} ({v['bytes']:,} B)" for k, v in t["families"].items())
    # The AOT side instantiates (scan, metric, filter) triples only: it is
    # compared with the embedded bytes of those three families. The other
    # families (IVF, k-NN) have no AOT side here.
    same = [f for f in ("scan", "metric", "filter") if f in t["families"]]
    same_bytes = sum(t["families"][f]["bytes"] for f in same)
    same_frags = sum(t["families"][f]["fragments"] for f in same)
    lines += [
        "## 2. Binary size",
        "",
        "Embedded fragment bytes (`fraglink catalog --json` totals: nvFatbin-compressed LTO-IR for "
        f"{aot['fragments']['archs']}, NVRTC {aot['fragments']['nvrtc_version']}) against ahead-of-time "
        f"instantiation of every valid full kernel: {aot['valid_combinations']} (scan, metric, filter) "
        "triples (scan dtype = metric dtype, scan idx = filter idx), each compiled as ONE whole-program "
        "translation unit (the three rendered fragment sources concatenated) to a cubin for "
        f"{' and '.join(aot['archs'])} by the same NVRTC {aot['nvrtc_version']} "
        "(`--gpu-architecture=sm_XX -std=c++17`, cubin output), packed per kernel with nvFatbin "
        f"using fraglink's options (`{' '.join(aot['fatbin_options'])}`).",
        "",
        "| side | objects | bytes | vs fraglink |",
        "| --- | --- | ---: | ---: |",
        f"| fraglink: embedded fragments of the kernels' families ({', '.join(same)}) | {same_frags} fragments "
        f"| {kib(same_bytes)} | 1.00× |",
        f"| AOT: one fatbin per kernel, compressed like fraglink's | {aot['fatbins']} fatbins "
        f"({aot['cubins']} cubins) | {kib(aot['fatbin_bytes'])} | {ratio(aot['fatbin_bytes'], same_bytes)} |",
        f"| AOT: raw cubins (uncompressed) | {aot['cubins']} cubins "
        f"({', '.join(f'{k} {v:,} B' for k, v in aot['cubin_bytes_per_arch'].items())}) "
        f"| {kib(aot['cubin_bytes'])} | {ratio(aot['cubin_bytes'], same_bytes)} |",
        f"| (all of fraglink's embedded fragments; the other families have no AOT side here) "
        f"| {t['fragments']} fragments ({fam}) | {kib(t['bytes'])} | |",
        "",
        f"The AOT compile took {fmt(aot['wall_s'], 1)} s wall on {aot['jobs']} threads "
        f"({fmt(aot['sum_compile_s'], 1)} s of compile time, {aot['sum_compile_s'] / aot['compiled_combinations']:.2f} s per "
        "kernel for both archs) — against the fragment build of section 1. Coverage differs in fraglink's "
        "favour: an sm_75 cubin runs only on sm_75 and an sm_90 cubin only on sm_90, while the "
        "compute_75 LTO-IR links for every GPU from sm_75 on (covering sm_80/86/89/100/120 with AOT would "
        "add one cubin set per architecture). fraglink pays instead with a link at first use "
        "(section 3), shortened to a quick link (no LTO) where a fragment also holds its real "
        "arch's relocatable SASS (sm_90 in the default archs; counted in its bytes above). The "
        "archs also differ: the embedded LTO-IR is for "
        f"{aot['fragments']['archs']}, the AOT cubins for {' and '.join(aot['archs'])} only.",
        "",
    ]
    headline.append((f"Binary size ({', '.join(same)} families)",
                     f"{same_bytes:,} B fragments vs {aot['fatbin_bytes']:,} B AOT fatbins "
                     f"({aot['fatbins']} kernels)",
                     f"AOT / fraglink = {ratio(aot['fatbin_bytes'], same_bytes)}"))


def section_link(res, lines, headline):
    c = load_json(os.path.join(res, "criterion.json"))
    con = load_json(os.path.join(res, "contention.json"))
    raw, planner = c.get("link_cold/raw_nvjitlink", {}), c.get("link_cold/planner", {})
    mem, disk = c.get("link_cached/memory_hit", {}), c.get("link_cached/disk_hit", {})
    lines += [
        "## 3. Link",
        "",
        "From `benches/link.rs` (criterion; `scan_f32_u32_v4_k128` + `metric_l2_f32` + `filter_none_u32` "
        "for sm_80). min / median / max are over criterion's samples (each sample's mean time per "
        "iteration; cold links: 10 samples).",
        "",
        "| measurement | samples | time per link min / median / max | ratio |",
        "| --- | ---: | --- | --- |",
    ]

    def row(name, e, r):
        if not e or e.get("missing"):
            lines.append(f"| {name} | – | not measured (benchmark missing) | |")
        else:
            lines.append(f"| {name} | {e['samples']} | {mmm_ns(e)} | {r} |")

    ok = lambda e: e and not e.get("missing")
    row("cold link, raw nvJitLink (`nvJitLinkCreate` … `GetLinkedCubin`, info log)", raw, "1.00×")
    row("cold link through the planner (`LinkRuntime::link`, cache cleared)", planner,
        f"planner / raw = {ratio(planner['median_ns'], raw['median_ns'], 3)}" if ok(planner) and ok(raw) else "")
    row("memory-cache hit", mem,
        f"cold / hit = {planner['median_ns'] / mem['median_ns']:,.0f}×" if ok(planner) and ok(mem) else "")
    row("disk-cache hit (memory cleared)", disk,
        f"cold / hit = {planner['median_ns'] / disk['median_ns']:,.0f}×" if ok(planner) and ok(disk) else "")
    lines += [
        "",
        "Both sides pass the same nvJitLink command line (the raw side uses the plan's own "
        "`options(arch).to_args()`, `-kernels-used` included). Criterion runs the sides one after "
        "the other, so a machine that gets busier half-way shows up as overhead; the interleaved "
        "measurement below is the one to read.",
        "",
    ]
    optional = lambda name: (load_json(os.path.join(res, name))
                             if os.path.exists(os.path.join(res, name)) else None)
    over = optional("link_overhead.json")
    if over:
        lines += [
            f"**Cold link, interleaved** (`cargo bench --bench link_overhead`, {over['rounds']} rounds, "
            "each one link per side, the side going first alternating): raw nvJitLink median "
            f"{fmt(over['raw_ms'])} ms, planner {fmt(over['planner_ms'])} ms, per-round ratio planner / raw "
            f"median {over['ratio']:.3f} (quartiles {over['ratio_q1']:.3f}–{over['ratio_q3']:.3f}). "
            f"The planner's own work in a cold link (request time minus the time inside nvJitLink, "
            f"same call): {over['own_us']:.0f} µs, {over['own_us'] / 1e3 / over['raw_ms'] * 100:.2f}% of "
            "the raw link.",
            "",
        ]
        headline.append(("Cold link: planner vs raw nvJitLink, interleaved",
                         f"{fmt(over['planner_ms'])} ms vs {fmt(over['raw_ms'])} ms",
                         f"planner / raw = {over['ratio']:.3f}; planner's own work {over['own_us']:.0f} µs"))
        if "pair_ratio" in over:
            lines += [
                f"**A k-NN search's kernel pair, cold** (same bench, {over['pair_rounds']} interleaved "
                "rounds, `knn_tile_f32_tf32x3_q64_r64_k32_a16` + `knn_rerank_f32_k32` for sm_90, "
                f"{over['threads']} threads): linked one after the other "
                f"{fmt(over['pair_one_by_one_ms'])} ms, through `LinkRuntime::link_all` (both at once, "
                f"as the search's first call does) {fmt(over['pair_link_all_ms'])} ms; per-round ratio "
                f"median {over['pair_ratio']:.3f}.",
                "",
            ]
            headline.append(("k-NN kernel pair, cold: link_all vs one by one",
                             f"{fmt(over['pair_link_all_ms'])} ms vs {fmt(over['pair_one_by_one_ms'])} ms",
                             f"link_all / one by one = {over['pair_ratio']:.3f}"))
        if "quick_ratio" in over:
            lines += [
                f"**Quick first links** (same bench, {over['quick_rounds']} interleaved rounds, sm_90, "
                "`LinkRuntime::link_quick`: the fragments' SASS linked without LTO, what a search's "
                "cold first call links while the optimised link runs in the background): "
                "`scan_f32_u32_v4_k32` + `metric_l2_f32` + `filter_none_u32` cold LTO link "
                f"{fmt(over['scan_lto_ms'])} ms, quick link {fmt(over['scan_quick_ms'], 3)} ms "
                f"(per-round ratio quick / LTO median {over['quick_ratio']:.4f}); the k-NN pair above, "
                f"both kernels quick, {fmt(over['pair_quick_ms'], 3)} ms. The quick kernels' speed on a "
                "GPU is `gpu_bench`'s `scan_opt.quick.gpu` (GPU.md).",
                "",
            ]
            headline.append(("Cold link vs quick link (sm_90, first-call scan)",
                             f"quick {fmt(over['scan_quick_ms'], 3)} ms vs LTO {fmt(over['scan_lto_ms'])} ms",
                             f"LTO / quick = {1 / over['quick_ratio']:,.0f}×"))
    pre = optional("prelink.json")
    if pre:
        lines += [
            "**First call in a fresh process** (`benches/scripts/prelink_first_call.sh`, "
            f"{pre['rounds']} interleaved rounds per side, sm_80, no GPU: the first call is the link): "
            f"not prelinked {fmt(pre['cold_request_ms'])} ms per request ({fmt(pre['cold_process_ms'])} ms "
            f"for the whole process); after `fraglink prelink --from` a profile "
            f"{fmt(pre['prelinked_request_ms'], 3)} ms ({fmt(pre['prelinked_process_ms'])} ms).",
            "",
        ]
        headline.append(("First call, prelinked vs not (fresh process)",
                         f"{fmt(pre['prelinked_request_ms'], 3)} ms vs {fmt(pre['cold_request_ms'])} ms",
                         f"{pre['cold_request_ms'] / pre['prelinked_request_ms']:,.0f}× faster"))
    if ok(planner) and ok(raw):
        headline.append(("Cold link: planner vs raw nvJitLink",
                         f"{ns_human(planner['median_ns'])} vs {ns_human(raw['median_ns'])}",
                         f"planner / raw = {ratio(planner['median_ns'], raw['median_ns'], 3)}"))
    if ok(planner) and ok(mem) and ok(disk):
        headline.append(("Cache hits vs cold link",
                         f"memory {ns_human(mem['median_ns'])}, disk {ns_human(disk['median_ns'])}",
                         f"cold / memory = {planner['median_ns'] / mem['median_ns']:,.0f}×, "
                         f"cold / disk = {planner['median_ns'] / disk['median_ns']:,.0f}×"))

    f, m = con["fraglink"], con["mutex"]
    lines += [
        "### Contention: 64 threads, 16 keys",
        "",
        f"`benches/contention.rs`: {con['threads']} threads ask for {con['keys']} distinct kernels "
        f"({con['threads'] // con['keys']} threads per key: 16 scan fragments with the l2 metric of "
        f"their dtype and the `none` filter of their idx, for {con['arch']}), released together by a "
        "barrier; every round starts from empty caches. fraglink: `LinkRuntime` (fresh memory cache, "
        "no disk cache). cuVS's scheme: one `Mutex<HashMap>` held across look-up, link (the same "
        "`fraglink::link::Linker`, same options) and insert. The sides alternate round by round.",
        "",
        "| side | rounds | wall time min / median / max (s) | median thread latency (s) | links per round | median vs fraglink |",
        "| --- | ---: | --- | --- | --- | ---: |",
        f"| fraglink (single flight per key, no global lock) | {f['wall']['n']} | {mmm(f['wall'], digits=3)} "
        f"| {fmt(f['thread_latency_median_s']['median'], 3)} | {sorted(set(f['links_per_round']))} | 1.00× |",
        f"| one exclusive mutex across every link | {m['wall']['n']} | {mmm(m['wall'], digits=3)} "
        f"| {fmt(m['thread_latency_median_s']['median'], 3)} | {sorted(set(m['links_per_round']))} "
        f"| {ratio(m['wall']['median'], f['wall']['median'])} |",
        "",
        f"With {con['cores']} cores, parallel links can gain at most {con['cores']}× over the global lock; "
        "the gain grows with the core count.",
        "",
    ]
    headline.append(("Contention (64 threads, 16 keys)",
                     f"fraglink {fmt(f['wall']['median'], 2)} s vs global mutex {fmt(m['wall']['median'], 2)} s",
                     f"mutex / fraglink = {ratio(m['wall']['median'], f['wall']['median'])}"))


def busy_note(c):
    """'' for a quiet case, else why its ratio is not evidence."""
    if c.get("quiet", True):
        return ""
    o = c["other_busy_pct"]
    return (f"BUSY: {c['reps_quiet']} of {c['reps_total']} repetitions quiet (other work used "
            f"{o['median']:.0f}% of the CPUs, median; quiet ≤ {c['busy_max']:.0f}%), not evidence")


def search_ratio(c):
    r = ratio(c["fraglink_qps"]["median"], c["faiss_qps"]["median"])
    return r if c.get("quiet", True) else f"{r} (BUSY, not evidence)"


def section_search(res, lines, headline):
    s = load_json(os.path.join(res, "search.json"))
    busy_max = s.get("busy_max", 10)
    lines += [
        "## 4. Search on the CPU",
        "",
        f"`fraglink search --device cpu` against faiss-cpu {s['cases'][0]['faiss_version']} "
        f"on identical data: {s['n']:,} × {s['dim']} base, "
        f"{s['nq']:,} queries, k = {s['k']} ({s['data']}, seed {s['seed']}), written once (.fvecs for "
        "f32, .npy otherwise) and read by both. f32 is compared with `IndexFlatL2` / `IndexFlatIP`; "
        "f16, i8 and u8 with faiss' nearest equivalents, each tried and the faster one compared: "
        "`IndexScalarQuantizer` holding the same type (`QT_fp16`, `QT_8bit_direct_signed`, "
        "`QT_8bit_direct`) and `IndexFlat` on a float32 copy of the same values. "
        "Each timed search runs in a fresh process (faiss: `index.search` alone; "
        "fraglink: the JSON `search_ms`, the search alone), alternating faiss and fraglink. "
        "One thread: `RAYON_NUM_THREADS=1` (fraglink), "
        "`faiss.omp_set_num_threads(1)` and `OMP/OPENBLAS/MKL_NUM_THREADS=1` (faiss); all threads: "
        f"{s['cores']}. With more than one thread faiss also runs with `OMP_WAIT_POLICY=PASSIVE` (its "
        "OpenMP threads otherwise spin beside BLAS' threads) and its fastest variant is compared.",
        "",
        "Around every timed process the script reads the CPU time of the whole machine and of the "
        "process; the rest is other work's share of the CPUs during the run. A repetition counts "
        f"when every run in it saw at most {busy_max:.0f}% of the CPUs used by other work; the script "
        f"repeats (up to 3 × {s['reps']}) until it has {s['reps']} such repetitions, and the figures come "
        "from them. A case without enough quiet repetitions is marked **BUSY**: its figures come from "
        "all its repetitions, and its ratio is not evidence either way.",
        "",
        "| dtype metric, threads | faiss peer (fastest variant) | faiss ms min / median / max | fraglink ms min / median / max | QPS faiss / fraglink (median) | fraglink QPS ÷ faiss QPS | other work on the CPUs (median %) |",
        "| --- | --- | --- | --- | --- | ---: | ---: |",
    ]
    for c in s["cases"]:
        lines.append(
            f"| {c['label']} | {c['faiss_best_variant']} | {mmm(c['faiss_ms'], digits=0)} | "
            f"{mmm(c['fraglink_ms'], digits=0)} | "
            f"{c['faiss_qps']['median']:,.0f} / {c['fraglink_qps']['median']:,.0f} | "
            f"{search_ratio(c)} | {c['other_busy_pct']['median']:.0f}% "
            f"({c['reps_quiet']}/{c['reps_total']} quiet) |")
        if c["dtype"] == "f32":
            headline.append((f"CPU search QPS, {c['label']} (faiss {c['faiss_best_variant']})",
                             f"fraglink {c['fraglink_qps']['median']:,.0f} vs faiss {c['faiss_qps']['median']:,.0f}",
                             f"fraglink / faiss = {search_ratio(c)}"))
    notes = [f"{c['label']}: {busy_note(c)}" for c in s["cases"] if busy_note(c)]
    if notes:
        lines += ["", "Cases measured while the CPUs were busy:", ""] + [f"- {n}" for n in notes]
    lines += ["", "Every faiss variant (median ms): " + "; ".join(
        f"{c['label']}: " + ", ".join(f"{n} {v['ms']['median']:,.0f}" for n, v in c["faiss_variants"].items())
        for c in s["cases"]) + "."]
    lines += [
        "",
        "Recall@10 (|A ∩ B| / k averaged over queries; with k results on each side the measure is "
        "symmetric, so fraglink-vs-faiss equals faiss-vs-fraglink). \"exact\" is float64 brute force "
        "in numpy over the values both sides read (ties by smaller id).",
        "",
        "| dtype metric, threads | fraglink vs faiss (= faiss vs fraglink) | fraglink vs exact | faiss vs exact |",
        "| --- | ---: | ---: | ---: |",
    ]
    for c in s["cases"]:
        lines.append(f"| {c['label']} | {c['recall_fraglink_vs_faiss']:.4f} | "
                     f"{c['recall_fraglink_vs_exact_f64']:.4f} | {c['recall_faiss_vs_exact_f64']:.4f} |")
    lines += [
        "",
        f"fraglink command (per case and run): `{s['cases'][0]['fraglink_command']} --groundtruth FAISS_IDS.ivecs` "
        "(with `RAYON_NUM_THREADS=T`; other dtypes read `base_DTYPE.npy` / `queries_DTYPE.npy`); faiss: "
        "`python benches/scripts/search_bench.py faiss --base BASE --queries Q --metric l2|ip --k 10 "
        "--threads T --ids-out FAISS_IDS.ivecs --index flat|sq_fp16|sq_8bit_direct_signed|sq_8bit_direct`.",
        "",
    ]


def section_ivf(res, lines, headline):
    """IVF-Flat on the CPU against faiss IndexIVFFlat (benches/scripts/ivf_bench.py);
    skipped when the run has no ivf.json."""
    path = os.path.join(res, "ivf.json")
    if not os.path.exists(path):
        return
    s = load_json(path)
    c0 = s["cases"][0]
    lines += [
        "## 6. IVF-Flat on the CPU",
        "",
        f"`fraglink index build --kind ivf-flat` + `fraglink search --index` against faiss-cpu "
        f"{c0['faiss_version']} `IndexIVFFlat` (`IndexFlatL2` quantizer, default training: "
        f"{c0['faiss_niter']} k-means iterations) on identical files: {s['n']:,} × {s['dim']} f32 base, "
        f"{s['nq']:,} queries, k = {s['k']}, nlist = {s['nlist']}, l2 ({s['data']}, seed {s['seed']}). "
        "Build: faiss `train` + `add` against fraglink's `build_seconds` (k-means, assignment, "
        "interleaved lists; not the file write). Search: faiss `index.search` alone against fraglink's "
        "JSON `search_ms` (coarse step + list scan; not the index file read), fraglink in a fresh process "
        "per nprobe, the sides alternating per repetition; "
        + (f"each side runs every search {s['search_reps']} times in its process and reports the median "
           "(threads and heap warm: faiss after its build, fraglink after its file read; `--repeat`), "
           if s.get("search_reps", 1) > 1 else "each search timed once, ")
        + f"{s['reps']} repetitions. Recall@{s['k']} of both sides against the same float64 exact "
        "neighbours. With more than one thread faiss also runs with `OMP_WAIT_POLICY=PASSIVE` and its "
        "better variant per figure is compared. The last column is the median of each side's first "
        "search per process (faiss's after its build in the same process, fraglink's after reading the "
        "index file in a fresh one).",
        "",
        "| threads | nprobe | recall faiss / fraglink | QPS faiss (median) | QPS fraglink (median) | fraglink ÷ faiss "
        "| first search ms faiss / fraglink |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    busy = [f"**{threads(c['threads'])}: BUSY, not evidence** — only {c['reps_quiet']} of "
            f"{c['reps_total']} repetitions had other work at most {c['busy_max']:.0f}% of the CPUs."
            for c in s["cases"] if not c.get("quiet", True)]
    lines[-3:-3] = [line for b in busy for line in ("", b)]
    for c in s["cases"]:
        for r in c["nprobe"]:
            variant = "" if r.get("faiss_variant", "default") == "default" else f" ({r['faiss_variant']})"
            lines.append(
                f"| {c['threads']} | {r['nprobe']} | {r['faiss_recall']['median']:.4f} / "
                f"{r['fraglink_recall']['median']:.4f} | {r['faiss_qps']['median']:,.0f}{variant} | "
                f"{r['fraglink_qps']['median']:,.0f} | {ratio(r['fraglink_qps']['median'], r['faiss_qps']['median'])} | "
                + (f"{r['faiss_first_ms']['median']:.1f} / {r['fraglink_first_ms']['median']:.1f} |"
                   if "faiss_first_ms" in r else "not recorded |"))
            headline.append((f"IVF-Flat QPS, {threads(c['threads'])}, nprobe {r['nprobe']}",
                             f"fraglink {r['fraglink_qps']['median']:,.0f} vs faiss {r['faiss_qps']['median']:,.0f}",
                             f"fraglink / faiss = {ratio(r['fraglink_qps']['median'], r['faiss_qps']['median'])}"))
    lines += [
        "",
        "| threads | build faiss s min / median / max | build fraglink s min / median / max | fraglink ÷ faiss |",
        "| --- | --- | --- | ---: |",
    ]
    for c in s["cases"]:
        variant = "" if c.get("faiss_build_variant", "default") == "default" else f" ({c['faiss_build_variant']})"
        lines.append(
            f"| {c['threads']} | {mmm(c['faiss_build_s'])}{variant} | {mmm(c['fraglink_build_s'])} | "
            f"{ratio(c['fraglink_build_s']['median'], c['faiss_build_s']['median'])} |")
        headline.append((f"IVF-Flat build, {threads(c['threads'])}",
                         f"fraglink {c['fraglink_build_s']['median']:.2f} s vs faiss {c['faiss_build_s']['median']:.2f} s",
                         f"fraglink / faiss = {ratio(c['fraglink_build_s']['median'], c['faiss_build_s']['median'])}"))
    lines += [
        "",
        "Commands (per repetition, `RAYON_NUM_THREADS=T` / `OMP_NUM_THREADS=T`): "
        f"`fraglink index build --kind ivf-flat --nlist {s['nlist']} --base base.fvecs --metric l2 --seed S "
        "--out fraglink.ivf --json`, then per nprobe `fraglink search --index fraglink.ivf --queries "
        f"queries.fvecs --nprobe P --k {s['k']} --groundtruth truth.ivecs --repeat R --json`; faiss: "
        "`python benches/scripts/ivf_bench.py faiss ...` (same files). The whole comparison: "
        "`target/bench-env/bin/python benches/scripts/ivf_bench.py run --fraglink target/release/fraglink "
        "--work DIR --reps 3 --out ivf.json`.",
        "",
    ]


def section_small(res, lines, headline):
    c = load_json(os.path.join(res, "criterion.json"))
    lines += [
        "## 5. Small costs",
        "",
        "Criterion (100 samples each); min / median / max over samples of the mean time per iteration.",
        "",
        "| operation | min / median / max |",
        "| --- | --- |",
    ]
    rows = [
        ("cost-model decision, warm model with a GPU (`cost/choose/gpu/warm`)", "cost/choose/gpu/warm"),
        ("cost-model decision, no GPU (`cost/choose/no_gpu`)", "cost/choose/no_gpu"),
        ("cost-model decision, unseen operation (`cost/choose/gpu/unseen_op`)", "cost/choose/gpu/unseen_op"),
        ("cost-model learn (`cost/learn`)", "cost/learn"),
        ("warm planner lookup: build the plan + memory-cache hit (`link_cached/warm_planner_lookup`)",
         "link_cached/warm_planner_lookup"),
        ("router's linked check, once per configuration and batch size: the k-NN pair planned and looked up in memory (`route/linked_check`)",
         "route/linked_check"),
    ]
    for name, key in rows:
        e = c.get(key, {})
        if not e or e.get("missing"):
            lines.append(f"| {name} | not measured (benchmark missing) |")
        else:
            lines.append(f"| {name} | {' / '.join(fmt(e[k], 0) + ' ns' for k in ('min_ns', 'median_ns', 'max_ns'))} |")
    lines += [
        "",
        "The host's merge of a split scan's per-split sorted lists (`search::splits::merge_splits`: "
        "a merge of the lists' heads) against sorting each query's entries in full (`total_cmp`, "
        "then the id); medians, interleaved in one run:",
        "",
        "| case | heads | full sort | full sort / heads |",
        "| --- | --- | --- | --- |",
    ]
    for case in ("nq1_splits264_k10", "nq1_splits264_k100", "nq100_splits3_k100"):
        h, s = c.get(f"merge/heads/{case}", {}), c.get(f"merge/full_sort/{case}", {})
        if not h or not s or h.get("missing") or s.get("missing"):
            lines.append(f"| {case} | not measured (benchmark missing) | | |")
            continue
        ratio = s["median_ns"] / h["median_ns"]
        lines.append(f"| {case} | {fmt(h['median_ns'] / 1e3, 1)} µs | {fmt(s['median_ns'] / 1e3, 1)} µs | {ratio:.1f}× |")
        if case == "nq1_splits264_k100":
            headline.append(("Split merge on the host (1 query, 264 splits, k 100)",
                             f"heads {fmt(h['median_ns'] / 1e3, 1)} µs vs full sort {fmt(s['median_ns'] / 1e3, 1)} µs",
                             f"full sort / heads = {ratio:.1f}×"))
    for label, key in (("Cost-model decision", "cost/choose/gpu/warm"),
                       ("Warm planner lookup", "link_cached/warm_planner_lookup")):
        e = c.get(key, {})
        if e and not e.get("missing"):
            headline.append((label, f"{e['median_ns']:,.0f} ns (median)", ""))
    lines.append("")


# --------------------------------------------------------------------------- partial runs

# The sections, in document order, with the heading numbers they carry.
SECTIONS = {"build": "1", "size": "2", "link": "3", "search": "4", "small": "5", "ivf": "6"}

# Summary rows by the section that makes them (first words of the figure).
ROW_PREFIXES = [("Fragment build", "build"), ("Rebuild", "build"), ("Binary size", "size"),
                ("Cold link", "link"), ("Cache hits", "link"), ("Contention", "link"),
                ("First call", "link"), ("k-NN kernel pair", "link"), ("IVF-Flat", "ivf"),
                ("CPU search", "search"), ("Cost-model", "small"), ("Warm planner", "small"),
                ("Split merge", "small")]


def row_section(figure):
    return next((sec for prefix, sec in ROW_PREFIXES if figure.startswith(prefix)), None)


PROVENANCE = "Where each section was measured:"


def parse_existing(path):
    """Sections (as lines), summary rows and per-section provenance (date, CPU) of an
    existing report."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        lines = f.read().split("\n")
    number_to_name = {v: k for k, v in SECTIONS.items()}
    sections, current, summary, in_summary = {}, None, [], False
    generated, cpu, provenance, in_prov = "date unknown", "machine unknown", {}, False
    for line in lines:
        if line.startswith("Generated by"):
            m = re.search(r" on (\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC)", line)
            generated = m.group(1) if m else generated
        if line.startswith("| CPU |") and cpu == "machine unknown":
            cpu = line.split("|")[2].strip()
        if line == PROVENANCE:
            in_prov = True
            continue
        if in_prov:
            if not line and not provenance:
                continue  # the blank line after the heading
            if not line.startswith("- "):
                in_prov = False
            else:
                names, _, rest = line[2:].partition(": ")
                date, _, where = rest.partition(", ")
                for n in names.split(", "):
                    provenance[n] = (date, where.removesuffix(" (this run)"))
        if line.startswith("## "):
            in_summary = line == "## Summary"
            m = re.match(r"## (\d)\. ", line)
            current = number_to_name.get(m.group(1)) if m else None
            if current:
                sections[current] = []
        if line.startswith("## Method and commands"):
            current = None
        if current:
            sections[current].append(line)
        if in_summary and line.startswith("| ") and not line.startswith("| figure") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 3:
                summary.append(tuple(cells))
    # A report without the list was measured whole, in one run.
    for n in SECTIONS:
        provenance.setdefault(n, (generated, cpu))
    return {"sections": sections, "summary": summary, "provenance": provenance}


def provenance_lines(prov, now, cpu, only):
    """The list of where each section was measured (this run's sections last)."""
    groups = {}
    for n in SECTIONS:
        key = (now, cpu + " (this run)") if n in only else prov[n]
        groups.setdefault(key, []).append(n)
    return [PROVENANCE, ""] + [f"- {', '.join(ns)}: {d}, {w}" for (d, w), ns in groups.items()]


# --------------------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--results", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--cu13", required=True)
    p.add_argument("--seconds", type=int, required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--reps", required=True)
    p.add_argument("--only", default=",".join(SECTIONS))
    a = p.parse_args()
    res = a.results
    only = [x for x in a.only.split(",") if x]
    unknown = [x for x in only if x not in SECTIONS]
    if unknown:
        raise SystemExit(f"report.py: unknown section(s) {unknown} (expected some of {list(SECTIONS)})")
    partial = len(only) < len(SECTIONS)

    toolkit129 = None
    p129 = os.path.join(res, "build_fraglink129.jsonl")
    if os.path.exists(p129) and load_jsonl(p129):
        toolkit129 = os.path.dirname(load_jsonl(p129)[0]["toolkit"]["nvrtc"])
    elif os.path.isdir("target/fraglink-cuda-12.9"):
        # No build section this run: the toolkit the crate's build provisions.
        toolkit129 = os.path.realpath("target/fraglink-cuda-12.9")

    old = parse_existing(a.out) if partial else None
    if partial and old is None:
        raise SystemExit(f"report.py: --only needs an existing {a.out} to keep the other sections from")
    body, headline = [], []
    makers = {"build": lambda: section_build(res, a.jobs, body, headline),
              "size": lambda: section_size(res, body, headline),
              "link": lambda: section_link(res, body, headline),
              "search": lambda: section_search(res, body, headline),
              "small": lambda: section_small(res, body, headline),
              "ivf": lambda: section_ivf(res, body, headline)}
    for name in SECTIONS:
        if name in only:
            makers[name]()
        else:
            body += old["sections"][name]
            headline += [r for r in old["summary"] if row_section(r[0]) == name]

    # When the measurements ended (the newest results file), not when this
    # ran: rendering the same results again keeps their date.
    ended = max(os.path.getmtime(os.path.join(res, f)) for f in os.listdir(res))
    now = datetime.datetime.fromtimestamp(ended, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Benchmarks",
        "",
        f"Generated by `bash benches/run.sh` on {now} (the whole run took {a.seconds / 60:.1f} min). "
        "Do not edit by hand: rerun the script. Every figure is measured beside its peer in the same "
        "run and given as min / median / max over repeated runs, with ratios of medians. No GPU: "
        "everything here runs on the host (compiles, links, CPU search).",
        "",
    ]
    if partial:
        this_cpu = dict(machine(a.cu13, toolkit129))["CPU"]
        out += [
            f"This run measured only: {', '.join(only)} (`BENCH_ONLY`); the other sections are kept "
            "from earlier runs. Ratios compare peers within one run only.",
            "",
        ] + provenance_lines(old["provenance"], now, this_cpu, only) + [""]
    out += [
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
    ]
    out += [f"| {k} | {v} |" for k, v in machine(a.cu13, toolkit129)]
    with open(os.path.join(res, "load.txt")) as f:
        loads = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    out += [
        "",
        "The machine may be shared with other work. Before each section (and each cold-build "
        "repetition) the script waits up to `BENCH_QUIET_WAIT` (default 60) s for the CPUs to be at most "
        "`BENCH_QUIET_BUSY` (default 25) % busy, then "
        "notes what it found; the peers of each comparison alternate within the same run, so "
        "remaining load hits both sides:",
        "",
    ] + [f"- {k}: {v}" for k, v in loads] + [
        "",
        "## Summary",
        "",
        "| figure | measured (medians) | ratio |",
        "| --- | --- | --- |",
    ]
    out += [f"| {a_} | {b} | {c} |" for a_, b, c in headline]
    out += [""] + body
    with open(os.path.join(res, "commands.txt")) as f:
        cmds = [line.rstrip("\n") for line in f if line.strip()]
    root = os.getcwd() + "/"
    seen, uniq = set(), []
    for cmd in cmds:
        cmd = cmd.replace(root, "")
        if cmd not in seen:
            seen.add(cmd)
            uniq.append(cmd)
    out += [
        "## Method and commands",
        "",
        f"Repetitions: {a.reps} (`BENCH_*` variables in `benches/run.sh`); parallel jobs: {a.jobs}. "
        "Cold fragment builds use a fresh output and cache directory per run; each builder run is its "
        "own process, as a build script is. No timing is asserted anywhere.",
        "",
        "Every command `benches/run.sh` ran (repeated ones once):",
        "",
        "```sh",
    ] + uniq + ["```", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
