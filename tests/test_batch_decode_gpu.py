"""GPU tests of batch_decode_with_padded_kv_cache against the float64 reference (run on the H200).

Rows past each sequence's length hold NaN and the outputs start as NaN: the kernel must read
only the rows it owns and write every output element."""
import itertools

import numpy as np
import pytest

import pykda
from pykda import reference, runtime
from pykda.ops import decode

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
TOL = {"bfloat16": 1e-2, "float16": 2e-3}


def make(B, S, hq, hkv, d, dtype, lens, seed):
    """q [B, hq, d] and NHD k, v [B, S, hkv, d] with NaN past each length."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = (2 * torch.randn(B, hq, d, generator=g, device="cuda")).to(dt)
    k = torch.randn(B, S, hkv, d, generator=g, device="cuda").to(dt)
    v = torch.randn(B, S, hkv, d, generator=g, device="cuda").to(dt)
    for b, n in enumerate(lens):
        k[b, n:], v[b, n:] = float("nan"), float("nan")
    return q, k, v


def as_layout(x, layout):
    return x if layout == "NHD" else x.transpose(1, 2).contiguous()


def ref(q, k, v, lens, scale=None):
    """Per-sequence float64 reference over the first lens[b] rows (NHD k, v)."""
    outs, lses = [], []
    for b, n in enumerate(lens):
        o, lse = reference.decode_attention(*(cp.from_dlpack(x.double().contiguous()) for x in (q[b], k[b, :n], v[b, :n])),
                                            scale=scale)
        outs.append(cp.asnumpy(o))
        lses.append(cp.asnumpy(lse))
    return outs, lses


def check(o, lse, expected, lens, dtype):
    o, lse = o.float().cpu().numpy(), lse.cpu().numpy()
    assert np.isfinite(o).all(), "every output element written, no padding row read"
    o_ref, lse_ref = expected
    for b, n in enumerate(lens):
        if n == 0:
            assert (o[b] == 0).all() and (lse[b] == -np.inf).all(), "an empty sequence gives zeros, LSE -inf"
            continue
        err = reference.relative_error(o[b].astype(np.float64), o_ref[b])
        assert err < TOL[dtype], f"sequence {b} (length {n}): relative L2 error {err:.2e}"
        assert np.abs(lse[b] - lse_ref[b]).max() < 2e-3


def lengths(B, S, seed):
    """Each sequence's length: 0, 1 and S among them, the rest random."""
    fixed = [S, 0, 1, max(S - 1, 0)][:B] if B > 1 else [S]
    rng = np.random.default_rng(seed)
    return fixed + [int(x) for x in rng.integers(0, S + 1, B - len(fixed))]


