#!/usr/bin/env bash
# First call of a configuration in a fresh process: not prelinked (an empty
# disk cache: nvJitLink links it) against prelinked (`fraglink prelink --from`
# a profile an earlier process wrote: the disk cache serves it). The two sides
# are interleaved, each in its own process; medians of the request time
# (`elapsed_ms` of `fraglink link --json`) and of the process wall time.
#
#   bash benches/scripts/prelink_first_call.sh [ROUNDS]   (default 15)
#
# Needs a release build (`cargo build --release`); no GPU (it links for
# sm_80, so the first call here is the link, without module load or launch).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-15}
BIN=${FRAGLINK_BIN:-target/release/fraglink}
[ -x "$BIN" ] || { echo "error: $BIN not built (cargo build --release)" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PLAN=(scan_f32_u32_v4_k32 metric_l2_f32 filter_none_u32)
unset FRAGLINK_CACHE_DISABLE FRAGLINK_PROFILE CUDA_CACHE_PATH

# An earlier process records its plan; prelink fills the shared cache.
FRAGLINK_CACHE_DIR=$WORK/recorder FRAGLINK_PROFILE=$WORK/profile.jsonl \
  "$BIN" link --arch sm_80 --json "${PLAN[@]}" >/dev/null
FRAGLINK_CACHE_DIR=$WORK/prelinked "$BIN" prelink --from "$WORK/profile.jsonl" --json >"$WORK/prelink.json"

one() { # $1: cache dir -> "elapsed_ms wall_ms source"
  local t0 t1 out
  t0=$(date +%s%N)
  out=$(FRAGLINK_CACHE_DIR=$1 "$BIN" link --arch sm_80 --json "${PLAN[@]}")
  t1=$(date +%s%N)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["elapsed_ms"], (int(sys.argv[3])-int(sys.argv[2]))/1e6, d["source"])' "$out" "$t0" "$t1"
}
: >"$WORK/cold.txt"; : >"$WORK/warm.txt"
for i in $(seq "$ROUNDS"); do
  if (( i % 2 )); then
    one "$WORK/cold-$i" >>"$WORK/cold.txt"; one "$WORK/prelinked" >>"$WORK/warm.txt"
  else
    one "$WORK/prelinked" >>"$WORK/warm.txt"; one "$WORK/cold-$i" >>"$WORK/cold.txt"
  fi
done
python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys, os
work, rounds = sys.argv[1], sys.argv[2]
def load(name):
    rows = [l.split() for l in open(os.path.join(work, name))]
    return [float(r[0]) for r in rows], [float(r[1]) for r in rows], {r[2] for r in rows}
ce, cw, cs = load("cold.txt")
we, ww, ws = load("warm.txt")
assert cs == {"linked"} and ws == {"disk"}, (cs, ws)
m = statistics.median
load_avg = open("/proc/loadavg").read().split()[:3]
print(f"first call in a fresh process, {rounds} interleaved rounds each, sm_80, load average {' '.join(load_avg)}")
print(f"  not prelinked: request {m(ce):8.2f} ms   process {m(cw):8.1f} ms   (linked by nvJitLink)")
print(f"  prelinked:     request {m(we):8.2f} ms   process {m(ww):8.1f} ms   (disk cache)")
print(f"  request speed-up {m(ce)/m(we):.0f}x")
print(json.dumps({"cold_request_ms": m(ce), "cold_process_ms": m(cw), "prelinked_request_ms": m(we),
                  "prelinked_process_ms": m(ww), "rounds": int(rounds), "loadavg": load_avg}))
PY
