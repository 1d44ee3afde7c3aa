#!/usr/bin/env python3
"""The cuVS way of building fragments: one `nvcc -fatbin` process per fragment
source, run in parallel by `xargs -P JOBS`. Times one whole build and prints one
JSON line (wall time, files, output bytes, the command).

    nvcc_build.py --nvcc PATH --gen DIR --out DIR --jobs N --include DIR
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import time

GENCODE = ["-gencode", "arch=compute_75,code=lto_75", "-gencode", "arch=compute_90,code=lto_90"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nvcc", required=True)
    p.add_argument("--gen", required=True, help="directory of rendered <name>.cu sources")
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--include", required=True, help="the fragments/ headers")
    a = p.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    names = sorted(f[:-3] for f in os.listdir(a.gen) if f.endswith(".cu"))
    # Same language options as fraglink's NVRTC compiles (-std=c++17,
    # relocatable device code) and the same two LTO-IR targets.
    nvcc = [a.nvcc, "-fatbin", "-std=c++17", "-rdc=true", *GENCODE, "-I" + a.include,
            os.path.join(a.gen, "{}.cu"), "-o", os.path.join(a.out, "{}.fatbin")]
    cmd = ["xargs", "-P", str(a.jobs), "-I{}", *nvcc]
    t = time.perf_counter()
    subprocess.run(cmd, input="\n".join(names) + "\n", text=True, check=True)
    wall = time.perf_counter() - t
    sizes = [os.path.getsize(os.path.join(a.out, n + ".fatbin")) for n in names]
    print(json.dumps({
        "wall_s": wall,
        "files": len(names),
        "bytes": sum(sizes),
        "jobs": a.jobs,
        "command": "ls GEN/*.cu | xargs -P %d -I{} %s" % (
            a.jobs, " ".join(shlex.quote(x) for x in
                             ["nvcc", "-fatbin", "-std=c++17", "-rdc=true", *GENCODE, "-Ifragments",
                              "GEN/{}.cu", "-o", "OUT/{}.fatbin"])),
    }))


if __name__ == "__main__":
    main()
