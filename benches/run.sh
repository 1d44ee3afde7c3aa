#!/usr/bin/env bash
# Performance evidence: `bash benches/run.sh` writes BENCHMARKS.md.
#
# Installs what fraglink is compared against into target/bench-env (a Python
# venv: CUDA 13.0 wheels with nvcc, faiss-cpu, numpy — never system-wide), then
# measures each figure beside its peer in the same run:
#   1. fragment build: fraglink's in-process NVRTC builder vs one `nvcc -fatbin`
#      per fragment under `xargs -P` (both CUDA 13.0), plus rebuild after
#      touching one template;
#   2. binary size: embedded fragments vs ahead-of-time cubins of every kernel;
#   3. link: cold link through the planner vs raw nvJitLink, cache hits, and
#      64 threads on 16 keys vs one global mutex;
#   4. CPU search: `fraglink search --device cpu` vs faiss-cpu IndexFlat (f32)
#      and its nearest equivalents (f16, i8, u8), each timed run checked for
#      other work on the CPUs (see BENCH_SEARCH_BUSY);
#   6. CPU IVF-Flat: `fraglink index build` + `search --index` vs faiss-cpu
#      IndexIVFFlat (recall, QPS at nprobe 1/4/16/64, build time; 1 and 2 threads);
#   5. small costs: a cost-model decision, a warm planner lookup.
# Needs Linux x86_64, Rust, python3 with venv/pip, a C++ host compiler (gcc) for
# nvcc, and network access to PyPI (and crates.io for the first build).
# About 15 minutes on 2 cores once built (plus the first build and the wheel
# downloads on a fresh machine). Repetition counts can be changed with the
# BENCH_* variables below; no timing is asserted anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ENV_DIR=target/bench-env
WORK=target/bench-work
RES=$WORK/results
JOBS=${BENCH_JOBS:-$(nproc)}
BUILD_REPS=${BENCH_BUILD_REPS:-5}       # cold builds, fraglink builder (CUDA 13.0)
NVCC_REPS=${BENCH_NVCC_REPS:-3}         # cold builds, nvcc + xargs -P (~1 min each)
BUILD129_REPS=${BENCH_BUILD129_REPS:-3} # cold builds, fraglink builder (CUDA 12.9)
REBUILD_REPS=${BENCH_REBUILD_REPS:-3}   # rebuilds per touched template
CONTENTION_ROUNDS=${BENCH_CONTENTION_ROUNDS:-10}
SEARCH_REPS=${BENCH_SEARCH_REPS:-5}
IVF_REPS=${BENCH_IVF_REPS:-3}             # IVF-Flat build + searches per thread count
# Before each section and each cold-build repetition, wait up to QUIET_WAIT
# seconds for the CPUs to be at most QUIET_BUSY % busy (other work on a shared
# machine); what was found is reported beside the results.
QUIET_BUSY=${BENCH_QUIET_BUSY:-25}
QUIET_WAIT=${BENCH_QUIET_WAIT:-60}
# CPU search: a repetition counts only when other work used at most this % of
# the CPUs during each of its timed runs (measured around every run); cases
# without BENCH_SEARCH_REPS such repetitions are marked BUSY in BENCHMARKS.md,
# and with BENCH_REFUSE_BUSY=1 the script then exits with status 3.
SEARCH_BUSY=${BENCH_SEARCH_BUSY:-10}
REFUSE_BUSY=${BENCH_REFUSE_BUSY:-0}
# Sections to measure (default all): build, size, link, search, small. With a
# subset, BENCHMARKS.md keeps the other sections from its previous run and
# says so (e.g. BENCH_ONLY=search,small after a change to the CPU search).
ONLY=${BENCH_ONLY:-build,size,link,search,small,ivf}
want() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# Variables that would change what is measured.
unset FRAGLINK_ARCHS FRAGLINK_BUILD_JOBS FRAGLINK_BUILD_CACHE_DIR FRAGLINK_CACHE_DISABLE \
  FRAGLINK_MEMORY_CACHE_ENTRIES RAYON_NUM_THREADS OMP_NUM_THREADS OPENBLAS_NUM_THREADS \
  MKL_NUM_THREADS OMP_WAIT_POLICY
# Linked-cubin disk cache of the CLI runs: inside the work directory.
export FRAGLINK_CACHE_DIR=$ROOT/$WORK/link-cache

STARTED=$(date +%s)
rm -rf "$RES"
mkdir -p "$RES"
: >"$RES/commands.txt"
: >"$RES/load.txt"

