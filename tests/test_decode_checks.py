"""CPU tests of flash-decoding argument checks and planning (no GPU needed)."""
import dataclasses

import numpy as np
import pytest

import pykda
from pykda.ops import decode
from pykda.ops.decode import (SPREAD_MAX_TILES, SPREAD_MIN_CTAS, TILE_ROWS, DecodeProblem, plan_decode,
                               validate_decode)
from fakes import BASE, device_array as arr
from pykda.runtime.arrays import as_device_array



def good(S=100, hq=32, hkv=8, d=128, dtype="bfloat16"):
    return arr((hq, d), dtype), arr((S, hkv, d), dtype), arr((S, hkv, d), dtype)


def test_valid_problem_is_described():
    p = validate_decode(*good(), None)
    assert (p.kv_len, p.q_heads, p.kv_heads, p.head_dim, p.group) == (100, 32, 8, 128, 4)


def test_hnd_layout_is_described():
    q, k, v = arr((32, 128)), arr((8, 100, 128)), arr((8, 100, 128))
    p = validate_decode(q, k, v, None, kv_layout="HND")
    assert (p.kv_len, p.kv_heads, p.batch) == (100, 8, 1)


def test_strided_view_of_a_larger_cache_is_accepted():
    q, k, v = good()
    big = arr((100, 8, 256))   # k = cache[:, :, :128] of a [100, 8, 256] cache
    k = arr((100, 8, 128), strides=big.strides)
    validate_decode(q, k, v, None)


@pytest.mark.parametrize("case, exc, message", [
    ("q_dtype", TypeError, "q must have dtype bfloat16 or float16; got float32"),
    ("kv_dtype", TypeError, "k must have the dtype of q"),
    ("q_rank", ValueError, "q must be 2-D"),
    ("k_rank", ValueError, "k must be 3-D"),
    ("ratio", ValueError, r"num_qo_heads \(30\) must be a multiple of num_kv_heads \(8\)"),
    ("d96", ValueError, r"head_dim must be one of \(64, 128, 256\); got 96"),
    ("s0", ValueError, "at least one KV row"),
    ("kv_mismatch", ValueError, "k and v must have the same shape"),
    ("qk_dim", ValueError, "must equal q's head_dim"),
    ("misaligned", ValueError, "k must start at a 16-byte aligned address"),
    ("stride16", ValueError, "k: stride 1004 of dim 0 is 2008 bytes; it must be a multiple of 16"),
    ("inner", ValueError, "v must be contiguous in its last dimension"),
    ("device", ValueError, "all arrays must be on one device"),
    ("out_shape", ValueError, "out must have shape"),
    ("out_dtype", TypeError, "out must have the dtype of q"),
    ("layout", ValueError, r"kv_layout must be one of \('NHD', 'HND'\); got 'BHSD'"),
    ("layout_type", ValueError, r"kv_layout must be one of \('NHD', 'HND'\); got None"),
    ("k_rank_hnd", ValueError, r"k must be 3-D \[num_kv_heads, kv_len, head_dim\]"),
])
def test_bad_input_names_the_argument(case, exc, message):
    q, k, v = good()
    out = None
    layout = "NHD"
    if case == "q_dtype":
        q = arr((32, 128), "float32")
    elif case == "kv_dtype":
        k = arr((100, 8, 128), "float16")
    elif case == "q_rank":
        q = arr((1, 32, 128))
    elif case == "k_rank":
        k = arr((100, 1024))
    elif case == "ratio":
        q = arr((30, 128))
    elif case == "d96":
        q, k, v = good(d=96)
    elif case == "s0":
        q, k, v = good(S=0)
    elif case == "kv_mismatch":
        v = arr((99, 8, 128))
    elif case == "qk_dim":
        q = arr((32, 64))
    elif case == "misaligned":
        k = arr((100, 8, 128), ptr=BASE + 8)
    elif case == "stride16":
        k = arr((100, 8, 128), strides=(1004, 128, 1))
    elif case == "inner":
        v = arr((100, 8, 128), strides=(2048, 256, 2))
    elif case == "device":
        v = arr((100, 8, 128), device=1)
    elif case == "out_shape":
        out = arr((32, 64))
    elif case == "out_dtype":
        out = arr((32, 128), "float16")
    elif case == "layout":
        layout = "BHSD"
    elif case == "layout_type":
        layout = None
    elif case == "k_rank_hnd":
        k, layout = arr((8, 100, 128, 1)), "HND"
    with pytest.raises(exc, match=message):
        validate_decode(q, k, v, out, kv_layout=layout)


