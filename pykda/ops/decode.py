"""Flash decoding for one query token per head: `single_decode_with_kv_cache`, and
`batch_decode_with_padded_kv_cache` over sequences padded to one length. One code path
(`flash_decode`): a single sequence is a batch of one.

validate -> plan (chunk size, pipeline, grid) -> spec -> kernel bound to its constants
(`prepare_decode`, memoized on the arguments' metadata and the settings) -> tensor maps + workspace
-> launch with the call's pointers and maps. A split call of at most 8 chunks merges them in
the kernel, each (sequence, KV head) a thread block cluster of its chunks' CTAs that exchange
their partials through distributed shared memory; a longer split takes its workspace (the chunks'
partial outputs and LSE) from the framework of q, one allocation per call, and merges them with a
second kernel. A short call of few CTAs (`tiny_pays`) runs decode_tiny instead: one launch, no
pipeline. Nothing carries over between calls, so a call can be captured in a CUDA graph on
any stream, and graphs sharing a memory pool replay in any order.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Iterator, NamedTuple

import numpy as np

from .. import runtime
from ..runtime.arrays import CallArrays, DeviceArray, contiguous_strides
from .bound import bound_launch
from .checks import (check_aligned, check_contiguous, check_dtype, check_inner_contiguous, check_ndim,
                     check_same_device, check_shape, check_stages, is_int, Memo, prepared_key, resolve_scale)

HEAD_DIMS = (64, 128, 256)
DTYPES = ("bfloat16", "float16")
CTYPES = {"bfloat16": "bf16_t", "float16": "fp16_t"}
TILE_ROWS = {64: 128, 128: 64, 256: 64}   # KV rows per pipeline tile, by head dim
SHORT_TILE_ROWS = 64   # the tile of a sequence that fits in it, any head dim: a 128-row tile of <= 64
                       # rows leaves warps idle (32/8 heads D 64, KV 16 / 64: 6.26 / 6.40 µs -> 5.98 / 6.04)
ONE_TILE_SHORT_ROWS = 32   # one-tile CTAs (two warps of 16 rows) of sequences within this many rows: half
                           # the shared memory, more CTAs an SM (H200, µs, 64-row -> 32-row tiles, boxes of
                           # 16: 256 x 32/8 KV 32~ 18.4 -> 16.1, 256 x 32/4 KV 32~ D 256 22.9 -> 18.8)
WARPS = 4             # consumer warps; one more warp produces
ONE_TILE_WARPS = 2    # `one_tile_ctas`' consumer warps
MAX_HEADS_PER_CTA = 16
MAX_GRID_Z = 65535    # grid z = batch x head_blocks
KV_LAYOUTS = ("NHD", "HND")   # k, v [.., kv_len, num_kv_heads, head_dim] or [.., num_kv_heads, kv_len, head_dim]
DEFAULT_STAGES = {64: 3, 128: 3, 256: 3}   # D 64 at 3 (two CTAs an SM) rather than 4 (one): H200, µs 4 -> 3,
                                          # 256 x 32/8 KV 2048~ pages of 16 163.0 -> 135.6, of 1 192.7 -> 143.3,
                                          # padded 145.5 -> 139.9; 16/16 KV 8192 18.0 -> 15.0; at most 3 % lost
                                          # (16 x 32/4 KV 16384~ 39.7 -> 40.8)
# Head dim 128 calls of at most one unit (sequence, KV head, head block) an SM: 4 stages, one CTA an SM,
# not 3 and two: each CTA streams a long chunk, and fewer streams reach more of the DRAM's rate. H100,
# µs, 3 -> 4 stages (cuDNN in the same run): 32/8 KV 131072 181.7 -> 178.9 (180.7), 64/4 KV 500000 336.2
# -> 331.5 (334.0), 128/8 KV 65536 98.1 -> 96.0 (96.8), 64/8 KV 50000 77.0 -> 75.0, 32/32 KV 8192 53.5 ->
# 52.2 (53.2), 8 x 32/8 KV 32768 351.1 -> 345.9 (346.9). More units lose: 256 x 64/8 KV 513~ 93.1 ->
# 99.1, 256 x 8/1 KV 4096~ 102.3 -> 105.8, 16 x 32/32 KV 8191~ 413.0 -> 419.8. Pages gathered row by row
# keep two CTAs an SM (their loads are the producer warp's cp.async): pages of 1, H100, a few units'
# paged / padded µs went from 1.00 to 1.06 at 4 stages (2 x 64/4 KV 500000: 692.4 / 655.1).
FEW_UNITS_STAGES = {128: 4}
TMA_MIN_PAGE = 16     # pages of fewer rows are gathered with cp.async rather than TMA boxes, and so are one-tile
                      # CTAs' pages of any size (DecodePlan.gathers)
# Padded caches with lengths on the device: rows per TMA box of a chunk's last, partial tile, so
# that a CTA reads no box wholly past its sequence's length (a 64-row tile of a sequence of 20 rows:
# 32 rows read, not 64); its whole tiles come in one box a sub-tile. H200, µs, whole tiles -> boxes
# (FlashInfer): 256 x 32/8 KV 64~ 23.8 -> 20.0 (24.8), 512 x 32/8 KV 64~ 40.5 -> 32.9 (39.9), 256 x
# 32/4 KV 32~ D 256 26.0 -> 22.9 (25.6), D 64 14.8 -> 13.1 (18.2). Every tile in boxes (one map)
# cost chunks of many tiles up to 8 % (128 x 32/4 KV 1024~ D 256 74.6 -> 80.8), hence the tail maps.
PADDED_BOX_ROWS = 16
# Pages of more rows than this, read in TMA boxes: a segment's last, partial tile in boxes of this
# many rows (the tail maps), those past its end unread, not in boxes of a whole page (a request's last
# page of 64 or 128 rows read whole)
PAGED_TAIL_ROWS = 16
TRANSPOSED_MAX_HEADS = 8   # CTAs of at most this many query heads run the transposed products
# decode_tiny (decode_tiny.cu.j2): a padded or paged cache's sequences of at most TINY_ROWS[-1] rows, in CTAs of
# at most TINY_MAX_HEADS heads and TINY_MAX_COLUMNS query-head columns (its compiled heads x head dim),
# where the call's units hold at most TINY_MAX_ROWS_PER_SM kernel rows an SM (its time is a CTA's fixed
# cost, not the stream): no pipeline, dot products on CUDA cores
TINY_ROWS = (32, 64)   # the kernels' rows: a call takes the least that holds its sequences (every lane
                       # scores all of its stream's rows). H100, µs, 64 rows / the pipeline, 32/8 heads:
                       # KV 64 D 64 5.82 / 6.34, D 128 6.58 / 6.75, 4 x KV 64~ D 128 6.94 / 7.74
TINY_MAX_HEADS = 8       # groups (so one head block)
TINY_MAX_COLUMNS = 1024  # groups up to 8 at D 128, 4 at D 256. H100, µs, decode_tiny / the pipeline:
                         # 32/8 KV 17 D 256 6.53 / 7.73, 8/1 KV 17 D 128 6.37 / 7.33, 64/8 KV 32 6.58 / 7.04
TINY_MAX_ROWS_PER_SM = 64   # two units of 32 rows, one of 64. H100, µs, decode_tiny / the pipeline, 32/8 D 128:
                            # 32 x KV 32~ (256 units) 7.68 / 8.35, 64 x (512) 10.11 / 9.36; 16 x KV 64~ (128)
                            # 8.02 / 8.30, 32 x (256) 9.95 / 9.01
# paged calls take decode_tiny by the same rule: each thread reads all of its rows' page ids, then copies
# them. H100, µs, decode_tiny / the pipeline (docs/studies/decode_tiny/paged_rows.py), 32/8 D 128 KV 64:
# pages of 16 7.71 / 7.84, pages of 1 7.55 / 7.94; 4 x KV 64~ 7.49 / 7.94 and 7.65 / 8.35
TINY_STREAMS = (8, 4)  # decode_tiny's row streams: 8 where a thread then holds one head, else 4
TINY_THREADS = 256     # at most, with heads side by side up to the group
_REGS_GUESS = {(64, False): 96, (128, False): 152, (256, False): 240,   # per thread, for the occupancy
               (64, True): 96, (128, True): 128, (256, True): 168}       # estimate, by (D, transposed)


class DecodeProblem(NamedTuple):
    kv_len: int           # rows of each sequence's cache (S; kv_lens may use fewer)
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    batch: int = 1

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def head_blocks(self) -> int:
        """CTAs per KV head along its query heads."""
        return -(-self.group // MAX_HEADS_PER_CTA)


@dataclass(frozen=True)
class DecodePlan:
    chunk: int            # KV rows per CTA (a kernel argument: any multiple of block_n)
    block_n: int          # KV rows per pipeline tile
    stages: int
    n_chunks: int
    head_blocks: int      # CTAs per KV head along the query heads
    heads_per_cta: int
    smem: int             # dynamic shared memory per CTA, bytes
    merge_warps: int      # decode_merge's warps per (query row, MERGE_COLUMNS columns)
    warps: int = WARPS    # decode_partial's consumer warps
    cluster: int = 0      # a split merged inside thread block clusters of this many CTAs (0: by decode_merge)
    balanced: int = 0     # CTAs of the balanced split (0: chunks of `chunk` rows per sequence)
    box_rows: int = 0     # padded caches: rows per TMA box of a chunk's last, partial tile, boxes past a
                          # length unread (0: a box a tile)
    tiny: bool = False    # decode_tiny instead of decode_partial (block_n: its most rows; no pipeline)
    streams: int = 0      # decode_tiny's row streams
    one_tile: bool = False   # `one_tile_ctas` at one stage (ONE_TILE_WARPS consumer warps)
    # one_tile's consumer warps copy the rows each computes on with cp.async, no producer warp and no
    # hand-off (pages, or a padded cache whose K and V strides are alike); else TMA boxes by a
    # producer. H100, µs, TMA / the producer's gather -> the warps' own (docs/studies/paged_one_tile):
    # 256 x 32/8 KV 64~ D 128 padded 22.6 -> 21.2, pages of 16 24.1 -> 23.2; 512 x 32/8 KV 32~ padded
    # 28.5 -> 23.9, pages of 16 29.7 -> 26.3; 1024 x 32/8 KV 64~ padded 70.0 -> 60.4, pages of 16
    # 73.4 -> 67.1; 256 x 32/4 KV 32~ D 256 pages of 16 19.9 -> 20.3 (the one loss; 18.0 since the
    # gathers take each row's place from one lane, docs/studies/pages_of_one)
    self_gather: bool = False

    @property
    def split(self) -> bool:
        return self.n_chunks > 1 or self.balanced > 0

    @property
    def threads(self) -> int:
        """Threads of a CTA of the plan's kernel: decode_tiny's warps, or decode_partial's consumer
        warps and its producer (none where the consumers gather their own rows: `self_gather`)."""
        return 32 * (self.warps if self.tiny or self.self_gather else self.warps + 1)

    def gathers(self, page_size: int) -> bool:
        """Whether this plan's kernel gathers pages of `page_size` rows (0: a padded cache) row by row
        with cp.async: pages below TMA_MIN_PAGE rows, and one-tile CTAs' pages of any size, where the
        warps copy just the request's rows (a TMA box of a page of 64 or 128 rows reads all of it,
        past a short request's end) and reach them no later than boxes of 16. H100, µs, shuffled
        HND pages, TMA boxes -> the producer's gather (the padded cache; docs/studies/paged_one_tile):
        256 x 32/8 KV 64~ D 128 pages of 16 24.7 -> 24.1, of 64 32.5 -> 24.1 (22.6); 256 x 32/4 KV
        32~ D 256 pages of 16 21.4 -> 19.9 (20.8); 1024 x 32/8 KV 64~ pages of 16 77.5 -> 72.6, of
        64 106.6 -> 73.3 (69.2); 256 x 8/1 KV 64~ pages of 16 9.8 -> 9.9."""
        return is_gathered(page_size) or (page_size > 0 and self.one_tile)

    @property
    def merge_launch(self) -> bool:
        """A split whose chunks decode_merge merges, after decode_partial (not in clusters)."""
        return self.split and not self.cluster

    @property
    def grid_chunks(self) -> int:
        """decode_partial's grid x: the chunks, a whole cluster of CTAs (those past the chunks exit),
        or the balanced split's CTAs."""
        return self.balanced or self.cluster or self.n_chunks

    def grid(self, p: DecodeProblem) -> tuple[int, int, int]:
        """decode_partial's grid: (chunks, KV heads, batch x head blocks), or the balanced split's
        (CTAs, 1, head blocks): its CTAs walk every sequence's KV heads."""
        if self.balanced:
            return self.balanced, 1, self.head_blocks
        return self.grid_chunks, p.kv_heads, p.batch * self.head_blocks


