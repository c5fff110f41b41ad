"""The decode planner's wave model on the uneven rows of `bench decode --grid`: chunks of a
sequence by floor (before session 14: rows // chunk chunks, the last taking the remainder, up to
two chunks of rows in one CTA) against ceil (main since: ceil(rows / chunk), none above a chunk).
CPU only; units are tile times, as in `plan_decode`.

    python docs/studies/decode_split/model.py
"""
from __future__ import annotations

from pykda.bench.decode import GRID, uneven_lengths
from pykda.ops import decode as D

SMS, SMEM = 132, 233472


def slots(d: int) -> int:
    return SMS * D.ctas_per_sm(d, D.DEFAULT_STAGES[d], SMEM)


def call_cost(p, tiles: int, lengths, ceil: bool) -> float:
    """Waves of the CTAs that have work x (the longest CTA's tiles + 1.5) + the merge. (the floor
    planner charged a floor split's extra tiles once, not in every wave; with many waves of last
    chunks that is optimistic, so it is not the measure here.)"""
    block_n = D.TILE_ROWS[p.head_dim]
    rows = tiles * block_n
    ctas, extra, most = 0, 0, 1
    for n_rows in lengths:
        n = max(1, -(-n_rows // rows) if ceil else n_rows // rows)
        n_tiles = -(-n_rows // block_n)
        extra = max(extra, n_tiles - (n - 1) * tiles - tiles)   # > 0 only by floor
        ctas += n * p.kv_heads * p.head_blocks
        most = max(most, n)
    waves = -(-ctas // slots(p.head_dim))
    return waves * (tiles + max(0, extra) + 1.5) + (D.merge_cost(most) if most > 1 else 0.0)


def floor_planner_cost(p, tiles: int) -> float:
    """The floor planner's own cost (before session 14): a split's extra tiles charged once."""
    n_tiles = -(-p.kv_len // D.TILE_ROWS[p.head_dim])
    n = max(1, p.kv_len // (tiles * D.TILE_ROWS[p.head_dim]))
    last = n_tiles - (n - 1) * tiles
    waves = -(-(n * p.batch * p.kv_heads * p.head_blocks) // slots(p.head_dim))
    return waves * (min(tiles, last) + 1.5) + max(0, last - tiles) + (D.merge_cost(n) if n > 1 else 0.0)


def pick(p, ceil: bool) -> int:
    """The tile count each planner picks: the floor planner's least own cost, or main's
    `plan_decode` (ceil)."""
    if ceil:
        return D.plan_decode(p, SMS, SMEM).chunk // D.TILE_ROWS[p.head_dim]
    n_tiles = -(-p.kv_len // D.TILE_ROWS[p.head_dim])
    return min(range(1, n_tiles + 1), key=lambda t: (floor_planner_cost(p, t), t))


if __name__ == "__main__":
    print(f"{'shape':>26} | {'floor t':>7} {'full':>6} {'uneven':>7} | {'ceil t':>6} {'full':>6} {'uneven':>7} | "
          f"{'x full':>6} {'x uneven':>8}")
    for b, hq, hkv, d, s, uneven in GRID:
        if not uneven:
            continue
        p = D.DecodeProblem(s, hq, hkv, d, "bfloat16", b)
        lens = [int(x) for x in uneven_lengths(b, s, seed=s + b)]
        tf, tc = pick(p, False), pick(p, True)
        ff, fu = call_cost(p, tf, [s] * b, False), call_cost(p, tf, lens, False)
        cf, cu = call_cost(p, tc, [s] * b, True), call_cost(p, tc, lens, True)
        print(f"{b:>5}x{hq}/{hkv} S~{s} D{d:<4} | {tf:7d} {ff:6.1f} {fu:7.1f} | {tc:6d} {cf:6.1f} {cu:7.1f} | "
              f"{ff / cf:6.2f} {fu / cu:8.2f}")
