#!/usr/bin/env python3
"""CPU IVF-Flat: `fraglink index build` + `fraglink search --index` against faiss-cpu
IndexIVFFlat (IndexFlat quantizer) on identical .fvecs files, same nlist and nprobe.

Run with the bench venv's python (numpy + faiss-cpu). Per repetition and thread
count the sides alternate: faiss builds (train + add, timed) and searches every
nprobe in one process (index.search alone timed); fraglink builds into a file
(its JSON `build_seconds`) and searches every nprobe in fresh processes (its
JSON `search_ms`, the search alone: coarse step + list scan, not the file read).
Both sides run each search `--search-reps` times in their process (faiss:
`index.search` in a loop; fraglink: `--repeat`) and report the median, so a
figure is a search with its threads and heap warm — faiss's first search comes
after its build, fraglink's after a file read — and the first run is kept
beside it (`first_ms`). Recall@k of both sides is against the same float64
exact neighbours.

    ivf_bench.py run --fraglink target/release/fraglink --work DIR --reps 3 --out F.json
    ivf_bench.py faiss --base B --queries Q --nlist N --nprobes 1,4 --k K --threads T --truth G
    ivf_bench.py small --fraglink target/release/fraglink --work DIR --out F.json   (small batches,
        on the files and index a `run` left in DIR)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from search_bench import (enough_reps, exact_ids, read_fvecs, recall, run_measured, summary, thread_env,  # noqa: E402
                          write_fvecs, write_ivecs)


def clustered(rng, n, nq, dim, centres, sigma):
    """Gaussian blobs (sigma) around `centres` points uniform in [-1, 1]^dim;
    queries from the same blobs."""
    c = rng.uniform(-1.0, 1.0, (centres, dim)).astype(np.float32)
    def draw(m):
        return (c[rng.integers(0, centres, m)] + sigma * rng.standard_normal((m, dim), dtype=np.float32))
    return draw(n).astype(np.float32), draw(nq).astype(np.float32)


def read_ivecs(path):
    raw = np.fromfile(path, dtype=np.int32)
    k = raw[0]
    return raw.reshape(-1, k + 1)[:, 1:].copy()


def faiss_ivf(base, nlist):
    """faiss IndexIVFFlat (IndexFlatL2 quantizer, default training) over base, and the seconds
    its train + add took."""
    import faiss
    d = base.shape[1]
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist, faiss.METRIC_L2)
    t = time.perf_counter()
    index.train(base)
    index.add(base)
    return index, time.perf_counter() - t


def faiss_main(a):
    import faiss
    faiss.omp_set_num_threads(a.threads)
    base, queries = read_fvecs(a.base), read_fvecs(a.queries)
    truth = read_ivecs(a.truth)
    index, build = faiss_ivf(base, a.nlist)
    out = {"build_seconds": build, "faiss": faiss.__version__, "threads": faiss.omp_get_max_threads(),
           "niter": index.cp.niter, "searches": []}
    for p in a.nprobes.split(","):
        index.nprobe = int(p)
        runs = []
        for _ in range(a.search_reps):
            t = time.perf_counter()
            _, ids = index.search(queries, a.k)
            runs.append(time.perf_counter() - t)
        s = statistics.median(runs)
        out["searches"].append({"nprobe": int(p), "search_ms": s * 1e3, "first_ms": runs[0] * 1e3,
                                "qps": queries.shape[0] / s, "recall": recall(ids, truth, a.k)})
    print(json.dumps(out))


def run_main(a):
    os.makedirs(a.work, exist_ok=True)
    base_p, q_p = os.path.join(a.work, "base.fvecs"), os.path.join(a.work, "queries.fvecs")
    truth_p, index_p = os.path.join(a.work, "truth.ivecs"), os.path.join(a.work, "fraglink.ivf")
    rng = np.random.default_rng(a.seed)
    base, queries = clustered(rng, a.n, a.nq, a.dim, a.centres, a.sigma)
    write_fvecs(base_p, base)
    write_fvecs(q_p, queries)
    write_ivecs(truth_p, exact_ids(base, queries, "l2", a.k))
    nprobes = [int(p) for p in a.nprobes.split(",")]
    me = os.path.abspath(__file__)
    results = {"n": a.n, "dim": a.dim, "nq": a.nq, "k": a.k, "nlist": a.nlist, "seed": a.seed,
               "reps": a.reps, "search_reps": a.search_reps, "busy_max": a.busy_max, "cores": os.cpu_count(),
               "data": f"{a.centres} Gaussian blobs (sigma {a.sigma}) around centres uniform in [-1,1]^dim, "
                       "numpy default_rng(seed); queries from the same blobs",
               "cases": []}
    for threads in a.threads:
        env = thread_env(threads)
        # As search_bench.py: with more than one thread faiss also runs with passive
        # OpenMP waiting (its spinning threads otherwise compete on a small machine);
        # per figure its better variant is compared.
        variants = [("default", env)]
        if threads > 1:
            variants.append(("OMP_WAIT_POLICY=PASSIVE", dict(env, OMP_WAIT_POLICY="PASSIVE")))
        reps = []  # per repetition: faiss runs by variant, our build and searches, other work %
        for attempt in range(a.reps * 3):
            rep = {"faiss": {}, "search": {}, "other": []}
            fa = [sys.executable, me, "faiss", "--base", base_p, "--queries", q_p, "--nlist", str(a.nlist),
                  "--nprobes", a.nprobes, "--k", str(a.k), "--threads", str(threads), "--truth", truth_p,
                  "--search-reps", str(a.search_reps)]
            for name, venv in variants:
                rep["faiss"][name], other = run_measured(fa, venv)
                rep["other"].append(other)
            build = [a.fraglink, "index", "build", "--kind", "ivf-flat", "--nlist", str(a.nlist), "--base", base_p,
                     "--metric", "l2", "--seed", str(a.seed + attempt), "--out", index_p, "--json"]
            rep["build"], other = run_measured(build, env)
            rep["other"].append(other)
            for p in nprobes:
                cmd = [a.fraglink, "search", "--index", index_p, "--queries", q_p, "--nprobe", str(p),
                       "--k", str(a.k), "--groundtruth", truth_p, "--repeat", str(a.search_reps), "--json"]
                rep["search"][p], other = run_measured(cmd, env)
                rep["other"].append(other)
            rep["quiet"] = max(rep["other"]) <= a.busy_max
            reps.append(rep)
            print(f"  ivf {threads} thread(s) rep {attempt + 1}: build faiss "
                  + ", ".join(f"{n} {r['build_seconds']:.2f} s" for n, r in rep["faiss"].items())
                  + f"; fraglink {rep['build']['build_seconds']:.2f} s; other work "
                  + f"{max(rep['other']):.0f}% of the CPUs" + ("" if rep["quiet"] else " (busy)"), file=sys.stderr)
            if enough_reps(reps, a.reps, attempt):
                break
        quiet = [r for r in reps if r["quiet"]]
        used = quiet if len(quiet) >= a.reps else reps
        faiss_by = {name: [r["faiss"][name] for r in used] for name, _ in variants}
        ours_build = [r["build"] for r in used]
        ours = {p: [r["search"][p] for r in used] for p in nprobes}
        builds = {n: summary([r["build_seconds"] for r in runs]) for n, runs in faiss_by.items()}
        best_build = min(builds, key=lambda n: builds[n]["median"])
        first = faiss_by["default"][0]
        case = {"threads": threads,
                "faiss_build_s": builds[best_build], "faiss_build_variant": best_build,
                "faiss_build_variants": builds,
                "fraglink_build_s": summary([r["build_seconds"] for r in ours_build]),
                "faiss_version": first["faiss"], "faiss_niter": first["niter"],
                "quiet": len(quiet) >= a.reps, "reps_quiet": len(quiet), "reps_total": len(reps),
                "busy_max": a.busy_max, "other_busy_pct": summary([o for r in reps for o in r["other"]]),
                "nprobe": []}
        for i, p in enumerate(nprobes):
            qps = {n: summary([r["searches"][i]["qps"] for r in runs]) for n, runs in faiss_by.items()}
            best = max(qps, key=lambda n: qps[n]["median"])
            fs = [r["searches"][i] for r in faiss_by[best]]
            case["nprobe"].append({
                "nprobe": p,
                "faiss_variant": best,
                "faiss_qps": qps[best],
                "fraglink_qps": summary([r["qps"] for r in ours[p]]),
                "faiss_first_ms": summary([s.get("first_ms", s["search_ms"]) for s in fs]),
                "fraglink_first_ms": summary([r.get("search_ms_first", r["search_ms"]) for r in ours[p]]),
                "faiss_recall": summary([s["recall"] for s in fs]),
                "fraglink_recall": summary([r["recall"] for r in ours[p]]),
            })
        results["cases"].append(case)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    for c in results["cases"]:
        print(f"threads {c['threads']}: build faiss {c['faiss_build_s']['median']:.2f} s, "
              f"fraglink {c['fraglink_build_s']['median']:.2f} s"
              + ("" if c["quiet"] else f" (BUSY, not evidence: {c['reps_quiet']} of {c['reps_total']} reps quiet)"))
        for r in c["nprobe"]:
            print(f"  nprobe {r['nprobe']:3d}: QPS faiss {r['faiss_qps']['median']:9.0f} fraglink "
                  f"{r['fraglink_qps']['median']:9.0f} ({r['fraglink_qps']['median'] / r['faiss_qps']['median']:.2f}x)"
                  f"  recall faiss {r['faiss_recall']['median']:.4f} fraglink {r['fraglink_recall']['median']:.4f}")


def small_main(a):
    """Small batches: faiss IndexIVFFlat.search in a loop against `fraglink search --repeat`,
    on the files a `run` left in --work (its base, queries and fraglink index), nq queries at a
    time from the start of the queries file; medians of --repeat searches per side."""
    import faiss
    base_p, q_p = os.path.join(a.work, "base.fvecs"), os.path.join(a.work, "queries.fvecs")
    index_p = os.path.join(a.work, "fraglink.ivf")
    base, queries = read_fvecs(base_p), read_fvecs(q_p)
    index, _ = faiss_ivf(base, a.nlist)
    index.nprobe = a.nprobe
    rows = []
    for threads in a.threads:
        faiss.omp_set_num_threads(threads)
        for nq in (int(x) for x in a.nqs.split(",")):
            part = os.path.join(a.work, f"queries_{nq}.fvecs")
            write_fvecs(part, queries[:nq])
            runs = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                index.search(queries[:nq], a.k)
                runs.append(time.perf_counter() - t)
            cmd = [a.fraglink, "search", "--index", index_p, "--queries", part, "--nprobe", str(a.nprobe),
                   "--k", str(a.k), "--repeat", str(a.repeat), "--json"]
            ours, other = run_measured(cmd, thread_env(threads))
            rows.append({"threads": threads, "nq": nq, "faiss_ms": statistics.median(runs) * 1e3,
                         "fraglink_ms": ours["search_ms"], "other_busy_pct": other})
            print(f"threads {threads} nq {nq}: faiss {rows[-1]['faiss_ms']:.3f} ms, fraglink "
                  f"{rows[-1]['fraglink_ms']:.3f} ms (medians of {a.repeat}; other work {other:.0f}%)")
    with open(a.out, "w") as f:
        json.dump({"nprobe": a.nprobe, "k": a.k, "repeat": a.repeat, "rows": rows}, f, indent=1)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--fraglink", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--n", type=int, default=200_000)
    r.add_argument("--dim", type=int, default=128)
    r.add_argument("--nq", type=int, default=2000)
    r.add_argument("--k", type=int, default=10)
    r.add_argument("--nlist", type=int, default=1024)
    r.add_argument("--nprobes", default="1,4,16,64")
    r.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    r.add_argument("--centres", type=int, default=1000)
    r.add_argument("--sigma", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--search-reps", type=int, default=5,
                   help="searches per nprobe in one process, both sides (the median is reported)")
    r.add_argument("--busy-max", type=float, default=10.0,
                   help="%% of the CPUs other work may use during a quiet repetition")
    f = sub.add_parser("faiss")
    f.add_argument("--base", required=True)
    f.add_argument("--queries", required=True)
    f.add_argument("--nlist", type=int, required=True)
    f.add_argument("--nprobes", required=True)
    f.add_argument("--k", type=int, required=True)
    f.add_argument("--threads", type=int, required=True)
    f.add_argument("--truth", required=True)
    f.add_argument("--search-reps", type=int, default=1)
    sm = sub.add_parser("small")
    sm.add_argument("--fraglink", required=True)
    sm.add_argument("--work", required=True, help="a `run`'s --work (its files and index are used)")
    sm.add_argument("--out", required=True)
    sm.add_argument("--nlist", type=int, default=1024)
    sm.add_argument("--nprobe", type=int, default=4)
    sm.add_argument("--k", type=int, default=10)
    sm.add_argument("--nqs", default="1,10,100")
    sm.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    sm.add_argument("--repeat", type=int, default=30)
    a = p.parse_args()
    {"run": run_main, "faiss": faiss_main, "small": small_main}[a.cmd](a)


if __name__ == "__main__":
    main()
