#!/usr/bin/env python3
"""CPU exact k-NN: `fraglink search --device cpu` against faiss-cpu on identical
data, one thread and all threads: f32 against IndexFlatL2 / IndexFlatIP; f16,
i8 and u8 against faiss' nearest equivalents, both tried, the faster compared:
an IndexScalarQuantizer holding the same type (QT_fp16, QT_8bit_direct_signed,
QT_8bit_direct) and an IndexFlat on a float32 copy of the same values.

Run with the bench venv's python (numpy + faiss-cpu). Every timed search runs in a
fresh process on both sides (fraglink: its JSON `search_ms`, the search alone;
faiss: `index.search` alone), alternating faiss / fraglink per repetition.

Busy machines: around every timed process the CPU time of the whole machine
(/proc/stat) and of the child (rusage) are read; what is left is other work's
share of the CPUs during the run. A repetition is quiet when every run in it
saw at most --busy-max % (default 10) of the CPUs used by other work; the
script keeps repeating (up to --reps × 3 repetitions) until it has --reps quiet
ones, and a case's figures come from its quiet repetitions. A case with fewer
quiet repetitions than --reps is marked busy (`"quiet": false`): its ratio is
not evidence, and the report says so.

    search_bench.py run --fraglink target/release/fraglink --work DIR --reps 5 --out F.json
    search_bench.py faiss --base B --queries Q --metric l2|ip --k K --threads T --ids-out F.ivecs \
        [--index flat|sq_fp16|sq_8bit_direct_signed|sq_8bit_direct]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np


def write_fvecs(path, a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    n, d = a.shape
    out = np.empty((n, d + 1), dtype=np.float32)
    out[:, 0] = np.array([d], dtype=np.int32).view(np.float32)[0]
    out[:, 1:] = a
    out.tofile(path)


def read_fvecs(path):
    raw = np.fromfile(path, dtype=np.float32)
    d = raw[:1].view(np.int32)[0]
    return raw.reshape(-1, d + 1)[:, 1:].copy()


def write_ivecs(path, ids):
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    n, k = ids.shape
    out = np.empty((n, k + 1), dtype=np.int32)
    out[:, 0] = k
    out[:, 1:] = ids
    out.tofile(path)


def exact_ids(base, queries, metric, k, block=100):
    """Exact neighbours in float64 (ties: smaller id first)."""
    b = base.astype(np.float64)
    bn = (b * b).sum(axis=1)
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    for s in range(0, queries.shape[0], block):
        q = queries[s:s + block].astype(np.float64)
        dots = q @ b.T
        if metric == "l2":
            dist = (q * q).sum(axis=1)[:, None] - 2.0 * dots + bn[None, :]
        else:
            dist = -dots
        part = np.argpartition(dist, k, axis=1)[:, :k + 8 if k + 8 < dist.shape[1] else k]
        for i in range(part.shape[0]):
            cand = part[i]
            order = np.lexsort((cand, dist[i, cand]))
            out[s + i] = cand[order][:k]
    return out


def recall(found, truth, k):
    hits = 0
    for f, t in zip(found, truth):
        hits += len(set(f[:k].tolist()) & set(t[:k].tolist()))
    return hits / (len(found) * k)


def read_any(path):
    """float32 rows of an .fvecs or .npy file (any dtype, widened exactly)."""
    if path.endswith(".npy"):
        return np.load(path).astype(np.float32)
    return read_fvecs(path)


SQ_TYPES = {"sq_fp16": "QT_fp16", "sq_8bit_direct_signed": "QT_8bit_direct_signed",
            "sq_8bit_direct": "QT_8bit_direct"}


def faiss_main(a):
    import faiss
    faiss.omp_set_num_threads(a.threads)
    base = read_any(a.base)
    queries = read_any(a.queries)
    d = base.shape[1]
    if a.index == "flat":
        index = faiss.IndexFlatL2(d) if a.metric == "l2" else faiss.IndexFlatIP(d)
    else:
        metric = faiss.METRIC_L2 if a.metric == "l2" else faiss.METRIC_INNER_PRODUCT
        index = faiss.IndexScalarQuantizer(d, getattr(faiss.ScalarQuantizer, SQ_TYPES[a.index]), metric)
        index.train(base)
    index.add(base)
    t = time.perf_counter()
    _, ids = index.search(queries, a.k)
    s = time.perf_counter() - t
    if a.ids_out:
        write_ivecs(a.ids_out, ids)
    print(json.dumps({"search_ms": s * 1e3, "qps": queries.shape[0] / s,
                      "threads": faiss.omp_get_max_threads(), "faiss": faiss.__version__}))


def summary(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def thread_env(threads):
    env = dict(os.environ)
    for var in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(var, None)
        if threads is not None:
            env[var] = str(threads)
    return env


def machine_jiffies():
    """(all, idle) CPU time of the whole machine so far, in clock ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v), v[3] + v[4]