def test_host_numpy_arrays_are_refused_by_name():
    with pytest.raises(TypeError, match="q must be a GPU array"):
        pykda.single_decode_with_kv_cache(np.zeros((32, 128), np.float16), np.zeros((4, 8, 128), np.float16),
                                          np.zeros((4, 8, 128), np.float16))


def test_non_arrays_are_refused_by_name():
    with pytest.raises(TypeError, match="k must be a GPU array"):
        as_device_array(object(), "k")


def test_cpu_torch_tensor_is_refused_by_name():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="q must be a CUDA tensor"):
        as_device_array(torch.zeros(4), "q")


# ---- planning ----
H200 = dict(sm_count=132, smem_per_sm=233472)


@pytest.mark.parametrize("S, hq, hkv", [(1, 32, 32), (15, 8, 1), (8192, 32, 32), (131073, 32, 8), (131072, 32, 32)])
def test_plan_covers_every_row_and_fills_the_gpu(S, hq, hkv):
    p = DecodeProblem(S, hq, hkv, 128, "bfloat16")
    plan = plan_decode(p, **H200)
    # (sequences within ONE_TILE_SHORT_ROWS rows: one tile of that many)
    tile = decode.ONE_TILE_SHORT_ROWS if S <= decode.ONE_TILE_SHORT_ROWS else TILE_ROWS[128]
    assert plan.chunk % tile == 0 and plan.block_n == tile
    # ceil(kv_len / chunk) chunks, the last the remainder (at most a chunk; a single chunk may be
    # short): every row in a chunk, no chunk empty (131073 rows: the last chunk of one row, 131072:
    # 33 chunks of 63 tiles, the last of 32; see test_plan_takes_chunks_of_any_tile_count)
    assert plan.n_chunks == -(-S // plan.chunk)
    assert (plan.n_chunks - 1) * plan.chunk < S <= plan.n_chunks * plan.chunk
    ctas = plan.n_chunks * hkv * plan.head_blocks
    if S >= 8192 and not plan.cluster:   # (one CTA an SM at 4 stages: 32 KV heads x 4 chunks on 132 SMs)
        assert ctas >= 0.95 * 132, "every SM but a few gets work"
    assert plan.split == (plan.n_chunks > 1)


@pytest.mark.parametrize("S, hq, hkv, d, chunks", [(8192, 16, 16, 128, 4), (4096, 32, 8, 128, 8), (16384, 32, 8, 128, 8),
                                                   (4097, 128, 8, 256, 8), (32768, 16, 16, 64, 8)])
def test_short_splits_of_few_ctas_spread_in_clusters(S, hq, hkv, d, chunks):
    """Where 2-8 chunks of at most SPREAD_MAX_TILES tiles, in clusters, fill at most half the
    GPU's slots with at least SPREAD_MIN_CTAS CTAs, those are the plan (spread_tiles' measurements)."""
    plan = plan_decode(DecodeProblem(S, hq, hkv, d, "bfloat16"), **H200)
    n_tiles = -(-S // plan.block_n)
    assert (plan.n_chunks, plan.cluster) == (chunks, chunks)
    assert plan.chunk == -(-n_tiles // chunks) * plan.block_n <= SPREAD_MAX_TILES * plan.block_n
    assert chunks * hkv * plan.head_blocks >= SPREAD_MIN_CTAS
    assert not plan.merge_launch


@pytest.mark.parametrize("S, hq, hkv, d", [(50000, 64, 8, 128), (65536, 128, 8, 128), (131072, 16, 16, 64),
                                           (65537, 8, 1, 256), (131072, 32, 8, 128)])
def test_long_chunks_or_many_ctas_keep_the_cost_pick(S, hq, hkv, d, request):
    """Chunks of more than SPREAD_MAX_TILES tiles (they stream slower on few SMs) and grids of
    under SPREAD_MIN_CTAS CTAs keep the cost's pick: the plan of a planner without the rule."""
    p = DecodeProblem(S, hq, hkv, d, "bfloat16")
    plan = plan_decode(p, **H200)
    request.getfixturevalue("cost_pick")
    assert plan == plan_decode(p, **H200)


def test_spread_only_where_the_planner_picks_the_chunks():
    """A chunk size given, or lengths on the device (uneven), keep the cost's chunks."""
    p = DecodeProblem(8192, 32, 32, 64, "bfloat16")
    assert plan_decode(p, **H200).cluster == 4
    assert plan_decode(p, **H200, uneven=True).n_chunks == 8 and plan_decode(p, **H200, uneven=True).cluster == 0
    assert plan_decode(p, **H200, chunk_size=1024).n_chunks == 8


def test_plan_groups_query_heads_per_kv_head():
    plan = plan_decode(DecodeProblem(1000, 64, 2, 128, "float16"), **H200)
    assert plan.heads_per_cta == 16 and plan.head_blocks == 2


@pytest.mark.parametrize("hq, hkv, heads_per_cta, transposed", [
    (32, 32, 1, True), (24, 8, 3, True), (32, 4, 8, True),   # groups of at most 8: Sᵀ = K·qᵀ, Oᵀ += Vᵀ·Pᵀ
    (64, 4, 16, False), (64, 2, 16, False),                 # 16 heads a CTA (two head blocks of 32)
    (48, 2, 16, False),   # a group of 24: CTAs of 16 and 8 heads run one kernel, sized for 16
])
def test_ctas_of_at_most_8_query_heads_run_the_transposed_products(hq, hkv, heads_per_cta, transposed):
    for S, d in ((1, 64), (1000, 128), (131072, 256)):
        p = DecodeProblem(S, hq, hkv, d, "bfloat16")
        plan = plan_decode(p, **H200)
        assert plan.heads_per_cta == heads_per_cta
        assert decode.decode_spec(p, plan, "sm_90a").param_dict["TRANSPOSED"] is transposed


@pytest.mark.parametrize("S, d", [(17, 128), (64, 256), (100, 64), (4096, 128)])
def test_padded_chunks_over_lengths_read_their_tails_in_boxes(S, d):
    """With lengths on the device, a chunked plan of any chunk size reads each chunk's last,
    partial tile in boxes of PADDED_BOX_ROWS rows (the kernel then skips boxes past each length;
    its tail maps have that box); with the lengths known (every sequence kv_len long) or the
    balanced split, whole tiles only."""
    p = DecodeProblem(S, 32, 8, d, "bfloat16", 64)
    tile = decode.tile_rows(d, S)
    for chunk_size in (tile, 2 * tile, None):
        plan = plan_decode(p, **H200, uneven=True, chunk_size=chunk_size)
        assert plan.box_rows == decode.PADDED_BOX_ROWS and not plan.balanced
        # (a one-tile plan's warps gather their rows, no boxes; its TMA kernel, for K and V of unlike strides, has them)
        boxed = dataclasses.replace(plan, self_gather=False)
        assert decode.decode_spec(p, boxed, "sm_90a").param_dict["PADDED_BOX_ROWS"] == decode.PADDED_BOX_ROWS
        assert (decode.decode_spec(p, plan, "sm_90a").param_dict.get("PADDED_BOX_ROWS") is None) == plan.self_gather
        assert decode.decode_spec(p, plan, "sm_90a", 16).param_dict.get("PADDED_BOX_ROWS") is None   # pages: their own
        assert plan_decode(p, **H200, chunk_size=chunk_size).box_rows == 0
    assert plan_decode(p, **H200, uneven=True, balanced=True).box_rows == 0


def test_head_dim_128_calls_of_at_most_an_sms_units_stream_through_4_stages():
    """FEW_UNITS_STAGES: head dim 128 calls of at most an SM's units (sequence, KV head, head block)
    whose rows come in TMA boxes take 4 stages, one CTA an SM; more units, pages gathered row by
    row and the other head dims keep DEFAULT_STAGES (two CTAs an SM at 3)."""
    for (d, units, gathered), stages in {(128, 1, False): 4, (128, 132, False): 4, (128, 133, False): 3,
                                         (128, 8, True): 3, (64, 8, False): 3, (256, 8, False): 3}.items():
        assert decode.decode_stages(d, units, H200["sm_count"], gathered) == stages, (d, units, gathered)
    p = DecodeProblem(131072, 32, 8, 128, "bfloat16")   # 8 units; a batch of 17: 136
    plan = plan_decode(p, **H200)
    assert (plan.stages, plan.smem) == (4, decode.smem_bytes(128, 64, 4)) and _waves(p, plan) == 1
    assert plan_decode(p._replace(batch=17), **H200).stages == 3 and plan_decode(p, **H200, gathered=True).stages == 3
    assert plan_decode(p, **H200, stages=3).stages == 3   # an override stands


@pytest.mark.parametrize("S, d, block_n", [(1, 64, 32), (32, 256, 32), (33, 64, 64), (64, 128, 64), (64, 256, 64),
                                           (65, 64, 128), (128, 64, 128)])
def test_one_tile_sequences_stream_through_one_stage(S, d, block_n):
    """A transposed CTA of one tile fills one stage of ONE_TILE_WARPS consumer warps (a tile of
    ONE_TILE_SHORT_ROWS for sequences within that): more CTAs share an SM. The balanced split walks many tiles (its default stages); a stages override
    stands (with the default warps); two tiles, or CTAs of 16 heads, take the defaults."""
    for batch, uneven, hq in ((1, False, 32), (256, True, 32), (3, True, 64)):   # groups of 4, 4 and 8
        p = DecodeProblem(S, hq, 8, d, "bfloat16", batch)
        plan = plan_decode(p, **H200, uneven=uneven)
        assert (plan.block_n, plan.stages, plan.n_chunks) == (block_n, 1, 1)
        assert plan.warps == decode.ONE_TILE_WARPS and plan.self_gather   # no producer warp
        assert plan.threads == 32 * decode.ONE_TILE_WARPS
        assert plan.smem == decode.smem_bytes(d, block_n, 1)
        assert plan_decode(p, **H200, uneven=uneven, balanced=None).stages == 1
        stages = decode.decode_stages(d, batch * 8, H200["sm_count"])   # (4 at D 128 for at most an SM's units)
        assert plan_decode(p, **H200, balanced=True).stages == stages
        assert plan_decode(p, **H200, stages=2).stages == 2 and plan_decode(p, **H200, stages=2).warps == decode.WARPS
        longer = p._replace(kv_len=TILE_ROWS[d] + 1)   # two tiles
        assert plan_decode(longer, **H200).stages == stages
        assert plan_decode(longer, **H200).warps == decode.WARPS and not plan_decode(longer, **H200).self_gather
    wide = plan_decode(DecodeProblem(S, 64, 4, d, "bfloat16", 256), **H200, uneven=True)   # a group of 16
    assert (wide.stages, wide.warps) == (decode.DEFAULT_STAGES[d], decode.WARPS)


def test_plan_chunk_override_and_its_check():
    p = DecodeProblem(8192, 32, 8, 128, "bfloat16")
    assert plan_decode(p, chunk_size=512, **H200).n_chunks == 16   # 8192 = 16 · 512: 16 chunks
    assert plan_decode(p, chunk_size=576, **H200).n_chunks == 15   # ceil(8192 / 576): 14 of 576, the last of 128
    with pytest.raises(ValueError, match="chunk_size must be a positive multiple of 64"):
        plan_decode(p, chunk_size=100, **H200)
    p64 = DecodeProblem(8192, 32, 8, 64, "bfloat16")   # head_dim 64 streams 128-row tiles
    assert plan_decode(p64, chunk_size=1024, **H200).block_n == 128
    with pytest.raises(ValueError, match="multiple of 128 .*head_dim 64"):
        plan_decode(p64, chunk_size=64, **H200)
    short = DecodeProblem(64, 32, 8, 64, "bfloat16")   # a sequence within 64 rows: 64-row tiles, any head dim
    assert plan_decode(short, **H200).block_n == 64 and plan_decode(short, chunk_size=64, **H200).n_chunks == 1
    assert plan_decode(DecodeProblem(65, 32, 8, 64, "bfloat16"), **H200).block_n == 128
    assert plan_decode(p, chunk_size=512, **H200).n_chunks == 16   # (cached before the values equal to it)
    for not_an_int in (512.0, "512", True):   # (would reach the template and the grid)
        with pytest.raises(ValueError, match=f"chunk_size must be a positive multiple of 64 .*got {not_an_int!r}"):
            plan_decode(p, chunk_size=not_an_int, **H200)
    assert plan_decode(p, chunk_size=np.int64(512), **H200).n_chunks == 16


@pytest.fixture
def cost_pick(monkeypatch):
    """The planner without `spread_tiles`: its chunks are the cost's pick."""
    monkeypatch.setattr(decode, "SPREAD_MIN_CTAS", 1 << 30)
    plan_decode.cache_clear()
    yield
    plan_decode.cache_clear()


def _waves(p, plan, sm_count=132, smem_per_sm=233472):
    slots = sm_count * decode.ctas_per_sm(p.head_dim, plan.block_n, plan.stages, smem_per_sm, plan.heads_per_cta, plan.warps)
    return -(-(plan.n_chunks * p.batch * p.kv_heads * plan.head_blocks) // slots)


# Chunks by ceil: n = ceil(tiles of S / tiles), cost waves · (tiles + 1.5) + 2 + n / 16 when split;
# slots on the H200: 132 SMs x 2 CTAs (D 64/128) or x 1 (D 256, and D 128 at 4 stages: calls of at most
# 132 units, as all of these but the D 256 one are). Each pick below is the least cost,
# checked by hand (and against `_every_tile_count`); in parentheses, a rival's cost (the old floor
# planner's pick where it differs: 26, 24, 244 and 64 tiles):
@pytest.mark.parametrize("S, hq, hkv, d, batch, tiles, n_chunks, waves", [
    # session 11's losing shapes: 8, 16, 16 tiles in 3 waves as powers of two
    (50000, 64, 8, 128, 1, 49, 16, 1),    # 782 tiles: 16 x 8 = 128 CTAs, 50.5 + 2 + 1 = 53.5 (24 tiles, 33 in 2 waves: 55.06)
    (200000, 32, 4, 128, 1, 95, 33, 1),   # 3125 tiles: 33 x 4 = 132, 96.5 + 2 + 33/16 = 100.56 (96 tiles: 101.56)
    (99999, 64, 4, 256, 1, 48, 33, 1),    # 1563 tiles: 33 x 4 = 132 slots, 53.56 (24 tiles, 66 in 2 waves: 57.13)
    (500000, 64, 4, 128, 2, 237, 33, 2),  # 7813 tiles: 33 x 8 = 264 in 2 waves, 477 + 4.06 = 481.06 (489 x 16: 493.5)
    # shapes the powers of two already served
    (8192, 32, 32, 128, 1, 32, 4, 1),     # 128 tiles: 4 x 32 = 128, 33.5 + 2.25 = 35.75 (16 x 8, 2 waves: 37.5)
    (131072, 32, 8, 128, 1, 128, 16, 1),  # 2048 tiles: 16 x 8 = 128, 129.5 + 3 = 132.5 (63 x 33, 2 waves: 133.06)
    (65536, 128, 8, 128, 1, 64, 16, 1),   # 1024 tiles: 16 x 8 = 128, 65.5 + 3 = 68.5 (65: 69.5)
])
def test_plan_takes_chunks_of_any_tile_count(S, hq, hkv, d, batch, tiles, n_chunks, waves, cost_pick):
    """The chunk is a kernel argument: the planner prices every tile count, so 64/8 S=50000 D128
    runs 33 chunks of 24 tiles (1536 rows, the last of 848) in one wave on an H200 rather than 98
    of 8 in three."""
    p = DecodeProblem(S, hq, hkv, d, "bfloat16", batch)
    plan = plan_decode(p, **H200)
    assert (plan.chunk, plan.n_chunks, _waves(p, plan)) == (tiles * TILE_ROWS[d], n_chunks, waves)
    assert n_chunks == -(-S // (tiles * TILE_ROWS[d])) and plan.chunk == _every_tile_count(p)


def _every_tile_count(p, sm_count=132, smem_per_sm=233472, uneven=False):
    """The planner's cost priced at every tile count from 1 (up to the first of one chunk): the
    least cost's smallest tile count (uneven lengths: the smallest within 5 % of the least). A
    sequence has ceil(kv_len / chunk) chunks (the last the remainder, never more than a chunk), so
    each wave costs a whole chunk: waves x (tiles + 1.5), plus the merge when split."""
    if p.kv_len <= decode.ONE_TILE_SHORT_ROWS and decode.transposed(min(p.group, decode.MAX_HEADS_PER_CTA)):
        return decode.ONE_TILE_SHORT_ROWS   # one-tile CTAs of the shortest tile
    bn, units = decode.tile_rows(p.head_dim, p.kv_len), p.batch * p.kv_heads * p.head_blocks
    stages, n_tiles = decode.decode_stages(p.head_dim, units, sm_count), -(-p.kv_len // bn)   # (many tiles)
    slots = sm_count * decode.ctas_per_sm(p.head_dim, bn, stages, smem_per_sm, min(p.group, decode.MAX_HEADS_PER_CTA),
                                          decode.WARPS)
    costs = {}
    for tiles in range(1, n_tiles + 1):
        n_chunks = -(-p.kv_len // (tiles * bn))
        costs[tiles] = -(-(n_chunks * units) // slots) * (tiles + 1.5) + (2.0 + n_chunks / 16 if n_chunks > 1 else 0)
        if n_chunks == 1:
            break
    least = min(costs.values()) * (1.05 if uneven else 1)
    return min(t for t, cost in costs.items() if cost <= least) * bn


def test_plan_is_the_scan_of_every_tile_count(cost_pick):
    """`chunk_tile_counts` prices the first tile count of each run of one chunk count only: the
    same pick, of full lengths and of uneven ones."""
    rng = np.random.default_rng(13)
    for _ in range(400):
        d = int(rng.choice(decode.HEAD_DIMS))
        hkv, group, batch = (int(rng.choice(c)) for c in ((1, 2, 4, 8, 32), (1, 2, 4, 8, 32), (1, 1, 2, 3, 8, 64)))
        S = int(rng.integers(1, int(rng.choice((300, 20000, 400000)))))
        p = DecodeProblem(S, hkv * group, hkv, d, "bfloat16", batch)
        assert plan_decode(p, **H200).chunk == _every_tile_count(p), p
        assert plan_decode(p, **H200, uneven=True).chunk == _every_tile_count(p, uneven=True), p
    for S in (1, 63, 64, 65, 127, 128, 129, 1000, 4096, 50000):
        assert list(decode.chunk_tile_counts(S, 64)) == sorted(set(decode.chunk_tile_counts(S, 64)))
        # exactly each t whose ceil chunk count differs from t - 1's, up to the first of one chunk
        n_tiles = -(-S // 64)
        firsts = [t for t in range(1, n_tiles + 1) if t == 1 or -(-S // (t * 64)) != -(-S // ((t - 1) * 64))]
        assert list(decode.chunk_tile_counts(S, 64)) == firsts, S


def test_plan_of_the_longest_rows_is_quick_and_fits_an_int():
    """A paged plan's rows go up to 2^31 - 1 (max_kv_len): O(sqrt(tiles)) prices, a chunk within int32."""
    import time
    for hkv, batch in ((1, 1), (8, 3)):
        p = DecodeProblem((1 << 31) - 1, 32, hkv, 128, "bfloat16", batch)
        t0 = time.perf_counter()
        plan = plan_decode(p, **H200)
        assert time.perf_counter() - t0 < 2.0
        # ceil: every row in a chunk, the last chunk's first row (the kernel's int) below kv_len
        assert 0 < plan.chunk < 1 << 31 and plan.n_chunks == -(-p.kv_len // plan.chunk)
        assert (plan.n_chunks - 1) * plan.chunk < p.kv_len <= plan.n_chunks * plan.chunk


def test_any_chunk_size_override_is_one_kernel():
    """chunk_size= takes any multiple of the tile (192 rows: 3 tiles), and every split chunk runs
    the one kernel (the chunk is its last argument, not a template constant)."""
    p = DecodeProblem(50000, 64, 8, 128, "bfloat16")
    plan = plan_decode(p, chunk_size=192, **H200)
    assert (plan.chunk, plan.n_chunks) == (192, 261)   # ceil(50000 / 192): 260 of 192, the last of 80 rows
    specs = {decode.decode_spec(p, plan_decode(p, chunk_size=c, **H200), "sm_90a") for c in (192, 512, 1664, 4096)}
    assert specs == {decode.decode_spec(p, plan_decode(p, **H200), "sm_90a")}
    assert "CHUNK" not in decode.decode_spec(p, plan, "sm_90a").param_dict
    for too_large in (1 << 31, (1 << 31) + 64):
        with pytest.raises(ValueError, match=r"chunk_size must be a positive multiple of 64 .*below 2\^31"):
            plan_decode(p, chunk_size=too_large, **H200)


# ---- scalar options shared by the ops ----
def test_scalar_options_are_checked_by_name():
    from pykda.ops.checks import check_lower_bound, check_stages, resolve_scale
    assert resolve_scale(None, 64) == 0.125 and resolve_scale(0.5, 64) == 0.5
    with pytest.raises(ValueError, match="scale must be finite in float32; got nan"):
        resolve_scale(float("nan"), 128)
    with pytest.raises(ValueError, match="scale must be finite in float32; got 1e"):
        resolve_scale(1e39, 128)
    check_stages(None), check_stages(2), check_stages(8)
    with pytest.raises(ValueError, match="stages must be in 2..8; got 1"):
        check_stages(1)
    assert check_lower_bound(-5) == -5.0
    with pytest.raises(ValueError, match="lower_bound must be finite and <= 0; got 0.5"):
        check_lower_bound(0.5)
    with pytest.raises(ValueError, match="lower_bound must be finite and <= 0; got -inf"):
        check_lower_bound(float("-inf"))


# ---- the decode bench's shape option ----
def test_bench_shapes_parse_single_and_batched_cases():
    from pykda.bench.decode import parse_shapes
    assert parse_shapes("32/8:100000, 8x32/8:32768") == [(1, 32, 8, 100000, False, 128, False),
                                                          (8, 32, 8, 32768, True, 128, False)]
    assert parse_shapes("16/16:100003:64,2x64/4:99999:256") == [(1, 16, 16, 100003, False, 64, False),
                                                               (2, 64, 4, 99999, True, 256, False)]
    assert parse_shapes("32x32/8:8192~:64,4x8/1:100~") == [(32, 32, 8, 8192, True, 64, True), (4, 8, 1, 100, True, 128, True)]
    for bad in ("32:8", "32/8:100~"):   # (one sequence has no uneven lengths)
        with pytest.raises(ValueError, match=f"--shapes: '{bad}' is not"):
            parse_shapes(f"32/32:8192,{bad}")


def test_paged_bench_shapes_take_head_dim_128_and_whole_pages():
    from pykda.bench.paged_decode import _cases
    assert _cases(False, "8x32/8:32768,2x32/8:1024:128") == [(8, 32, 8, 32768), (2, 32, 8, 1024)]
    with pytest.raises(ValueError, match="paged-decode --shapes: head dim 128 only"):
        _cases(False, "8x32/8:32768:64")
    with pytest.raises(ValueError, match="every KV_LEN must be a multiple of 128"):
        _cases(False, "8x32/8:1000")
    with pytest.raises(ValueError, match=r"no uneven lengths \(S~\)"):
        _cases(False, "8x32/8:1024~")


def test_decode_tiny_takes_short_padded_calls_of_few_units_only():
    """decode_tiny where asked for (`tiny`: a padded cache), every sequence within TINY_ROWS' last
    rows, compiled heads x head dim within TINY_MAX_COLUMNS, units of at most 64 kernel rows an SM,
    no chunk size, stages or balanced split set; the pipeline otherwise. Its rows: the least of
    TINY_ROWS that hold the sequences. Its compiled heads: the group's power of two."""
    p = DecodeProblem(17, 32, 8, 64, "bfloat16")
    plan = plan_decode(p, **H200, tiny=True)
    assert plan.tiny and plan.n_chunks == 1 and not plan.split and plan.threads == 256   # 8 x 4 heads x 8 streams
    assert decode.TINY_ROWS == (32, 64) and [plan_decode(p._replace(kv_len=n), **H200, tiny=True).block_n
                                             for n in (1, 32, 33, 64)] == [32, 32, 64, 64]
    assert plan.streams == 8 and plan_decode(p._replace(head_dim=256), **H200, tiny=True).streams == 4
    assert decode.decode_spec(p, plan, "sm_90a").template == "decode_tiny"
    assert not plan_decode(p, **H200).tiny   # paged caches (and the default)
    for kwargs in (dict(chunk_size=64), dict(stages=1), dict(balanced=True)):
        assert not plan_decode(p, **H200, tiny=True, **kwargs).tiny, kwargs
    assert plan_decode(p, **H200, tiny=True, balanced=None).tiny
    short = decode.TINY_ROWS[-1]
    assert decode.TINY_MAX_COLUMNS == 1024
    assert [plan_decode(p._replace(head_dim=d, q_heads=8 * g), **H200, tiny=True).tiny
            for d, g in ((64, 8), (128, 8), (256, 4), (256, 5))] == [True, True, True, False]
    for q in (p._replace(kv_len=short + 1), p._replace(q_heads=8 * 9),
              p._replace(batch=2 * 132 // 8 + 1)):
        assert not plan_decode(q, **H200, tiny=True).tiny, q
    assert plan_decode(p._replace(kv_len=32, batch=2 * 132 // 8), **H200, tiny=True).tiny
    assert plan_decode(p._replace(kv_len=short, batch=132 // 8), **H200, tiny=True).tiny   # one unit of 64 rows an SM
    assert not plan_decode(p._replace(kv_len=short, batch=132 // 8 + 1), **H200, tiny=True).tiny
    assert [decode.tiny_heads(g) for g in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
