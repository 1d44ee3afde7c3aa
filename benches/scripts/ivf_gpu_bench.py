#!/usr/bin/env python3
"""IVF-Flat on the GPU: probe splits against one block per query.

Run on the GPU machine by scripts/gpu-run.sh (step `ivf`; numpy and torch are
installed there). With fewer queries than two blocks per SM, fraglink splits
each query's probed lists over several blocks and merges their best k on the
host (src/search/splits.rs); FRAGLINK_IVF_SPLITS=1 is the kernel's old
way, one block per query. This measures both on the same index and queries.

Data: clustered f32 rows (Gaussian blobs, seeded, as `fraglink search`'s
synthetic data), n x dim, and queries drawn from the same blobs; one index
built by `fraglink index build --kind ivf-flat --nlist N` (its build time is
reported, not compared); the exact neighbours computed once in float64 on the
GPU (torch) and handed to every search as --groundtruth.

Per case (nq x k x nprobe) and round, the two sides run alternately, the side
going first alternating by round: `fraglink search --index I --queries Q
--device gpu --nprobe P --k K --repeat R --json` with FRAGLINK_IVF_SPLITS unset
(auto) or 1, each a fresh process whose figure is its JSON `search_ms` (the
median of R searches; a search is the coarse step on the GPU, the list scan,
transfers and, when split, the host merge; the first search of a process links
or loads the kernels). A side's figure is the median over rounds; the ratio is
one block / split (> 1: the splits are faster). Both sides must report the
same recall (their results are the same bit for bit: tests/scan_emulated.rs,
tests/ivf_gpu.rs). Writes one JSON document.

`--dry-run` imports neither numpy nor torch and runs nothing: it writes the
cases with the splits the planner would take at --sm-count, but no figures,
so the plumbing into scripts/gpu_report.py can be checked without a GPU
(tests/gpu_scripts.rs does).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile
import time

# Seconds one fraglink search process may take (index read, upload, link,
# searches), and the index build (k-means over n rows on the host's cores).
FRAGLINK_TIMEOUT = 120
BUILD_TIMEOUT = 300


MAX_MERGE_ENTRIES = 1 << 15


def probe_splits(nq, nprobe, k, sm_count):
    """src/search/splits.rs's splits, with the probes as the parts."""
    target = 2 * max(sm_count, 1)
    if nq == 0 or nq >= target:
        return 1
    return max(1, min(math.ceil(target / nq), nprobe, MAX_MERGE_ENTRIES // max(k, 1), 65535))


def cases(a, sm_count):
    out = []
    for nprobe in a.nprobes:
        for k in a.ks:
            for nq in a.nqs:
                out.append({"nq": nq, "k": k, "nprobe": nprobe, "splits": probe_splits(nq, nprobe, k, sm_count)})
    return out


def write_vecs(path, a, dtype):
    """.fvecs (float32) or .ivecs (int32): each row prefixed by its length."""
    import numpy as np
    a = np.ascontiguousarray(a, dtype=dtype)
    n, d = a.shape
    out = np.empty((n, d + 1), dtype=dtype)
    out[:, 0] = np.array([d], dtype=np.int32).view(dtype)[0]
    out[:, 1:] = a
    out.tofile(path)


def make_data(a, work):
    """Base and query files, and the exact neighbours of every query (float64 on the GPU)."""
    import numpy as np
    import torch
    rng = np.random.default_rng(a.seed)
    centres = rng.uniform(-1.0, 1.0, (a.centres, a.dim)).astype(np.float32)

    def draw(m):
        return (centres[rng.integers(0, a.centres, m)]
                + a.sigma * rng.standard_normal((m, a.dim), dtype=np.float32)).astype(np.float32)

    base, queries = draw(a.n), draw(max(a.nqs))
    base_p = os.path.join(work, "base.fvecs")
    write_vecs(base_p, base, np.float32)
    x = torch.from_numpy(base).cuda().double()
    xn = (x * x).sum(1)
    kmax = max(a.ks)
    truth = []
    for s in range(0, queries.shape[0], 250):
        q = torch.from_numpy(queries[s:s + 250]).cuda().double()
        d = xn[None, :] - 2.0 * (q @ x.T)
        truth.append(torch.topk(d, kmax, dim=1, largest=False).indices.cpu().numpy())
    truth = np.concatenate(truth)
    files = {}
    for nq in a.nqs:
        q_p, t_p = os.path.join(work, f"queries_{nq}.fvecs"), os.path.join(work, f"truth_{nq}.ivecs")
        write_vecs(q_p, queries[:nq], np.float32)
        write_vecs(t_p, truth[:nq], np.int32)
        files[nq] = (q_p, t_p)
    return base_p, files


def run_json(cmd, env, timeout=None):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout or FRAGLINK_TIMEOUT)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout)


