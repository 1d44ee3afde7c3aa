#!/usr/bin/env bash
# Runs fraglink's fuzz targets (fuzz/, cargo-fuzz + libFuzzer) for DURATION
# seconds each, from the committed corpora in fuzz/corpus/<target>/, under a
# 2 GiB RSS limit. New inputs that reach new code are added to the corpora.
#   scripts/fuzz.sh DURATION [TARGET...]     (default: every target)
# Prints each target's executions and exits non-zero on the first crash
# (libFuzzer leaves the input in fuzz/artifacts/<target>/).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
duration=${1:?usage: scripts/fuzz.sh DURATION [TARGET...]}
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(matrix vector_files disk_entry info_log cubin ivf_file)

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# cargo-fuzz builds with -Zsanitizer=address, a nightly flag; RUSTC_BOOTSTRAP
# lets the machine's stable toolchain accept it (no other toolchain here).
export RUSTC_BOOTSTRAP=1
# Reuse the main build's CUDA libraries and compiled fragments when present
# (fraglink's build.rs runs for the fuzz crate too).
if [ -z "${FRAGLINK_CUDA_ROOT:-}" ] && [ -d "$root/target/fraglink-cuda-12.9" ]; then
  export FRAGLINK_CUDA_ROOT=$root/target/fraglink-cuda-12.9
fi
export FRAGLINK_BUILD_CACHE_DIR=${FRAGLINK_BUILD_CACHE_DIR:-$root/target/fraglink-build-cache}

cd fuzz
cargo fuzz build -O
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if ! cargo fuzz run -O "$t" "corpus/$t" -- -max_total_time="$duration" -rss_limit_mb=2048 \
      -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t FAILED (see fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  runs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  echo "fuzz: $t: ${runs:-?} executions in ${duration}s, 0 crashes"
  rm -f "$log"
done