def is_gathered(page_size: int) -> bool:
    """Whether pages of `page_size` rows (0: a padded cache) are gathered row by row with cp.async."""
    return 0 < page_size < TMA_MIN_PAGE


def box_major(plan: "DecodePlan", page_size: int, head_dim: int) -> bool:
    """Whether the plan's kernel reads pages of `page_size` rows in box-major tiles (decode.cu.j2's
    BOX_MAJOR): pages in TMA boxes of fewer rows than a tile and no tail boxes (pages of
    PAGED_TAIL_ROWS at most), where one 5-D copy brings a page's rows of every 64-column sub-tile
    instead of one copy a sub-tile (head dims of more than one sub-tile)."""
    return (not plan.gathers(page_size) and 0 < page_size < plan.block_n and page_size <= PAGED_TAIL_ROWS
            and head_dim > 64)


def page_shift(page_size: int) -> int:
    """log2 of a page size (a power of two: decode_tiny and page_snapshot find a row's page by
    shifts); 0 for a padded cache."""
    return max(page_size.bit_length() - 1, 0)


def tile_rows(head_dim: int, kv_len: int) -> int:
    """KV rows per pipeline tile: the head dim's, or SHORT_TILE_ROWS where the sequence fits in that."""
    return SHORT_TILE_ROWS if kv_len <= SHORT_TILE_ROWS else TILE_ROWS[head_dim]


def stage_bytes(head_dim: int, block_n: int) -> int:
    return 2 * block_n * head_dim * 2


def decode_stages(head_dim: int, units: int, sm_count: int, gathered: bool = False) -> int:
    """The pipeline depth of a call of `units` (sequence, KV head, head block) that streams many
    tiles: FEW_UNITS_STAGES' where it names the head dim, the units fit one an SM and the rows
    come in TMA boxes (not `gathered` pages), else DEFAULT_STAGES'."""
    if units <= sm_count and head_dim in FEW_UNITS_STAGES and not gathered:
        return FEW_UNITS_STAGES[head_dim]
    return DEFAULT_STAGES[head_dim]


def smem_bytes(head_dim: int, block_n: int, stages: int) -> int:
    return stages * stage_bytes(head_dim, block_n) + 1024   # + alignment slack for 1024-byte TMA tiles