def enough_reps(reps, wanted, attempt):
    """Whether a case stops repeating after `attempt` (0-based, of at most 3 × wanted): it has
    `wanted` quiet repetitions, or the attempts left could no longer bring it there."""
    quiet = sum(1 for r in reps if r["quiet"])
    return quiet >= wanted or (attempt + 1 >= wanted and quiet + (wanted * 3 - attempt - 1) < wanted)


def run_measured(cmd, env):
    """Runs cmd; returns (its JSON output, % of the CPUs other work used meanwhile)."""
    hz = os.sysconf("SC_CLK_TCK")
    a0, i0 = machine_jiffies()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.monotonic()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - w0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    a1, i1 = machine_jiffies()
    busy = ((a1 - a0) - (i1 - i0)) / hz  # CPU seconds, every process (steal included)
    own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    other = max(0.0, busy - own) / (wall * (os.cpu_count() or 1)) * 100.0
    return json.loads(out), other


# dtype → (what the fraglink side reads, the faiss indexes tried on the same values)
DTYPE_PEERS = {
    "f32": ["flat"],
    "f16": ["sq_fp16", "flat"],
    "i8": ["sq_8bit_direct_signed", "flat"],
    "u8": ["sq_8bit_direct", "flat"],
}
PEER_NAMES = {
    "flat": "IndexFlat",
    "sq_fp16": "IndexScalarQuantizer(QT_fp16)",
    "sq_8bit_direct_signed": "IndexScalarQuantizer(QT_8bit_direct_signed)",
    "sq_8bit_direct": "IndexScalarQuantizer(QT_8bit_direct)",
}


def typed(a, dtype):
    """The standard normal data in `dtype` (ints: ×32, rounded, clamped; u8 +128)."""
    if dtype == "f32":
        return a
    if dtype == "f16":
        return a.astype(np.float16)
    if dtype == "i8":
        return np.clip(np.rint(a * 32), -128, 127).astype(np.int8)
    return np.clip(np.rint(a * 32 + 128), 0, 255).astype(np.uint8)


def write_data(work, dtype, base, queries):
    """Writes base and queries for both sides: .fvecs (f32) or .npy (others)."""
    if dtype == "f32":
        paths = [os.path.join(work, "base.fvecs"), os.path.join(work, "queries.fvecs")]
        write_fvecs(paths[0], base)
        write_fvecs(paths[1], queries)
    else:
        paths = [os.path.join(work, f"base_{dtype}.npy"), os.path.join(work, f"queries_{dtype}.npy")]
        np.save(paths[0], typed(base, dtype))
        np.save(paths[1], typed(queries, dtype))
    return paths


