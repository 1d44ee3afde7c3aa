#!/usr/bin/env bash
# Runs fraglink's tests (the ignored GPU tests included), doctor, the GPU
# search matrix, the GPU benches and kernel profiles (ncu) from
# target/gpu-archive/ (made by scripts/gpu-archive.sh), on a machine with the
# NVIDIA driver and CUDA libraries but no Rust toolchain and no network.
#
#   scripts/gpu-run.sh OUTDIR [STEP...]
#
# Steps, in the default order (every one but gpu-tests and tests when none
# is named): what issue 9 and 10 need first, the checks after.
#   all-tests  every test, the ignored (GPU) ones included, in one nextest
#              run: the GPU tests start first and the portable ones fill the
#              other cores beside them (.config/nextest.toml, profile gpu)
#   search     `fraglink search --device gpu` over metric x dtype x filter
#   bench      gpu_bench, the GPU contract's figures
#   peers      exact k-NN against torch and CuPy (benches/scripts/gpu_peers.py;
#              its goal cases first, then its diagnostic sides, until the
#              budget's end)
#   sanitize   compute-sanitizer (memcheck, racecheck, synccheck, initcheck)
#              over small searches that reach every GPU kernel family,
#              GPU_SANITIZE_JOBS (4) at a time
#   ivf        IVF-Flat probe splits against one block per query
#              (benches/scripts/ivf_gpu_bench.py)
#   ncu        Nsight Compute profiles of the k-NN kernels
#   gpu-tests  the ignored tests only (to rerun them after a fix)
#   tests      every other test (portable; CI runs them too, without a GPU)
#
# One call of a GPU lease runs at most 10 minutes, and a command killed at
# that limit would lose everything, so the run keeps to a budget:
# GPU_RUN_SECONDS (default 540) from its start. A step that cannot start
# inside it is left out, one that runs past it is stopped, and the results
# of the steps done so far are written after each step. The last line names
# the steps still to run: pass them to the next call and give every call's
# gpu-results.json to `gpu_report.py md` (it merges them).
#
# Writes into OUTDIR (three files):
#   gpu-results.json  device, driver, CUDA, commit, each step's outcome, each
#                     test's outcome, each search's recall and QPS, the bench
#                     figures, the comparison, the profiles' headline metrics
#   gpu-summary.md    the same, short
#   gpu-logs.tar.gz   every log
# Exit: 0 all steps done and every test passed; nextest's exit when a test
# failed; 1 when another step failed; 3 without a GPU (then only the
# portable tests run); 5 when steps are left for another call.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$SECONDS
outdir=${1:?usage: scripts/gpu-run.sh OUTDIR [all-tests|search|bench|peers|sanitize|ivf|ncu|gpu-tests|tests ...]}
shift
all_steps="all-tests search bench peers sanitize ivf ncu gpu-tests tests"
default_steps="all-tests search bench peers sanitize ivf ncu"
steps=${*:-$default_steps}
for s in $steps; do
  case " $all_steps " in
    *" $s "*) ;;
    *) echo "error: unknown step \`$s\` (steps: $all_steps)" >&2; exit 2 ;;
  esac
done
budget=${GPU_RUN_SECONDS:-540}
case "$budget" in
  '' | *[!0-9]*) echo "error: GPU_RUN_SECONDS must be a whole number of seconds, not \`$budget\`" >&2; exit 2 ;;
esac
# Seconds kept back for writing the results and the log archive.
reserve=20
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
arch=$root/target/gpu-archive
test -f "$arch/fraglink-tests.tar.zst" || { echo "error: $arch/fraglink-tests.tar.zst missing: run scripts/gpu-archive.sh first" >&2; exit 2; }

work=$(mktemp -d /tmp/fraglink-gpu.XXXXXX)
# Some tests run the CLI as another user (uid 65534) to check permission
# errors: the extracted binaries must be reachable by everyone.
chmod 755 "$work"
mkdir -p "$work/x"
logs=$work/logs
mkdir -p "$logs"
py=$(command -v python3)

# Seconds left before the budget's reserve; limit: the same, at least 1 (a
# `timeout 0` would never stop).
left() { echo $((budget - reserve - (SECONDS - start))); }
limit() { local l; l=$(left); [ "$l" -ge 1 ] || l=1; echo "$l"; }
# The same, at most $1 seconds: one command of a step must not take the call.
limit_at_most() { local l; l=$(limit); [ "$l" -le "$1" ] || l=$1; echo "$l"; }