def measure(a, work, doc):
    import torch
    doc["device"] = torch.cuda.get_device_name(0)
    try:
        base_p, files = make_data(a, work)
        index_p = os.path.join(work, "index.ivf")
        t = time.perf_counter()
        built = run_json([a.fraglink, "index", "build", "--kind", "ivf-flat", "--nlist", str(a.nlist), "--base",
                          base_p, "--seed", str(a.seed), "--out", index_p, "--json"], dict(os.environ),
                         timeout=BUILD_TIMEOUT)
        doc["build_seconds"] = built.get("build_seconds", time.perf_counter() - t)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, OSError) as e:
        # No index, no case: the document says why.
        doc["error"] = f"data or index build: {str(e)[-500:]}"
        print(doc["error"], flush=True)
        write(a.out, doc)
        return
    sides = {"split": None, "one_block": "1"}
    for c in doc["cases"]:
        q_p, t_p = files[c["nq"]]
        cmd = [a.fraglink, "search", "--index", index_p, "--queries", q_p, "--groundtruth", t_p, "--device", "gpu",
               "--nprobe", str(c["nprobe"]), "--k", str(c["k"]), "--repeat", str(a.repeat), "--json"]
        runs = {s: [] for s in sides}
        recall = {}
        try:
            for r in range(a.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
                for side in order:
                    env = dict(os.environ)
                    env.pop("FRAGLINK_IVF_SPLITS", None)
                    if sides[side] is not None:
                        env["FRAGLINK_IVF_SPLITS"] = sides[side]
                    out = run_json(cmd, env)
                    runs[side].append(out["search_ms"])
                    recall[side] = out["recall"]
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            c["error"] = str(e)[-500:]
            print(f"nq {c['nq']} k {c['k']} nprobe {c['nprobe']}: {c['error']}", flush=True)
            write(a.out, doc)
            continue
        c["split_ms"] = statistics.median(runs["split"])
        c["one_block_ms"] = statistics.median(runs["one_block"])
        c["split_runs_ms"], c["one_block_runs_ms"] = runs["split"], runs["one_block"]
        c["ratio"] = c["one_block_ms"] / c["split_ms"] if c["split_ms"] > 0 else None
        c["recall"] = recall["split"]
        c["same_recall"] = recall["split"] == recall["one_block"]
        print(f"nq {c['nq']} k {c['k']} nprobe {c['nprobe']} splits {c['splits']}: split {c['split_ms']:.3f} ms, "
              f"one block {c['one_block_ms']:.3f} ms, one block / split {c['ratio']}, recall {c['recall']}"
              f"{'' if c['same_recall'] else ' (RECALLS DIFFER)'}", flush=True)
        # Rewritten after each case: a run stopped at its time limit keeps what it finished.
        write(a.out, doc)


def write(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fraglink", default="target/release/fraglink")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--nlist", type=int, default=1024)
    p.add_argument("--nqs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 100, 1000])
    p.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[10, 100, 1000])
    p.add_argument("--nprobes", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64])
    p.add_argument("--centres", type=int, default=1000)
    p.add_argument("--sigma", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20, help="searches per process (its median is its figure)")
    p.add_argument("--sm-count", type=int, default=132, help="--dry-run: the SMs the splits are planned for")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    sm_count = a.sm_count
    if not a.dry_run:
        import torch
        sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    doc = {"n": a.n, "dim": a.dim, "nlist": a.nlist, "rounds": a.rounds, "repeat": a.repeat, "sm_count": sm_count,
           "cases": cases(a, sm_count)}
    # Written before anything runs: a run stopped early still leaves the cases.
    write(a.out, doc)
    if a.dry_run:
        return
    with tempfile.TemporaryDirectory(prefix="fraglink-ivf-gpu-") as work:
        measure(a, work, doc)
    write(a.out, doc)


if __name__ == "__main__":
    main()