def run_case(a, me, dtype, metric, threads, base_p, q_p, exact, exact_p):
    """One (dtype, metric, threads) comparison; repeats until a.reps quiet repetitions."""
    label = f"{dtype} {metric}, {threads} thread{'s' if threads > 1 else ''}"
    ids_p = os.path.join(a.work, f"faiss_{dtype}_{metric}_{threads}.ivecs")
    env = thread_env(threads)
    # faiss' OpenMP threads spin while they wait; beside OpenBLAS' own
    # threads that can cost more than it gains on few cores, so with more
    # than one thread faiss also runs with passive waiting. Every variant
    # (index type × waiting) is timed and the fastest is the one compared.
    variants = []
    for index in DTYPE_PEERS[dtype]:
        variants.append((PEER_NAMES[index], index, env))
        if threads > 1:
            variants.append((PEER_NAMES[index] + ", OMP_WAIT_POLICY=PASSIVE", index,
                             dict(env, OMP_WAIT_POLICY="PASSIVE")))
    fl_cmd = [a.fraglink, "search", "--base", base_p, "--queries", q_p, "--k", str(a.k),
              "--metric", metric, "--device", "cpu", "--json"]
    reps = []  # per repetition: {"faiss": {name: run}, "fraglink": run, "other": [%...]}
    for attempt in range(a.reps * 3):
        rep = {"faiss": {}, "other": []}
        for name, index, venv in variants:
            fa = [sys.executable, me, "faiss", "--base", base_p, "--queries", q_p, "--metric", metric,
                  "--k", str(a.k), "--threads", str(threads), "--ids-out", ids_p, "--index", index]
            out, other = run_measured(fa, venv)
            rep["faiss"][name] = out
            rep["other"].append(other)
        out, other = run_measured(fl_cmd + ["--groundtruth", ids_p], env)
        rep["fraglink"] = out
        rep["other"].append(other)
        rep["quiet"] = max(rep["other"]) <= a.busy_max
        reps.append(rep)
        print(f"  search {label} rep {attempt + 1}: faiss "
              + ", ".join(f"{n} {r['search_ms']:.1f} ms" for n, r in rep["faiss"].items())
              + f"; fraglink {out['search_ms']:.1f} ms; other work {max(rep['other']):.0f}% of the CPUs"
              + ("" if rep["quiet"] else " (busy)"), file=sys.stderr)
        if enough_reps(reps, a.reps, attempt):
            break
    quiet = [r for r in reps if r["quiet"]]
    used = quiet if len(quiet) >= a.reps else reps
    # Recall against float64 exact neighbours: fraglink via its CLI, faiss here.
    vs_exact = json.loads(subprocess.run(fl_cmd + ["--groundtruth", exact_p], env=env, check=True,
                                         capture_output=True, text=True).stdout)
    faiss_ids = np.fromfile(ids_p, dtype=np.int32).reshape(a.nq, a.k + 1)[:, 1:]
    faiss_variants = {
        name: {"ms": summary([r["faiss"][name]["search_ms"] for r in used]),
               "qps": summary([r["faiss"][name]["qps"] for r in used]),
               "threads_reported": used[0]["faiss"][name]["threads"]}
        for name, _, _ in variants
    }
    best = min(faiss_variants, key=lambda n: faiss_variants[n]["ms"]["median"])
    rel = lambda x: os.path.relpath(x) if os.path.exists(x) else x
    other_all = [o for r in reps for o in r["other"]]
    return {
        "dtype": dtype, "metric": metric, "threads": threads, "label": label,
        "faiss_variants": faiss_variants,
        "faiss_best_variant": best,
        "faiss_ms": faiss_variants[best]["ms"],
        "faiss_qps": faiss_variants[best]["qps"],
        "fraglink_ms": summary([r["fraglink"]["search_ms"] for r in used]),
        "fraglink_qps": summary([r["fraglink"]["qps"] for r in used]),
        "faiss_version": used[0]["faiss"][best]["faiss"],
        "fraglink_route": used[0]["fraglink"]["route"],
        "recall_fraglink_vs_faiss": used[0]["fraglink"]["recall"],
        "recall_fraglink_vs_exact_f64": vs_exact["recall"],
        "recall_faiss_vs_exact_f64": recall(faiss_ids, exact, a.k),
        "fraglink_command": " ".join(["fraglink"] + [rel(x) for x in fl_cmd[1:]]),
        "quiet": len(quiet) >= a.reps,
        "reps_quiet": len(quiet), "reps_total": len(reps), "busy_max": a.busy_max,
        "other_busy_pct": summary(other_all),
    }


def run_main(a):
    os.makedirs(a.work, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    base = rng.standard_normal((a.n, a.dim), dtype=np.float32)
    queries = rng.standard_normal((a.nq, a.dim), dtype=np.float32)
    cores = os.cpu_count()
    results = {"n": a.n, "dim": a.dim, "nq": a.nq, "k": a.k, "seed": a.seed, "reps": a.reps,
               "busy_max": a.busy_max,
               "data": "standard normal f32, numpy default_rng(seed); f16 rounded; i8 rint(32x) "
                       "clamped; u8 rint(32x + 128) clamped",
               "cores": cores, "cases": []}
    me = os.path.abspath(__file__)
    for dtype in a.dtypes.split(","):
        base_p, q_p = write_data(a.work, dtype, base, queries)
        wide_b, wide_q = read_any(base_p), read_any(q_p)  # the values both sides see
        for metric in ("l2", "ip"):
            exact = exact_ids(wide_b, wide_q, metric, a.k)
            exact_p = os.path.join(a.work, f"exact_{dtype}_{metric}.ivecs")
            write_ivecs(exact_p, exact)
            for threads in (1, cores):
                results["cases"].append(run_case(a, me, dtype, metric, threads, base_p, q_p, exact, exact_p))
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--fraglink", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--reps", type=int, default=5)
    r.add_argument("--n", type=int, default=100_000)
    r.add_argument("--dim", type=int, default=128)
    r.add_argument("--nq", type=int, default=1000)
    r.add_argument("--k", type=int, default=10)
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--dtypes", default="f32,f16,i8,u8")
    r.add_argument("--busy-max", type=float, default=10.0,
                   help="%% of the CPUs other work may use during a quiet repetition")
    f = sub.add_parser("faiss")
    f.add_argument("--base", required=True)
    f.add_argument("--queries", required=True)
    f.add_argument("--metric", choices=["l2", "ip"], required=True)
    f.add_argument("--k", type=int, required=True)
    f.add_argument("--threads", type=int, required=True)
    f.add_argument("--ids-out")
    f.add_argument("--index", choices=["flat"] + sorted(SQ_TYPES), default="flat")
    a = p.parse_args()
    (run_main if a.cmd == "run" else faiss_main)(a)


if __name__ == "__main__":
    main()
