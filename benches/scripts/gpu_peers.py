#!/usr/bin/env python3
"""Exact k-NN on the GPU, fraglink against what users pick instead (issue 10).

Run on the GPU machine by scripts/gpu-run.sh (torch and CuPy are installed
there). One dataset per dtype (n x dim, seeded normal data), the same bytes
for every side; fraglink reads them from .npy files through its CLI.

Sides, each processing queries in batches of at most 1 000 (so no side runs
out of memory on the distance matrix):
  torch.mm+topk        ||x||^2 - 2 q.x with torch's default f32 math
  torch.mm+topk/tf32   the same with torch.backends.cuda.matmul.allow_tf32
  torch.cdist+topk     torch.cdist (p=2) then topk
  cupy.mm+argpartition the CuPy equivalent of the first
  fraglink             `fraglink search --device gpu --json --repeat reps+1`:
                       timed like the peers, one warm-up search (it links or
                       loads the kernels; reported as first_search_ms) then
                       the median of `reps`; a search's time covers all it
                       does per call (query upload, norms, launches, result
                       download; the peers' queries and results stay on the
                       GPU); its recall must be 1.0. The tensor-core
                       candidates + exact re-rank path where the planner
                       takes it (`gpu_kernel` names what ran)
  fraglink/scan        the same with FRAGLINK_GPU_KNN=0: the exact scan kernel,
                       to see where it still wins (beyond k 256 the two-pass
                       select, knn_dist + knn_select); below a wave of its
                       blocks (what the GPU holds at once) its rows split
                       over blocks (FRAGLINK_SCAN_SPLITS)
  fraglink/scan-1block the scan with FRAGLINK_SCAN_SPLITS=1 (one block per
                       query, as before the row splits), only where the
                       split count differs (nq < 2 x SMs, k <= 256):
                       `scan_splits_gain` = fraglink/scan over it
  fraglink/scan-2sm    the scan with its rows split for two blocks per SM
                       (FRAGLINK_SCAN_SPLITS = ceil(2 x SMs / nq), the split
                       count before a wave of the scan's resident blocks set
                       it), where it differs: `scan_wave_gain` =
                       fraglink/scan over it
  fraglink/fast-link   `fraglink` with FRAGLINK_FAST_COMPILE=min: kernels linked
                       at nvJitLink's -Ofc=min (about half the cold link, see
                       benches/scripts/cold_links.sh), so that their speed is
                       known before a plan takes that level:
                       `fast_link_vs_default` = it over `fraglink`
  fraglink/no-bound    `fraglink` with FRAGLINK_KNN_SHARED_BOUND=0: the row
                       chunks of a query each on their own, as before the
                       candidate kernel's shared bound (knn_tile.cuh
                       `shared_bound`), where the tensor-core path serves
                       (k <= 1024): `shared_bound_gain` = `fraglink` over it
  fraglink/no-prefetch `fraglink` with FRAGLINK_KNN_PREFETCH=0: the candidate
                       kernel without its L2 prefetch ahead of the copy
                       pipeline (copy_async.cuh `prefetch_l2`), where the
                       tensor-core path serves (k <= 1024): `prefetch_gain`
                       = `fraglink` over it
  traces               not a side: for nq <= 100 and k <= 100, `fraglink` once
                       more with FRAGLINK_SEARCH_TRACE=1 (and at nq 1, k 10,
                       `fraglink/scan` too), the last repetition's trace in
                       the case's `traces`: host time per step of the
                       search and the device time between CUDA events
                       recorded after each step that queues work, so the
                       host's share of a small search shows (wall less the
                       device span). Timed apart: the events cost time
  fraglink[<variant>]  for the cases of --variant-nq x --variant-k: fraglink
                       with FRAGLINK_KNN_VARIANT naming each candidate kernel
                       (knn_tile_*) of the dtype, per precision (f32: TF32,
                       3xTF32 and f16copy, which reads f16 copies of the
                       rows) and block shape the smallest capacity holding
                       k, from `fraglink catalog --json`;
                       `best_variant` says which was fastest, so the planner's
                       pick (the `fraglink` side) can be checked against it

Order, for a run cut short: every case's goal sides first (the peers and
`fraglink`, the planner's pick: the issue's table), then the diagnostic sides
of every case (`fraglink/no-prefetch`, then `fraglink/scan`, then the traces,
then `fraglink/no-bound`, then `fraglink/fast-link`, then `fraglink/scan-1block`
and `fraglink/scan-2sm`, then the candidate kernels by name). With `--seconds S`
(gpu-run.sh passes what its budget has left) nothing is started that the run's own timings say would end
after S seconds: such cases are listed in `cases_left_out`, such sides in
their case's `sides_left_out`, and GPU.md says so.

Recall is against the exact answer computed in float64 on the GPU. Each
case also gets its floor: the larger of the bytes it must read at the
measured device bandwidth and the FLOPs at the unit's peak (the note names
which). Each case records the issue's goal for it (fraglink / best peer at
least 1.0 at nq = 10 000 and 1.5 at nq <= 100) and whether it was met.
Writes one JSON document.

`--dry-run` imports neither torch, numpy nor CuPy and runs nothing: it writes
the same document with every case's shape, floor (at `--bandwidth`) and goal
but no sides, so the plumbing into scripts/gpu_report.py can be checked on a
machine without a GPU (tests/gpu_scripts.rs does).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

np = None
torch = None
cp = None


def load_libraries():
    """numpy, torch and (optionally) CuPy: only a real run needs them."""
    global np, torch, cp
    import numpy
    import torch as torch_
    np, torch = numpy, torch_
    try:
        import cupy
        cp = cupy
    except Exception:  # noqa: BLE001 - CuPy is optional
        cp = None

BATCH = 1000
# Seconds one fraglink process may take (data load, upload, link, searches).
FRAGLINK_TIMEOUT = 120
# H100 SXM peaks (dense): f32 FMA 67 TFLOP/s, TF32 tensor 495, f16 tensor 990.
# An f32 case's FLOP limit is the fastest way to an exact f32 answer on the
# device: 3xTF32 on the tensor cores (three TF32 products per product, 165),
# which is what fraglink's f32 candidates use, not the CUDA cores' FMA rate.
PEAK_FLOPS = {"f32": 67e12, "tf32": 495e12, "3xtf32": 495e12 / 3, "f16": 990e12}


# A side whose warm-up run takes longer than this is timed once, not `reps`
# times: CuPy's argpartition sorts every row in full (a second or more per
# 1 000 x 1M batch) and the whole comparison must fit one GPU-lease call.
SLOW_RUN_SECONDS = 1.0


def timed(fn, reps):
    """Median seconds of `fn` over `reps` runs after one warm-up (CUDA events);
    one timed run when the warm-up took over SLOW_RUN_SECONDS."""
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    if time.perf_counter() - t0 > SLOW_RUN_SECONDS:
        reps = 1
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2], out


def batches(nq):
    return [(s, min(s + BATCH, nq)) for s in range(0, nq, BATCH)]


def torch_mm(x, xn, q, k):
    ids = []
    for s, e in batches(q.shape[0]):
        qb = q[s:e]
        d = xn[None, :] - 2.0 * (qb @ x.T)
        ids.append(torch.topk(d, k, dim=1, largest=False).indices)
    return torch.cat(ids)


def torch_cdist(x, q, k):
    ids = []
    for s, e in batches(q.shape[0]):
        d = torch.cdist(q[s:e], x)
        ids.append(torch.topk(d, k, dim=1, largest=False).indices)
    return torch.cat(ids)


def cupy_mm(x, xn, q, k):
    ids = []
    for s, e in batches(q.shape[0]):
        d = xn[None, :] - 2.0 * (q[s:e] @ x.T)
        part = cp.argpartition(d, k, axis=1)[:, :k]
        pd = cp.take_along_axis(d, part, axis=1)
        order = cp.argsort(pd, axis=1)
        ids.append(cp.take_along_axis(part, order, axis=1))
    return cp.concatenate(ids)


def exact(x64, q64, k):
    ids = []
    xn = (x64 * x64).sum(1)
    for s, e in batches(q64.shape[0]):
        qb = q64[s:e]
        d = xn[None, :] - 2.0 * (qb @ x64.T) + (qb * qb).sum(1)[:, None]
        ids.append(torch.topk(d, k, dim=1, largest=False).indices)
    return torch.cat(ids)


def recall(found, truth):
    f = found.cpu().numpy() if hasattr(found, "cpu") else cp.asnumpy(found)
    t = truth.cpu().numpy()
    hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(f, t))
    return hits / t.size


def floor_seconds(n, dim, nq, elem, unit, bandwidth):
    passes = len(batches(nq))
    bytes_ = passes * n * dim * elem + nq * dim * elem
    flops = 2.0 * n * dim * nq
    t_mem, t_flop = bytes_ / bandwidth, flops / PEAK_FLOPS[unit]
    return max(t_mem, t_flop), ("memory" if t_mem >= t_flop else f"{unit} FLOPs")


def measure_bandwidth():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    secs, _ = timed(lambda: b.copy_(a), 10)
    return 2 * a.numel() / secs


def goal(nq, k=10):
    """The issue's target ratio fraglink / best peer for a case, or None (the
    issue's cases are k 10 and 100; the --large-k ones have no goal)."""
    if k > 100:
        return None
    if nq >= 10_000:
        return 1.0
    if nq <= 100:
        return 1.5
    return None