# One line per step into steps.jsonl: STEP STATUS SECONDS EXIT [NOTE].
# STATUS: done | failed | stopped (ran past the budget) | not started | left out.
record() {
  "$py" -c 'import json,sys; s,st,sec,rc=sys.argv[1:5]; print(json.dumps({"step":s,"status":st,"seconds":int(sec),"exit":int(rc),"note":" ".join(sys.argv[5:])}))' \
    "$@" >>"$logs/steps.jsonl"
}

# A step's status from its command's exit: done, stopped (124: timeout
# ended it at the budget) or failed.
status_of() { case $1 in 0) echo done ;; 124) echo stopped ;; *) echo failed ;; esac; }

collect() {
  "$py" "$root/scripts/gpu_report.py" collect --logs "$logs" --archive "$arch" --gpu "$gpu" \
    --out "$outdir" >"$logs/collect.txt" 2>&1 || cat "$logs/collect.txt" >&2
  tar -czf "$outdir/gpu-logs.tar.gz" -C "$work" logs
}

# nextest, unpacked with Python's lzma (no xz tool needed).
"$py" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
  "$arch/cargo-nextest.xz" "$work/cargo-nextest"
chmod +x "$work/cargo-nextest"

gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >"$logs/nvidia-smi-L.txt" 2>&1 && grep -q GPU "$logs/nvidia-smi-L.txt"; then
  gpu=1
  nvidia-smi >"$logs/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$logs/gpu.csv" 2>&1
fi
ls /usr/local/cuda*/lib64/libnvJitLink* /usr/local/cuda*/lib64/libnvrtc.so* >"$logs/cuda-libs.txt" 2>&1

export FRAGLINK_TESTDATA=$arch/testdata
export FRAGLINK_CACHE_DIR=$work/link-cache
# nvJitLink keeps links in the driver's compute cache too: start it empty so
# a run does not depend on what ran on this machine before.
export CUDA_CACHE_PATH=$work/cuda-compute-cache
export RUST_BACKTRACE=1
# Tests that run cargo cannot run here (no toolchain): compile-fail checks and
# the downstream crate's build. Everything else runs, ignored tests included
# (the downstream crate's GPU test runs its binary from the archive).
filter='not (binary(compile_fail) | (binary(downstream) & test(downstream_crate_builds_and_plans_all_its_kernels)))'
# GPU_RUN_TESTS: a nextest filterset the tests must also match, to rerun a part
# after a fix without the whole suite (e.g. 'binary(knn_gpu)').
if [ -n "${GPU_RUN_TESTS:-}" ]; then
  filter="($filter) & ($GPU_RUN_TESTS)"
fi
# nextest reads .config/nextest.toml (profile gpu, its test group and
# priorities) from the remapped checkout; not as a tool config, whose test
# groups would need an `@tool:` prefix the repository config cannot have.
archive_args=(--archive-file "$arch/fraglink-tests.tar.zst" --workspace-remap "$root"
  --extract-to "$work/x" --extract-overwrite)

# Runs STEP's tests: run-ignored RUN_IGNORED, stopped (SIGINT, so nextest
# still reports what finished) when the budget runs out.
nextest_step() {
  local step=$1 run_ignored=$2 t0=$SECONDS rc
  echo "== $step (run-ignored=$run_ignored, $(left) s left)"
  rm -f "$root/target/nextest/gpu/junit.xml"
  # The driver's compute cache off for the tests: nvJitLink serves a link
  # any process made before from there with an empty info log, and the tests
  # read ptxas's figures from the log (the disk cache shared by the test
  # processes would keep such log-less entries too). The bench measures the
  # compute cache on purpose, in its own environment.
  CUDA_CACHE_DISABLE=1 timeout -s INT -k 30 "$(limit)" "$work/cargo-nextest" nextest run "${archive_args[@]}" \
    --profile gpu --run-ignored "$run_ignored" --no-fail-fast --no-tests pass \
    -E "$filter" >"$logs/tests-$step.txt" 2>&1
  rc=$?
  tail -40 "$logs/tests-$step.txt"
  # nextest writes JUnit under the (remapped) workspace's target/nextest/<profile>/.
  local junit
  junit=$(find "$root/target/nextest/gpu" "$work/x" -name junit.xml 2>/dev/null | head -1)
  [ -n "$junit" ] && mv "$junit" "$logs/junit-$step.xml"
  record "$step" "$(status_of "$rc")" $((SECONDS - t0)) "$rc"
  [ "$rc" = 0 ] || tests_rc=$rc
  extracted=1
}

