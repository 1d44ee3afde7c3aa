#!/usr/bin/env python3
"""A lockstep model of knn_tile's chunks for one query, with and without the bound
the chunks share (fragments/knn_tile.cuh `shared_bound`), and with the union bound
of the chunks' certificates beside it (`union_of`).

Not a benchmark and no GPU: it counts what the candidate kernel's select does
(insertions, compactions, candidates written) when every chunk of one wave
advances one row iteration at a time, as concurrent blocks roughly do, over
random normal rows with f16copy's l2 margin at dim 128 (knn_bounds.cuh: about
1.1e-3 (|q| + |x|)^2). The shared bound is read one iteration late, as the
kernel reads it. Usage (numpy: benches/scripts/requirements.txt):

    python3 benches/scripts/shared_bound_model.py K CAPACITY CHUNKS [ROWS]

e.g. `10 32 924` for nq 1 on an H100/H200 (924 chunks of the f16copy q16 k32
tile), `100 128 99` for a 32-query tile at nq 100 and k 100.
"""
import sys

import numpy as np

RT = 64  # rows per block iteration (knn_tile's rtile)
DIM = 128


UNION_MIN_CHUNKS = 32  # knn_tile.cuh
UNION_MAX_ROWS = 8
UNION_SAMPLE = 256  # certificates one warp reads (32 lanes x 8)


def union_shape(k, chunks):
    """knn_tile.cuh union_of: (j, r), or None where the union bound is off."""
    if chunks < UNION_MIN_CHUNKS:
        return None
    j = -(-2 * k // chunks)
    return (j, -(-k // j)) if j <= UNION_MAX_ROWS else None


def union_bound(certs, r):
    """The r-th smallest of a sample of the certificates spread evenly over them,
    as knn_tile.cuh reads it (inf: none)."""
    n = min(len(certs), UNION_SAMPLE)
    if r > n:
        return np.inf
    spread = len(certs) if len(certs) > UNION_SAMPLE else UNION_SAMPLE
    sample = certs[(np.arange(n) * spread) >> 8]
    return np.partition(sample, r - 1)[r - 1]


def model(k, cap, chunks, n, share, lo, hi, union=False):
    chunk_rows = -(-n // chunks)
    chunk_rows = -(-chunk_rows // RT) * RT
    chunks = -(-n // chunk_rows)
    bufs = [np.empty(0, dtype=np.int64) for _ in range(chunks)]
    thr = np.full(chunks, np.inf)
    certs = np.full(chunks, np.inf)
    shape = union_shape(k, chunks) if union else None
    bound = bound_seen = np.inf
    inserted = compactions = 0
    for j in range(chunk_rows // RT):
        bound_used, bound_seen = bound_seen, bound  # one iteration late
        for c in range(chunks):
            end = min(n, (c + 1) * chunk_rows)
            r0 = c * chunk_rows + j * RT
            if r0 >= end:
                continue
            rows = np.arange(r0, min(r0 + RT, end))
            keep = lo[rows] < thr[c]
            if share:
                keep &= lo[rows] <= bound_used
            bufs[c] = np.concatenate([bufs[c], rows[keep]])
            inserted += int(keep.sum())
            last = r0 + RT >= end
            limit = k if last else cap
            joint = np.inf
            if shape and (len(bufs[c]) > limit or (last and len(bufs[c]) > 0)):
                rows_each, rank = shape
                if len(bufs[c]) >= rows_each:
                    certs[c] = min(certs[c], np.partition(hi[bufs[c]], rows_each - 1)[rows_each - 1])
                joint = union_bound(certs, rank)
            if len(bufs[c]) > limit or (last and len(bufs[c]) > 0 and min(bound_used, joint) < np.inf):
                compactions += 1
                b = bufs[c]
                t = min(thr[c], np.partition(hi[b], k - 1)[k - 1]) if len(b) >= k else thr[c]
                bufs[c] = b[lo[b] <= (min(t, bound_used, joint) if share else t)]
                thr[c] = t
                if share:
                    bound = min(bound, t, joint)
    written = [b[lo[b] <= bound] if share else b for b in bufs]
    return chunks, chunk_rows, inserted, compactions, sum(len(b) for b in written)


def main():
    k, cap, chunks = (int(a) for a in sys.argv[1:4])
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000_000
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    q = rng.standard_normal(DIM, dtype=np.float32)
    d = ((x - q) ** 2).sum(1)
    s = np.sqrt((x * x).sum(1)) + np.sqrt((q * q).sum())
    e = 1.1e-3 * s * s
    for share, union in ((False, False), (True, False), (True, True)):
        c, rows, ins, comp, wrote = model(k, cap, chunks, n, share, d - e, d + e, union)
        how = "T and union bounds" if union else ("shared T bound" if share else "no shared bound")
        print(f"k {k}, capacity {cap}, {c} chunks of {rows} rows, {how}: "
              f"inserted {ins}, compactions {comp}, candidates written {wrote}")


if __name__ == "__main__":
    main()
