#!/usr/bin/env python3
"""Criterion results → JSON: for each benchmark id under target/criterion, the
min / median / max of the per-iteration time of its samples (each sample's total
time / its iteration count), criterion's median and mean point estimates, in
nanoseconds.

    criterion_stats.py --criterion target/criterion --out F.json ID [ID ...]
"""
import argparse
import json
import os
import statistics


def load(root):
    found = {}
    for dirpath, _, files in os.walk(root):
        if os.path.basename(dirpath) == "new" and "benchmark.json" in files:
            with open(os.path.join(dirpath, "benchmark.json")) as f:
                bench = json.load(f)
            found[bench["full_id"]] = dirpath
    return found


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--criterion", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("ids", nargs="+")
    a = p.parse_args()
    found = load(a.criterion)
    out = {}
    for bid in a.ids:
        d = found.get(bid)
        if d is None:
            out[bid] = {"missing": True}
            continue
        with open(os.path.join(d, "sample.json")) as f:
            s = json.load(f)
        with open(os.path.join(d, "estimates.json")) as f:
            e = json.load(f)
        per_iter = [t / i for t, i in zip(s["times"], s["iters"])]
        out[bid] = {
            "min_ns": min(per_iter),
            "median_ns": statistics.median(per_iter),
            "max_ns": max(per_iter),
            "samples": len(per_iter),
            "iterations": int(sum(s["iters"])),
            "estimate_median_ns": e["median"]["point_estimate"],
            "estimate_mean_ns": e["mean"]["point_estimate"],
            "sampling_mode": s.get("sampling_mode"),
        }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