def tiny_smem_bytes(head_dim: int, rows: int, heads: int, streams: int) -> int:
    """decode_tiny's dynamic shared memory: K, V [rows][D] (2-byte elements), the row streams' o
    [streams][heads][D], m and l [streams][heads] (fp32)."""
    return 2 * rows * head_dim * 2 + streams * heads * (head_dim + 2) * 4


def tiny_side_by_side(head_dim: int, heads: int, streams: int) -> int:
    """decode_tiny's heads side by side (its HY): as many of the compiled `heads` as TINY_THREADS
    allows beside head_dim / 8 threads along a row and `streams` row streams."""
    return min(heads, max(1, TINY_THREADS // (head_dim // 8 * streams)))


def tiny_threads(head_dim: int, heads: int, streams: int) -> int:
    """decode_tiny's threads: head_dim / 8 along a row, times the heads side by side, times the row
    streams."""
    return head_dim // 8 * tiny_side_by_side(head_dim, heads, streams) * streams


def tiny_streams(head_dim: int, heads: int) -> int:
    """decode_tiny's row streams: TINY_STREAMS' first where each thread then holds one of the compiled
    `heads`, else its second (twice the heads side by side, twice the rows a stream). H100, µs, 8 / 4
    streams: 32/8 heads KV 17 D 64 5.60 / 5.54, KV 32 5.63 / 5.63, 32/32 KV 17 D 128 5.50 / 5.63
    (one head a thread at 8); 32/8 KV 17 D 128 6.24 / 5.84, D 256 7.39 / 6.53, 8/1 KV 17 D 128 7.14 /
    6.37, 64/8 KV 32 D 128 7.39 / 6.58 (two to eight heads a thread at 8)."""
    many, few = TINY_STREAMS
    return many if tiny_side_by_side(head_dim, heads, many) == heads else few


def tiny_heads(heads_per_cta: int) -> int:
    """decode_tiny's compiled heads for a CTA of `heads_per_cta`: the power of two at or above (a
    kernel serves groups 1, 2, 3-4 and 5-8)."""
    return 1 << (heads_per_cta - 1).bit_length()


def tiny_rows(kv_len: int) -> int:
    """decode_tiny's rows for sequences of at most `kv_len` (within TINY_ROWS' last): the least of TINY_ROWS
    that holds them."""
    return next(r for r in TINY_ROWS if r >= kv_len)


def tiny_pays(p: DecodeProblem, heads_per_cta: int, units: int, sm_count: int) -> bool:
    """Whether decode_tiny runs a call: every sequence within TINY_ROWS[-1] rows, CTAs
    of at most TINY_MAX_HEADS heads and TINY_MAX_COLUMNS query-head columns, units of at most
    TINY_MAX_ROWS_PER_SM kernel rows an SM."""
    return (p.kv_len <= TINY_ROWS[-1] and heads_per_cta <= TINY_MAX_HEADS
            and tiny_heads(heads_per_cta) * p.head_dim <= TINY_MAX_COLUMNS
            and units * tiny_rows(p.kv_len) <= TINY_MAX_ROWS_PER_SM * sm_count)


def transposed(heads_per_cta: int) -> bool:
    """Whether a CTA of this many query heads computes Sᵀ = K·qᵀ and Oᵀ += Vᵀ·Pᵀ, the heads as the
    mma's 8 columns (half the mma of 16 padded heads, half the output's registers)."""
    return heads_per_cta <= TRANSPOSED_MAX_HEADS


def one_tile_ctas(kv_len: int, block_n: int, heads_per_cta: int, balanced: bool | None) -> bool:
    """Transposed CTAs of one tile each (every sequence within `block_n` rows, outside the balanced
    split, which walks many): they run one stage (a one-tile CTA fills one, and the warps' merge
    buffer fits in it at every head dim) of ONE_TILE_WARPS consumer warps, so more CTAs share an
    SM. H200, µs, 3 stages / 1 / 1 of 2 warps (FlashInfer): 256 x 32/8 KV 64~ D 128 31.9 / 24.9 /
    23.8 (24.5), 256 x 32/4 KV 32~ D 256 37.8 / 26.9 / - (25.5), 256 x 32/8 KV 64~ D 64 17.6 / 15.4
    / 14.5 (17.9)."""
    return kv_len <= block_n and balanced is not True and transposed(heads_per_cta)


def ctas_per_sm(head_dim: int, block_n: int, stages: int, smem_per_sm: int, heads_per_cta: int, warps: int) -> int:
    by_smem = smem_per_sm // (smem_bytes(head_dim, block_n, stages) + 2048)   # + static smem and reserve
    by_regs = 65536 // ((warps + 1) * 32 * _REGS_GUESS[head_dim, transposed(heads_per_cta)])
    return max(1, min(by_smem, by_regs))


MAX_CHUNK_ROWS = (1 << 31) - 1   # the kernel's chunk_rows is an int
MERGE_THREADS = 256
MERGE_COLUMNS = 32   # per group of a merge CTA's warps
MERGE_WARPS = MERGE_THREADS // 32
WARPS_PER_SM = 64


def merge_warps(rows: int, head_dim: int, n_chunks: int, sm_count: int) -> int:
    """decode_merge's warps per (query row, MERGE_COLUMNS columns): as many as the chunks can use
    (four chunk lanes a warp), but no more than keep two rounds of the GPU's warps busy, so that
    many rows of few chunks (a batch split in two) do not launch a CTA per row."""
    w = MERGE_WARPS
    while w > 1 and (4 * w // 2 >= n_chunks or rows * (head_dim // MERGE_COLUMNS) * w > 2 * sm_count * WARPS_PER_SM):
        w //= 2
    return w


def merge_rows(p: DecodeProblem, balanced: int) -> int:
    """decode_merge's rows: one per (sequence, query head); with a balanced split of `balanced`
    CTAs, one per (unit, head of a group) where the (sequence, KV head) units are no more than the
    CTAs (each row then reads its unit's pieces straight away, and no row is launched for a CTA that
    splits nothing: 2 x 64/4 KV 500000 takes 128 rows, not 2112), else one per (CTA, head of a
    group), which merges the unit the CTA splits. decode_merge tells the two apart by the count:
    B · q_heads rows are by unit."""
    if not balanced:
        return p.batch * p.q_heads
    return min(p.batch * p.kv_heads, balanced) * p.group


CLUSTERS = (2, 4, 8)   # portable thread block cluster sizes: a split of at most 8 chunks merges in one


def merge_cluster(n_chunks: int) -> int:
    """The cluster that can merge a split of `n_chunks` chunks without decode_merge: the smallest
    of CLUSTERS that holds them (0: none, unsplit or too many chunks)."""
    return next((c for c in CLUSTERS if n_chunks <= c), 0) if n_chunks > 1 else 0


def cluster_pays(tiles: int, ctas: int, slots: int) -> bool:
    """Whether a split of at most 8 chunks merges in clusters: where its CTAs (`ctas`) fill more
    than one round of the GPU's `slots`, or each chunk is one tile (a launch-bound call). Within
    one round the scheduler packs a cluster's CTAs onto few SMs of one GPC and leaves others idle:
    on the H200, 16/16 heads KV 100003 D 64 took 134 µs in clusters of 8 against 100 with
    decode_merge, 32/32 KV 8192 43.3 against 39.6; beyond one round (or one tile) the cluster
    saves the merge's launch and workspace: 32/4 KV 1000 D 64 10.6 -> 7.7 µs, 32 x 32/8 KV 8192~
    D 64 92.5 -> 89.7, 64 x 32/8 KV 8192~ 253.5 -> 247.6."""
    return ctas > slots or tiles == 1


def spread_tiles(units: int, n_tiles: int, slots: int) -> int:
    """Tiles a chunk where a split the cost picked is short enough to spread: 8, 4 or 2 chunks of
    at most SPREAD_MAX_TILES tiles, merged in clusters, whose CTAs fill at most half the GPU's
    `slots` but at least SPREAD_MIN_CTAS; 0 where none. Clusters spread a small grid over the
    GPCs and save decode_merge's launch, which a short chunk cannot hide: H200, µs, the cost's
    chunks -> these: 16/16 heads KV 8192 25.6 -> 22.9 (8 chunks), 32/8 KV 4096 14.6 -> 12.6 (8),
    32/32 KV 8192 40.4 -> 39.5 (4), 128/8 KV 4097 D 256 21.2 -> 18.0 (8). Longer chunks stream
    slower on so few SMs: 64/8 KV 50000 58.1 -> 61.1 (8 chunks of 98 tiles), 128/8 KV 65536 73.3
    -> 76.0 (128 tiles), 16/16 KV 32768 D 64 40.6 -> 48.9 (4 of 64, one CTA an SM at four stages;
    at D 64's three, 8 chunks of 32 tiles: 40.4 -> 37.8)."""
    for n in reversed(CLUSTERS):
        tiles = -(-n_tiles // n)
        chunks = -(-n_tiles // tiles)
        if chunks > 1 and tiles <= SPREAD_MAX_TILES and SPREAD_MIN_CTAS <= units * chunks <= slots // 2:
            return tiles
    return 0


def merge_cost(n_chunks: int) -> float:
    """A split's cost beyond its waves, in tile times: decode_merge's launch and reads, and each
    chunk's partial (written, then read) and its own prologue. Fitted on the H200: 64/8 heads at
    KV 50000 take 57.6 µs in 30 chunks and 62.2 µs in 65, where a constant merge would pick 65."""
    return 2.0 + n_chunks / 16


UNEVEN_SLACK = 0.05   # of the least full-length cost, spent on shorter chunks where lengths are uneven
BALANCED_MAX_BATCH = 1024   # the balanced split's CTAs each scan every length: batches up to this many
BALANCED_UNIT_COST = 1      # the balanced split's fixed cost of a (sequence, KV head), in tiles of streaming
BALANCED_MIN_TILES = 64     # the planner's balanced split: for kv_len of at least this many tiles
SPREAD_MIN_CTAS = 64        # a short split in clusters (`spread_tiles`): at least this many CTAs,
SPREAD_MAX_TILES = 32       # chunks of at most this many tiles


def balanced_pays(p: DecodeProblem, block_n: int, per_sm: int, sm_count: int) -> bool:
    """Where the planner takes the balanced split for lengths on the device: long sequences
    (kv_len >= BALANCED_MIN_TILES tiles) and few of them: (sequence, KV head) units x CTAs per
    SM <= 2 x SMs (a unit an SM where two CTAs fit, two where one does). Measured on the H200
    (uneven lengths up to kv_len, µs chunked -> balanced): 32 x 32/8 heads KV 8192 D 64 103 -> 89
    at four stages (one CTA an SM; at D 64's three since session 33 it takes the chunks, 91.5
    against 89.4 balanced), 32 x 64/4 KV 65536 531 -> 502, 4 x 16/16 KV 65536 D 64 209 -> 203;
    with more or shorter units the chunks win (their many short CTAs balance on the GPU's
    scheduler, and the balanced split's merge is a launch they do not need): 256 x 8/1 KV 4096 78
    -> 83, 256 x 64/8 KV 513 75 -> 89; and single sequences, whose chunks are even anyway (32/32
    KV 8192 40.6 -> 44.7)."""
    return (p.batch > 1 and p.batch <= BALANCED_MAX_BATCH and p.kv_len >= BALANCED_MIN_TILES * block_n
            and p.batch * p.kv_heads * per_sm <= 2 * sm_count)


def chunk_tile_counts(kv_len: int, block_n: int) -> Iterator[int]:
    """The tile counts t that `plan_decode` prices, increasing, up to the first that makes one
    chunk: the smallest t of each run of t with the same chunk count n = ceil(n_tiles / t).
    Within a run the cost (waves · (t + 1.5) + the merge, the waves and the merge fixed by n)
    grows with t, so its least is the run's first: the pick of pricing every t from 1, in
    O(sqrt(n_tiles)) steps (a paged plan may be for 2^31 - 1 rows)."""
    n_tiles = -(-kv_len // block_n)
    t = 1
    while True:
        n_chunks = -(-n_tiles // t)
        yield t
        if n_chunks <= 1:
            return
        t = -(-n_tiles // (n_chunks - 1))


@functools.lru_cache(maxsize=1024, typed=True)   # (a bad 128.0 must not find the plan of 128)
def plan_decode(p: DecodeProblem, sm_count: int, smem_per_sm: int, chunk_size: int | None = None,
                stages: int | None = None, uneven: bool = False, balanced: bool | None = False,
                gathered: bool = False, tiny: bool = False) -> DecodePlan:
    """Choose the chunk size so that every SM has work and the last wave is full.

    Candidate chunks are any whole number of tiles, from one tile to the first count that makes
    the sequence one chunk (the chunk is a kernel argument: one kernel serves them all); a
    sequence has ceil(kv_len / chunk) chunks, the last the remainder, so no CTA streams more than
    a chunk (with kv_lens, whatever each sequence's length; a paged plan's graph replayed over
    longer requests gives the rest to the last chunk). Cost, in tile times: waves x (tiles
    per chunk + a tile and a half of prologue/epilogue) + `merge_cost` when split; the least
    cost's smallest chunk wins (`chunk_tile_counts` prices only the tile counts where it can be).
    `uneven`: the sequences' lengths are not known here (kv_lens on the device, pages): the cost
    is of full lengths still, but the smallest chunk within UNEVEN_SLACK of the least wins, as
    shorter CTAs end a batch of uneven lengths sooner (its longest sequences' CTAs are its tail).
    A split of at most 8 chunks merges them in thread block clusters where `cluster_pays`; a short
    split of few heads takes 2-8 chunks in clusters instead where `spread_tiles` finds them.
    `balanced` (at most BALANCED_MAX_BATCH sequences, padded or paged): instead of chunks, one round
    of CTAs (the GPU's slots) shares every sequence's and KV head's tiles evenly, the lengths read
    on the device; a CTA's share may cross sequences and heads, and decode_merge merges the units
    it splits. None: where `balanced_pays`, for uneven lengths and no chunk size given.
    `gathered`: pages gathered row by row, whose stages `decode_stages` chooses apart.
    `tiny`: decode_tiny may take the call where it is short (`tiny_pays`) and no chunk size, stages
    or balanced split is asked for (padded and paged caches alike: decode_tiny's kernel is the
    same for both, so the registry's paged kernels are planned without it).
    """
    block_n = tile_rows(p.head_dim, p.kv_len)
    heads_per_cta = min(p.group, MAX_HEADS_PER_CTA)
    one_tile = one_tile_ctas(p.kv_len, block_n, heads_per_cta, balanced)
    head_blocks = p.head_blocks
    units = p.batch * p.kv_heads * head_blocks
    if tiny and chunk_size is None and stages is None and not balanced and tiny_pays(p, heads_per_cta, units, sm_count):
        heads = tiny_heads(heads_per_cta)
        streams, rows = tiny_streams(p.head_dim, heads), tiny_rows(p.kv_len)
        return DecodePlan(chunk=rows, block_n=rows, stages=1, n_chunks=1, head_blocks=head_blocks,
                          heads_per_cta=heads_per_cta, merge_warps=1,
                          warps=tiny_threads(p.head_dim, heads, streams) // 32, tiny=True, streams=streams,
                          smem=tiny_smem_bytes(p.head_dim, rows, heads, streams))
    stages = stages or (1 if one_tile else decode_stages(p.head_dim, units, sm_count, gathered))
    one_stage = one_tile and stages == 1   # the one-tile CTAs' kernel (DecodePlan.one_tile)
    if one_stage and p.kv_len <= ONE_TILE_SHORT_ROWS:
        block_n = ONE_TILE_SHORT_ROWS
    warps = ONE_TILE_WARPS if one_stage else WARPS
    slots = sm_count * ctas_per_sm(p.head_dim, block_n, stages, smem_per_sm, heads_per_cta, warps)
    n_tiles = -(-p.kv_len // block_n)
    if chunk_size is not None:
        if not is_int(chunk_size) or not 0 < chunk_size <= MAX_CHUNK_ROWS or chunk_size % block_n:
            raise ValueError(f"chunk_size must be a positive multiple of {block_n} (the tile rows for "
                             f"head_dim {p.head_dim} at kv_len {p.kv_len}) below 2^31; got {chunk_size!r}")
        tiles = min(chunk_size // block_n, n_tiles)   # a chunk past the longest sequence is that sequence
    else:
        costs = []   # (cost, tiles), tiles increasing
        for tiles in chunk_tile_counts(p.kv_len, block_n):
            n_chunks = -(-n_tiles // tiles)
            waves = -(-(n_chunks * units) // slots)
            costs.append((waves * (tiles + 1.5) + (merge_cost(n_chunks) if n_chunks > 1 else 0.0), tiles))
        least = min(costs)[0] * (1 + UNEVEN_SLACK if uneven else 1)
        tiles = next(t for cost, t in costs if cost <= least)
    n_chunks = -(-n_tiles // tiles)
    spread = 0 if chunk_size is not None or uneven or balanced or n_chunks == 1 else spread_tiles(units, n_tiles, slots)
    if spread:
        tiles, n_chunks = spread, -(-n_tiles // spread)
    if balanced is None:
        balanced = uneven and chunk_size is None and balanced_pays(p, block_n, slots // sm_count, sm_count)
    if balanced:
        if p.batch > BALANCED_MAX_BATCH:
            raise ValueError(f"balanced=True reads at most {BALANCED_MAX_BATCH} sequences; got batch {p.batch}")
        units = p.batch * p.kv_heads
        return DecodePlan(chunk=block_n, block_n=block_n, stages=stages, n_chunks=1, head_blocks=head_blocks,
                          heads_per_cta=heads_per_cta, smem=smem_bytes(p.head_dim, block_n, stages),
                          merge_warps=merge_warps(merge_rows(p, slots), p.head_dim, -(-slots // units) + 1, sm_count),
                          balanced=slots)
    return DecodePlan(chunk=tiles * block_n, block_n=block_n, stages=stages, n_chunks=n_chunks, head_blocks=head_blocks,
                      heads_per_cta=heads_per_cta, smem=smem_bytes(p.head_dim, block_n, stages),
                      warps=warps,
                      merge_warps=merge_warps(merge_rows(p, 0), p.head_dim, n_chunks, sm_count),
                      cluster=merge_cluster(n_chunks) if spread or cluster_pays(tiles, n_chunks * units, slots) else 0,
                      box_rows=PADDED_BOX_ROWS if uneven and block_n > PADDED_BOX_ROWS else 0,
                      one_tile=one_stage, self_gather=one_stage)


@functools.lru_cache(maxsize=1024)
def decode_spec(p: DecodeProblem, plan: DecodePlan, arch: str, page_size: int = 0) -> runtime.KernelSpec:
    """The kernel of `plan` (whatever its chunk: an argument); `page_size` > 0 reads a paged cache
    (gathered where `plan.gathers` it)."""
    if plan.tiny:
        return runtime.KernelSpec.make("decode_tiny", {
            "D": p.head_dim, "DTYPE": CTYPES[p.dtype], "ROWS": plan.block_n, "HEADS": tiny_heads(plan.heads_per_cta),
            "HY": tiny_side_by_side(p.head_dim, tiny_heads(plan.heads_per_cta), plan.streams), "HZ": plan.streams},
            arch, kernels=("decode_tiny",))
    return runtime.KernelSpec.make("decode", {
        "D": p.head_dim, "DTYPE": CTYPES[p.dtype], "BLOCK_N": plan.block_n, "STAGES": plan.stages,
        "WARPS": plan.warps, "TRANSPOSED": transposed(plan.heads_per_cta), "SPLIT": plan.split, "PAGE": page_size,
        "GATHER": plan.gathers(page_size), "SELF_GATHER": plan.self_gather, "CLUSTER": plan.cluster,
        **({"PADDED_BOX_ROWS": plan.box_rows} if plan.box_rows and not page_size and not plan.self_gather else {}),
        **({"TAIL_ROWS": PAGED_TAIL_ROWS} if page_size > PAGED_TAIL_ROWS and not plan.gathers(page_size) else {}),
        **({"BOX_MAJOR": True} if box_major(plan, page_size, p.head_dim) else {}),
        **({"BALANCED": BALANCED_MAX_BATCH, "UNIT_COST": BALANCED_UNIT_COST} if plan.balanced else {"BALANCED": 0}),
        "MERGE_THREADS": MERGE_THREADS,
        "MERGE_COLUMNS": MERGE_COLUMNS}, arch,
        kernels=("decode_partial", "decode_merge") if plan.merge_launch else ("decode_partial",))


def layouts(batched: bool, kv_layout: str) -> tuple[str, str]:
    """How q (and out) and k, v are laid out, for messages."""
    lead = "batch, " if batched else ""
    kv = "kv_len, num_kv_heads" if kv_layout == "NHD" else "num_kv_heads, kv_len"
    return f"[{lead}num_qo_heads, head_dim]", f"[{lead}{kv}, head_dim]"


def kv_view(a: DeviceArray, batched: bool, kv_layout: str) -> tuple[tuple, tuple]:
    """K or V as (batch, kv_len, kv_heads, head_dim) sizes and element strides, whatever the layout."""
    shape, strides = tuple(a.shape), tuple(a.strides)
    if not batched:
        shape, strides = (1,) + shape, (0,) + strides
    if kv_layout == "HND":
        shape, strides = (shape[0], shape[2], shape[1], shape[3]), (strides[0], strides[2], strides[1], strides[3])
    return shape, strides


def check_grid(p: DecodeProblem) -> None:
    """The grid's z (batch x head blocks) within CUDA's limit."""
    if p.batch * p.head_blocks > MAX_GRID_Z:
        raise ValueError(f"batch {p.batch} is too large: batch x ceil(group / {MAX_HEADS_PER_CTA}) must be "
                         f"at most {MAX_GRID_Z}")


def check_out(out: DeviceArray | None, q: DeviceArray, q_layout: str, arrays: dict) -> None:
    """`out`, when given, shaped and typed as q, rows 8-byte aligned; added to `arrays`."""
    if out is not None:
        check_shape(out, "out", q.shape, q_layout)
        if out.dtype != q.dtype:
            raise TypeError(f"out must have the dtype of q ({q.dtype}); got {out.dtype}")
        check_inner_contiguous(out, "out")
        check_aligned(out, "out", 8)
        arrays["out"] = out


def validate_decode(q: DeviceArray, k: DeviceArray, v: DeviceArray, out: DeviceArray | None,
                    kv_lens: DeviceArray | None = None, *, batched: bool = False, kv_layout: str = "NHD") -> DecodeProblem:
    """Check the layout name, dtypes, ranks, shapes, head ratio, head dim, strides and alignment; no GPU needed."""
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}; got {kv_layout!r}")
    q_layout, kv_layout_text = layouts(batched, kv_layout)
    check_ndim(q, "q", 2 + batched, q_layout)
    check_ndim(k, "k", 3 + batched, kv_layout_text)
    check_ndim(v, "v", 3 + batched, kv_layout_text)
    check_dtype(q, "q", DTYPES)
    for name, a in (("k", k), ("v", v)):
        if a.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}); got {a.dtype}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    hq, d = q.shape[-2:]
    (b, s, hkv, dk), _ = kv_view(k, batched, kv_layout)
    if batched and q.shape[0] != b:
        raise ValueError(f"q and k must have the same batch size; got {q.shape[0]} and {b}")
    if dk != d:
        raise ValueError(f"k/v head_dim {dk} must equal q's head_dim {d}")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}; got {d}")
    if b < 1:
        raise ValueError(f"the batch must hold at least one sequence; got batch {b}")
    if s < 1:
        raise ValueError(f"k/v must hold at least one KV row; got kv_len {s}")
    if hkv < 1 or hq < 1 or hq % hkv:
        raise ValueError(f"num_qo_heads ({hq}) must be a multiple of num_kv_heads ({hkv})")
    p = DecodeProblem(kv_len=s, q_heads=hq, kv_heads=hkv, head_dim=d, dtype=q.dtype, batch=b)
    check_grid(p)
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_inner_contiguous(a, name)
        check_aligned(a, name, 16)
    arrays = {"q": q, "k": k, "v": v}
    check_out(out, q, q_layout, arrays)
    if kv_lens is not None:
        check_dtype(kv_lens, "kv_lens", ("int32",))
        check_shape(kv_lens, "kv_lens", (b,), "[batch]")
        check_contiguous(kv_lens, "kv_lens")
        check_aligned(kv_lens, "kv_lens", 4)
        arrays["kv_lens"] = kv_lens
    check_same_device(arrays)
    return p


# decode_partial's parameters, in order, as `runtime.signature` gives them: q and its (batch, head)
# strides, the K and V tensor maps (whole tiles, then a segment's partial last tile: `tail_maps`),
# kv_lens, kv_len, group, heads per CTA, head blocks, scale, the split workspace (partial o,
# partial lse), out and its strides, lse; then a paged cache's page table (kv_indptr,
# kv_indices), K and V, and the pages' count and (page, row, head) strides; last, the plan's chunk
# (KV rows per CTA), the KV heads, the batch and the page ids per request plan() copied after
# kv_indptr's entries (0: none)
KERNEL_SIGNATURE = (int, np.int64, np.int64, 128, 128, 128, 128, int, np.int32, np.int32, np.int32, np.int32,
                    np.float32, int, int, int, np.int64, np.int64, int, int, int, int, int, np.int32, np.int64,
                    np.int64, np.int64, np.int32, np.int32, np.int32, np.int32)
# decode_merge's: the workspace (partial o, partial lse), kv_lens, kv_len, query heads, the
# partial grid's x (chunks, or the balanced split's CTAs), the chunk, out and its strides, lse,
# warps per row, rows (merge_rows; balanced: B · q_heads of them are by unit, fewer by CTA), KV heads, batch
MERGE_SIGNATURE = (int, int, int, np.int32, np.int32, np.int32, np.int32, int, np.int64, np.int64, int, np.int32,
                   np.int64, np.int32, np.int32)
# decode_tiny's: q and its strides, k, v and their (batch or page, row, head) strides, kv_lens, kv_len,
# group, scale, out and its strides, lse, and a paged cache's first page entries, page ids (both null:
# padded), page count, log2 of the page size and the page ids per request copied after the first entries
TINY_SIGNATURE = (int, np.int64, np.int64, int, int) + (np.int64,) * 6 + (int, np.int32, np.int32, np.float32, int,
                                                                           np.int64, np.int64, int, int, int,
                                                                           np.int32, np.int32, np.int32)
# what a call gives its launches anew (runtime.CallValues), in this order (the kernels' names); all
# else is the prepared call's
CALL_VALUES = ("q", "k_map", "v_map", "k_tail_map", "v_tail_map", "kv_lens", "ws_o", "ws_lse", "out", "lse",
               "kv_indptr", "kv_indices", "k_cache", "v_cache")
CALL_SIGNATURE = (int, 128, 128, 128, 128) + (int,) * 9
PER_CALL = {name: runtime.PerCall(i) for i, name in enumerate(CALL_VALUES)}


def plan_for(p: DecodeProblem, device: int, chunk_size: int | None, stages: int | None, page_size: int = 0,
             uneven: bool = False, balanced: bool | None = False,
             kv_strides_alike: bool = True) -> tuple[DecodePlan, runtime.KernelSpec]:
    """The plan of `p` on `device` (its shared memory within the device's; `uneven`: lengths not
    known here; `balanced`: the balanced split, None the planner's choice) and the spec of its
    kernel (paged with `page_size` > 0). A padded K and V of different strides are read by TMA
    (`kv_strides_alike` False: the warps' gather takes one set of strides for both)."""
    dev = runtime.device_info(device)
    plan = plan_decode(p, dev.sm_count, dev.smem_per_sm, chunk_size, stages, uneven, balanced, is_gathered(page_size),
                       tiny=True)
    if plan.self_gather and not page_size and not kv_strides_alike:
        plan = replace(plan, self_gather=False)
    if plan.smem > dev.smem_per_block_optin:
        raise ValueError(f"stages={plan.stages} needs {plan.smem} bytes of shared memory per block; "
                         f"the device allows {dev.smem_per_block_optin}")
    return plan, decode_spec(p, plan, dev.arch, page_size)


def kv_tensor_maps(a: DeviceArray, name: str, batched: bool, kv_layout: str, box_rows: int,
                   box_major: bool = False) -> runtime.TiledMaps:
    """4-D maps (head_dim, kv_heads, kv_len, batch) with 64-column, box_rows-row, 128-byte-swizzled
    boxes, for arrays laid out as `a`; `box_major`: 5-D maps (64, kv_len, head_dim / 64, kv_heads,
    batch) whose box holds box_rows rows of every 64-column sub-tile (decode.cu.j2's BOX_MAJOR).

    The strides come from the array in whatever order its layout has them; a dimension of size 1
    is never stepped along, so it gets a stride TMA accepts."""
    (b, s, h, d), (sb, ss, sh, _) = kv_view(a, batched, kv_layout)
    item = 2   # bytes an element (bf16, fp16)

    def strides(*dims):   # in bytes, from each (element stride, size) of the dimensions past the first
        return tuple((st if n > 1 else d) * item for st, n in dims)
    # No L2 promotion: a 256-byte fetch per 128-byte box row cost 7 % of the stream (ncu: 89 % of
    # DRAM peak with it, L2 hit rate 26 %; 96 % without, as cuDNN's kernel reads).
    if box_major:
        return runtime.TiledMaps(name, a.dtype, (64, s, d // 64, h, b),
                                 strides((ss, s), (64, d // 64), (sh, h), (sb, b)), (64, box_rows, d // 64, 1, 1),
                                 swizzle=128)
    return runtime.TiledMaps(name, a.dtype, (d, h, s, b), strides((sh, h), (ss, s), (sb, b)), (64, 1, box_rows, 1),
                             swizzle=128)


def kv_map_pair(k: DeviceArray, v: DeviceArray, names: tuple[str, str], batched: bool, kv_layout: str,
                box_rows: int, box_major: bool = False) -> tuple[runtime.TiledMaps, runtime.TiledMaps]:
    """The maps of K and V in boxes of box_rows rows (`kv_tensor_maps`), their geometries checked
    before any launch (TensorMapError names the argument)."""
    maps = tuple(kv_tensor_maps(a, name, batched, kv_layout, box_rows, box_major) for a, name in zip((k, v), names))
    maps[0](k.ptr), maps[1](v.ptr)
    return maps


def row_strides(strides: tuple, batched: bool) -> tuple[np.int64, np.int64]:
    """Batch and head strides (elements) of q or out; a single sequence has no batch stride."""
    return np.int64(strides[0] if batched else 0), np.int64(strides[-2])


NO_PAGES = (np.int32(0), np.int64(0), np.int64(0), np.int64(0))   # a padded cache's page count and strides


def no_map(ptr: int) -> bytes:
    """The tensor map slot of a cache no TMA reads (a gathered paged cache, decode_tiny's rows):
    zeros, whatever the address, so a new address costs no encode."""
    return bytes(128)


class DecodeCall(NamedTuple):
    """A prepared call: what its launch needs besides the pointers, the outputs, the workspace,
    the tensor maps of the call's K and V and the stream."""
    problem: DecodeProblem
    plan: DecodePlan
    values: runtime.CallValues  # the buffer of CALL_VALUES the launch reads
    launches: tuple             # the kernel, bound to its constants
    k_maps: runtime.TiledMaps   # (or `no_map` where no TMA reads the cache)
    v_maps: runtime.TiledMaps
    k_tail_maps: runtime.TiledMaps   # a padded segment's last, partial tile in boxes (or k_maps, v_maps)
    v_tail_maps: runtime.TiledMaps
    rows: tuple                 # query rows of out and lse: (batch, heads) or (heads,)
    workspace_bytes: int        # 0 without a split or in clusters; else the partial outputs (fp32), then
    lse_offset: int             # the partial lse from this byte


def workspace_layout(p: DecodeProblem, plan: DecodePlan) -> tuple[int, int]:
    """Bytes of a call's workspace and where its lse starts. 0 without a split or with its merge
    in clusters; else the partial outputs (fp32, [rows, head_dim]), then the partial lse [rows]:
    [batch, q_heads, chunks] rows, or the balanced split's [CTAs + units, group] (units = batch x
    KV heads) and after them each unit's (first CTA, pieces), two int32, and each CTA's split unit
    (int32: the unit it shares with the CTA before it, or -1)."""
    if not plan.merge_launch:
        return 0, 0
    units = p.batch * p.kv_heads
    n_part = (plan.balanced + units) * p.group if plan.balanced else p.batch * p.q_heads * plan.n_chunks
    lse_offset = n_part * p.head_dim * 4
    return lse_offset + n_part * 4 + (4 * (2 * units + plan.balanced) if plan.balanced else 0), lse_offset


def row_params(p: DecodeProblem, plan: DecodePlan, scale: float, max_rows: int) -> tuple:
    """The kernel's kv_len (rows are clamped to it), group, heads per CTA, head blocks and scale."""
    i32 = np.int32
    return i32(max_rows), i32(p.group), i32(plan.heads_per_cta), i32(plan.head_blocks), np.float32(scale)


def decode_call(p: DecodeProblem, plan: DecodePlan, spec: runtime.KernelSpec, q: DeviceArray, out: DeviceArray | None,
                batched: bool, k_maps, v_maps, scale: float, max_rows: int, pages: tuple = NO_PAGES,
                tail_maps: tuple | None = None, kv_strides: tuple = (), page_size: int = 0,
                snap_width: int = 0) -> DecodeCall:
    """The prepared call of `plan`: the kernels of `spec` (compiled on first use) bound to their
    constants: q's and out's row strides (out given, or new and contiguous), the row
    parameters (`row_params`), a paged cache's page count and strides (`pages`) and the plan's
    chunk (the last argument); with a split of more chunks than a cluster holds, decode_merge after
    decode_partial. `k_maps`,
    `v_maps`: the tensor maps of K and V by address (TiledMaps; decode_tiny reads none); `tail_maps`, those of a segment's
    last, partial tile in boxes of plan.box_rows rows (None: the same); `kv_strides`, decode_tiny's
    (batch or page, row, head) element strides of K, then V; `page_size`, a paged cache's (0: padded);
    `snap_width`, the page ids per request that plan() copied after a paged cache's first page entries
    (decode_tiny and the one-tile CTAs read their first rows' there)."""
    rows = (p.batch, p.q_heads) if batched else (p.q_heads,)
    out_strides = out.strides if out is not None else contiguous_strides(rows + (p.head_dim,))
    at = PER_CALL   # at["q"]: the argument the launch reads from the call's value "q"
    values = runtime.CallValues(CALL_SIGNATURE)
    if plan.tiny:
        i32 = np.int32
        args = (at["q"], *row_strides(q.strides, batched), at["k_cache"], at["v_cache"], *map(np.int64, kv_strides),
                at["kv_lens"], i32(max_rows), i32(p.group), np.float32(scale), at["out"],
                *row_strides(out_strides, batched), at["lse"], at["kv_indptr"], at["kv_indices"], pages[0],
                i32(page_shift(page_size)), i32(snap_width))
        launches = (bound_launch(spec, q.device, values, "decode_tiny", TINY_SIGNATURE, args, plan.grid(p),
                                 plan.threads, plan.smem),)
        return DecodeCall(p, plan, values, launches, no_map, no_map, no_map, no_map, rows, 0, 0)
    args = (at["q"], *row_strides(q.strides, batched), at["k_map"], at["v_map"], at["k_tail_map"], at["v_tail_map"],
            at["kv_lens"],
            *row_params(p, plan, scale, max_rows), at["ws_o"], at["ws_lse"], at["out"],
            *row_strides(out_strides, batched), at["lse"], at["kv_indptr"], at["kv_indices"], at["k_cache"],
            at["v_cache"], *pages, np.int32(plan.chunk), np.int32(p.kv_heads), np.int32(p.batch), np.int32(snap_width))
    launches = (bound_launch(spec, q.device, values, "decode_partial", KERNEL_SIGNATURE, args,
                             plan.grid(p), plan.threads, plan.smem),)
    if plan.merge_launch:
        i32 = np.int32
        n_rows = merge_rows(p, plan.balanced)
        rows_per_cta = MERGE_WARPS // plan.merge_warps
        merge_args = (at["ws_o"], at["ws_lse"], at["kv_lens"], i32(max_rows), i32(p.q_heads), i32(plan.grid_chunks),
                      i32(plan.chunk), at["out"], *row_strides(out_strides, batched), at["lse"],
                      i32(plan.merge_warps), np.int64(n_rows), i32(p.kv_heads), i32(p.batch))
        launches += (bound_launch(spec, q.device, values, "decode_merge", MERGE_SIGNATURE, merge_args,
                                  (-(-n_rows // rows_per_cta), p.head_dim // MERGE_COLUMNS, 1), MERGE_THREADS, 0),)
    return DecodeCall(p, plan, values, launches, k_maps, v_maps, *(tail_maps or (k_maps, v_maps)), rows,
                      *workspace_layout(p, plan))


def check_balanced(balanced, chunk_size) -> None:
    """`balanced` is None (the planner's choice) or a bool, and True leaves no chunk size to set."""
    if balanced is not None and not isinstance(balanced, bool):
        raise TypeError(f"balanced must be None, True or False; got {balanced!r}")
    if balanced and chunk_size is not None:
        raise ValueError("chunk_size sets the chunks of the chunked split; balanced=True has none (give one or the other)")


def prepare_decode(q, k, v, out, kv_lens, batched, kv_layout, scale, chunk_size, stages, balanced=None) -> DecodeCall:
    """Validate a call and make everything its launch needs but the pointers, the outputs, the
    workspace, the tensor maps of the call's K and V and the stream. The output, when `out` is
    None, is new and contiguous."""
    p = validate_decode(q, k, v, out, kv_lens, batched=batched, kv_layout=kv_layout)
    scale = resolve_scale(scale, p.head_dim)
    check_stages(stages)
    check_balanced(balanced, chunk_size)
    runtime.require_gpu()
    uneven = kv_lens is not None and p.batch > 1
    strides = tuple(kv_view(a, batched, kv_layout)[1][:3] for a in (k, v))   # (batch, row, head) of K, then V
    plan, spec = plan_for(p, q.device, chunk_size, stages, uneven=uneven, balanced=balanced,
                          kv_strides_alike=strides[0] == strides[1])

    kv_maps = functools.partial(kv_map_pair, k, v, ("k", "v"), batched, kv_layout)   # (box_rows)
    whole = kv_maps(plan.block_n)   # (decode_tiny and the warps' gather read none, but take the strides TMA takes)
    # the warps' gather: the batch as the "pages", K's strides (V's alike)
    rows = (np.int32(p.batch), *map(np.int64, strides[0])) if plan.self_gather else NO_PAGES
    return decode_call(p, plan, spec, q, out, batched, *whole, scale, p.kv_len, pages=rows,
                       tail_maps=kv_maps(plan.box_rows) if plan.box_rows and not plan.self_gather else None,
                       kv_strides=sum(strides, ()))


ARGUMENTS = ("q", "k", "v", "out", "kv_lens")
REQUIRED = 3   # q, k, v
# prepared calls by the arguments' key (CallArrays) and the settings: a repeated call is one key compare
PREPARED = Memo(lambda arrays, settings: prepare_decode(*arrays.views(), *settings))


def single_decode_with_kv_cache(q, k, v, *, kv_layout: str = "NHD", scale: float | None = None, out=None,
                                return_lse: bool = False, stream=None, chunk_size: int | None = None,
                                stages: int | None = None):
    """Decode attention of one query token per head: softmax(scale · q Kᵀ) V.

    q: [num_qo_heads, head_dim]; k, v: [kv_len, num_kv_heads, head_dim] ("NHD") or
    [num_kv_heads, kv_len, head_dim] ("HND") (strided views of a larger cache allowed where TMA
    can express them); bf16 or fp16; head_dim 64, 128 or 256; num_qo_heads a multiple of
    num_kv_heads (query head i reads KV head i // group).
    Returns o [num_qo_heads, head_dim] in q's framework (or `out`), and with `return_lse`
    also the natural-log log-sum-exp of the scaled scores, [num_qo_heads] fp32.
    `chunk_size` (KV rows per CTA, a multiple of the pipeline tile: 128 rows for head_dim 64, else
    64, and 64 for any kv_len <= 64) and `stages` override the planner.
    """
    return flash_decode(q, k, v, batched=False, kv_layout=kv_layout, scale=scale, out=out,
                        return_lse=return_lse, stream=stream, chunk_size=chunk_size, stages=stages)


def batch_decode_with_padded_kv_cache(q, k, v, *, kv_layout: str = "NHD", kv_lens=None, scale: float | None = None,
                                      out=None, return_lse: bool = False, stream=None, chunk_size: int | None = None,
                                      stages: int | None = None, balanced: bool | None = None):
    """Decode attention of one query token per head for a batch of sequences padded to one length.

    q: [batch, num_qo_heads, head_dim]; k, v: [batch, kv_len, num_kv_heads, head_dim] ("NHD") or
    [batch, num_kv_heads, kv_len, head_dim] ("HND"), strided views allowed where TMA can express
    them. `kv_lens` [batch] int32 on the device (each <= kv_len; read by the kernel, never by the
    host) gives each sequence's length; rows past it are never used (they may hold anything), and
    a length of 0 gives zeros and an LSE of -inf; the planner then assumes uneven lengths (shorter
    chunks, a few % slower if every sequence is in fact kv_len long). Returns o [batch,
    num_qo_heads, head_dim], and with `return_lse` also the natural-log LSE [batch, num_qo_heads]
    fp32. `balanced=True` splits the work evenly over one round of CTAs instead of in chunks per
    sequence: each CTA streams the same number of KV tiles, its share crossing sequences and KV
    heads where it falls (the lengths are read on the device; at most 1024 sequences); False keeps
    the chunks; None leaves it to the planner. Other arguments as in `single_decode_with_kv_cache`.
    """
    return flash_decode(q, k, v, batched=True, kv_layout=kv_layout, kv_lens=kv_lens, scale=scale, out=out,
                        return_lse=return_lse, stream=stream, chunk_size=chunk_size, stages=stages,
                        balanced=balanced)


def flash_decode(q, k, v, *, batched: bool, kv_layout: str = "NHD", kv_lens=None, scale: float | None = None,
                 out=None, return_lse: bool = False, stream=None, chunk_size: int | None = None,
                 stages: int | None = None, balanced: bool | None = None):
    """The one code path of both ops: one launch, and with a split of more chunks than a cluster
    holds (or a balanced split) a second that merges the pieces of each query row."""
    arrays = CallArrays((q, k, v, out, kv_lens), ARGUMENTS, REQUIRED)
    settings = (batched, kv_layout, scale, chunk_size, stages, balanced)
    call = PREPARED.get(prepared_key(arrays.key, settings, (chunk_size, stages, balanced)), arrays, settings)
    return launch(call, arrays, stream, out, return_lse, arrays.ptrs[4])


def launch(call: DecodeCall, arrays: CallArrays, stream, out, return_lse: bool, kv_lens: int, page_table=(0, 0)):
    """Launch a prepared call on arrays (q, k, v, out, ...) with the device pointers of the rows
    per sequence (`kv_lens`, 0 for all) and of a paged cache's (kv_indptr, kv_indices); the
    output (new unless `out`), the LSE with `return_lse` and the workspace of a split are made
    here. Returns o, or (o, lse)."""
    strm = arrays.stream(stream)
    q_p, k_p, v_p, o_p = arrays.ptrs[:4]   # 0 for None
    if out is None:
        out, o_p = arrays.new_empty(0, call.rows + (call.problem.head_dim,), call.problem.dtype)
    lse, lse_p = arrays.new_empty(0, call.rows, "float32") if return_lse else (None, 0)
    ws_o = ws_lse = 0
    if call.workspace_bytes:   # `scratch` owns the memory until the launches are enqueued
        scratch, ws_o = runtime.workspace(arrays.objs[0], strm, call.workspace_bytes)
        ws_lse = ws_o + call.lse_offset
    call.values.launch((q_p, call.k_maps(k_p), call.v_maps(v_p), call.k_tail_maps(k_p), call.v_tail_maps(v_p),
                        kv_lens, ws_o, ws_lse, o_p, lse_p, *page_table, k_p, v_p), call.launches, strm)   # CALL_VALUES
    out = arrays.result(out)
    return (out, arrays.result(lse)) if return_lse else out