HEADS, DIMS, DTYPES = [(32, 8), (8, 8), (8, 1), (64, 4)], [64, 128, 256], ["bfloat16", "float16"]
# each (heads, head_dim, dtype) once among the (S, B, layout) cases (groups 1-8 transposed, 16 not)
CASES = [(S, B, layout, *HEADS[i % 4], DIMS[i // 4 % 3], DTYPES[i // 12 % 2])
         for i, (S, B, layout) in enumerate(itertools.product((1, 17, 1000, 8192), (1, 3, 8), ("NHD", "HND")))]


@pytest.mark.parametrize("S, B, layout, hq, hkv, d, dtype", CASES)
def test_matches_reference(S, B, layout, hq, hkv, d, dtype):
    lens = lengths(B, S, seed=S + B)
    q, k, v = make(B, S, hq, hkv, d, dtype, lens, seed=S * 7 + B + d)
    kv_lens = None if (B == 1 and layout == "NHD") else torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o, lse = pykda.batch_decode_with_padded_kv_cache(q, as_layout(k, layout), as_layout(v, layout), kv_layout=layout,
                                                     kv_lens=kv_lens, out=out, return_lse=True)
    assert o is out and lse.shape == (B, hq) and lse.dtype == torch.float32
    check(o, lse, ref(q, k, v, lens), lens, dtype)


@pytest.mark.parametrize("chunk_size, merge_warps", [(64, 4), (192, 2), (512, 1)])   # 192: 3 tiles, not a power of 2
def test_split_sequences_of_different_lengths_and_scale(chunk_size, merge_warps):
    """A forced small chunk: sequences of 0, 1, 64, 65 and 1000 rows take ceil(rows / chunk) chunks,
    1..16 each (1..6 of 192, 1..2 of 512), the last the remainder (at 64, 65 rows end in a chunk of
    one row); the merge gives each (query row, 32 columns) 4, 2 or 1 warps."""
    assert decode.merge_warps(5 * 16, 128, -(-1000 // chunk_size), 132) == merge_warps
    lens = [0, 1, 64, 65, 1000]
    q, k, v = make(5, 1000, 16, 4, 128, "bfloat16", lens, seed=1)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    o, lse = pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=kv_lens, scale=0.3, return_lse=True,
                                                     chunk_size=chunk_size)
    check(o, lse, ref(q, k, v, lens, scale=0.3), lens, "bfloat16")


@pytest.mark.parametrize("chunk_size, cluster", [(128, 8), (384, 4), (512, 2)])
def test_split_sequences_merge_in_clusters(chunk_size, cluster):
    """48 sequences of 0..1000 rows in chunks of 128, 384 or 512 rows (at most 8, 3 or 2 each): more
    CTAs than one round of the GPU, so each sequence's chunks merge in a cluster of 8, 4 or 2 CTAs
    (those past its chunks leave at once), no decode_merge; out poisoned first."""
    lens = [1000, 0, 1, 64, 65, 999, 129, 383, 385, 512, 513] + np.random.default_rng(chunk_size).integers(0, 1001, 37).tolist()
    B, S, hq, hkv, d = len(lens), 1000, 32, 8, 128
    dev = runtime.device_info(0)
    plan = decode.plan_decode(decode.DecodeProblem(S, hq, hkv, d, "bfloat16", B), dev.sm_count, dev.smem_per_sm,
                              chunk_size, uneven=True)
    assert plan.cluster == cluster, plan
    q, k, v = make(B, S, hq, hkv, d, "bfloat16", lens, seed=chunk_size)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o, lse = pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=kv_lens, scale=0.3, out=out, return_lse=True,
                                                     chunk_size=chunk_size)
    assert o is out
    check(o, lse, ref(q, k, v, lens, scale=0.3), lens, "bfloat16")


def checked_call(B, S, hq, hkv, d, dtype, layout, lens, seed, **kwargs):
    """A call with `kwargs` (and kv_lens on the device) on a cache in `layout` whose rows past each
    length are NaN, into a NaN-poisoned out, checked against float64 (with kwargs' scale). Returns
    q, the cache's k and v, kv_lens, o and lse, for a second call to compare with."""
    q, k, v = make(B, S, hq, hkv, d, dtype, lens, seed=seed)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kl, vl = as_layout(k, layout), as_layout(v, layout)
    out = torch.full_like(q, float("nan"))
    o, lse = pykda.batch_decode_with_padded_kv_cache(q, kl, vl, kv_layout=layout, kv_lens=kv_lens, out=out,
                                                     return_lse=True, **kwargs)
    assert o is out
    check(o, lse, ref(q, k, v, lens, scale=kwargs.get("scale")), lens, dtype)
    return q, kl, vl, kv_lens, o, lse


# decode_tiny: (batch, longest, heads, head dim, dtype, layout): one sequence of one row; groups of 1,
# 2, 3 (the 4-head kernel), 5 (the 8-head one) and 8; the longest rows it takes; lengths with 0 and 1
TINY_CASES = [(1, 1, 32, 8, 64, "bfloat16", "NHD"), (5, 17, 24, 8, 128, "float16", "HND"),
              (4, 32, 16, 8, 256, "bfloat16", "NHD"), (3, 15, 16, 16, 64, "float16", "HND"),
              (2, 32, 4, 2, 128, "bfloat16", "HND"), (1, 31, 5, 1, 64, "float16", "NHD"),
              (2, 9, 64, 8, 64, "bfloat16", "HND"),
              (3, 20, 64, 8, 128, "float16", "NHD"), (2, 32, 12, 3, 256, "bfloat16", "HND"),   # 2 heads a thread
              (33, 7, 32, 8, 64, "bfloat16", "HND"),   # 264 units: two an SM
              (3, 64, 32, 8, 128, "bfloat16", "HND"), (1, 50, 32, 8, 64, "float16", "NHD"),   # kernels of 64 rows
              (2, 33, 8, 2, 256, "float16", "NHD")]


@pytest.mark.parametrize("B, S, hq, hkv, d, dtype, layout", TINY_CASES)
def test_short_calls_run_decode_tiny_and_match_the_reference(B, S, hq, hkv, d, dtype, layout):
    """Short sequences in few CTAs go to decode_tiny (rows past each length NaN, out poisoned); the
    pipeline's kernel (a chunk size sets it) gives the same answer within rounding."""
    dev = runtime.device_info(0)
    assert decode.plan_decode(decode.DecodeProblem(S, hq, hkv, d, dtype, B), dev.sm_count, dev.smem_per_sm,
                              uneven=True, balanced=None, tiny=True).tiny
    q, kl, vl, kv_lens, o, lse = checked_call(B, S, hq, hkv, d, dtype, layout, lengths(B, S, seed=S + 3 * B),
                                              seed=S + d, scale=0.2)
    o2, lse2 = pykda.batch_decode_with_padded_kv_cache(q, kl, vl, kv_layout=layout, kv_lens=kv_lens, return_lse=True,
                                                       scale=0.2, chunk_size=64)
    assert reference.relative_error(o2.double().cpu().numpy(), o.double().cpu().numpy()) < TOL[dtype]
    assert torch.equal(torch.isinf(lse2), torch.isinf(lse))


# the balanced split: (batch, longest, heads, head dim, dtype, layout): one round of CTAs sharing
# every (sequence, KV head)'s tiles; fewer tiles than CTAs (each CTA one tile, the rest leave),
# units of one tile among long ones, many units a CTA (short sequences), two head blocks (group 32)
BALANCED_CASES = [(1, 17, 32, 8, 128, "bfloat16", "NHD"), (3, 1000, 32, 8, 64, "float16", "HND"),
                  (5, 8192, 8, 1, 256, "bfloat16", "NHD"), (16, 16384, 64, 8, 128, "bfloat16", "HND"),
                  (300, 200, 16, 16, 128, "float16", "NHD"), (7, 4097, 64, 2, 128, "bfloat16", "NHD"),
                  (64, 2048, 32, 8, 64, "bfloat16", "HND")]


@pytest.mark.parametrize("B, S, hq, hkv, d, dtype, layout", BALANCED_CASES)
def test_balanced_split_matches_reference(B, S, hq, hkv, d, dtype, layout):
    """balanced=True: each CTA streams its share of every sequence's tiles, crossing sequences and
    KV heads; lengths 0, 1, S, S - 1 and random (NaN past them), out poisoned; against float64 and
    within rounding of the chunked split of the same call."""
    q, kc, vc, kv_lens, o, lse = checked_call(B, S, hq, hkv, d, dtype, layout, lengths(B, S, seed=B + S + d),
                                              seed=B * 3 + S, balanced=True)
    o2, lse2 = pykda.batch_decode_with_padded_kv_cache(q, kc, vc, kv_layout=layout, kv_lens=kv_lens, return_lse=True,
                                                       balanced=False)
    assert (o.float() - o2.float()).abs().max().item() < 2e-2
    finite = torch.isfinite(lse2)
    assert torch.equal(finite, torch.isfinite(lse)) and (lse - lse2)[finite].abs().max().item() < 1e-3


def test_balanced_split_in_a_cuda_graph_with_new_lengths():
    """torch's capture idiom around a balanced call; replays with new data and lengths (the
    shares move with them: the lengths are read on the device)."""
    B, S, hq, hkv, d = 24, 4096, 32, 8, 128
    q, k, v = make(B, S, hq, hkv, d, "bfloat16", [S] * B, seed=11)
    kv_lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    graph, lse = capture_as_torch_documents(q, k, v, kv_lens, out, balanced=True)
    replay_with_new_data(graph, q, k, v, kv_lens, out, lse,
                         [(seed, lengths(B, S, seed)) for seed in (12, 13)] + [(14, [0] * B), (15, [1] * B)])


def test_planner_split_with_long_short_and_empty_sequences():
    lens = [8192, 3000, 0]
    q, k, v = make(3, 8192, 32, 8, 128, "bfloat16", lens, seed=2)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    o, lse = decode.flash_decode(q, k, v, batched=True, kv_lens=kv_lens, return_lse=True)
    check(o, lse, ref(q, k, v, lens), lens, "bfloat16")


@pytest.mark.parametrize("d, layout, alike", [(64, "NHD", True), (128, "HND", True), (256, "NHD", True),
                                             (128, "NHD", False), (64, "HND", False)])
def test_one_tile_ctas_gather_their_rows_or_read_boxes(d, layout, alike):
    """A batch of many sequences within a tile (more units than decode_tiny takes): one-tile CTAs,
    whose warps gather their own rows with cp.async where K and V have like strides, and whose
    producer reads TMA boxes where they do not (V a view of a cache of twice the KV heads);
    lengths 0..64, NaN past them and in the wider cache."""
    B, S, hq, hkv = 40, 64, 32, 8
    lens = lengths(B, S, seed=d)
    q, k_nhd, v_nhd = make(B, S, hq, hkv, d, "bfloat16", lens, seed=d + 1)
    k, v = as_layout(k_nhd, layout), as_layout(v_nhd, layout)
    if not alike:
        heads = 2 if layout == "NHD" else 1
        wide = torch.full(v.shape[:heads] + (2 * hkv,) + v.shape[heads + 1:], float("nan"), dtype=v.dtype, device="cuda")
        v = wide.narrow(heads, 0, hkv)
        v.copy_(as_layout(v_nhd, layout))
        assert v.stride() != k.stride()
    plan, spec = decode.plan_for(decode.DecodeProblem(S, hq, hkv, d, "bfloat16", B), 0, None, None, uneven=True,
                                 balanced=None, kv_strides_alike=alike)
    assert plan.one_tile and not plan.tiny and spec.param_dict["SELF_GATHER"] == alike, plan
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    o, lse = pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout=layout, kv_lens=kv_lens, out=out,
                                                     return_lse=True)
    check(o, lse, ref(q, k_nhd, v_nhd, lens), lens, "bfloat16")


def test_strided_hnd_views_of_a_larger_cache():
    B, S, S_max, hkv, d = 3, 3000, 4096, 8, 128
    lens = [3000, 17, 2048]
    q = torch.randn(B, 32, d, device="cuda").to(torch.bfloat16)
    cache = torch.randn(B, 2, hkv, S_max, d, device="cuda").to(torch.bfloat16)   # [B, K|V, H, S_max, D]
    k, v = cache[:, 0, :, :S], cache[:, 1, :, :S]
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    o, lse = pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="HND", kv_lens=kv_lens, return_lse=True)
    check(o, lse, ref(q, k.transpose(1, 2), v.transpose(1, 2), lens), lens, "bfloat16")