# The later steps run the CLI and gpu_bench from the archive: unpack it when
# no test step has (`nextest list` extracts without running anything).
extract() {
  [ "${extracted:-0}" = 1 ] && return 0
  "$work/cargo-nextest" nextest list "${archive_args[@]}" -E 'none()' >"$logs/extract.txt" 2>&1 \
    || { echo "error: could not unpack the archive:" >&2; tail -20 "$logs/extract.txt" >&2; return 1; }
  extracted=1
}

# Appends one search's line to OUT (the CLI's JSON LINE, or `unparsed`,
# with RC and the KEY=VALUE fields given) and prints its exit: 4 for a search
# that exited 0 but that the CPU answered (a GPU failure and the exact
# fallback): not a GPU result. With sanitizer_log=PATH, the sanitizer's
# report there adds `errors`, `warnings` (racecheck) and the first lines of
# the first report; errors make the exit 9 (compute-sanitizer's
# --error-exitcode), a report without its summary line 6.
search_line() {
  "$py" -c '
import json, os, re, sys
out, rc, line = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    d = json.loads(line) if line.strip() else {}
except ValueError:
    d = {"unparsed": True}
if rc == 0 and (d.get("route") != "gpu" or d.get("fell_back")):
    rc = 4
for kv in sys.argv[4:]:
    k, _, v = kv.partition("=")
    d[k] = v
log = d.pop("sanitizer_log", None)
if log is not None:
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    race = re.search(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    summary = re.search(r"ERROR SUMMARY: (\d+) errors?", text)
    d["errors"] = int(race.group(1)) if race else int(summary.group(1)) if summary else None
    d["warnings"] = int(race.group(2)) if race else None
    reports = [l.strip("= ").strip() for l in text.splitlines()
               if l.startswith("=========") and "COMPUTE-SANITIZER" not in l and "SUMMARY" not in l]
    d["first_report"] = " / ".join(r for r in reports[:4] if r)[:400]
    if d["errors"]:
        rc = 9
    elif d["errors"] is None and rc == 0:
        rc = 6
d["exit"] = rc
with open(out, "a") as f:
    f.write(json.dumps(d) + "\n")
print(rc)' "$@"
}

search_step() {
  local t0=$SECONDS status=done metric dtype filter line rc failed=0
  echo "== search matrix ($(left) s left)"
  : >"$logs/search.jsonl"
  for metric in l2 ip cosine; do
    for dtype in f32 f16 i8 u8; do
      for filter in none bitset:0.5 bitset:0.05; do
        if [ "$(left)" -le 15 ]; then status=stopped; break 3; fi
        # --repeat 3: the QPS is the median, a warm search (the first one
        # loads the kernels and makes the first allocations).
        line=$(timeout -k 10 "$(limit_at_most 120)" "$bin" search --device gpu --json --n 100000 --dim 128 --nq 1000 --k 10 \
          --repeat 3 --metric "$metric" --dtype "$dtype" --filter "$filter" 2>>"$logs/search.err")
        rc=$(search_line "$logs/search.jsonl" "$?" "$line" metric="$metric" dtype="$dtype" filter="$filter")
        echo "$metric $dtype $filter exit=$rc"
        [ "$rc" = 0 ] || failed=$((failed + 1))
      done
    done
  done
  [ "$status" = done ] && [ "$failed" != 0 ] && status=failed
  local note=""
  [ "$failed" = 0 ] || note="$failed of the searches failed"
  record search "$status" $((SECONDS - t0)) "$failed" "$note"
}

# The sanitizer's cases: NAME TOOLS ENV ARGS. Small searches that reach every
# GPU kernel family: the tensor-core candidates and their re-rank (f32 with a
# partial query tile: f16copy by default, plain TF32 and 3xTF32 by name; f16 cosine with a bitset over rows of dim 100 (200 bytes:
# a staging-0 variant and its 4-byte copies; the others take `_a16` variants),
# u8 at nq 1 where a query's
# rows span blocks and the re-rank merges, i8 inner product at k 300, f32 through
# an f16copy variant, which stages the rows' f16 copies), the
# scan (nq 5: its rows split 12 ways automatically), the two-pass select (k 3000 in one sort; k 17000 in two slices on an
# H100: i8 of dim 4, whose many equal distances take the select over the ties'
# ids, and half the rows filtered out, whose excluded rows end the query), and
# IVF-Flat (k 10, and k 1000: capacity 1024, whose top-k sorts once per 8 tiles
# with candidates), and rows and queries special for the tensor-core bounds
# (special_data below). memcheck on each; racecheck and
# synccheck where blocks exchange through shared memory; initcheck on two.
sanitize_cases="\
tile-f32 memcheck,racecheck,synccheck,initcheck FRAGLINK_GPU_KNN=1 --n 6000 --nq 70 --k 10
tile-tf32 memcheck,racecheck FRAGLINK_KNN_VARIANT=knn_tile_f32_tf32_q16_r64_k32_a16 --n 6000 --nq 10 --k 10
tile-tf32x3 memcheck,racecheck FRAGLINK_KNN_VARIANT=knn_tile_f32_tf32x3_q32_r64_k32_a16 --n 6000 --nq 70 --k 10
tile-f16 memcheck,racecheck FRAGLINK_GPU_KNN=1 --dtype f16 --dim 100 --metric cosine --filter bitset:0.5 --n 6000 --nq 40 --k 100
tile-u8-nq1 memcheck FRAGLINK_GPU_KNN=1 --dtype u8 --filter bitset:0.5 --n 30000 --nq 1 --k 10
tile-f16copy memcheck,racecheck FRAGLINK_KNN_VARIANT=knn_tile_f32_f16copy_q32_r64_k32_a16 --n 6000 --nq 70 --k 10
tile-i8-k300 memcheck FRAGLINK_GPU_KNN=1 --dtype i8 --metric ip --n 6000 --nq 5 --k 300
scan-f16 memcheck,racecheck FRAGLINK_GPU_KNN=0 --dtype f16 --n 6000 --nq 5 --k 10
select memcheck,racecheck,synccheck,initcheck FRAGLINK_GPU_KNN=1 --n 6000 --nq 5 --k 3000
select-slices memcheck,racecheck,synccheck FRAGLINK_GPU_KNN=1 --dtype i8 --dim 4 --n 20000 --nq 2 --k 17000
select-slices-filter memcheck FRAGLINK_GPU_KNN=1 --filter bitset:0.5 --n 20000 --dim 16 --nq 2 --k 17000
ivf-i8 memcheck,racecheck FRAGLINK_GPU_KNN=1 --ivf-flat --nlist 32 --nprobe 8 --dtype i8 --filter bitset:0.5 --n 6000 --nq 20 --k 10
ivf-k1000 memcheck,racecheck FRAGLINK_GPU_KNN=1 --ivf-flat --nlist 32 --nprobe 8 --n 6000 --nq 4 --k 1000
special memcheck,racecheck FRAGLINK_GPU_KNN=1 --base @WORK@/special-base.fvecs --queries @WORK@/special-queries.fvecs --metric cosine --k 10"

# The `special` case's files (fvecs, dim 32, seeded): 6000 rows of which row 5
# holds a NaN, row 77 an infinity, row 300 a huge norm and rows 0 and 1999 are
# zero vectors (special for the tensor-core bounds: the candidate kernel skips
# them and a scan searches them beside it), and 40 queries of which query 3
# holds a NaN and query 10 is zero (answered apart by the scan).
special_data() {
  "$py" - "$1" <<'PY'
import random, struct, sys
def fvecs(path, rows):
    with open(path, "wb") as f:
        for r in rows:
            f.write(struct.pack("<i%df" % len(r), len(r), *r))
rnd = random.Random(7)
base = [[rnd.gauss(0, 1) for _ in range(32)] for _ in range(6000)]
base[5][4] = float("nan"); base[77][0] = float("-inf"); base[300][31] = 2e30
base[0] = [0.0] * 32; base[1999] = [0.0] * 32
queries = [[rnd.gauss(0, 1) for _ in range(32)] for _ in range(40)]
queries[3][9] = float("nan"); queries[10] = [0.0] * 32
fvecs(sys.argv[1] + "/special-base.fvecs", base)
fvecs(sys.argv[1] + "/special-queries.fvecs", queries)
PY
}

# One sanitized search: NAME TOOL ENV ARGS, its line appended to
# sanitize.jsonl (search_line), `NAME TOOL exit=RC` printed.
sanitize_one() {
  local name=$1 tool=$2 envs=$3 args=$4 log line
  log=$logs/sanitize-$name-$tool.txt
  # shellcheck disable=SC2086
  line=$(env "$envs" timeout -k 10 "$(limit_at_most 120)" "$sanitizer" --tool "$tool" --error-exitcode 9 \
    --print-limit 20 --log-file "$log" "$bin" search --device gpu --json $args 2>>"$logs/sanitize-$name-$tool.err")
  echo "$name $tool exit=$(search_line "$logs/sanitize.jsonl" "$?" "$line" case="$name" tool="$tool" \
    args="$args" env="$envs" sanitizer_log="$log")"
}

# GPU_SANITIZE_JOBS (default 4) sanitized searches at a time: each is a small
# search of its own process, slowed down by its tool, and the run is about
# correctness, not time. A search whose tool wrote no summary (exit 6: the
# tool did not finish, as it might if instances got in each other's way) is
# run again alone before the step is judged.
sanitize_step() {
  local t0=$SECONDS status=done failed name tools envs args tool again
  local jobs_max=${GPU_SANITIZE_JOBS:-4}
  case "$jobs_max" in '' | *[!0-9]* | 0) jobs_max=4 ;; esac
  echo "== compute-sanitizer ($(left) s left, $jobs_max at a time)"
  : >"$logs/sanitize.jsonl"
  special_data "$work"
  while read -r name tools envs args; do
    args=${args//@WORK@/$work}
    for tool in ${tools//,/ }; do
      if [ "$(left)" -le 15 ]; then status=stopped; break 2; fi
      while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
      sanitize_one "$name" "$tool" "$envs" "$args" &
    done
  done <<<"$sanitize_cases"
  wait
  # The searches to run again alone, one per line: NAME TOOL ENV ARGS (their
  # lines leave sanitize.jsonl).
  again=$("$py" - "$logs/sanitize.jsonl" <<'PY'
import json, sys
path = sys.argv[1]
keep, again = [], []
for line in open(path):
    d = json.loads(line)
    (again if d.get("exit") == 6 else keep).append(d)
with open(path, "w") as f:
    f.writelines(json.dumps(d) + "\n" for d in keep)
for d in again:
    print(d["case"], d["tool"], d["env"], d["args"])
PY
)
  if [ -n "$again" ]; then
    echo "again, one at a time: $(echo "$again" | wc -l) searches whose tool wrote no summary"
    while read -r name tool envs args; do
      if [ "$(left)" -le 15 ]; then status=stopped; break; fi
      sanitize_one "$name" "$tool" "$envs" "$args"
    done <<<"$again"
  fi
  # Judged from the lines: 124 is a search stopped at the budget.
  read -r failed stopped < <("$py" -c 'import json,sys; d=[json.loads(l) for l in open(sys.argv[1])]; print(sum(x["exit"] != 0 for x in d), sum(x["exit"] == 124 for x in d))' "$logs/sanitize.jsonl")
  [ "$stopped" = 0 ] || status=stopped
  [ "$status" = done ] && [ "$failed" != 0 ] && status=failed
  local note=""
  [ "$failed" = 0 ] || note="$failed of the sanitized searches failed or reported errors"
  record sanitize "$status" $((SECONDS - t0)) "$failed" "$note"
}

bench_step() {
  local t0=$SECONDS rc
  echo "== gpu bench ($(left) s left)"
  timeout -k 10 "$(limit)" "$bench" --json "$logs/bench.json" >"$logs/bench.txt" 2>&1
  rc=$?
  cat "$logs/bench.txt"
  record bench "$(status_of "$rc")" $((SECONDS - t0)) "$rc"
}

# Runs one of benches/scripts' GPU comparisons as step STEP: SCRIPT, writing
# $logs/STEP.json (each script rewrites it after every case, so a run stopped
# at the budget keeps the cases it finished) and $logs/STEP.txt, with the
# extra arguments ARGS (split on spaces), and records the step.
script_step() {
  local step=$1 script=$2 args=$3 t0=$SECONDS rc
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 timeout -k 10 "$(limit)" "$py" "$root/benches/scripts/$script" --fraglink "$bin" \
    --out "$logs/$step.json" $args >"$logs/$step.txt" 2>&1
  rc=$?
  tail -30 "$logs/$step.txt"
  record "$step" "$(status_of "$rc")" $((SECONDS - t0)) "$rc"
}

peers_step() {
  echo "== exact k-NN against torch / CuPy (benches/scripts/gpu_peers.py, $(left) s left)"
  # GPU_PEERS_ARGS: more arguments for gpu_peers.py, to split the comparison
  # over calls (e.g. '--dtypes f16'); gpu_report.py md merges the cases.
  # --seconds: the script starts nothing that its own timings say would end
  # after the budget (the goal cases come first), and stops by itself, a
  # little before the timeout would.
  local deadline=$(($(left) - 10))
  [ "$deadline" -ge 1 ] || deadline=1
  script_step peers gpu_peers.py "--seconds $deadline ${GPU_PEERS_ARGS:-}"
}

ivf_step() {
  echo "== IVF-Flat probe splits (benches/scripts/ivf_gpu_bench.py, $(left) s left)"
  # GPU_IVF_ARGS: more arguments (e.g. '--nprobes 16').
  script_step ivf ivf_gpu_bench.py "${GPU_IVF_ARGS:-}"
}

# Kernel profiles for whoever tunes the kernels next: Nsight Compute on the
# second (warm) search of n 1M x 128 f32, k 10 (the first for knn-nq1000 and
# knn-nq100-k100, below): the tensor-core kernels at nq 1 and 1000, the scan at
# nq 1, and the tensor-core kernels at nq 100 with k 100.
ncu_step() {
  local t0=$SECONDS status=done spec rc failed=0
  echo "== kernel profiles (ncu, $(left) s left)"
  # name, nq, FRAGLINK_GPU_KNN, launches of the first search (skipped), launches
  # profiled, k. knn-nq100-k100: the case furthest from its goal in the first H200
  # run (0.44-0.49x torch); its first search's launches (candidates, the re-rank's
  # merge and final levels).
  # At nq 1 a search's rows span hundreds of chunks, so the re-rank has its merge
  # level, and the host merges its groups (knn::gpu::HOST_MERGE_MAX_ENTRIES): two
  # launches, knn_tile and knn_rerank (merge); the second search's are profiled. At nq 1000 (f16copy:
  # 32 query tiles of 32) the chunks fit one re-rank level on an H100 or H200 where the tile
  # kernel fits 2 blocks per SM (16 chunks at most: two launches), but with 3 a
  # merge level is added; so that case profiles the first search's launches, two
  # or three (a third of the next search's is a repeat), not the second search's:
  # ncu flushes the caches before each profiled kernel either way.
  # Why warps wait: cycles stalled per issued instruction, by reason (the
  # WarpStateStats section's breakdown, which its details page leaves out).
  local reason ncu_stalls=""
  for reason in long_scoreboard barrier short_scoreboard wait mio_throttle lg_throttle \
    math_pipe_throttle not_selected selected membar dispatch_stall no_instruction branch_resolving; do
    ncu_stalls="$ncu_stalls${ncu_stalls:+,}smsp__average_warps_issue_stalled_${reason}_per_issue_active.ratio"
  done
  for spec in "knn-nq1 1 1 2 2 10" "knn-nq1000 1000 1 0 3 10" "scan-nq1 1 0 1 1 10" "knn-nq100-k100 100 1 0 3 100"; do
    if [ "$(left)" -le 30 ]; then status=stopped; break; fi
    set -- $spec
    # Clocks as the application sees them (ncu's default locks them at base).
    FRAGLINK_GPU_KNN=$3 timeout -k 10 "$(limit_at_most 240)" ncu --target-processes all --kernel-name regex:'knn_|scan_' \
      --clock-control none \
      --launch-skip "$4" --launch-count "$5" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
      --metrics "$ncu_stalls" \
      -f -o "$logs/ncu-$1" \
      "$bin" search --device gpu --json --n 1000000 --dim 128 --nq "$2" --k "$6" --dtype f32 \
      --repeat 2 >"$logs/ncu-$1.out" 2>&1
    rc=$?
    echo "ncu $1 exit $rc"
    [ "$rc" = 124 ] && status=stopped
    ncu --import "$logs/ncu-$1.ncu-rep" --csv --page details >"$logs/ncu-$1.csv" 2>>"$logs/ncu-$1.out" \
      || rc=1
    [ "$rc" = 0 ] || failed=$((failed + 1))
  done
  [ "$status" = done ] && [ "$failed" != 0 ] && status=failed
  local note=""
  [ "$failed" = 0 ] || note="$failed of the profiles failed"
  record ncu "$status" $((SECONDS - t0)) "$failed" "$note"
}

bin=$work/x/target/release/fraglink
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
bench=$work/x/target/release/examples/gpu_bench
tests_rc=0
: >"$logs/steps.jsonl"
echo "steps: $steps (budget ${budget} s)"
for step in $steps; do
  # Roughly the least time a step needs to be worth starting.
  case $step in
    all-tests | gpu-tests | tests) need=60 ;;
    ncu | sanitize) need=60 ;;
    *) need=30 ;;
  esac
  if [ "$gpu" != 1 ] && [ "$step" != tests ] && [ "$step" != all-tests ]; then
    record "$step" "left out" 0 0 "no CUDA GPU on this machine"
    continue
  fi
  if { [ "$step" = peers ] && [ "${GPU_RUN_PEERS:-1}" = 0 ]; } ||
    { [ "$step" = ncu ] && { [ "${GPU_RUN_NCU:-1}" = 0 ] || ! command -v ncu >/dev/null; }; }; then
    record "$step" "left out" 0 0 "GPU_RUN_PEERS/GPU_RUN_NCU = 0, or no ncu"
    continue
  fi
  if [ "$step" = sanitize ] && [ -z "$sanitizer" ]; then
    record "$step" "left out" 0 0 "no compute-sanitizer on PATH or in /usr/local/cuda*/bin"
    continue
  fi
  if [ "$(left)" -lt "$need" ]; then
    record "$step" "not started" 0 0 "$(left) s left of GPU_RUN_SECONDS=$budget"
    continue
  fi
  case $step in
    # Without a GPU, every test that runs without one.
    all-tests) if [ "$gpu" = 1 ]; then nextest_step all-tests all; else nextest_step all-tests default; fi ;;
    gpu-tests) nextest_step gpu-tests only ;;
    tests) nextest_step tests default ;;
    *)
      if ! extract; then
        record "$step" failed 0 1 "the archive could not be unpacked"
        continue
      fi
      # The doctor's report (libraries, embedded IR) goes with every call's results.
      [ -f "$logs/doctor.json" ] || "$bin" doctor --json >"$logs/doctor.json" 2>"$logs/doctor.err"
      "${step}_step"
      ;;
  esac
  collect
