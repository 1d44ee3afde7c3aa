#!/usr/bin/env bash
# Builds everything a GPU machine without a Rust toolchain or network needs to
# run fraglink's tests and GPU benches (README, "Testing on a GPU machine"):
#
#   target/gpu-archive/
#     fraglink-tests.tar.zst   cargo-nextest archive: release tests, the CLI,
#                              the gpu_bench binary, the downstream example's
#                              binary (.config/nextest.toml)
#     testdata/                a copy of ../shared/testdata
#     cargo-nextest.xz         nextest itself, xz (Python's lzma unpacks it)
#
# Built against CUDA 13.0 (FRAGLINK_CUDA_VERSION=13) because GPU machines with
# driver 580 ship CUDA 13.0 and its nvJitLink must be the IR's major; set
# FRAGLINK_CUDA_VERSION=12 to build for CUDA 12 instead. The build uses its
# own target directory (target/gpu-cuda<major>) so the default build's
# artifacts stay valid.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

export FRAGLINK_CUDA_VERSION=${FRAGLINK_CUDA_VERSION:-13}
export CARGO_TARGET_DIR=${GPU_ARCHIVE_TARGET_DIR:-$root/target/gpu-cuda$FRAGLINK_CUDA_VERSION}
out=$root/target/gpu-archive
testdata=${FRAGLINK_TESTDATA:-$root/../shared/testdata}

command -v cargo-nextest >/dev/null || { echo "error: cargo-nextest is not installed (cargo install cargo-nextest --locked)" >&2; exit 1; }
command -v xz >/dev/null || { echo "error: xz is not installed" >&2; exit 1; }
command -v zstd >/dev/null || { echo "error: zstd is not installed" >&2; exit 1; }
test -d "$testdata/cuvs-matrices" || { echo "error: test data not found at $testdata (set FRAGLINK_TESTDATA)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
# The commit the binaries are built from (read before the build starts);
# `-dirty` when the working tree
# has changes, so a report never names a commit its binaries do not match.
if commit=$(git rev-parse HEAD 2>/dev/null); then
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    echo "warning: the working tree has uncommitted changes: the archive is $commit-dirty" >&2
    commit=$commit-dirty
  fi
  echo "$commit" >"$out/commit"
fi
echo "== building for CUDA $FRAGLINK_CUDA_VERSION into $CARGO_TARGET_DIR"
cargo build --release --example gpu_bench
# The downstream example crate (its own workspace) is built here, not by
# cargo on the GPU machine: tests/downstream.rs's ignored GPU test runs this
# binary from beside the CLI.
cargo build --release --manifest-path examples/downstream/Cargo.toml \
  --target-dir "$CARGO_TARGET_DIR/downstream"
cp "$CARGO_TARGET_DIR/downstream/release/fraglink-downstream-example" "$CARGO_TARGET_DIR/release/"
# nextest does not archive fraglink's OUT_DIR; tests/host_headers.rs needs the
# rendered fragment sources, so they travel beside the CLI (archive.include).
registry=$(ls -t "$CARGO_TARGET_DIR"/release/build/fraglink-*/out/fraglink_registry.rs | head -1)
rm -rf "$CARGO_TARGET_DIR/release/fraglink-gen"
cp -r "$(dirname "$registry")/gen" "$CARGO_TARGET_DIR/release/fraglink-gen"
cargo nextest archive --release --archive-file "$out/fraglink-tests.tar.zst"
# Every test binary links the library and with it the whole embedded fragment
# set (3 MB of fatbins since the knn families), so the archive holds dozens of
# copies of the same bytes. nextest's own zstd frame (8 MB window) cannot see
# one copy from the next; a 128 MB window (--long=27, which zstd decoders —
# nextest's included — accept by default) stores each once: 65 MB -> 12 MB.
zstd -dc "$out/fraglink-tests.tar.zst" | zstd -q --long=27 -19 -T0 -o "$out/fraglink-tests.long.tar.zst"
mv "$out/fraglink-tests.long.tar.zst" "$out/fraglink-tests.tar.zst"
# Read the archive back as gpu-run.sh will, with its profile, so a nextest
# config it cannot take (test groups, filters, priorities) fails here, not in
# a GPU lease.
check=$(mktemp -d)
cargo nextest list --archive-file "$out/fraglink-tests.tar.zst" --workspace-remap "$root" \
  --extract-to "$check" --profile gpu --run-ignored all -E 'none()' >/dev/null \
  || { rm -rf "$check"; echo "error: nextest cannot run the archive with profile gpu (above)" >&2; exit 1; }
rm -rf "$check"
cp -r "$testdata" "$out/testdata"
xz -9 -T0 -c "$(command -v cargo-nextest)" >"$out/cargo-nextest.xz"
echo "== $out"
du -ab "$out" | sort -n | tail -4
size=$(du -sb "$out" | cut -f1)
echo "total $((size / 1024 / 1024)) MiB ($size bytes)"
if [ "$size" -gt $((48 * 1024 * 1024)) ]; then
  echo "error: the archive folder is over 48 MiB" >&2
  exit 1
fi
