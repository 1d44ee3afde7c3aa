#!/usr/bin/env python3
"""The cuVS way of building fragments: one `nvcc -fatbin` process per fragment
source, run in parallel by `xargs -P JOBS`. Times one whole build and prints one
JSON line (wall time, files, output bytes, the command).

    nvcc_build.py --nvcc PATH --gen DIR --archs FILE --out DIR --jobs N --include DIR

Each fragment is compiled for the archs the builder compiled it for (FILE:
`bench_build cold`'s archs.json, name -> ["compute_75", "compute_80",
"sm_90", ...]; a fragment's minimum arch leaves some out): LTO-IR of the
same targets, `-gencode arch=compute_XX,code=lto_XX` for compute_XX and
sm_XX alike.
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import time


def gencode(arch):
    """nvcc's LTO-IR target for the builder's arch name (compute_80, sm_90)."""
    number = arch.split("_", 1)[1]
    return ["-gencode", f"arch=compute_{number},code=lto_{number}"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nvcc", required=True)
    p.add_argument("--gen", required=True, help="directory of rendered <name>.cu sources")
    p.add_argument("--archs", required=True, help="bench_build's archs.json: each fragment's archs")
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--include", required=True, help="the fragments/ headers")
    a = p.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    names = sorted(f[:-3] for f in os.listdir(a.gen) if f.endswith(".cu"))
    with open(a.archs) as f:
        archs = json.load(f)
    missing = [n for n in names if not archs.get(n)]
    if missing:
        raise SystemExit(f"nvcc_build.py: no archs in {a.archs} for {', '.join(missing[:5])}")
    # Same language options as fraglink's NVRTC compiles (-std=c++17,
    # relocatable device code) and the same LTO-IR targets per fragment: one
    # input line per fragment, its name then its -gencode pairs.
    lines = [" ".join([n] + [g for arch in archs[n] for g in gencode(arch)]) for n in names]
    script = ('n=$1; shift; exec "$0" -fatbin -std=c++17 -rdc=true "$@" -I"$INCLUDE" '
              '"$GEN/$n.cu" -o "$OUT/$n.fatbin"')
    cmd = ["xargs", "-P", str(a.jobs), "-L", "1", "sh", "-c", script, a.nvcc]
    env = dict(os.environ, INCLUDE=a.include, GEN=a.gen, OUT=a.out)
    t = time.perf_counter()
    subprocess.run(cmd, input="\n".join(lines) + "\n", text=True, check=True, env=env)
    wall = time.perf_counter() - t
    sizes = [os.path.getsize(os.path.join(a.out, n + ".fatbin")) for n in names]
    print(json.dumps({
        "wall_s": wall,
        "files": len(names),
        "bytes": sum(sizes),
        "jobs": a.jobs,
        "targets": sum(len(archs[n]) for n in names),
        "command": "(one line per fragment: NAME -gencode arch=compute_XX,code=lto_XX ... for its archs) | "
                   "INCLUDE=fragments GEN=GEN OUT=OUT xargs -P %d -L 1 sh -c %s nvcc" % (a.jobs, shlex.quote(script)),
    }))


if __name__ == "__main__":
    main()