log() { printf '\n=== %s ===\n' "$*" >&2; }
# Records a command for BENCHMARKS.md, then runs it.
run() {
  printf '%s\n' "$*" >>"$RES/commands.txt"
  "$@"
}
# Percentage of CPU time spent busy, over 2 seconds.
busy() {
  local u n s i w q sq st t1 i1
  read -r _ u n s i w q sq st _ </proc/stat
  t1=$((u + n + s + i + w + q + sq + st)) i1=$((i + w))
  sleep 2
  read -r _ u n s i w q sq st _ </proc/stat
  echo $((100 * ((u + n + s + i + w + q + sq + st - t1) - (i + w - i1)) / (u + n + s + i + w + q + sq + st - t1)))
}
# Waits for a quiet machine (see QUIET_*), then notes what it found.
load() {
  local b waited=0
  b=$(busy)
  while [ "$b" -gt "$QUIET_BUSY" ] && [ "$waited" -lt "$QUIET_WAIT" ]; do
    sleep 8
    waited=$((waited + 10))
    b=$(busy)
  done
  printf '%s\tCPU %s%% busy (waited %s s), load %s\n' "$1" "$b" "$waited" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$RES/load.txt"
}
# cargo, retried: other work on the tree may briefly break the build.
cargo_retry() {
  local i
  for i in 1 2 3; do
    if run cargo "$@"; then return 0; fi
    [ "$i" = 3 ] && return 1
    echo "cargo $* failed; retrying in 60 s" >&2
    sleep 60
  done
}

log "bench environment ($ENV_DIR)"
# A venv; where python3 has no venv module (Debian without python3-venv), a
# pip --target directory on PYTHONPATH instead. Nothing is installed system-wide.
venv_ok() { "$ENV_DIR/bin/python" -m pip --version >/dev/null 2>&1; }
if [ ! -d "$ENV_DIR/site" ] && { venv_ok || { rm -rf "$ENV_DIR" && python3 -m venv "$ENV_DIR" && venv_ok; }; }; then
  PY=$ROOT/$ENV_DIR/bin/python
  run "$PY" -m pip install --disable-pip-version-check -q -r benches/scripts/requirements.txt
else
  echo "python3 -m venv is not available: installing into $ENV_DIR/site instead" >&2
  rm -rf "$ENV_DIR/bin" "$ENV_DIR/lib" "$ENV_DIR/pyvenv.cfg"
  PY=$(command -v python3)
  export PYTHONPATH=$ROOT/$ENV_DIR/site${PYTHONPATH:+:$PYTHONPATH}
  run "$PY" -m pip install --disable-pip-version-check -q --target "$ENV_DIR/site" \
    -r benches/scripts/requirements.txt
fi
CU13=$("$PY" -c 'import os, nvidia; print(next(os.path.join(p, "cu13") for p in nvidia.__path__ if os.path.isdir(os.path.join(p, "cu13"))))')
NVCC=$CU13/bin/nvcc
test -x "$NVCC" || { echo "FATAL: no nvcc at $NVCC" >&2; exit 1; }
"$NVCC" --version | tail -2 >&2

log "building fraglink, its bench examples and benches (release)"
cargo_retry build --release --bin fraglink --example bench_build --example bench_aot
cargo_retry bench --no-run --bench link --bench cost --bench contention
FRAGLINK=$ROOT/target/release/fraglink
BENCH_BUILD=$ROOT/target/release/examples/bench_build
BENCH_AOT=$ROOT/target/release/examples/bench_aot

if want build; then
log "1. fragment build: fraglink builder vs nvcc -fatbin per fragment (jobs $JOBS)"
load build
: >"$RES/build_fraglink13.jsonl"
: >"$RES/build_fraglink129.jsonl"
: >"$RES/build_nvcc.jsonl"
for i in $(seq 1 "$BUILD_REPS"); do
  [ "$i" = 1 ] || load "build run $i"
  run "$BENCH_BUILD" cold --out "$WORK/build/fraglink13" --cuda-root "$CU13" --jobs "$JOBS" \
    >>"$RES/build_fraglink13.jsonl"
  echo "  fraglink builder (CUDA 13.0) run $i/$BUILD_REPS: $(tail -1 "$RES/build_fraglink13.jsonl" | cut -c1-60)" >&2
  # nvcc compiles the sources the builder just rendered (identical text).
  if [ "$i" -le "$NVCC_REPS" ]; then
    run "$PY" benches/scripts/nvcc_build.py --nvcc "$NVCC" --gen "$WORK/build/fraglink13/out/gen" \
      --archs "$WORK/build/fraglink13/out/archs.json" --out "$WORK/build/nvcc" --jobs "$JOBS" --include "$ROOT/fragments" >>"$RES/build_nvcc.jsonl"
    echo "  nvcc run $i/$NVCC_REPS: $(tail -1 "$RES/build_nvcc.jsonl" | cut -c1-60)" >&2
  fi
  if [ "$i" -le "$BUILD129_REPS" ]; then
    run "$BENCH_BUILD" cold --out "$WORK/build/fraglink129" --jobs "$JOBS" >>"$RES/build_fraglink129.jsonl"
  fi