ELEM_BYTES = {"f32": 4, "f16": 2, "i8": 1, "u8": 1}


def knn_variants(bin_, dtype, k, dim):
    """The candidate kernels (knn_tile_*) of `dtype` from the binary's own
    catalog: per precision and block shape the smallest capacity that holds
    k (a larger one only costs more), in the staging the planner picks for
    rows of `dim` elements (the `_a16` variants where rows are whole 16-byte
    groups; the others copy the same way then, from more code)."""
    staging = "16" if dim * ELEM_BYTES[dtype] % 16 == 0 else "0"
    p = subprocess.run([bin_, "catalog", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        return []
    best = {}
    for f in json.loads(p.stdout)["fragments"]:
        q = f["params"]
        if f["family"] != "knn_tile" or q.get("dtype") != dtype or int(q.get("capacity", 0)) < k:
            continue
        if q.get("staging", "0") != staging:
            continue
        shape = (q.get("precision"), q.get("qtile"), q.get("rtile"))
        if shape not in best or int(q["capacity"]) < int(best[shape]["params"]["capacity"]):
            best[shape] = f
    return sorted(f["name"] for f in best.values())


def run_fraglink(bin_, base, queries, gt, k, dtype, reps, knn=True, variant=None, splits=None,
                 fast_compile=None, shared_bound=True, prefetch=None, trace=False,
                 timeout=FRAGLINK_TIMEOUT):
    """fraglink's side, timed as the peers are (`timed`): one warm-up search,
    then the median of `reps` (`--repeat reps+1` in one process; the first
    search, which links or loads the kernels, is reported apart). `variant`
    names the candidate kernel (FRAGLINK_KNN_VARIANT), `splits` fixes the
    scan's row splits (FRAGLINK_SCAN_SPLITS), `fast_compile` the link's
    fast-compile level (FRAGLINK_FAST_COMPILE), `shared_bound` False turns
    the candidate kernel's shared bound off (FRAGLINK_KNN_SHARED_BOUND=0),
    `prefetch` sets its L2 prefetch lead (FRAGLINK_KNN_PREFETCH; None: the
    default), `trace` asks for the search's trace (FRAGLINK_SEARCH_TRACE=1)."""
    cmd = [bin_, "search", "--device", "gpu", "--json", "--base", base, "--queries", queries,
           "--groundtruth", gt, "--k", str(k), "--metric", "l2", "--dtype", dtype,
           "--repeat", str(reps + 1)]
    env = dict(os.environ, FRAGLINK_GPU_KNN="1" if knn else "0")
    env.pop("FRAGLINK_KNN_VARIANT", None)
    env.pop("FRAGLINK_SCAN_SPLITS", None)
    env.pop("FRAGLINK_FAST_COMPILE", None)
    env.pop("FRAGLINK_KNN_PREFETCH", None)
    if prefetch is not None:
        env["FRAGLINK_KNN_PREFETCH"] = str(prefetch)
    env["FRAGLINK_KNN_SHARED_BOUND"] = "1" if shared_bound else "0"
    env["FRAGLINK_SEARCH_TRACE"] = "1" if trace else "0"
    if fast_compile:
        env["FRAGLINK_FAST_COMPILE"] = fast_compile
    if variant:
        env["FRAGLINK_KNN_VARIANT"] = variant
    if splits:
        env["FRAGLINK_SCAN_SPLITS"] = str(splits)
    started = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout:.0f} s", "exit": None,
                "process_wall_s": time.perf_counter() - started}
    wall = time.perf_counter() - started
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-500:], "exit": p.returncode}
    d = json.loads(p.stdout)
    # A GPU search that failed and was answered on the CPU is not a GPU figure.
    if d.get("route") != "gpu" or d.get("fell_back"):
        return {"error": f"served by route {d.get('route')} (fell back: {d.get('fell_back')}): "
                         + str(d.get("reason") or "")[:300],
                "exit": 0}
    warm = sorted(d["search_ms_runs"][1:])
    seconds = warm[len(warm) // 2] / 1e3
    return {"qps": d["nq"] / seconds, "seconds": seconds, "recall": d.get("recall"),
            "route": d.get("route"), "gpu_kernel": d.get("gpu_kernel"),
            "first_search_ms": d.get("search_ms_first"), "upload_ms": d.get("upload_ms"),
            "process_wall_s": wall, **({"trace": d.get("trace")} if trace else {})}


class Deadline:
    """`--seconds`: work that would not end before the run's deadline is not
    started. Its estimates are what the run has seen: the longest goal case
    at the same nq (else any, else DEFAULT_CASE_S) and the longest fraglink
    process (else DEFAULT_FRAGLINK_S); a fraglink process is also stopped at
    the deadline (or FRAGLINK_TIMEOUT, the smaller)."""
    DEFAULT_CASE_S = 20.0
    DEFAULT_FRAGLINK_S = 10.0

    def __init__(self, seconds):
        self.seconds = seconds
        self.started = time.monotonic()
        self.case_walls = {}
        self.fraglink_wall = 0.0
        self.last_need = 0.0

    def left(self):
        if self.seconds is None:
            return float("inf")
        return self.seconds - (time.monotonic() - self.started)

    def allows(self, need):
        self.last_need = need
        return self.left() >= need

    def reason(self):
        return (f"left out at the deadline (--seconds {self.seconds:g}): {max(self.left(), 0):.0f} s "
                f"left, about {self.last_need:.0f} s needed")

    def case_estimate(self, nq=None):
        same = self.case_walls.get(nq)
        if same:
            return same
        return max(self.case_walls.values(), default=self.DEFAULT_CASE_S)

    def case_done(self, nq, wall):
        self.case_walls[nq] = max(self.case_walls.get(nq, 0.0), wall)

    def fraglink_estimate(self):
        return self.fraglink_wall or self.DEFAULT_FRAGLINK_S

    def fraglink(self, *args, **kwargs):
        timeout = max(1.0, min(FRAGLINK_TIMEOUT, self.left()))
        side = run_fraglink(*args, timeout=timeout, **kwargs)
        self.fraglink_wall = max(self.fraglink_wall, side.get("process_wall_s") or 0.0)
        return side


def finish_case(case):
    """Ratios and the goal of a case whose sides are measured."""
    peers = [s.get("qps") or 0 for n, s in case["sides"].items() if not n.startswith("fraglink")]
    variants = {n[len("fraglink["):-1]: s.get("qps") or 0 for n, s in case["sides"].items()
                if n.startswith("fraglink[")}
    case["best_variant"] = max(variants, key=variants.get) if any(variants.values()) else None
    best = max(peers, default=0)
    fq = case["sides"].get("fraglink", {}).get("qps")
    sq = case["sides"].get("fraglink/scan", {}).get("qps")
    case["fraglink_vs_best_peer"] = (fq / best) if (fq and best) else None
    case["tensor_core_vs_scan"] = (fq / sq) if (fq and sq) else None
    oq = case["sides"].get("fraglink/scan-1block", {}).get("qps")
    case["scan_splits_gain"] = (sq / oq) if (sq and oq) else None
    wq = case["sides"].get("fraglink/scan-2sm", {}).get("qps")
    case["scan_wave_gain"] = (sq / wq) if (sq and wq) else None
    lq = case["sides"].get("fraglink/fast-link", {}).get("qps")
    case["fast_link_vs_default"] = (lq / fq) if (fq and lq) else None
    bq = case["sides"].get("fraglink/no-bound", {}).get("qps")
    case["shared_bound_gain"] = (fq / bq) if (fq and bq) else None
    pq = case["sides"].get("fraglink/no-prefetch", {}).get("qps")
    case["prefetch_gain"] = (fq / pq) if (fq and pq) else None
    r = case["fraglink_vs_best_peer"]
    case["goal_met"] = None if (case["goal"] is None or r is None) else r >= case["goal"]


def dry_run(a, nqs, ks_of):
    """The document's shape without running anything (module docs)."""
    out = {"device": None, "dry_run": True, "n": a.n, "dim": a.dim, "batch": BATCH,
           "bandwidth_gbps": a.bandwidth / 1e9, "cases": []}
    for dtype in a.dtypes.split(","):
        elem = ELEM_BYTES[dtype]
        unit = "f16" if dtype == "f16" else "3xtf32"
        for nq in nqs:
            for k in ks_of(dtype, nq):
                fl, bound = floor_seconds(a.n, a.dim, nq, elem, unit, a.bandwidth)
                case = {"dtype": dtype, "nq": nq, "k": k, "sides": {}, "floor_qps": nq / fl,
                        "floor_bound": bound, "goal": goal(nq, k)}
                finish_case(case)
                out["cases"].append(case)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"dry run: {len(out['cases'])} cases written to {a.out}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fraglink", help="the fraglink binary (required unless --dry-run)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nq", default="1,100,10000")
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--large-k", default="2000",
                    help="k values beyond the candidate kernels (the two-pass select) timed for "
                         "f32 at nq <= 100 only, without a goal ('' for none)")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variant-nq", default="1,100,10000",
                    help="nq values whose cases also time every candidate kernel by name ('' for none)")
    ap.add_argument("--variant-k", default="10,100",
                    help="k values whose cases also time every candidate kernel by name")
    ap.add_argument("--seconds", type=float, default=None,
                    help="the run's deadline, in seconds from its start: work that would end after "
                         "it is not started and is listed as left out (default: none)")
    ap.add_argument("--dry-run", action="store_true",
                    help="write the cases' shapes, floors and goals only (no GPU, no torch)")
    ap.add_argument("--bandwidth", type=float, default=3.35e12,
                    help="bytes/s for --dry-run's floors (default: H100 SXM HBM3)")
    a = ap.parse_args()
    # From the start: torch's import and the device's first use count too.
    clock = Deadline(a.seconds)
    nqs = [int(v) for v in a.nq.split(",")]
    ks = [int(v) for v in a.k.split(",")]
    large_ks = [int(v) for v in a.large_k.split(",") if v]

    def ks_of(dtype, nq):
        return ks + (large_ks if dtype == "f32" and nq <= 100 else [])

    variant_nqs = {int(v) for v in a.variant_nq.split(",") if v}
    variant_ks = {int(v) for v in a.variant_k.split(",") if v}
    if a.dry_run:
        return dry_run(a, nqs, ks_of)
    if not a.fraglink:
        ap.error("--fraglink is required")
    load_libraries()
    torch.manual_seed(1234)
    dev = torch.cuda.get_device_name()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    bandwidth = measure_bandwidth()
    out = {"device": dev, "sm_count": sm_count, "torch": torch.__version__,
           "cupy": cp.__version__ if cp else None,
           "n": a.n, "dim": a.dim, "batch": BATCH, "bandwidth_gbps": bandwidth / 1e9, "cases": []}
    tmp = tempfile.mkdtemp(prefix="fraglink-peers-")

    def save():
        # Written after every case and side, so a late failure or a run cut
        # at its deadline keeps the rest.
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)

    # The diagnostic sides, run after every case's goal sides: (case, side
    # name, run_fraglink's keyword arguments, the files the case reads).
    extras = []
    for dtype in a.dtypes.split(","):
        tdt = {"f32": torch.float32, "f16": torch.float16}[dtype]
        x = torch.randn(a.n, a.dim, device="cuda").to(tdt)
        qall = torch.randn(max(nqs), a.dim, device="cuda").to(tdt)
        base = os.path.join(tmp, f"base_{dtype}.npy")
        np.save(base, x.cpu().numpy())
        x64 = x.double()
        xf = x.float()
        xn = (xf * xf).sum(1).to(tdt)
        for nq in nqs:
            q = qall[:nq].contiguous()
            qpath = os.path.join(tmp, f"q_{dtype}_{nq}.npy")
            np.save(qpath, q.cpu().numpy())
            for k in ks_of(dtype, nq):
                case = {"dtype": dtype, "nq": nq, "k": k, "sides": {}, "goal": goal(nq, k)}
                if not clock.allows(clock.case_estimate(nq)):
                    # Not started: no half-measured case in the table.
                    out.setdefault("cases_left_out", []).append(
                        {"dtype": dtype, "nq": nq, "k": k, "reason": clock.reason()})
                    continue
                case_started = time.monotonic()
                truth = exact(x64, q.double(), k)
                gt = os.path.join(tmp, f"gt_{dtype}_{nq}_{k}.ivecs")
                t = truth.cpu().numpy().astype(np.int32)
                with open(gt, "wb") as f:
                    for row in t:
                        f.write(np.int32(k).tobytes())
                        f.write(row.tobytes())
                elem = ELEM_BYTES[dtype]
                unit = "f16" if dtype == "f16" else "3xtf32"
                fl, bound = floor_seconds(a.n, a.dim, nq, elem, unit, bandwidth)
                case["floor_qps"] = nq / fl
                case["floor_bound"] = bound
                sides = {
                    "torch.mm+topk": lambda: torch_mm(x, xn, q, k),
                    "torch.cdist+topk": lambda: torch_cdist(xf, q.float(), k),
                }
                if dtype == "f32":
                    def tf32():
                        torch.backends.cuda.matmul.allow_tf32 = True
                        try:
                            return torch_mm(x, xn, q, k)
                        finally:
                            torch.backends.cuda.matmul.allow_tf32 = False
                    sides["torch.mm+topk/tf32"] = tf32
                if cp is not None:
                    try:
                        cx, cxn, cq = cp.asarray(x), cp.asarray(xn), cp.asarray(q)
                        sides["cupy.mm+argpartition"] = lambda: cupy_mm(cx, cxn, cq, k)
                    except Exception as e:  # noqa: BLE001 - a CuPy/CUDA mismatch: report, go on
                        case["sides"]["cupy.mm+argpartition"] = {"error": str(e)[:300]}
                for name, fn in sides.items():
                    try:
                        secs, found = timed(fn, a.reps)
                        case["sides"][name] = {"qps": nq / secs, "seconds": secs,
                                               "recall": recall(found, truth)}
                    except Exception as e:  # noqa: BLE001 - report, go on
                        case["sides"][name] = {"error": str(e)[:300]}
                    # Each side's distance batches must not stay cached for the
                    # next (CuPy's pool once held 65 GB here and starved torch).
                    torch.cuda.empty_cache()
                    if cp is not None:
                        cp.get_default_memory_pool().free_all_blocks()
                files = (base, qpath, gt)
                case["sides"]["fraglink"] = clock.fraglink(a.fraglink, *files, k, dtype, a.reps)
                clock.case_done(nq, time.monotonic() - case_started)
                finish_case(case)
                out["cases"].append(case)
                save()
                print(json.dumps({kk: case[kk] for kk in ("dtype", "nq", "k", "fraglink_vs_best_peer",
                                                          "goal", "goal_met")}), flush=True)
                if k <= 1024:
                    extras.append((case, "fraglink/no-prefetch", {"prefetch": 0}, files))
                extras.append((case, "fraglink/scan", {"knn": False}, files))
                if nq <= 100 and k <= 100:
                    extras.append((case, "trace:fraglink", {"trace": True}, files))
                if nq == 1 and k == 10:
                    extras.append((case, "trace:fraglink/scan", {"knn": False, "trace": True}, files))
                if k <= 1024:
                    extras.append((case, "fraglink/no-bound", {"shared_bound": False}, files))
                extras.append((case, "fraglink/fast-link", {"fast_compile": "min"}, files))
                if nq < 2 * sm_count and k <= 256:
                    extras.append((case, "fraglink/scan-1block", {"knn": False, "splits": 1}, files))
                    two_per_sm = -(-2 * sm_count // nq)
                    if two_per_sm > 1:
                        extras.append((case, "fraglink/scan-2sm", {"knn": False, "splits": two_per_sm},
                                       files))
                if nq in variant_nqs and k in variant_ks:
                    for v in knn_variants(a.fraglink, dtype, k, a.dim):
                        extras.append((case, f"fraglink[{v}]", {"variant": v}, files))
        del x, x64, xf, qall
        torch.cuda.empty_cache()
    # The candidate kernel without its L2 prefetch first (not yet measured on
    # a GPU: the default's one open question), then the scan against the
    # tensor-core path (every case's), then the
    # candidate kernel without its shared bound, then the fast-compile links,
    # then one block per query against the row splits,
    # then the candidate kernels by name: the order in which they answer
    # questions about the planner.
    rank = {"fraglink/no-prefetch": -1, "fraglink/scan": 0, "trace:fraglink": 1,
            "trace:fraglink/scan": 1, "fraglink/no-bound": 2, "fraglink/fast-link": 3, "fraglink/scan-1block": 4, "fraglink/scan-2sm": 4}
    for case, name, kwargs, files in sorted(extras, key=lambda e: rank.get(e[1], 5)):
        if not clock.allows(clock.fraglink_estimate()):
            case.setdefault("sides_left_out", []).append(name)
            case["left_out_reason"] = clock.reason()
            continue
        got = clock.fraglink(a.fraglink, *files, case["k"], case["dtype"], a.reps, **kwargs)
        if name.startswith("trace:"):
            # Not a side: its QPS carries the events' cost.
            case.setdefault("traces", {})[name[len("trace:"):]] = got
            save()
            continue
        case["sides"][name] = got
        finish_case(case)
        save()
        print(json.dumps({"dtype": case["dtype"], "nq": case["nq"], "k": case["k"], "side": name,
                          "qps": case["sides"][name].get("qps"),
                          "best_variant": case["best_variant"],
                          "tensor_core_vs_scan": case["tensor_core_vs_scan"],
                          "fast_link_vs_default": case["fast_link_vs_default"],
                          "shared_bound_gain": case["shared_bound_gain"],
                          "prefetch_gain": case["prefetch_gain"],
                          "scan_splits_gain": case["scan_splits_gain"]}), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
