"""CPU tests of the batched decode op and the KV layouts: argument checks, planning, and the
launch sequence offline (fake device, kernels and tensor maps; no GPU needed)."""
import re

import numpy as np
import pytest

import pykda
from pykda import runtime
from pykda.ops import decode
from pykda.ops.decode import DecodeProblem, kv_view, plan_decode, validate_decode
from fakes import BASE, device_array as arr, offline_runtime

H200 = dict(sm_count=132, smem_per_sm=233472)


def kv_shape(B, S, hkv, d, layout):
    return (B, S, hkv, d) if layout == "NHD" else (B, hkv, S, d)


def good(B=3, S=100, hq=32, hkv=8, d=128, layout="NHD", dtype="bfloat16"):
    return arr((B, hq, d), dtype), arr(kv_shape(B, S, hkv, d, layout), dtype), arr(kv_shape(B, S, hkv, d, layout), dtype)


def check(q, k, v, out=None, kv_lens=None, layout="NHD"):
    return validate_decode(q, k, v, out, kv_lens, batched=True, kv_layout=layout)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_valid_batched_problem_is_described(layout):
    q, k, v = good(layout=layout)
    p = check(q, k, v, kv_lens=arr((3,), "int32"), layout=layout)
    assert p == DecodeProblem(kv_len=100, q_heads=32, kv_heads=8, head_dim=128, dtype="bfloat16", batch=3)


def test_strided_views_of_a_larger_cache_are_accepted():
    # k = cache[:, 0, :, :100] of an HND cache [B, K|V, H, S_max, D]
    cache = arr((3, 2, 8, 256, 128))
    k = arr((3, 8, 100, 128), strides=(cache.strides[0], cache.strides[2], cache.strides[3], 1))
    q, _, v = good(layout="HND")
    assert check(q, k, v, layout="HND").kv_len == 100


@pytest.mark.parametrize("case, exc, message", [
    ("layout", ValueError, r"kv_layout must be one of \('NHD', 'HND'\); got 'NDH'"),
    ("q_rank", ValueError, r"q must be 3-D \[batch, num_qo_heads, head_dim\]"),
    ("k_rank", ValueError, r"k must be 4-D \[batch, kv_len, num_kv_heads, head_dim\]"),
    ("v_rank_hnd", ValueError, r"v must be 4-D \[batch, num_kv_heads, kv_len, head_dim\]"),
    ("batch", ValueError, "q and k must have the same batch size; got 4 and 3"),
    ("batch0", ValueError, "the batch must hold at least one sequence"),
    ("heads_hnd", ValueError, r"num_qo_heads \(32\) must be a multiple of num_kv_heads \(100\)"),
    ("kv_dtype", TypeError, "v must have the dtype of q"),
    ("out_shape", ValueError, r"out must have shape \[batch, num_qo_heads, head_dim\]"),
    ("lens_dtype", TypeError, "kv_lens must have dtype int32; got int64"),
    ("lens_shape", ValueError, r"kv_lens must have shape \[batch\] = \(3,\); got \(4,\)"),
    ("lens_rank", ValueError, r"kv_lens must have shape \[batch\]"),
    ("lens_strided", ValueError, "kv_lens must be contiguous"),
    ("lens_device", ValueError, "all arrays must be on one device"),
    ("grid", ValueError, "batch 70000 is too large"),
])
def test_bad_input_names_the_argument(case, exc, message):
    q, k, v = good()
    out = kv_lens = None
    layout = "NHD"
    if case == "layout":
        layout = "NDH"
    elif case == "q_rank":
        q = arr((32, 128))
    elif case == "k_rank":
        k = arr((100, 8, 128))
    elif case == "v_rank_hnd":
        layout, (q, k, _) = "HND", good(layout="HND")
        v = arr((3, 8, 100, 128, 1))
    elif case == "batch":
        q = arr((4, 32, 128))
    elif case == "batch0":
        q, k, v = good(B=0)
    elif case == "heads_hnd":   # NHD-shaped k read as HND: 100 KV heads
        layout = "HND"
    elif case == "kv_dtype":
        v = arr(k.shape, "float16")
    elif case == "out_shape":
        out = arr((3, 32, 64))
    elif case == "lens_dtype":
        kv_lens = arr((3,), "int64")
    elif case == "lens_shape":
        kv_lens = arr((4,), "int32")
    elif case == "lens_rank":
        kv_lens = arr((3, 1), "int32")
    elif case == "lens_strided":
        kv_lens = arr((3,), "int32", strides=(2,))
    elif case == "lens_device":
        kv_lens = arr((3,), "int32", device=1)
    elif case == "grid":
        q, k, v = good(B=70000, S=1, hq=32, hkv=1, d=64)
    with pytest.raises(exc, match=message):
        check(q, k, v, out, kv_lens, layout)


