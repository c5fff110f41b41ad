"""GPU tests of the segmented KDA prefill (long sequences split into segments: pass 1 maps, the scan,
pass 2), against the float64 reference and against pykda's own serial path (`segment_chunks=0`)."""
import numpy as np
import pytest

import pykda
from pykda.ops.kda import plan_kda, validate_kda
from pykda.ops.kda_variant import KdaFlags
from pykda.runtime.arrays import as_device_array

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from test_kda_gpu import (SOFTPLUS, TOL, VARLEN, cu_of, f64, long_memory, make, pool_case, ref, rel,  # noqa: E402
                          run, unbounded_inputs)


def poisoned(B, T, H, K):
    return torch.full((B, T, H, K), float("nan"), dtype=torch.bfloat16, device="cuda")


def segmented_and_serial(x, flags, seg, **kw):
    """(out, final state) of a call with `seg` chunks per segment, and of the serial path."""
    B, T, H, K = x["q"].shape
    o, fs = run(x, flags, out=poisoned(B, T, H, K), segment_chunks=seg, **kw)
    o1, fs1 = run(x, flags, segment_chunks=0, **kw)
    return o, fs, o1, fs1


@pytest.mark.parametrize("seg", [1, 3])
@pytest.mark.parametrize("state", [None, "float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["batch", "varlen"])
@pytest.mark.parametrize("C", [16, 32])
@pytest.mark.parametrize("K", [64, 128])
def test_segments_match_reference(K, C, layout, state, seg):
    """Lengths of 1, 15, 16, 17, 0, 1000 and 4099 tokens (varlen) or three of 333 (batch): segments
    of one chunk, of three (a partial last one), sequences of a single segment among them."""
    if layout == "batch":
        B, T, cu, N = 3, 333, None, 3
    else:
        B, T, N = 1, sum(VARLEN), len(VARLEN)
        cu = cu_of(VARLEN, torch.int64 if K == 64 else torch.int32)
    x, s0 = make(B, T, 2, K, seed=100 + K + C + seg, state_dtype=state, N=N)
    o, fs, o1, fs1 = segmented_and_serial(x, SOFTPLUS, seg, initial_state=s0, output_final_state=state is not None,
                                          cu_seqlens=cu, chunk_size=C)
    o_ref, s_ref = ref(x, None, s0, cu, flags=SOFTPLUS)
    assert torch.isfinite(o).all(), "every output row written"
    err = rel(o, o_ref)
    assert err <= TOL, f"out relative L2 error {err:.2e}"
    assert rel(o, f64(o1)) <= 2e-3, "segmented and serial paths agree"
    if state is None:
        assert fs is None
    else:
        assert fs.dtype == s0.dtype and fs.shape == s0.shape
        assert rel(fs, s_ref) <= TOL and rel(fs, f64(fs1)) <= 2e-3


@pytest.mark.parametrize("v_first", [True, False])
@pytest.mark.parametrize("seg", [0, 3])
@pytest.mark.parametrize("layout", ["batch", "varlen"])
def test_warpgroup_products_match_reference(layout, seg, v_first):
    """At K 128, C 16 the products run on wgmma (which reads the record in the hardware's shared-memory
    layouts) for 4 and 8 consumer warps in segments (pass 1's maps and pass 2) and for 8 serially;
    on mma.sync (the same record, read by ldmatrix) otherwise. Out (poisoned first) and the final
    state against float64; the same path at two warp counts bit for bit, the other within 2e-3; both
    state layouts."""
    if layout == "batch":
        B, T, cu, N = 3, 333, None, 3
    else:
        B, T, N = 1, sum(VARLEN), len(VARLEN)
        cu = cu_of(VARLEN)
    x, s0 = make(B, T, 2, 128, seed=300 + seg + len(layout), state_dtype="bfloat16", N=N)
    o_ref, s_ref = ref(x, None, s0, cu, flags=SOFTPLUS)
    as_layout = (lambda s: s) if v_first else (lambda s: s.transpose(-1, -2).contiguous())
    results = {}
    for warps in (2, 4, 8):
        o, fs = pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **SOFTPLUS, A_log=x["A_log"],
                                dt_bias=x["dt_bias"], state_v_first=v_first, initial_state=as_layout(s0),
                                output_final_state=True, cu_seqlens=cu, out=poisoned(B, T, 2, 128), warps=warps,
                                segment_chunks=seg)
        fs = as_layout(fs)
        assert torch.isfinite(o).all(), f"every output row written ({warps} warps)"
        assert rel(o, o_ref) <= TOL and rel(fs, s_ref) <= TOL, (warps, rel(o, o_ref), rel(fs, s_ref))
        results[warps] = o, fs
    (a, b), other = ((4, 8), 2) if seg else ((2, 4), 8)   # wgmma in segments at 4 and 8 warps, serially at 8
    assert torch.equal(results[a][0], results[b][0]) and torch.equal(results[a][1], results[b][1])
    o2, fs2 = results[other]
    assert rel(results[a][0], f64(o2)) <= 2e-3 and rel(results[a][1], f64(fs2)) <= 2e-3


def test_scan_candidates_fewer_than_the_sequences():
    """51 sequences, 50 of them short: the scan's grid has fewer candidates than sequences (26 for
    51), so each long sequence is found by floor(base / (2·seg + 1)), not by its index."""
    lengths = [17] * 25 + [2000] + [17] * 25
    x, s0 = make(1, sum(lengths), 2, 64, seed=31, state_dtype="float32", N=len(lengths))
    x = long_memory(x)   # a wrong segment start shows
    cu = cu_of(lengths)
    args = [as_device_array(x[n], n) for n in ("q", "k", "v", "g", "beta")]
    p = validate_kda(*args, None, None, as_device_array(s0, "s0"), None, None, as_device_array(cu, "cu"), None, None,
                     KdaFlags(True, False, True, False, False, None), True, 16)
    assert 0 < plan_kda(p, 132, segment_chunks=4).segments.scan_candidates < len(lengths)
    o, fs, o1, fs1 = segmented_and_serial(x, SOFTPLUS, 4, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    o_ref, s_ref = ref(x, None, s0, cu, flags=SOFTPLUS)
    assert torch.isfinite(o).all(), "every output row written"
    assert rel(o, o_ref) <= TOL and rel(fs, s_ref) <= TOL
    assert rel(o, f64(o1)) <= 2.5e-3 and rel(fs, f64(fs1)) <= 2.5e-3


def test_the_planner_segments_a_long_sequence_of_few_heads():
    x, s0 = make(1, 16384, 2, 128, seed=7, state_dtype="float32")
    args = [as_device_array(x[n], n) for n in ("q", "k", "v", "g", "beta")]
    p = validate_kda(*args, None, None, None, None, None, None, None, None,
                     KdaFlags(True, False, True, False, False, None), True, 16)
    assert plan_kda(p, torch.cuda.get_device_properties(0).multi_processor_count).segments.chunks > 0
    o, fs, o1, fs1 = segmented_and_serial(x, SOFTPLUS, None, initial_state=s0, output_final_state=True)
    o_ref, s_ref = ref(x, None, s0, flags=SOFTPLUS)
    err, serr = rel(o, o_ref), rel(fs, s_ref)
    print(f"\nT=16384 H=2 planned segments: out {err:.2e} state {serr:.2e}; vs serial "
          f"{rel(o, f64(o1)):.2e} / {rel(fs, f64(fs1)):.2e}")
    assert err <= 3e-3 and serr <= 3e-3
    assert rel(o, f64(o1)) <= 1e-3 and rel(fs, f64(fs1)) <= 1e-3


@pytest.mark.parametrize("B, K, C", [(1, 128, 16), (2, 64, 32), (1, 64, 16), (2, 128, 32)])
def test_two_level_scan_matches_reference(B, K, C):
    """One head, segments of one chunk: the scan in two levels (groups composed at once, their
    starts walked, each group walked from its start; the last group partial) against float64 and
    the serial path."""
    T, H = 2500, 1
    x, s0 = make(B, T, H, K, seed=300 + B + K + C, state_dtype="float32")
    args = [as_device_array(x[n], n) for n in ("q", "k", "v", "g", "beta")]
    p = validate_kda(*args, None, None, None, None, None, None, None, None,
                     KdaFlags(True, False, True, False, False, None), True, C)
    seg = plan_kda(p, torch.cuda.get_device_properties(0).multi_processor_count, segment_chunks=1).segments
    assert seg.groups > 1 and (seg.slots // B - 2) % seg.group_slots, "two levels, a partial last group"
    o, fs, o1, fs1 = segmented_and_serial(x, SOFTPLUS, 1, initial_state=s0, output_final_state=True, chunk_size=C)
    o_ref, s_ref = ref(x, None, s0, flags=SOFTPLUS)
    assert torch.isfinite(o).all(), "every output row written"
    assert rel(o, o_ref) <= TOL and rel(fs, s_ref) <= TOL
    assert rel(o, f64(o1)) <= 2e-3 and rel(fs, f64(fs1)) <= 2e-3


def test_the_planner_splits_only_the_long_sequences_of_a_varlen_batch():
    """Varlen, planned: the sequences longer than a share split (here 40000 and 3000 tokens),
    the short ones stay whole beside them; the output (poisoned first) and the final states
    equal the serial path's."""
    lengths = [40000, 100, 17, 0, 3000, 1]
    x, s0 = make(1, sum(lengths), 2, 128, seed=171, state_dtype="float32", N=len(lengths))
    cu = cu_of(lengths)
    args = [as_device_array(x[n], n) for n in ("q", "k", "v", "g", "beta")]
    p = validate_kda(*args, None, None, as_device_array(s0, "s0"), None, None, as_device_array(cu, "cu"), None, None,
                     KdaFlags(True, False, True, False, False, None), True, 16)
    seg = plan_kda(p, torch.cuda.get_device_properties(0).multi_processor_count).segments
    chunks = [-(-n // 16) for n in lengths]
    assert seg.split_above > 0 and sum(c > seg.split_above for c in chunks) >= 1
    assert sum(c <= seg.split_above for c in chunks) >= 3
    o, fs, o1, fs1 = segmented_and_serial(x, SOFTPLUS, None, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    assert torch.isfinite(o).all(), "every output row written"
    assert rel(o, f64(o1)) <= 1e-3 and rel(fs, f64(fs1)) <= 1e-3
    whole = [n for n, c in enumerate(chunks) if c <= seg.split_above]
    rows = torch.cat([torch.arange(int(cu[n]), int(cu[n + 1])) for n in whole]).cuda()
    assert torch.equal(o[:, rows], o1[:, rows]) and torch.equal(fs[whole], fs1[whole]), "unsplit: bit for bit"
    o_ref, s_ref = ref(x, None, s0, cu, flags=SOFTPLUS)
    assert rel(o, o_ref) <= 3e-3 and rel(fs, s_ref) <= 3e-3


@pytest.mark.parametrize("state", ["float32", "bfloat16"])
def test_segments_on_the_state_pool_in_place(state):
    """A sequence's first segment reads its pool row while its last writes it: the start state is
    taken into the map slots first, so the result equals the serial path's."""
    P = 11
    x, pool, before, idx, has, cu = pool_case([400, 0, 1, 777, 16], 131, state, P=P)
    kw = dict(cu_seqlens=cu, state_indices=idx, has_initial_state=has, output_final_state=True)
    o, fs = run(x, SOFTPLUS, initial_state=pool, segment_chunks=2, **kw)
    assert fs is pool
    serial = before.clone()
    o1, _ = run(x, SOFTPLUS, initial_state=serial, segment_chunks=0, **kw)
    assert rel(o, f64(o1)) <= 2e-3
    live = [r for r in idx.tolist() if r >= 0]
    assert rel(pool[live], f64(serial[live])) <= 2e-3
    untouched = [r for r in range(P) if r not in live]
    assert torch.equal(pool[untouched], before[untouched]), "rows no sequence names are not touched"
    s0 = torch.stack([before[7], before[2], torch.zeros_like(before[0]), torch.zeros_like(before[0]), before[0]])
    o_ref, s_ref = ref(x, None, s0, cu, flags=SOFTPLUS)
    assert rel(o, o_ref) <= TOL and rel(pool[live], s_ref[[0, 1, 3, 4]]) <= TOL


def test_segments_with_steep_decays_and_fla_layout():
    """Kimi Linear's unbounded gate with decays near 0 (the growth-free form) and fla's K-first
    states: every segment map composes through them."""
    x, s0 = unbounded_inputs(4096, 4, 128, seed=141, dt_bias_scale=3.0)
    flags = dict(SOFTPLUS, A_log=x["A_log"], dt_bias=x["dt_bias"])
    s0k = s0.transpose(-1, -2).contiguous()
    call = lambda seg: pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **flags, initial_state=s0k,  # noqa: E731
                                       output_final_state=True, segment_chunks=seg)
    (o, fs), (o1, fs1) = call(7), call(0)
    o_ref, s_ref = ref(x, None, s0, flags=SOFTPLUS)
    assert rel(o, o_ref) <= 2.5e-3 and rel(fs.transpose(-1, -2), s_ref) <= 2e-3
    assert rel(o, f64(o1)) <= 1e-3 and rel(fs, f64(fs1)) <= 1e-3


def test_segmented_call_is_captured_and_replayed_with_new_lengths():
    """Segments are enumerated on the device: a captured call replays with other lengths."""
    H, K, T = 2, 64, 3000
    x, _ = make(1, T, H, K, seed=151)
    cu = cu_of([1000, 0, 2000])
    o = poisoned(1, T, H, K)
    run(x, SOFTPLUS, cu_seqlens=cu, out=o, segment_chunks=4)   # compile, warm up
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(x, SOFTPLUS, cu_seqlens=cu, out=o, segment_chunks=4)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(x, SOFTPLUS, cu_seqlens=cu, out=o, segment_chunks=4)
    for lengths in ([3000, 0, 0], [17, 2900, 83], [1, 1, 2998]):
        cu.copy_(cu_of(lengths))
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        o_ref, _ = ref(x, None, None, cu, flags=SOFTPLUS)
        assert torch.isfinite(o).all() and rel(o, o_ref) <= TOL, lengths


@pytest.mark.parametrize("memory", ["short", "long"])
def test_long_sequence_accuracy_at_131072_tokens(memory):
    """The issue's accuracy bar: out and final state within 3e-3 of float64, and near the serial
    path: within 1e-3 where the state forgets within a segment (random unit keys, β ~ 0.5: the
    start of a segment barely matters). Where it remembers across segments, both paths are
    2.9e-3 from float64 (H200: the bf16 state operand of S·kdᵀ and S·qdᵀ, the bf16 output),
    rounded differently, so they are 2.2e-3 apart: within 2.5e-3."""
    x, s0 = make(1, 131072, 1, 128, seed=161, state_dtype="float32")
    if memory == "long":
        x = long_memory(x)
    o, fs, o1, fs1 = segmented_and_serial(x, SOFTPLUS, None, initial_state=s0, output_final_state=True)
    o_ref, s_ref = ref(x, None, s0, flags=SOFTPLUS)
    err, serr = rel(o, o_ref), rel(fs, s_ref)
    d, ds = rel(o, f64(o1)), rel(fs, f64(fs1))
    print(f"\nT=131072 H=1 K=128 softplus, {memory} memory: out {err:.2e} state {serr:.2e}; serial "
          f"{rel(o1, o_ref):.2e} / {rel(fs1, s_ref):.2e}; vs serial out {d:.2e} state {ds:.2e}")
    near = 1e-3 if memory == "short" else 2.5e-3
    assert err <= 3e-3 and serr <= 3e-3 and d <= near and ds <= near
    assert np.isfinite(err)


def checkpoints_ref(x, s0, lengths, every, flags=SOFTPLUS, cu=None):
    """float64 checkpoints [rows, H, V, K]: the state before tokens 0, E, 2E, ... of each sequence
    (the initial state, then the reference's state after token i·E − 1)."""
    from pykda import reference
    gate_args = {n: f64(x[n]) for n in ("A_log", "dt_bias")}
    _, _, states = reference.kda_recurrent(
        f64(x["q"]), f64(x["k"]), f64(x["v"]), f64(x["g"]), f64(x["beta"]), **gate_args,
        initial_state=None if s0 is None else f64(s0), cu_seqlens=None if cu is None else cu.cpu().numpy(),
        intermediate_states=True, **reference.kda_options(flags))
    B, T, H, K = x["q"].shape
    rows, begin = [], 0
    for n, length in enumerate(lengths):
        row, start = (n, 0) if cu is None else (0, begin)
        for i in range(-(-length // every)):
            if i == 0:
                rows.append(np.zeros((H, K, K)) if s0 is None else f64(s0)[n])
            else:
                rows.append(states[row, start + i * every - 1])
        begin += length
    return np.stack(rows) if rows else np.zeros((0, H, K, K))


@pytest.mark.parametrize("seg", [0, 3])
@pytest.mark.parametrize("state", [None, "bfloat16"])
@pytest.mark.parametrize("C, every", [(16, 64), (32, 32)])
@pytest.mark.parametrize("K", [64, 128])
def test_checkpoints_match_reference(K, C, every, state, seg):
    """return_intermediate_states, fixed lengths: [B, ceil(T / E), H, V, K] in bf16 (fla's)
    whatever the states' dtype, the serial walk and segments of 3 chunks alike."""
    B, T = 2, 333
    x, s0 = make(B, T, 2, K, seed=40 + K + C + seg, state_dtype=state)
    x = long_memory(x)
    o, fs, ck = run(x, SOFTPLUS, initial_state=s0, output_final_state=True, chunk_size=C, segment_chunks=seg,
                    return_intermediate_states=True, checkpoint_every=every)
    rows = -(-T // every)
    assert tuple(ck.shape) == (B, rows, 2, K, K) and ck.dtype == torch.bfloat16
    expected = checkpoints_ref(x, s0, [T] * B, every)
    assert rel(ck.reshape(B * rows, 2, K, K), expected) <= 1e-2
    o1, _ = run(x, SOFTPLUS, initial_state=s0, chunk_size=C, segment_chunks=seg)
    assert torch.equal(o, o1), "checkpoints change nothing else"


@pytest.mark.parametrize("given", [False, True])
def test_varlen_checkpoints_in_fla_packing(given):
    """cu_seqlens with lengths 1, 15, 16, 17, 0, 1000, 4099: Σ ceil(len / 64) rows in sequence order,
    fla's layout [1, rows, H, K, V], bf16; a given buffer (poisoned, fp32) is filled in place."""
    lengths = VARLEN
    x, s0 = make(1, sum(lengths), 2, 128, seed=77, state_dtype="float32", N=len(lengths))
    x = long_memory(x)
    cu = cu_of(lengths)
    rows = sum(-(-n // 64) for n in lengths)
    s0k = s0.transpose(-1, -2).contiguous()
    gate = {n: x[n] for n in ("A_log", "dt_bias")}
    kw = dict(initial_state=s0k, cu_seqlens=cu, return_intermediate_states=True, segment_chunks=3)
    if given:
        buf = torch.full((1, rows, 2, 128, 128), float("nan"), device="cuda")
        kw["intermediate_states"] = buf
    else:
        kw["cu_seqlens_cpu"] = cu.cpu()
    _, _, ck = pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **SOFTPLUS, **gate, **kw)
    if given:
        assert ck.data_ptr() == buf.data_ptr()
    assert tuple(ck.shape) == (1, rows, 2, 128, 128) and torch.isfinite(ck).all()
    assert ck.dtype == (torch.float32 if given else torch.bfloat16)
    expected = checkpoints_ref(x, s0, lengths, 64, cu=cu)
    assert rel(ck[0].transpose(-1, -2), expected) <= 1e-2


@pytest.mark.parametrize("seg", [0, 3])
@pytest.mark.parametrize("v_first", [False, True])
def test_bf16_checkpoints_of_fp32_states_are_the_fp32_ones_rounded(seg, v_first):
    """A bf16 intermediate_states buffer beside fp32 states (fla's checkpoint dtype): the same
    states as an fp32 buffer's, rounded to bf16 (nothing else of the call changes)."""
    lengths = VARLEN
    x, s0 = make(1, sum(lengths), 2, 128, seed=78, state_dtype="float32", N=len(lengths))
    x = long_memory(x)
    cu = cu_of(lengths)
    rows = sum(-(-n // 64) for n in lengths)
    gate = {n: x[n] for n in ("A_log", "dt_bias")}
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        buf = torch.full((1, rows, 2, 128, 128), float("nan"), device="cuda", dtype=dtype)
        o, fs, ck = pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **SOFTPLUS, **gate,
                                    initial_state=s0, cu_seqlens=cu, output_final_state=True, segment_chunks=seg,
                                    state_v_first=v_first, intermediate_states=buf, return_intermediate_states=True)
        assert ck.data_ptr() == buf.data_ptr() and fs.dtype == torch.float32
        results.append((o, fs, ck))
    (o32, fs32, ck32), (o16, fs16, ck16) = results
    assert torch.equal(ck16, ck32.to(torch.bfloat16))
    assert torch.equal(o16, o32) and torch.equal(fs16, fs32)
