#!/usr/bin/env python3
"""Turns a scripts/gpu-run.sh run into gpu-results.json and gpu-summary.md
(`collect`), and the gpu-results.json of one or more runs of the same commit
on the same device (one lease call each, each running some of the steps) into
GPU.md (`md`). GPU.md is only ever written by this script: never edit it by
hand."""
import argparse
import csv
import json
import os
import re
import sys
import xml.etree.ElementTree as ET


def read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def read_json(path):
    text = read(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def read_jsonl(path):
    """The JSON documents of a file of one per line; lines that do not parse
    are left out."""
    out = []
    for line in (read(path, "") or "").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def tests_from_junit(path):
    out = []
    if not os.path.exists(path):
        return out
    root = ET.parse(path).getroot()
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            outcome = "passed"
            message = ""
            for tag in ("failure", "error"):
                el = case.find(tag)
                if el is not None:
                    outcome = "failed"
                    message = (el.get("message") or "")[:300]
            if case.find("skipped") is not None:
                outcome = "skipped"
            out.append({
                "binary": suite.get("name"),
                "test": case.get("name"),
                "outcome": outcome,
                "seconds": float(case.get("time") or 0),
                "message": message,
            })
    return out


# A test's line in nextest's output: `        PASS [   0.011s] (5/8) fraglink::knn_gpu name`
# (also FAIL, TIMEOUT, SIGSEGV, SIGABRT, ABORT, LEAK, LEAK-FAIL ...).
NEXTEST_LINE = re.compile(r"^\s*(?:TRY \d+ )?([A-Z][A-Z-]+)\s+\[\s*([0-9.]+)s\]\s+(?:\(\s*\d+/\d+\)\s+)?"
                          r"(\S+)\s+(\S.*?)\s*$")
NEXTEST_START = re.compile(r"^\s*Starting (\d+) tests? across")


def tests_from_log(path):
    """The tests nextest reported in its output, for a run stopped before it
    wrote JUnit: (tests, how many it started)."""
    out, started = [], None
    for line in (read(path, "") or "").splitlines():
        m = NEXTEST_START.match(line)
        if m:
            started = int(m.group(1))
            continue
        m = NEXTEST_LINE.match(line)
        if not m or m.group(1) in ("SLOW", "START", "RETRY", "CANCEL", "SETUP"):
            continue
        status = m.group(1)
        out.append({
            "binary": m.group(3),
            "test": m.group(4),
            "outcome": "passed" if status in ("PASS", "LEAK") else "failed",
            "seconds": float(m.group(2)),
            "message": "" if status == "PASS" else status,
        })
    return out, started


def tests_of_step(logs, step, status):
    """A test step's tests (JUnit where nextest wrote it, else its output)
    and how many nextest started with. In a step stopped at the budget, the
    tests nextest interrupted (SIGINT) are "stopped", not failed."""
    log_tests, started = tests_from_log(os.path.join(logs, f"tests-{step}.txt"))
    junit = os.path.join(logs, f"junit-{step}.xml")
    tests = tests_from_junit(junit) if os.path.exists(junit) else log_tests
    for t in tests:
        t["step"] = step
        if status == "stopped" and t["outcome"] == "failed" and "SIGINT" in t["message"]:
            t["outcome"] = "stopped"
    return tests, started


# Nsight Compute metrics GPU.md shows per profiled kernel (gpu-run.sh's ncu step).
NCU_METRICS = [
    "Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput",
    "Registers Per Thread", "Theoretical Occupancy", "Achieved Occupancy",
]


# gpu-run.sh's `--metrics`: warp cycles stalled per issued instruction, by reason.
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def ncu_profiles(logs):
    """Per ncu-<case>.csv (`ncu --import R --csv --page details`): each profiled
    kernel's NCU_METRICS as "value unit" strings, and its warp stalls (cycles
    per issued instruction by reason, numbers), in launch order."""
    out = []
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        if not (name.startswith("ncu-") and name.endswith(".csv")):
            continue
        text = read(os.path.join(logs, name), "") or ""
        rows = list(csv.DictReader(line for line in text.splitlines() if line.startswith('"')))
        kernels = {}
        for row in rows:
            kid = row.get("ID")
            metric = row.get("Metric Name") or ""
            stall = metric.startswith(STALL_PREFIX) and metric.endswith(STALL_SUFFIX)
            if kid is None or (metric not in NCU_METRICS and not stall):
                continue
            k = kernels.setdefault(kid, {"kernel": (row.get("Kernel Name") or "").split("(")[0],
                                         "grid": row.get("Grid Size"), "block": row.get("Block Size"),
                                         "metrics": {}, "stalls": {}})
            if stall:
                try:
                    value = float((row.get("Metric Value") or "").replace(",", ""))
                except ValueError:
                    continue
                k["stalls"][metric[len(STALL_PREFIX):-len(STALL_SUFFIX)]] = value
                continue
            unit = row.get("Metric Unit") or ""
            k["metrics"][metric] = f"{row.get('Metric Value', '')} {unit}".strip()
        out.append({"case": name[len("ncu-"):-len(".csv")],
                    "kernels": [kernels[i] for i in sorted(kernels, key=lambda x: int(x) if x.isdigit() else 0)]})
    return out


def collect(a):
    logs = a.logs
    gpu_csv = (read(os.path.join(logs, "gpu.csv"), "") or "").strip().splitlines()
    device = driver = memory = None
    if gpu_csv:
        parts = [p.strip() for p in gpu_csv[0].split(",")]
        if len(parts) >= 3:
            device, driver, memory = parts[:3]
    doctor = read_json(os.path.join(logs, "doctor.json"))
    searches = read_jsonl(os.path.join(logs, "search.jsonl"))
    sanitized = read_jsonl(os.path.join(logs, "sanitize.jsonl"))
    bench = read_json(os.path.join(logs, "bench.json"))
    peers = read_json(os.path.join(logs, "peers.json"))
    ivf = read_json(os.path.join(logs, "ivf.json"))
    profiles = ncu_profiles(logs)
    steps = read_jsonl(os.path.join(logs, "steps.jsonl"))
    tests = []
    for st in steps:
        if st["step"] in ("all-tests", "gpu-tests", "tests") and st["status"] not in ("left out", "not started"):
            step_tests, started = tests_of_step(logs, st["step"], st["status"])
            tests += step_tests
            st["tests_started"] = started
            st["tests_reported"] = len(step_tests)
    commit = (read(os.path.join(a.archive, "commit"), "") or "").strip() or None
    results = {
        "device": device,
        "driver": driver,
        "memory": memory,
        "gpu": a.gpu == "1",
        "commit": commit,
        "cuda": (doctor or {}).get("libraries") if doctor else None,
        "doctor": doctor,
        "steps": steps,
        "test_counts": test_counts(tests),
        "tests": tests,
        "searches": searches,
        "sanitize": sanitized,
        "bench": bench,
        "peers": peers,
        "ivf": ivf,
        "profiles": profiles,
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gpu-results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(a.out, "gpu-summary.md"), "w") as f:
        f.write(render(results, summary=True))


def test_counts(tests):
    counts = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    return counts


def merge(runs):
    """One report from the results of several calls of one commit on one
    kind of device: a later call's steps, tests and figures replace an
    earlier one's."""
    for key in ("commit", "device"):
        seen = {r.get(key) for r in runs if r.get(key)}
        if len(seen) > 1:
            raise SystemExit(f"error: the results are of different {key}s: {sorted(seen)}")
    out = dict(runs[0])
    steps, tests, peer_cases, peers_left_out = {}, {}, {}, {}
    for r in runs:
        for key in ("device", "driver", "memory", "commit", "cuda", "doctor"):
            if r.get(key) and not out.get(key):
                out[key] = r[key]
        out["gpu"] = out.get("gpu") or r.get("gpu")
        for key in ("searches", "sanitize", "bench", "ivf", "profiles"):
            if r.get(key):
                out[key] = r[key]
        if (r.get("peers") or {}).get("cases"):
            # A comparison split over calls (gpu-run.sh's GPU_PEERS_ARGS):
            # the cases of each, a later call's replacing an earlier one's.
            peer_cases.update({(c["dtype"], c["nq"], c["k"]): c for c in r["peers"]["cases"]})
            out["peers"] = dict(r["peers"], cases=list(peer_cases.values()))
        for c in (r.get("peers") or {}).get("cases_left_out") or []:
            peers_left_out[(c["dtype"], c["nq"], c["k"])] = c
        for st in r.get("steps") or []:
            if st["status"] != "left out" or st["step"] not in steps:
                steps[st["step"]] = st
        for t in r.get("tests") or []:
            tests[(t["binary"], t["test"])] = t
    if out.get("peers"):
        # A case one call left out at its deadline and another measured is
        # not left out.
        out["peers"] = dict(out["peers"], cases_left_out=[
            c for key, c in peers_left_out.items() if key not in peer_cases])
    out["steps"] = list(steps.values())
    out["tests"] = list(tests.values())
    out["test_counts"] = test_counts(out["tests"])
    return out


def trace_table(cases):
    """GPU.md's lines for the searches gpu_peers.py traced
    (FRAGLINK_SEARCH_TRACE): wall, device span, the host's share, and each
    step's host and device time."""
    rows = []
    for c in cases:
        for path, got in (c.get("traces") or {}).items():
            t = (got or {}).get("trace")
            if not t:
                rows.append(f"| {c['dtype']} | {c['nq']} | {c['k']} | {path} | error: "
                            f"{fmt((got or {}).get('error', 'no trace'))[:80]} | | | |")
                continue
            wall, span = t.get("wall_us") or 0.0, t.get("gpu_span_us") or 0.0
            steps = "; ".join(
                f"{st['step']} {fmt(st.get('host_us'))}"
                + (f" / {fmt(st['gpu_us'])}" if st.get("gpu_us") is not None else "")
                + (f" (x{st['count']})" if st.get("count", 1) != 1 else "")
                for st in t.get("steps") or [])
            rows.append(f"| {c['dtype']} | {c['nq']} | {c['k']} | {path} | {fmt(wall)} | {fmt(span)} | "
                        f"{fmt(wall - span)} | {steps} |")
    if not rows:
        return []
    return ["### Where a search's time goes (`FRAGLINK_SEARCH_TRACE=1`, a run of its own)\n",
            "µs. Steps: host time / device time between the CUDA events recorded after the steps "
            "that queue device work (that work and any idle time before it). Wall less the device "
            "span is what the host adds on the critical path.\n",
            "| dtype | nq | k | path | wall | device span | host share | steps (host / device) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"] + rows + [""]


def fmt(v):
    """A table cell: floats to 4 significant digits, None empty, `|` escaped."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v).replace("|", "\\|")


def table(headers, rows):
    """Markdown table lines: a header row, its rule, one line per row."""
    out = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    out += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return out


def render(r, summary=False):
    lines = []
    title = "GPU run summary" if summary else "fraglink on a GPU"
    lines.append(f"# {title}\n")
    if not summary:
        lines.append("Generated by `scripts/gpu_report.py md` from the `gpu-results.json` of each call "
                     "(written by `scripts/gpu-run.sh`); never edited by hand.\n")
    lines.append(f"- device: {r.get('device')} ({r.get('memory')})")
    lines.append(f"- driver: {r.get('driver')}")
    doctor = r.get("doctor") or {}
    for lib in doctor.get("libraries", []) or []:
        lines.append(f"- {lib.get('name')}: {lib.get('version')} from {lib.get('path')} ({lib.get('origin')})")
    emb = doctor.get("embedded") or {}
    if emb:
        lines.append(f"- embedded LTO-IR: NVRTC {emb.get('nvrtc_version')}, archs {emb.get('archs')}")
    lines.append(f"- commit tested: `{r.get('commit')}`")
    c = r.get("test_counts", {})
    lines.append(f"- tests: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                 f"{c.get('skipped', 0)} skipped, {c.get('stopped', 0)} stopped at a call's budget\n")
    steps = r.get("steps") or []
    if steps:
        lines.append("## Steps of `scripts/gpu-run.sh`\n")
        lines += table(["step", "status", "s", "exit", "tests started", "tests reported", "note"],
                       [[st["step"], st["status"], st.get("seconds"), st.get("exit"),
                         st.get("tests_started"), st.get("tests_reported"), st.get("note")]
                        for st in steps])
        missing = [st["step"] for st in steps if st["status"] in ("stopped", "not started")]
        if missing:
            lines.append(f"\n**Incomplete**: {', '.join(missing)} did not run to the end; "
                         "run them in another call and merge its results.")
        lines.append("")
    failed = [t for t in r.get("tests", []) if t["outcome"] == "failed"]
    if failed:
        lines.append("## Failed tests\n")
        for t in failed:
            lines.append(f"- `{t['binary']}::{t['test']}`: {t['message']}")
        lines.append("")
    if not summary:
        lines.append("## Every test\n")
        lines.append("| binary | test | outcome | s |")
        lines.append("| --- | --- | --- | --- |")
        for t in r.get("tests", []):
            lines.append(f"| {t['binary']} | {t['test']} | {t['outcome']} | {t['seconds']:.2f} |")
        lines.append("")
    s = r.get("searches") or []
    if s:
        lines.append("## `fraglink search --device gpu` (n 100000, dim 128, nq 1000, k 10)\n")
        lines.append("QPS: the median of `--repeat 3`. Exit 4: the search exited 0 but the CPU "
                     "answered it (a GPU failure and the exact fallback).\n")
        lines.append("| metric | dtype | filter | exit | route | kernel | recall | QPS |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for x in s:
            lines.append(f"| {x.get('metric')} | {x.get('dtype')} | {x.get('filter')} | {x.get('exit')} | "
                         f"{fmt(x.get('route'))} | {fmt(x.get('gpu_kernel'))} | {fmt(x.get('recall'))} | "
                         f"{fmt(x.get('qps'))} |")
        lines.append("")
    z = r.get("sanitize") or []
    if z:
        lines.append("## compute-sanitizer (small searches reaching every GPU kernel family)\n")
        lines.append("`compute-sanitizer --tool TOOL fraglink search --device gpu ARGS`. Exit 9: the tool "
                     "reported errors; 4: the CPU answered (a GPU failure); 6: the tool wrote no summary. "
                     "Warnings: racecheck's possible hazards, which are not errors.\n")
        lines += table(["case", "tool", "exit", "kernel", "errors", "warnings", "first report", "args"],
                       [[x.get("case"), x.get("tool"), x.get("exit"), x.get("gpu_kernel"), x.get("errors"),
                         x.get("warnings"), x.get("first_report"), f"{x.get('env')} {x.get('args')}"]
                        for x in z])
        lines.append("")
    b = r.get("bench") or {}
    figs = b.get("figures") or []
    if figs:
        lines.append("## GPU contract figures (`gpu_bench`)\n")
        lines += table(["figure", "value", "unit", "target", "met", "note"],
                       [[f_.get(c) for c in ("name", "value", "unit", "target", "met", "note")]
                        for f_ in figs])
        lines.append("")
    p = r.get("peers") or {}
    if p.get("cases"):
        lines.append(f"## Exact k-NN against torch and CuPy (n {p.get('n')}, dim {p.get('dim')}, "
                     f"batches of {p.get('batch')}; `benches/scripts/gpu_peers.py`)\n")
        if p.get("from_commit"):
            lines.append(f"From the run of commit `{p['from_commit']}` on the same kind of "
                         "device (this run left the comparison out).\n")
        lines.append(f"torch {p.get('torch')}, CuPy {p.get('cupy')}; measured copy bandwidth "
                     f"{fmt(p.get('bandwidth_gbps'))} GB/s. QPS; recall in brackets; floor = the "
                     "case's memory or FLOP limit.\n")
        names = []
        for c in p["cases"]:
            for n in c["sides"]:
                if n not in names and not n.startswith("fraglink["):
                    names.append(n)
        lines.append("| dtype | nq | k | " + " | ".join(names)
                     + " | fraglink kernel | fraglink / best peer | goal (met) | tensor cores / scan"
                     + " | -Ofc=min link / default | shared bound / none | L2 prefetch / none"
                     + " | scan row splits / 1 block"
                     + " | scan wave splits / 2 per SM | floor QPS (bound) |")
        lines.append("| --- | --- | --- | " + " | ".join("---" for _ in names)
                     + " | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in p["cases"]:
            cells = []
            for n in names:
                s_ = c["sides"].get(n)
                if s_ is None:
                    cells.append("—")
                elif "error" in s_:
                    cells.append("error")
                else:
                    cells.append(f"{fmt(s_.get('qps'))} ({fmt(s_.get('recall'))})")
            kernel = (c["sides"].get("fraglink") or {}).get("gpu_kernel")
            target = c.get("goal")
            met = f"{fmt(target)} ({fmt(c.get('goal_met'))})" if target is not None else "—"
            lines.append(f"| {c['dtype']} | {c['nq']} | {c['k']} | " + " | ".join(cells)
                         + f" | {fmt(kernel)} | {fmt(c.get('fraglink_vs_best_peer'))} | {met}"
                         + f" | {fmt(c.get('tensor_core_vs_scan'))} | {fmt(c.get('fast_link_vs_default'))}"
                         + f" | {fmt(c.get('shared_bound_gain'))} | {fmt(c.get('prefetch_gain'))}"
                         + f" | {fmt(c.get('scan_splits_gain'))}"
                         + f" | {fmt(c.get('scan_wave_gain'))}"
                         + f" | {fmt(c.get('floor_qps'))} ({c.get('floor_bound')}) |")
        lines.append("")
        left = [f"{c['dtype']} nq {c['nq']} k {c['k']}" for c in p.get("cases_left_out") or []]
        if left:
            lines.append(f"**Cases not measured** ({(p['cases_left_out'][0].get('reason') or '')}): "
                         + ", ".join(left) + ".\n")
        sides_left = [f"{c['dtype']} nq {c['nq']} k {c['k']}: " + ", ".join(c["sides_left_out"])
                      for c in p["cases"] if c.get("sides_left_out")]
        if sides_left:
            lines.append("**Diagnostic sides not measured** (the run's deadline): "
                         + "; ".join(sides_left) + ".\n")
        lines += trace_table(p["cases"])
        named = [(c, n[len("fraglink["):-1], s_) for c in p["cases"] for n, s_ in c["sides"].items()
                 if n.startswith("fraglink[")]
        if named:
            lines.append("### Candidate kernels by name (`FRAGLINK_KNN_VARIANT`)\n")
            lines.append("QPS (recall) of each knn_tile variant, against the planner's pick "
                         "(the `fraglink` side above).\n")
            lines.append("| dtype | nq | k | variant | QPS (recall) | / planner's pick | planner's pick |")
            lines.append("| --- | --- | --- | --- | --- | --- | --- |")
            for c, v, s_ in named:
                pick = c["sides"].get("fraglink") or {}
                if "error" in s_:
                    cell, ratio = f"error: {s_['error'][:80]}", None
                else:
                    cell = f"{fmt(s_.get('qps'))} ({fmt(s_.get('recall'))})"
                    ratio = (s_["qps"] / pick["qps"]) if (s_.get("qps") and pick.get("qps")) else None
                best = " **best**" if c.get("best_variant") == v else ""
                lines.append(f"| {c['dtype']} | {c['nq']} | {c['k']} | {v}{best} | {cell} | {fmt(ratio)} | "
                             f"{fmt(pick.get('gpu_kernel'))} |")
            lines.append("")
    v = r.get("ivf") or {}
    if v.get("error"):
        lines.append(f"## IVF-Flat: probe splits against one block per query\n\nNot measured: {fmt(v['error'])}\n")
    elif v.get("cases"):
        lines.append(f"## IVF-Flat: probe splits against one block per query (n {v.get('n')}, dim {v.get('dim')}, "
                     f"nlist {v.get('nlist')}; `benches/scripts/ivf_gpu_bench.py`)\n")
        lines.append(f"Index built in {fmt(v.get('build_seconds'))} s (`fraglink index build`, not compared). "
                     f"`fraglink search --index --device gpu`, ms per search: the median over {v.get('rounds')} "
                     f"rounds (sides alternating) of each process's median of {v.get('repeat')}; splits "
                     f"as planned for {v.get('sm_count')} SMs; one block = `FRAGLINK_IVF_SPLITS=1`, the "
                     "kernel's former launch. Both sides return the same neighbours.\n")
        rows = []
        for c in v["cases"]:
            if "error" in c:
                rows.append([c["nq"], c["k"], c["nprobe"], c["splits"], f"error: {c['error'][:80]}", None, None, None])
            else:
                same = "" if c.get("same_recall", True) else " (sides differ!)"
                rows.append([c["nq"], c["k"], c["nprobe"], c["splits"], c.get("split_ms"), c.get("one_block_ms"),
                             c.get("ratio"), f"{fmt(c.get('recall'))}{same}"])
        lines += table(["nq", "k", "nprobe", "splits", "split ms", "one block ms", "one block / split", "recall"],
                       rows)
        lines.append("")
    prof = [c for c in (r.get("profiles") or []) if c.get("kernels")]
    if prof:
        lines.append("## Kernel profiles (Nsight Compute; n 1M x 128 f32; k 10 unless the case names k 100; "
                     "the second search, or the first for knn-nq1000 and knn-nq100-k100)\n")
        lines.append("Warp stalls: cycles a warp waits per issued instruction, the four largest reasons "
                     "(`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`): long_scoreboard "
                     "= global or local memory, barrier = `__syncthreads`, short_scoreboard = shared memory "
                     "or MUFU, wait = fixed-latency dependencies, selected = issuing.\n")
        lines.append("| case | kernel | grid | block | " + " | ".join(NCU_METRICS) + " | warp stalls |")
        lines.append("| --- | --- | --- | --- | " + " | ".join("---" for _ in NCU_METRICS) + " | --- |")
        for c in prof:
            for k in c["kernels"]:
                stalls = sorted((k.get("stalls") or {}).items(), key=lambda kv: -kv[1])[:4]
                lines.append(f"| {c['case']} | {k['kernel']} | {fmt(k.get('grid'))} | {fmt(k.get('block'))} | "
                             + " | ".join(fmt(k["metrics"].get(m)) for m in NCU_METRICS) + " | "
                             + (", ".join(f"{r} {v:.2f}" for r, v in stalls) or "—") + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def md(a):
    runs = []
    for path in a.results:
        with open(path) as f:
            runs.append(json.load(f))
    r = merge(runs)
    if not r.get("peers") and a.peers_from:
        # The comparison from an earlier run, labelled with its own commit.
        with open(a.peers_from) as f:
            earlier = json.load(f)
        if earlier.get("peers"):
            r["peers"] = dict(earlier["peers"])
            r["peers"]["from_commit"] = earlier.get("commit")
    with open(a.out, "w") as f:
        f.write(render(r))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--logs", required=True)
    c.add_argument("--archive", required=True)
    c.add_argument("--gpu", required=True)
    c.add_argument("--out", required=True)
    m = sub.add_parser("md")
    m.add_argument("results", nargs="+", help="gpu-results.json of one or more calls, in the order they ran")
    m.add_argument("--out", default="GPU.md")
    m.add_argument("--peers-from", help="an earlier gpu-results.json whose torch/CuPy "
                   "comparison to show when this run has none")
    a = p.parse_args()
    {"collect": collect, "md": md}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