done
load rebuild
run "$BENCH_BUILD" rebuild --work "$WORK/build/rebuild" --cuda-root "$CU13" --jobs "$JOBS" \
  --reps "$REBUILD_REPS" >"$RES/rebuild.json"
fi

if want size; then
log "2. binary size: embedded fragments vs AOT cubins of every kernel"
load aot
run "$FRAGLINK" catalog --json >"$RES/catalog.json"
run "$BENCH_AOT" --jobs "$JOBS" >"$RES/aot.json"
fi

if want link; then
log "3. link: criterion (benches/link.rs), contention (benches/contention.rs), interleaved cold-link overhead, prelinked first call"
load link
rm -rf target/criterion/link_cold target/criterion/link_cached
cargo_retry bench --bench link
load contention
cargo_retry bench --bench contention -- --rounds "$CONTENTION_ROUNDS" --json "$ROOT/$RES/contention.json" >/dev/null
load link_overhead
# Interleaved cold links, planner vs raw nvJitLink; its last line is JSON.
cargo_retry bench --bench link_overhead | tee "$RES/link_overhead.txt" >&2
tail -n 1 "$RES/link_overhead.txt" >"$RES/link_overhead.json"
load prelink
# A fresh process's first call, prelinked or not (release CLI, built above).
FRAGLINK_BIN=$FRAGLINK run bash benches/scripts/prelink_first_call.sh | tee "$RES/prelink.txt" >&2
tail -n 1 "$RES/prelink.txt" >"$RES/prelink.json"
fi

if want small; then
log "5. small costs: cost-model decision, split merge (benches/cost.rs)"
load cost
rm -rf target/criterion/cost target/criterion/route target/criterion/merge
cargo_retry bench --bench cost
fi
if want link || want small; then
run "$PY" benches/scripts/criterion_stats.py --criterion target/criterion --out "$RES/criterion.json" \
  link_cold/raw_nvjitlink link_cold/planner link_cached/memory_hit link_cached/disk_hit \
  link_cached/warm_planner_lookup cost/choose/gpu/warm cost/choose/no_gpu cost/choose/gpu/unseen_op \
  cost/learn route/linked_check \
  merge/heads/nq1_splits264_k10 merge/full_sort/nq1_splits264_k10 \
  merge/heads/nq1_splits264_k100 merge/full_sort/nq1_splits264_k100 \
  merge/heads/nq100_splits3_k100 merge/full_sort/nq100_splits3_k100
fi

if want search; then
log "4. CPU search: fraglink vs faiss-cpu (100k x 128 f32/f16/i8/u8, 1k queries, k = 10)"
load search
run "$PY" benches/scripts/search_bench.py run --fraglink "$FRAGLINK" --work "$WORK/search" \
  --reps "$SEARCH_REPS" --busy-max "$SEARCH_BUSY" --out "$RES/search.json"
fi
load end

if want ivf; then
log "6. CPU IVF-Flat: fraglink vs faiss-cpu IndexIVFFlat (200k x 128 f32 clustered, nlist 1024)"
load ivf
run "$PY" benches/scripts/ivf_bench.py run --fraglink "$FRAGLINK" --work "$WORK/ivf" \
  --reps "$IVF_REPS" --out "$RES/ivf.json"
load end
fi

log "writing BENCHMARKS.md"
run "$PY" benches/scripts/report.py --results "$RES" --out BENCHMARKS.md --cu13 "$CU13" \
  --seconds "$(($(date +%s) - STARTED))" --jobs "$JOBS" \
  --reps "build=$BUILD_REPS nvcc=$NVCC_REPS build129=$BUILD129_REPS rebuild=$REBUILD_REPS contention=$CONTENTION_ROUNDS search=$SEARCH_REPS ivf=$IVF_REPS" \
  --only "$ONLY"
echo "BENCHMARKS.md written ($(($(date +%s) - STARTED)) s)" >&2
BUSY_CASES=
if want search; then
  BUSY_CASES=$("$PY" -c 'import json, sys
print("; ".join(c["label"] for c in json.load(open(sys.argv[1]))["cases"] if not c["quiet"]))' "$RES/search.json")
fi
if [ -n "$BUSY_CASES" ]; then
  echo "WARNING: CPU search ratios measured while other work used more than $SEARCH_BUSY% of the CPUs (marked BUSY in BENCHMARKS.md): $BUSY_CASES" >&2
  if [ "$REFUSE_BUSY" = 1 ]; then
    echo "BENCH_REFUSE_BUSY=1: refusing these ratios (exit 3); rerun on a quiet machine" >&2
    exit 3
  fi
fi