done
if [ ! -f "$logs/doctor.json" ] && extract; then
  "$bin" doctor --json >"$logs/doctor.json" 2>"$logs/doctor.err"
fi
collect
cat "$outdir/gpu-summary.md"
steps_with() {
  "$py" -c 'import json,sys; print(" ".join(d["step"] for d in map(json.loads, open(sys.argv[1])) if d["status"] in sys.argv[2:]))' \
    "$logs/steps.jsonl" "$@"
}
remaining=$(steps_with stopped "not started")
failed_steps=$(steps_with failed)
if [ "$gpu" != 1 ]; then
  echo "gpu-run: no CUDA GPU on this machine: ran the portable tests only (exit $tests_rc)"
  exit 3
fi
if [ "$tests_rc" != 0 ]; then
  echo "gpu-run: tests failed (nextest exit $tests_rc)${remaining:+; steps left for another call: $remaining}"
  exit "$tests_rc"
fi
if [ -n "$failed_steps" ]; then
  echo "gpu-run: steps failed: $failed_steps (see gpu-summary.md and the logs)${remaining:+; steps left for another call: $remaining}"
  exit 1
fi
if [ -n "$remaining" ]; then
  echo "gpu-run: steps left for another call: $remaining"
  exit 5
fi
echo "gpu-run: every step done"
