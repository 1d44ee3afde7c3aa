#!/usr/bin/env bash
# Runs fraglink's whole test suite (ignored GPU tests included), doctor, the
# GPU search matrix, the GPU benches and kernel profiles (ncu) from
# target/gpu-archive/ (made by
# scripts/gpu-archive.sh), on a machine with the NVIDIA driver and CUDA
# libraries but no Rust toolchain and no network. Writes into OUTDIR:
#   gpu-results.json  device, driver, CUDA, commit, each test's outcome,
#                     each search's recall and QPS, the bench figures
#   gpu-summary.md    the same, short
#   gpu-logs.tar.gz   every log
# Without a GPU it runs the portable tests, then exits 3 with one line.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
outdir=${1:?usage: scripts/gpu-run.sh OUTDIR}
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
# after a fix without the whole suite (e.g. 'binary(knn_gpu)'; 'none()' runs no
# test but still unpacks the binaries for the steps below).
if [ -n "${GPU_RUN_TESTS:-}" ]; then
  filter="($filter) & ($GPU_RUN_TESTS)"
fi
ignored=all
[ "$gpu" = 1 ] || ignored=default
echo "== tests (run-ignored=$ignored)"
rm -f "$root/target/nextest/gpu/junit.xml"
"$work/cargo-nextest" nextest run \
  --archive-file "$arch/fraglink-tests.tar.zst" \
  --workspace-remap "$root" \
  --extract-to "$work/x" --extract-overwrite \
  --tool-config-file "fraglink:$root/.config/nextest.toml" \
  --profile gpu --run-ignored "$ignored" --no-fail-fast --no-tests pass \
  -E "$filter" 2>&1 | tee "$logs/tests.txt"
tests_rc=${PIPESTATUS[0]}
# nextest writes JUnit under the (remapped) workspace's target/nextest/<profile>/.
junit=$(find "$root/target/nextest/gpu" "$work/x" -name junit.xml 2>/dev/null | head -1)
[ -n "$junit" ] && cp "$junit" "$logs/junit.xml"

bin=$work/x/target/release/fraglink
bench=$work/x/target/release/examples/gpu_bench
echo "== doctor"
"$bin" doctor --json >"$logs/doctor.json" 2>"$logs/doctor.err"
echo "doctor exit $?"

if [ "$gpu" = 1 ]; then
  echo "== search matrix"
  : >"$logs/search.jsonl"
  for metric in l2 ip cosine; do
    for dtype in f32 f16 i8 u8; do
      for filter in none bitset:0.5 bitset:0.05; do
        line=$("$bin" search --device gpu --json --n 100000 --dim 128 --nq 1000 --k 10 \
          --metric "$metric" --dtype "$dtype" --filter "$filter" 2>>"$logs/search.err")
        rc=$?
        "$py" -c 'import json,sys; d=json.loads(sys.argv[1]) if sys.argv[1].strip() else {}; d.update(metric=sys.argv[2],dtype=sys.argv[3],filter=sys.argv[4],exit=int(sys.argv[5])); print(json.dumps(d))' \
          "$line" "$metric" "$dtype" "$filter" "$rc" >>"$logs/search.jsonl" 2>>"$logs/search.err" \
          || echo "{\"metric\":\"$metric\",\"dtype\":\"$dtype\",\"filter\":\"$filter\",\"exit\":$rc,\"unparsed\":true}" >>"$logs/search.jsonl"
        echo "$metric $dtype $filter exit=$rc"
      done
    done
  done
  echo "== gpu bench"
  "$bench" --json "$logs/bench.json" 2>&1 | tee "$logs/bench.txt"
  # GPU_RUN_PEERS=0 leaves the torch/CuPy comparison out (about a minute).
  if [ "${GPU_RUN_PEERS:-1}" != 0 ]; then
    echo "== exact k-NN against torch / CuPy (benches/scripts/gpu_peers.py)"
    PYTHONUNBUFFERED=1 "$py" "$root/benches/scripts/gpu_peers.py" --fraglink "$bin" \
      --out "$logs/peers.json" 2>&1 | tee "$logs/peers.txt"
  fi
  # Kernel profiles for whoever tunes the kernels next: Nsight Compute on the
  # second (warm) search of n 1M x 128 f32, k 10: the tensor-core kernels at
  # nq 1 and 1000, the scan at nq 1. GPU_RUN_NCU=0 leaves them out (about a
  # minute, most of it the CLI's exact CPU answer for the recall).
  if [ "${GPU_RUN_NCU:-1}" != 0 ] && command -v ncu >/dev/null; then
    echo "== kernel profiles (ncu)"
    # name, nq, FRAGLINK_GPU_KNN, launches of the first search (skipped), launches profiled.
    # At nq 1 a search's rows span hundreds of chunks, so the re-rank has its merge
    # level: knn_tile, knn_rerank (merge), knn_rerank (final). At nq 1000 (16 query
    # tiles of 64) the chunks fit one re-rank level on an H100 or H200: two launches.
    for spec in "knn-nq1 1 1 3 3" "knn-nq1000 1000 1 2 2" "scan-nq1 1 0 1 1"; do
      set -- $spec
      FRAGLINK_GPU_KNN=$3 ncu --target-processes all --kernel-name regex:'knn_|scan_' \
        --launch-skip "$4" --launch-count "$5" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
        -f -o "$logs/ncu-$1" \
        "$bin" search --device gpu --json --n 1000000 --dim 128 --nq "$2" --k 10 --dtype f32 \
        --repeat 2 >"$logs/ncu-$1.out" 2>&1
      echo "ncu $1 exit $?"
      ncu --import "$logs/ncu-$1.ncu-rep" --csv --page details >"$logs/ncu-$1.csv" 2>>"$logs/ncu-$1.out"
    done
  fi
fi

"$py" "$root/scripts/gpu_report.py" collect --logs "$logs" --archive "$arch" --gpu "$gpu" \
  --tests-exit "$tests_rc" --out "$outdir"
tar -czf "$outdir/gpu-logs.tar.gz" -C "$work" logs
cat "$outdir/gpu-summary.md"
if [ "$gpu" != 1 ]; then
  echo "gpu-run: no CUDA GPU on this machine: ran the portable tests only (exit $tests_rc)"
  exit 3
fi
exit "$tests_rc"
