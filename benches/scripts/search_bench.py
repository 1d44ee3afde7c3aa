#!/usr/bin/env python3
"""CPU exact k-NN: `fraglink search --device cpu` against faiss-cpu IndexFlatL2 /
IndexFlatIP on identical .fvecs data, one thread and all threads.

Run with the bench venv's python (numpy + faiss-cpu). Every timed search runs in a
fresh process on both sides (fraglink: its JSON `search_ms`, the search alone;
faiss: `index.search` alone), alternating faiss / fraglink per repetition.

    search_bench.py run --fraglink target/release/fraglink --work DIR --reps 5 --out F.json
    search_bench.py faiss --base B --queries Q --metric l2|ip --k K --threads T --ids-out F.ivecs
"""
import argparse
import json
import os
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


def faiss_main(a):
    import faiss
    faiss.omp_set_num_threads(a.threads)
    base = read_fvecs(a.base)
    queries = read_fvecs(a.queries)
    index = faiss.IndexFlatL2(base.shape[1]) if a.metric == "l2" else faiss.IndexFlatIP(base.shape[1])
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


def run_main(a):
    os.makedirs(a.work, exist_ok=True)
    base_p, q_p = os.path.join(a.work, "base.fvecs"), os.path.join(a.work, "queries.fvecs")
    rng = np.random.default_rng(a.seed)
    base = rng.standard_normal((a.n, a.dim), dtype=np.float32)
    queries = rng.standard_normal((a.nq, a.dim), dtype=np.float32)
    write_fvecs(base_p, base)
    write_fvecs(q_p, queries)
    cores = os.cpu_count()
    results = {"n": a.n, "dim": a.dim, "nq": a.nq, "k": a.k, "seed": a.seed, "reps": a.reps,
               "data": "standard normal f32, numpy default_rng(seed)", "cores": cores, "cases": []}
    me = os.path.abspath(__file__)
    for metric in ("l2", "ip"):
        exact = exact_ids(base, queries, metric, a.k)
        exact_p = os.path.join(a.work, f"exact_{metric}.ivecs")
        write_ivecs(exact_p, exact)
        for threads in (1, cores):
            label = f"{metric}, {threads} thread{'s' if threads > 1 else ''}"
            ids_p = os.path.join(a.work, f"faiss_{metric}_{threads}.ivecs")
            env = thread_env(threads)
            # faiss' OpenMP threads spin while they wait; beside OpenBLAS' own
            # threads that can cost more than it gains on few cores, so with
            # more than one thread faiss also runs with passive waiting, and
            # its faster variant is the one compared.
            variants = [("default", env)]
            if threads > 1:
                variants.append(("OMP_WAIT_POLICY=PASSIVE", dict(env, OMP_WAIT_POLICY="PASSIVE")))
            faiss_runs = {name: [] for name, _ in variants}
            ours_runs = []
            fl_cmd = [a.fraglink, "search", "--base", base_p, "--queries", q_p, "--k", str(a.k),
                      "--metric", metric, "--device", "cpu", "--json"]
            for rep in range(a.reps):
                for name, venv in variants:
                    fa = [sys.executable, me, "faiss", "--base", base_p, "--queries", q_p, "--metric", metric,
                          "--k", str(a.k), "--threads", str(threads), "--ids-out", ids_p]
                    out = subprocess.run(fa, env=venv, check=True, capture_output=True, text=True).stdout
                    faiss_runs[name].append(json.loads(out))
                out = subprocess.run(fl_cmd + ["--groundtruth", ids_p], env=env, check=True,
                                     capture_output=True, text=True).stdout
                ours_runs.append(json.loads(out))
                print(f"  search {label} rep {rep + 1}/{a.reps}: faiss "
                      + ", ".join(f"{n} {r[-1]['search_ms']:.1f} ms" for n, r in faiss_runs.items())
                      + f"; fraglink {ours_runs[-1]['search_ms']:.1f} ms", file=sys.stderr)
            # Recall against float64 exact neighbours: fraglink via its CLI, faiss here.
            vs_exact = json.loads(subprocess.run(fl_cmd + ["--groundtruth", exact_p], env=env, check=True,
                                                 capture_output=True, text=True).stdout)
            faiss_ids = np.fromfile(ids_p, dtype=np.int32).reshape(a.nq, a.k + 1)[:, 1:]
            faiss_variants = {
                name: {"ms": summary([r["search_ms"] for r in runs]),
                       "qps": summary([r["qps"] for r in runs]),
                       "threads_reported": runs[0]["threads"]}
                for name, runs in faiss_runs.items()
            }
            best = min(faiss_variants, key=lambda n: faiss_variants[n]["ms"]["median"])
            first = next(iter(faiss_runs.values()))[0]
            rel = lambda x: os.path.relpath(x) if os.path.exists(x) else x
            results["cases"].append({
                "metric": metric, "threads": threads, "label": label,
                "faiss_variants": faiss_variants,
                "faiss_best_variant": best,
                "faiss_ms": faiss_variants[best]["ms"],
                "faiss_qps": faiss_variants[best]["qps"],
                "fraglink_ms": summary([r["search_ms"] for r in ours_runs]),
                "fraglink_qps": summary([r["qps"] for r in ours_runs]),
                "faiss_version": first["faiss"],
                "fraglink_route": ours_runs[0]["route"],
                "recall_fraglink_vs_faiss": ours_runs[0]["recall"],
                "recall_fraglink_vs_exact_f64": vs_exact["recall"],
                "recall_faiss_vs_exact_f64": recall(faiss_ids, exact, a.k),
                "fraglink_command": " ".join(["fraglink"] + [rel(x) for x in fl_cmd[1:]]),
            })
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
    f = sub.add_parser("faiss")
    f.add_argument("--base", required=True)
    f.add_argument("--queries", required=True)
    f.add_argument("--metric", choices=["l2", "ip"], required=True)
    f.add_argument("--k", type=int, required=True)
    f.add_argument("--threads", type=int, required=True)
    f.add_argument("--ids-out")
    a = p.parse_args()
    (run_main if a.cmd == "run" else faiss_main)(a)


if __name__ == "__main__":
    main()
