#!/usr/bin/env bash
# Cold link time per kernel family: each plan linked in a fresh process with
# no disk cache (`FRAGLINK_CACHE_DISABLE=1 fraglink link --json`), so every
# link is nvJitLink's whole work: LTO (NVVM) then ptxas. This is the first call
# on a new configuration less module load and launch (issue 9's target: 50 ms).
# Rounds go through the plans in turn, so a machine that gets busier slows
# every plan alike. Prints a table (median, min, max of `link_ms`, the time
# inside nvJitLink; registers; cubin bytes), then one JSON line. Each plan is
# linked at every fast-compile level of LEVELS (FRAGLINK_FAST_COMPILE; `0` is
# full optimisation) in turn, and each level's median is also given as a
# fraction of the first level's.
#
# With FRAGLINK_BIN_B set to a second fraglink binary (another build, e.g. of
# an earlier commit: `cp target/release/fraglink /tmp/fraglink.old` before a
# change), each plan is linked by both binaries in every round, the order
# alternating between rounds, and each side's median is given as a fraction
# of the first side's (A = FRAGLINK_BIN, then B, at each level).
#
#   bash benches/scripts/cold_links.sh [ROUNDS] [ARCH] [LEVELS]
#   (default 5, sm_90, "0 min")
#
# Needs a release build (`cargo build --release`); no GPU. The figures depend
# on the host CPU and the nvJitLink release (`fraglink doctor` names it): compare
# only runs on one machine, and say how busy it was (`uptime`).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-5}
ARCH=${2:-sm_90}
read -r -a LEVELS <<<"${3:-0 min}"
BIN=${FRAGLINK_BIN:-target/release/fraglink}
[ -x "$BIN" ] || { echo "error: $BIN not built (cargo build --release)" >&2; exit 2; }
BINS=("$BIN")
if [ -n "${FRAGLINK_BIN_B:-}" ]; then
  [ -x "$FRAGLINK_BIN_B" ] || { echo "error: FRAGLINK_BIN_B=$FRAGLINK_BIN_B is not an executable" >&2; exit 2; }
  BINS+=("$FRAGLINK_BIN_B")
fi
SIDES=()
for level in "${LEVELS[@]}"; do
  for b in "${!BINS[@]}"; do SIDES+=("$b:$level"); done
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# One plan per line: the kernel fragment first (it names the entry).
PLANS=(
  "scan_f32_u32_v4_k32 metric_l2_f32 filter_none_u32"
  "scan_f32_u32_v1_k128 metric_cosine_f32 filter_bitset_u32"
  "scan_f16_u32_v8_k256 metric_l2_f16 filter_none_u32"
  "scan_i8_i64_v16_k32 metric_l2_i8 filter_bitset_i64"
  "ivf_scan_f32_v4_k128_asc metric_l2_f32 filter_none_i64"
  "ivf_scan_f32_v4_k1024_asc metric_l2_f32 filter_none_i64"
  "knn_tile_f32_tf32x3_q64_r64_k32_a16 metric_l2_f32 filter_none_u32"
  "knn_tile_f32_f16copy_q32_r64_k32_a16 metric_l2_f32 filter_none_u32"
  "knn_tile_f16_f16_q16_r64_k128 metric_l2_f16 filter_bitset_u32"
  "knn_rerank_f32_k32 metric_l2_f32"
  "knn_rerank_f16_k256 metric_inner_product_f16"
  "knn_dist_f32 metric_l2_f32 filter_none_u32"
  "knn_select_b256"
)
for round in $(seq "$ROUNDS"); do
  order=("${SIDES[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    order=()
    for ((j = ${#SIDES[@]} - 1; j >= 0; j--)); do order+=("${SIDES[$j]}"); done
  fi
  for i in "${!PLANS[@]}"; do
    for side in "${order[@]}"; do
      b=${side%%:*}
      level=${side#*:}
      # shellcheck disable=SC2086 # a plan is a list of fragment names
      FRAGLINK_CACHE_DISABLE=1 FRAGLINK_FAST_COMPILE=$level "${BINS[$b]}" link --arch "$ARCH" --json ${PLANS[$i]} \
        >>"$WORK/$i.$b.$level.jsonl"
    done
  done
done
python3 - "$WORK" "$ARCH" "$ROUNDS" "${#PLANS[@]}" "${BINS[*]}" "${SIDES[@]}" <<'EOF'
import json, statistics, sys
work, arch, rounds, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
bins = sys.argv[5].split(" ")
sides = sys.argv[6:]
levels = list(dict.fromkeys(s.split(":", 1)[1] for s in sides))
out = []
print(f"cold links for {arch}, {rounds} rounds, fresh process each, no disk cache; link_ms = inside nvJitLink;"
      f" fast-compile levels {' '.join(levels)}"
      + "".join(f"; {'AB'[b]} = {path}" for b, path in enumerate(bins) if len(bins) > 1))
print(f"{'entry':42} {'side':>5} {'median':>8} {'min':>8} {'max':>8} {'/ first':>7} {'regs':>5} {'cubin B':>8}")
for i in range(n):
    first = None
    for side in sides:
        b, level = side.split(":", 1)
        label = ("AB"[int(b)] + ":" if len(bins) > 1 else "") + level
        runs = [json.loads(line) for line in open(f"{work}/{i}.{b}.{level}.jsonl")]
        bad = [r["source"] for r in runs if r["source"] != "linked"]
        if bad:
            sys.exit(f"error: {runs[0]['entry']}: served from {bad[0]}, not linked")
        ms = sorted(r["link_ms"] for r in runs)
        last = runs[-1]
        row = {"entry": last["entry"], "binary": bins[int(b)], "fast_compile": level,
               "median_ms": statistics.median(ms),
               "min_ms": ms[0], "max_ms": ms[-1], "registers": last["registers"],
               "spill_stores": last["spill_stores"], "stack_bytes": last["stack_bytes"],
               "cubin_bytes": last["cubin_bytes"]}
        first = first or row["median_ms"]
        row["of_first_side"] = row["median_ms"] / first
        out.append(row)
        print(f"{row['entry']:42} {label:>5} {row['median_ms']:8.1f} {row['min_ms']:8.1f} {row['max_ms']:8.1f} "
              f"{row['of_first_side']:7.2f} {row['registers']:5} {row['cubin_bytes']:8}")
print(json.dumps({"arch": arch, "rounds": rounds, "levels": levels, "binaries": bins, "plans": out}))
EOF