@pytest.mark.parametrize("batched, layout, shape, strides, view", [
    (True, "NHD", (3, 100, 8, 128), None, ((3, 100, 8, 128), (102400, 1024, 128, 1))),
    (True, "HND", (3, 8, 100, 128), None, ((3, 100, 8, 128), (102400, 128, 12800, 1))),
    (False, "NHD", (100, 8, 128), None, ((1, 100, 8, 128), (0, 1024, 128, 1))),
    (False, "HND", (8, 100, 128), None, ((1, 100, 8, 128), (0, 128, 12800, 1))),
])
def test_kv_view_is_batch_rows_heads_dim_in_every_layout(batched, layout, shape, strides, view):
    assert kv_view(arr(shape, strides=strides), batched, layout) == view


def test_plan_counts_every_sequence_as_units():
    one = plan_decode(DecodeProblem(4096, 32, 8, 128, "bfloat16"), **H200)
    many = plan_decode(DecodeProblem(4096, 32, 8, 128, "bfloat16", 64), **H200)
    assert one.split and not many.split   # 64 x 8 units fill the GPU without splitting
    p = DecodeProblem(32768, 32, 8, 128, "bfloat16", 8)
    plan = plan_decode(p, **H200)   # (4 stages, one CTA an SM: 2 chunks x 64 units)
    assert plan.n_chunks * p.batch * p.kv_heads * plan.head_blocks >= 0.95 * 132


# ---- the launch sequence, offline ----
@pytest.fixture
def offline(monkeypatch):
    log = dict(launches=[], maps=[], workspaces=[])

    def workspace(ref, stream, nbytes):
        log["workspaces"].append((ref, stream, nbytes))
        return None, BASE * 4
    offline_runtime(monkeypatch, log["launches"], workspace, log["maps"])
    decode.PREPARED.clear()   # prepared calls hold the fake kernels: none before, none left after
    yield log
    decode.PREPARED.clear()


_KINDS = {int: "pointer", bytes: "TensorMap", np.int64: "long long", np.int32: "int", np.float32: "float"}


def kernel_parameters(name: str, params: dict, template: str = "decode") -> list[str]:
    """The parameter kinds of kernel `name` in the rendered decode template (or `template`)."""
    src = re.sub(r"//[^\n]*", "", runtime.render(template, params))
    sig = re.search(rf"\b{name}\(([^)]*)\)\s*\{{", src).group(1)
    kinds = []
    for param in sig.split(","):
        kinds.append("pointer" if "*" in param else "TensorMap" if "TensorMap" in param
                     else "long long" if "long long" in param else param.split()[-2])
    return kinds


def _spec_params(p, chunk_size=None, uneven=False):
    plan = plan_decode(p, **H200, chunk_size=chunk_size, uneven=uneven)
    return plan, decode.decode_spec(p, plan, "sm_90a").param_dict