def capture_as_torch_documents(q, k, v, kv_lens, out, **settings):
    """A padded batch call (into `out`, with its LSE) captured with torch's idiom: a warm-up on a
    side stream, then `torch.cuda.graph(g)` on a stream of its own. Returns the graph and its LSE."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=kv_lens, out=out, **settings)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=kv_lens, out=out, return_lse=True, **settings)
    return graph, lse


def replay_with_new_data(graph, q, k, v, kv_lens, out, lse, cases):
    """For each (seed, lengths) of `cases`: new bf16 data and lengths into the graph's inputs (q,
    NHD k and v, kv_lens), out poisoned, one replay, out and lse against the float64 reference."""
    (B, hq, d), (S, hkv) = q.shape, k.shape[1:3]
    for seed, lens in cases:
        q2, k2, v2 = make(B, S, hq, hkv, d, "bfloat16", lens, seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2), kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, lse, ref(q2, k2, v2, lens), lens, "bfloat16")


def test_cuda_graph_replay_with_new_lengths_and_data():
    B, S, hq, hkv, d = 3, 8192, 32, 8, 128
    q, k, v = make(B, S, hq, hkv, d, "bfloat16", [S] * B, seed=3)
    kv_lens = torch.tensor([S, 5000, 1], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up on the capture stream: compile, grow its workspace
        pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=kv_lens, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        _, lse_graph = pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=kv_lens, out=out, return_lse=True)
    replay_with_new_data(graph, q, k, v, kv_lens, out, lse_graph, ((4, [4097, 8192, 0]), (5, [1, 63, 8191])))


def test_cuda_graph_of_a_split_merged_in_clusters():
    """torch's capture idiom (warm-up on a side stream, then `torch.cuda.graph(g)`) around a call
    whose chunks merge in clusters of 8; replayed with new data and new lengths (0 and 1 rows, some
    sequences of fewer chunks than the cluster)."""
    B, S, hq, hkv, d, chunk = 48, 1000, 32, 8, 128, 128
    dev = runtime.device_info(0)
    plan = decode.plan_decode(decode.DecodeProblem(S, hq, hkv, d, "bfloat16", B), dev.sm_count, dev.smem_per_sm,
                              chunk, uneven=True)
    assert plan.cluster == 8, plan
    q, k, v = make(B, S, hq, hkv, d, "bfloat16", [S] * B, seed=8)
    kv_lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    graph, lse = capture_as_torch_documents(q, k, v, kv_lens, out, chunk_size=chunk)
    replay_with_new_data(graph, q, k, v, kv_lens, out, lse,
                         [(seed, [0, 1, 128, 129, 1000] + np.random.default_rng(seed).integers(0, 1001, B - 5).tolist())
                          for seed in (9, 10)])


def test_bad_inputs_raise_before_launch():
    q, k, v = make(2, 100, 32, 8, 128, "bfloat16", [100, 100], seed=6)
    with pytest.raises(TypeError, match="kv_lens must have dtype int32; got int64"):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_lens=torch.zeros(2, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="q and k must have the same batch size"):
        pykda.batch_decode_with_padded_kv_cache(q[:1], k, v)
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        pykda.batch_decode_with_padded_kv_cache(q, k, v, kv_layout="BHSD")