def test_lengths_on_the_device_are_planned_as_uneven(offline):
    """With kv_lens the host does not know the lengths: the batch takes the smallest chunk within
    UNEVEN_SLACK of the least full-length cost (shorter CTAs end a batch of uneven lengths sooner);
    without, every sequence is kv_len rows and the least cost wins."""
    B, S, hq, hkv, d = 64, 4096, 32, 8, 128
    p = DecodeProblem(S, hq, hkv, d, "bfloat16", B)
    full, uneven = plan_decode(p, **H200), plan_decode(p, **H200, uneven=True)
    assert uneven.chunk < full.chunk   # (a shape where the two differ)
    q, k, v = good(B, S, hq, hkv, d)
    pykda.batch_decode_with_padded_kv_cache(q, k, v)
    pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=arr((B,), "int32", ptr=BASE * 3))
    grids = [launch[1] for launch in offline["launches"] if launch[0] == "decode_partial"]
    assert grids == [(full.n_chunks, hkv, B), (uneven.n_chunks, hkv, B)]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_split_batch_is_a_partial_launch_then_a_merge(offline, layout):
    """A split of more chunks than a cluster holds: decode_partial's partials, then decode_merge."""
    B, S, hq, hkv, d = 3, 1000, 32, 8, 128
    q, k, v = good(B, S, hq, hkv, d, layout)
    lens = arr((B,), "int32", ptr=BASE * 3)
    o, lse = decode.flash_decode(q, k, v, batched=True, kv_layout=layout, kv_lens=lens, return_lse=True,
                                 chunk_size=64)
    assert tuple(o.shape) == (B, hq, d) and tuple(lse.shape) == (B, hq) and lse.dtype == "float32"
    plan, params = _spec_params(DecodeProblem(S, hq, hkv, d, "bfloat16", B), chunk_size=64, uneven=True)
    names = [entry[0] for entry in offline["launches"]]
    assert names == ["decode_partial", "decode_merge"] and plan.cluster == 0 and params["CLUSTER"] == 0
    _, grid, block, smem, args, _ = offline["launches"][0]
    # ceil(1000 / 64) = 16 chunks, the last of 40 rows
    assert grid == (16, hkv, B) and block == (160, 1, 1) and smem == plan.smem
    assert [_KINDS[type(a)] for a in args] == kernel_parameters("decode_partial", params)
    assert lens.ptr in args and BASE * 4 in args
    _, grid, block, smem, merge_args, _ = offline["launches"][1]
    # 16 chunks: four warps per query row and 32 columns (16 chunk lanes), so two rows a CTA
    assert plan.merge_warps == 4
    assert grid == (B * hq // 2, d // 32, 1) and block == (256, 1, 1) and smem == 0
    assert [_KINDS[type(a)] for a in merge_args] == kernel_parameters("decode_merge", params)
    ws_o, ws_lse, kv_lens, kv_len, q_heads, n_chunks, chunk, o_p, *_, lse_p, row_warps, n_rows, kv_heads, batch = \
        merge_args
    assert (ws_o, ws_lse, kv_lens) == tuple(args[13:15]) + (lens.ptr,) and (kv_len, q_heads, n_chunks, chunk) == (S, hq, 16, 64)
    assert (o_p, lse_p) == (args[15], args[18]) and lse_p != 0 and (row_warps, n_rows, kv_heads, batch) == (4, B * hq, hkv, B)
    assert tuple(args[-3:]) == (hkv, B, 0), "the kernel's last arguments: KV heads, batch, no page ids after the tables"
    assert len(offline["workspaces"]) == 1, "one workspace: the partials and their LSEs"
    # both maps walk (head_dim, kv_heads, kv_len, batch), whatever the layout in memory
    row, head = (hkv * d * 2, d * 2) if layout == "NHD" else (d * 2, S * d * 2)
    # lengths on the device: whole tiles, then each chunk's last tile in boxes of PADDED_BOX_ROWS rows
    # (none past a length read), the maps in the kernel's order (k, v, k's tail, v's tail)
    assert plan.box_rows == decode.PADDED_BOX_ROWS == params["PADDED_BOX_ROWS"]
    assert offline["maps"] == [(n, (d, hkv, S, B), (head, row, S * hkv * d * 2), (64, 1, rows, 1))
                               for rows in (plan.block_n, plan.box_rows) for n in "kv"]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_short_call_of_few_ctas_is_one_decode_tiny_launch(offline, layout):
    """Sequences within TINY_ROWS rows, groups within TINY_MAX_COLUMNS, at most two units an SM:
    one decode_tiny launch, grid (1, KV heads, batch), its threads and the shared memory of its
    layout, the arguments typed as the kernel's parameters (K and V by pointer with their batch,
    row and head strides), no workspace and no tensor-map argument."""
    B, S, hq, hkv, d = 3, 17, 24, 8, 128   # a group of 3: the kernel of 4 heads
    q, k, v = good(B, S, hq, hkv, d, layout)
    lens = arr((B,), "int32", ptr=BASE * 3)
    o, lse = decode.flash_decode(q, k, v, batched=True, kv_layout=layout, kv_lens=lens, return_lse=True)
    assert tuple(o.shape) == (B, hq, d) and tuple(lse.shape) == (B, hq)
    ((name, grid, block, smem, args, spec),) = offline["launches"]
    assert name == "decode_tiny" and spec.template == "decode_tiny" and spec.param_dict["HEADS"] == 4
    # D 128, 4 heads compiled: 16 threads a row, 4 heads side by side (one a thread) in 4 streams
    assert (spec.param_dict["HY"], spec.param_dict["HZ"]) == (4, 4) and grid == (1, hkv, B)
    assert block == (256, 1, 1) and smem == decode.tiny_smem_bytes(d, 32, 4, 4)   # 32 rows hold 17
    assert [_KINDS[type(a)] for a in args] == kernel_parameters("decode_tiny", spec.param_dict, "decode_tiny")
    row, head = (hkv * d, d) if layout == "NHD" else (d, S * d)
    assert args[3:11] == (k.ptr, v.ptr, S * hkv * d, row, head, S * hkv * d, row, head)
    assert args[11:14] == (lens.ptr, S, 3) and args[18] != 0 and offline["workspaces"] == []
    # the maps were checked once, when the call was prepared; a cache at a new address encodes none
    maps = len(offline["maps"])
    k2, v2 = (arr(a.shape, strides=a.strides, ptr=a.ptr + 4096) for a in (k, v))
    decode.flash_decode(q, k2, v2, batched=True, kv_layout=layout, kv_lens=lens)
    assert len(offline["maps"]) == maps and offline["launches"][1][4][3:5] == (k2.ptr, v2.ptr)


@pytest.mark.parametrize("chunk_size, chunks, cluster", [(128, 8, 8), (384, 3, 4), (512, 2, 2)])
def test_split_of_few_chunks_in_many_waves_merges_in_a_cluster(offline, chunk_size, chunks, cluster):
    """A split of at most 8 chunks whose CTAs fill more than one round of the GPU is one launch:
    the grid's x a whole cluster of CTAs (those past the chunks exit), the kernel compiled for that
    cluster, no workspace and no decode_merge."""
    B, S, hq, hkv, d = 64, 1000, 32, 8, 128
    q, k, v = good(B, S, hq, hkv, d)
    lens = arr((B,), "int32", ptr=BASE * 3)
    decode.flash_decode(q, k, v, batched=True, kv_lens=lens, return_lse=True, chunk_size=chunk_size)
    plan, params = _spec_params(DecodeProblem(S, hq, hkv, d, "bfloat16", B), chunk_size=chunk_size)
    assert (plan.n_chunks, plan.cluster, params["CLUSTER"]) == (chunks, cluster, cluster)
    ((name, grid, block, smem, args, spec),) = offline["launches"]
    assert name == "decode_partial" and grid == (cluster, hkv, B) and spec.param_dict["CLUSTER"] == cluster
    assert args[13:15] == (0, 0) and offline["workspaces"] == []
    assert args[-4] == chunk_size and lens.ptr in args and args[18] != 0   # the LSE, written by the cluster


def test_clusters_only_beyond_one_round_or_for_one_tile_chunks():
    """Within one round of the GPU a cluster's CTAs crowd few SMs (cluster_pays): 3 sequences of 8
    chunks of two tiles keep decode_merge, 64 of them or chunks of one tile merge in clusters (at 3
    stages: 264 slots)."""
    for B, S, chunk, cluster in ((3, 1000, 128, 0), (64, 1000, 128, 8), (3, 500, 64, 8), (1, 200, 64, 4)):
        plan = plan_decode(DecodeProblem(S, 32, 8, 128, "bfloat16", B), **H200, chunk_size=chunk, stages=3)
        assert plan.cluster == cluster, (B, chunk, plan)
    one_tile = plan_decode(DecodeProblem(1000, 32, 4, 64, "bfloat16"), **H200)   # 8 chunks of one 128-row tile
    assert (one_tile.n_chunks, one_tile.chunk, one_tile.cluster) == (8, 128, 8)
    assert decode.cluster_pays(1, 8, 264) and decode.cluster_pays(2, 265, 264) and not decode.cluster_pays(2, 264, 264)


def test_merge_cluster_holds_the_chunks():
    assert [decode.merge_cluster(n) for n in (1, 2, 3, 4, 5, 8, 9, 64)] == [0, 2, 4, 4, 8, 8, 0, 0]


@pytest.mark.parametrize("chunk_size", [None, 192, 1664])
def test_the_chunk_is_the_last_argument(offline, chunk_size):
    """The plan's chunk reaches the kernel as its last argument (an int; every other argument
    keeps its place), any multiple of the tile, the planner's or asked for; ceil(S / chunk) chunks."""
    B, S, hq, hkv, d = 1, 50000, 64, 8, 128
    q, k, v = arr((B, hq, d)), arr((B, S, hkv, d)), arr((B, S, hkv, d))
    decode.flash_decode(q, k, v, batched=True, chunk_size=chunk_size)
    rows = chunk_size or plan_decode(DecodeProblem(S, hq, hkv, d, "bfloat16", B), **H200).chunk
    # the planner's 3136 rows (49 tiles): 16 chunks, the last of 2960 rows; 192: 261, the last of 80;
    # 1664: 31, the last of 80
    n_chunks = -(-S // rows)
    assert (rows, n_chunks) == {None: (3136, 16), 192: (192, 261), 1664: (1664, 31)}[chunk_size]
    (_, grid, _, _, args, spec), (merge, *_, merge_args, _) = offline["launches"]
    assert grid == (n_chunks, hkv, B) and args[-4] == rows and type(args[-4]) is np.int32
    assert [_KINDS[type(a)] for a in args] == kernel_parameters("decode_partial", spec.param_dict)
    assert len(args) == len(decode.KERNEL_SIGNATURE) == 31
    assert merge == "decode_merge" and merge_args[5:7] == (n_chunks, rows)


def test_split_decode_takes_one_workspace_from_q_partials_then_lse(offline):
    B, S, hq, hkv, d = 3, 1000, 32, 8, 128
    q, k, v = arr((B, hq, d)), arr((B, S, hkv, d)), arr((B, S, hkv, d))
    decode.flash_decode(q, k, v, batched=True, chunk_size=64)
    n_part = B * hq * -(-S // 64)   # partial rows: ceil(1000 / 64) = 16 chunks (more than a cluster), the last of 40 rows
    ((ref, stream, nbytes),) = offline["workspaces"]
    assert ref is q and stream == 0
    (*_, args, _), (*_, merge_args, _) = offline["launches"]
    ws_o, ws_lse = args[13:15]
    assert ws_o == BASE * 4 and merge_args[:2] == (ws_o, ws_lse)
    assert ws_lse == ws_o + n_part * d * 4
    assert nbytes == ws_lse + n_part * 4 - ws_o


def test_decode_without_a_split_takes_no_workspace(offline):
    B, S, hq, hkv, d = 64, 4096, 32, 8, 128   # 64 x 8 head groups fill the GPU unsplit
    q, k, v = arr((B, hq, d)), arr((B, S, hkv, d)), arr((B, S, hkv, d))
    decode.flash_decode(q, k, v, batched=True)
    assert offline["workspaces"] == []
    ((name, *_, args, _),) = offline["launches"]   # no merge
    assert name == "decode_partial" and args[13:15] == (0, 0) and args[15] == BASE * 2   # the new out


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode_is_a_batch_of_one(offline, layout):
    S, hq, hkv, d = 5000, 16, 1, 64
    kv = (S, hkv, d) if layout == "NHD" else (hkv, S, d)
    q, k, v = arr((hq, d)), arr(kv), arr(kv)
    o = pykda.single_decode_with_kv_cache(q, k, v, kv_layout=layout)
    assert tuple(o.shape) == (hq, d)
    (name, grid, _, _, args, _), (merge, merge_grid, _, _, merge_args, _) = offline["launches"]
    plan, params = _spec_params(DecodeProblem(S, hq, hkv, d, "bfloat16"))
    assert plan.split and name == "decode_partial" and grid == (plan.n_chunks, hkv, 1)
    assert [_KINDS[type(a)] for a in args] == kernel_parameters("decode_partial", params)
    # one sequence of 16 heads and 20 chunks: a CTA (8 warps) per head and 32 columns
    assert plan.n_chunks == 20 and plan.merge_warps == 8 and merge == "decode_merge" and merge_grid == (hq, d // 32, 1)
    assert [_KINDS[type(a)] for a in merge_args] == kernel_parameters("decode_merge", params)
    assert merge_args == (*args[13:15], 0, S, hq, plan.n_chunks, plan.chunk, args[15], 0, d, 0, 8, hq, hkv, 1), \
        "no kv_lens (every row S), out without a batch stride, no LSE asked for"
    # size-1 dims (one KV head, one sequence) get a stride TMA accepts
    row = d * 2 if layout == "HND" else hkv * d * 2
    assert offline["maps"][0] == ("k", (d, hkv, S, 1), (d * 2, row, d * 2), (64, 1, plan.block_n, 1))


def test_bad_layout_raises_before_any_launch(offline):
    q, k, v = good()
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="nhd")
    assert offline["launches"] == [] and offline["maps"] == []


def test_decode_family_registers_every_kernel_the_planner_picks():
    """One kernel per head dim, dtype, cache (padded or each page size), CTA kind (transposed for
    at most 8 query heads, or not) and unsplit, split with decode_merge or split in a cluster of 2,
    4 or 8; head dim 64's short tile unsplit; the transposed one-tile kernels (one stage, two warps;
    tiles of 32 rows, and head dim 64 in both its tiles); the balanced split's (head dim 64 in both tiles); and for
    padded caches each of those but the balanced ones again in boxes of PADDED_BOX_ROWS rows
    (chunks of one tile over lengths on the device); head dim 128's streaming kernels at 3 stages and,
    in TMA boxes, at 4 (calls of at most an SM's units); padded caches' one-tile kernels also with
    their warps gathering their rows (K and V of like strides): the registry holds all 874, which
    cover the planner's pick for any problem, chunk and cache, lengths on the device or not."""
    from pykda import registry
    from pykda.ops.paged_decode import PAGE_SIZES
    registered = registry.specs("decode", "sm_90a")
    tiny = [s for s in registered if s.template == "decode_tiny"]
    # each of TINY_ROWS, groups 1, 2, 4, 8 within TINY_MAX_COLUMNS: 4 at D 64 and 128, 3 at D 256
    assert len(tiny) == len(set(tiny)) == len(decode.TINY_ROWS) * len(decode.DTYPES) * (4 + 4 + 3)
    specs = [s for s in registered if s.template == "decode"]
    kinds = 2 + len(decode.CLUSTERS)   # unsplit, merged by decode_merge, merged in each cluster size
    # transposed, one stage: tiles of 32 rows (ONE_TILE_SHORT_ROWS) and the short tile; head dim 64's of 128 rows too
    one_tile = 2 * len(decode.HEAD_DIMS) + 1
    counts = {}   # gathered pages or not: (kernels a cache, transposed unbalanced ones, balanced ones a CTA kind)
    for gathered in (False, True):   # the streaming depths over the head dims: 4 in TMA boxes (D 128 at 3 and 4), 3
        depths = sum(len({decode.decode_stages(d, u, 132, gathered) for u in (1, 133)}) for d in decode.HEAD_DIMS)
        balanced, transposed = depths + 1, depths * kinds + one_tile
        # (+1: head dim 64's short tile, not transposed)
        counts[gathered] = (2 * (depths * kinds + balanced) + 1 + one_tile, transposed, balanced)
    caches = {gathered: len(decode.DTYPES) * sum(decode.is_gathered(page) == gathered for page in (0,) + PAGE_SIZES)
              for gathered in (False, True)}
    padded, _, balanced = counts[False]
    boxed = len(decode.DTYPES) * (padded - 2 * balanced)   # padded caches' kernels in boxes (none balanced)
    self_gathered = len(decode.DTYPES) * one_tile   # padded one-tile kernels whose warps gather their rows
    assert len(specs) == len(set(specs)) == sum(caches[g] * counts[g][0] for g in caches) + boxed + self_gathered == 874
    assert sum(s.param_dict.get("PADDED_BOX_ROWS", 0) == decode.PADDED_BOX_ROWS and not s.param_dict["PAGE"]
               and not s.param_dict["BALANCED"] for s in specs) == boxed
    assert (sum(s.param_dict["TRANSPOSED"] for s in specs)   # (the boxed ones: padded, none balanced)
            == sum(caches[g] * (counts[g][1] + counts[g][2]) for g in caches) + len(decode.DTYPES) * counts[False][1]
            + self_gathered)
    one_stage = [s.param_dict for s in specs if s.param_dict["STAGES"] == 1]
    assert (len(one_stage) == (sum(caches.values()) + 2 * len(decode.DTYPES)) * one_tile
            and all(d["TRANSPOSED"] and d["WARPS"] == 2 for d in one_stage))
    assert all(d["GATHER"] == (d["PAGE"] > 0) for d in one_stage), "one-tile CTAs gather pages of every size"
    assert all(d["SELF_GATHER"] for d in one_stage if d["PAGE"]), "each warp gathers its pages' rows at one stage"
    assert sum(d["SELF_GATHER"] and not d.get("PADDED_BOX_ROWS") for d in one_stage if not d["PAGE"]) == self_gathered
    assert not any(d["SELF_GATHER"] for d in (s.param_dict for s in specs) if d["STAGES"] > 1)
    specs = set(specs)
    rng = np.random.default_rng(5)
    for _ in range(200):
        d, dt = int(rng.choice(decode.HEAD_DIMS)), str(rng.choice(decode.DTYPES))
        hkv, group, batch = (int(rng.choice(c)) for c in ((1, 2, 8, 32), (1, 4, 8, 32), (1, 3, 8, 64, 256)))
        p = DecodeProblem(int(rng.integers(1, 300000 if rng.random() < 0.8 else 70)), hkv * group, hkv, d, dt, batch)
        chunk = None if rng.random() < 0.5 else int(rng.integers(1, 64)) * decode.TILE_ROWS[d]
        uneven = bool(rng.random() < 0.5)
        for page in (0,) + PAGE_SIZES:
            plan = plan_decode(p, **H200, chunk_size=chunk, uneven=uneven, gathered=decode.is_gathered(page),
                               tiny=page == 0)
            assert decode.decode_spec(p, plan, "sm_90a", page) in set(registered), (p, chunk, page)
            plan = plan_decode(p, **H200, balanced=True, gathered=decode.is_gathered(page))
            assert decode.decode_spec(p, plan, "sm_90a", page) in specs, (p, page)


def test_the_planners_register_figures_give_each_streaming_kernel_its_true_ctas_per_sm():
    """`ctas_per_sm` (the planner's slots: the chunks' waves, spread splits, the balanced split's
    one round) counts registers by `_REGS_GUESS`. For every registered decode kernel that streams
    full tiles through a pipeline (the kernels of sequences past SHORT_TILE_ROWS, whose plans the
    slots decide), the CTAs an SM it gives are those the compiled kernel's registers allow
    (`runtime.kernel_resources`, allocated 8 a thread at a time) under the same shared-memory
    bound. (Short caches' one-tile CTAs do not split, so their slots choose nothing.)"""
    from pykda import registry, runtime
    specs = [s for s in registry.specs("decode", "sm_90a")
             if s.template == "decode" and s.param_dict["STAGES"] > 1 and s.param_dict["BLOCK_N"] == decode.TILE_ROWS[s.param_dict["D"]]]
    assert len(specs) > 300
    guess = dict(decode._REGS_GUESS)
    try:
        for spec, cubin, _, _ in runtime.compile_specs(specs):
            d = spec.param_dict
            regs = runtime.kernel_resources(cubin)["decode_partial"].registers
            heads_per_cta = 1 if d["TRANSPOSED"] else decode.MAX_HEADS_PER_CTA
            shape = (d["D"], d["BLOCK_N"], d["STAGES"], H200["smem_per_sm"], heads_per_cta, d["WARPS"])
            planned = decode.ctas_per_sm(*shape)
            decode._REGS_GUESS[d["D"], d["TRANSPOSED"]] = -(-regs // 8) * 8
            assert decode.ctas_per_sm(*shape) == planned, (spec.describe(), regs, planned)
            decode._REGS_GUESS.update(guess)
    finally:
        decode._REGS_GUESS.update(guess)


def test_decode_family_registers_batch_shapes():
    from pykda import registry
    specs = set(registry.specs("decode", "sm_90a"))
    for B, S in ((64, 4096), (256, 1024), (8, 32768)):
        p = DecodeProblem(S, 32, 8, 128, "bfloat16", B)
        assert decode.decode_spec(p, plan_decode(p, **H200), "sm_90a") in specs


@pytest.mark.parametrize("good_kwargs, bad_kwargs, message", [
    (dict(chunk_size=128), dict(chunk_size=128.0), "chunk_size must be a positive multiple of 64 .*got 128.0"),
    (dict(stages=3), dict(stages=3.0), r"stages must be in 2..8; got 3.0 \(an int is needed\)"),
])
def test_a_bad_setting_equal_to_a_prepared_good_one_still_raises(offline, good_kwargs, bad_kwargs, message):
    """Settings are checked when a call is prepared: a later call whose bad value compares equal
    to the good one (128.0 == 128) must not find that prepared call."""
    q, k, v = good()
    pykda.batch_decode_with_padded_kv_cache(q, k, v, **good_kwargs)
    launched = len(offline["launches"])
    with pytest.raises(ValueError, match=message):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, **bad_kwargs)
    assert len(offline["launches"]) == launched


# ---- the balanced split ----
def test_balanced_split_is_one_round_of_ctas_then_a_merge(offline):
    """balanced=True: decode_partial over one round of CTAs (132 SMs x 1 slot: 4 stages for these 20
    units of head dim 128) along x, the head blocks along z (group 32: two); its workspace holds
    (CTAs + units) x group partial rows, their
    LSE, then each unit's (first CTA, pieces) and each CTA's split unit; decode_merge takes a row
    per (unit, head of a group) here (10 units, fewer than the CTAs) and gets the CTAs, the KV heads
    and the batch; with more units than CTAs, a row per (CTA, head of a group)."""
    B, S, hq, hkv, d = 5, 3000, 64, 2, 128
    q, k, v = good(B, S, hq, hkv, d)
    lens = arr((B,), "int32", ptr=BASE * 3)
    decode.flash_decode(q, k, v, batched=True, kv_lens=lens, return_lse=True, balanced=True)
    p = DecodeProblem(S, hq, hkv, d, "bfloat16", B)
    plan = plan_decode(p, **H200, uneven=True, balanced=True)
    assert plan.balanced == 132 and plan.split and plan.merge_launch and plan.head_blocks == 2
    (name, grid, block, smem, args, spec), (merge, merge_grid, _, _, merge_args, _) = offline["launches"]
    assert (name, merge) == ("decode_partial", "decode_merge") and spec.param_dict["BALANCED"] == decode.BALANCED_MAX_BATCH
    assert grid == (132, 1, 2) and block == (160, 1, 1) and smem == plan.smem
    assert [_KINDS[type(a)] for a in args] == kernel_parameters("decode_partial", spec.param_dict)
    assert tuple(args[-3:]) == (hkv, B, 0) and args[7] == lens.ptr
    rows = (132 + B * hkv) * (hq // hkv)
    ((_, _, nbytes),) = offline["workspaces"]
    assert args[14] - args[13] == rows * d * 4 and nbytes == rows * (d * 4 + 4) + 8 * B * hkv + 4 * 132
    assert merge_args[5] == 132 and tuple(merge_args[-3:]) == (B * hq, hkv, B), "B · q_heads rows: by unit"
    rows_per_cta = decode.MERGE_WARPS // plan.merge_warps
    assert merge_grid == (-(-B * hq // rows_per_cta), d // 32, 1)
    B = 300   # 600 units, more than the CTAs: a row per (CTA, head of a group)
    q, k, v = good(B, S, hq, hkv, d)
    decode.flash_decode(q, k, v, batched=True, kv_lens=arr((B,), "int32", ptr=BASE * 3), balanced=True)
    merge_args = offline["launches"][-1][4]
    ctas = merge_args[5]   # (the planner's stages for 600 units: two CTAs an SM)
    assert ctas < B * hkv and tuple(merge_args[-3:]) == (ctas * (hq // hkv), hkv, B), "fewer rows: by CTA"


def test_balanced_split_refusals(offline):
    q, k, v = good()
    with pytest.raises(TypeError, match="balanced must be None, True or False; got 'yes'"):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, balanced="yes")
    with pytest.raises(ValueError, match="chunk_size sets the chunks of the chunked split; balanced=True has none"):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, balanced=True, chunk_size=64)
    q, k, v = good(B=1025, S=16, hkv=1, hq=1)
    with pytest.raises(ValueError, match="balanced=True reads at most 1024 sequences; got batch 1025"):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, balanced=True)
    assert offline["launches"] == []


def test_balanced_shares_cover_every_tile_once_and_pieces_have_unique_rows():
    """The kernel's arithmetic, mirrored: shares ⌊i·W/G⌋ partition the slots (a unit's fixed-cost
    slots, then its tiles); a unit's pieces are CTAs tile_owner(first tile) .. tile_owner(last);
    CTA i's piece of unit u sits at partial row i + u, unique; each unit of more than one piece is
    named once among the CTAs' split units (by the CTA after its first)."""
    rng = np.random.default_rng(0)
    cases = ((1, 8, 264, 1), (3, 2, 5, 1), (300, 16, 264, 1), (7, 1, 264, 0), (64, 8, 264, 2), (256, 8, 264, 1))
    for batch, kv_heads, grid_x, cost in cases:
        tiles = np.maximum(1, -(-rng.integers(0, 3000, batch) // 64))
        unit_slots = np.repeat(tiles, kv_heads) + cost     # units b-major: b · kv_heads + h
        starts = np.concatenate(([0], np.cumsum(unit_slots)))
        W = int(starts[-1])
        G = min(grid_x, W)
        share = [(i * W // G, (i + 1) * W // G) for i in range(G)]
        assert all(t1 > t0 for t0, t1 in share) and share[0][0] == 0 and share[-1][1] == W
        owner = lambda t: ((t + 1) * G - 1) // W
        rows, split_units = set(), []
        for i in range(1, G):   # the kernel's split unit of CTA i
            t0 = share[i][0]
            u = int(np.searchsorted(starts, t0, side="right")) - 1
            if t0 > starts[u] + cost and owner(int(starts[u]) + cost) == i - 1:
                split_units.append(u)
        for u in range(len(unit_slots)):
            first, last = owner(int(starts[u]) + cost), owner(int(starts[u + 1]) - 1)
            assert share[first][0] <= starts[u] + cost < share[first][1]
            for i in range(first, last + 1):
                assert share[i][0] < starts[u + 1] and share[i][1] > starts[u] + cost   # CTA i holds a tile of u
                assert i + u not in rows
                rows.add(i + u)
            assert (last > first) == (u in split_units)
        assert max(rows) < G + len(unit_slots) and len(split_units) == len(set(split_units))


def test_planner_takes_the_balanced_split_for_few_long_sequences_on_the_device():
    """balanced=None (the default): the balanced split where the lengths are on the device and
    the batch is few long sequences (`balanced_pays`); chunks for many or short ones, for lengths
    known on the host, a single sequence, or a chunk size given."""
    def picks(B, hq, hkv, d, S, uneven=True, chunk_size=None):
        p = DecodeProblem(S, hq, hkv, d, "bfloat16", B)
        return plan_decode(p, **H200, chunk_size=chunk_size, uneven=uneven, balanced=None).balanced > 0
    assert picks(16, 32, 8, 64, 8192) and picks(32, 64, 4, 128, 65536) and picks(4, 16, 16, 64, 65536)
    assert not picks(32, 32, 8, 64, 8192)   # 256 units of two CTAs an SM (D 64 at three stages): chunks
    assert not picks(256, 8, 1, 128, 4096) and not picks(256, 64, 8, 128, 513) and not picks(64, 128, 8, 128, 2048)
    assert not picks(32, 64, 4, 128, 65536, uneven=False) and not picks(32, 64, 4, 128, 65536, chunk_size=1024)
    assert not picks(1, 32, 32, 128, 8192) and not picks(1025, 1, 1, 128, 65536)


def test_balanced_calls_are_keyed_by_the_flag_and_its_type(offline):
    """balanced=None, True and False prepare three calls; 1 is not True (a bad 1 must not find
    the call prepared for True: it raises)."""
    q, k, v = good(B=16, S=8192, hq=32, hkv=8, d=64)
    lens = arr((16,), "int32", ptr=BASE * 3)
    for flag in (None, True, False):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=lens, balanced=flag)
    grids = [launch[1] for launch in offline["launches"] if launch[0] == "decode_partial"]
    assert grids[0] == grids[1] == (264, 1, 1) and grids[2][1:] == (8, 16)   # auto: balanced here (D 64, two CTAs an SM)
    with pytest.raises(TypeError, match="balanced must be None, True or False; got 1"):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=lens, balanced=1)
