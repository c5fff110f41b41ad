"""GPU tests of KDA decode (fused_recurrent_kda) against the float64 recurrent reference."""
import numpy as np
import pytest

import pykda
from pykda import reference
from pykda.ops.kda_variant import SAFE_GATE_FLAGS

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
TOL = {"float32": 1e-2, "bfloat16": 2e-2}
SAFE = SAFE_GATE_FLAGS._asdict()


LAYOUTS = ["v_first", "k_first"]   # pools [P, H, V, K], fla's [P, H, K, V]


def decode(x, flags=SAFE, layout="v_first", **kw):
    """fused_recurrent_kda on x's arrays (a dict with q, k, v, g, beta and the gate's A_log,
    dt_bias) on a pool in `layout`; pykda's bounded gate unless `flags` says otherwise. Returns o."""
    o, _ = pykda.fused_recurrent_kda(**x, **flags, state_v_first=layout == "v_first", **kw)
    return o


def in_layout(pool, layout):
    """A V-first pool (as `make` returns it) in `layout`: K-first is its transposed copy."""
    return pool if layout == "v_first" else pool.transpose(-1, -2).contiguous()


def v_view(pool, layout):
    """The V-first view of a pool in `layout` (K-first: its transpose, the same memory), which
    the float64 reference and the checks read."""
    return pool if layout == "v_first" else pool.transpose(-1, -2)


def make(B, T, H, K, P, state_dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")
    bf = torch.bfloat16
    x = dict(q=rnd(B, T, H, K).to(bf), k=rnd(B, T, H, K).to(bf), v=rnd(B, T, H, K).to(bf),
             g=rnd(B, T, H, K).to(bf), beta=rnd(B, T, H).to(bf),
             A_log=torch.log(torch.rand(H, generator=g, device="cuda") * 15 + 1),
             dt_bias=0.1 * rnd(H, K))
    pool = (0.1 * rnd(P, H, K, K)).to(getattr(torch, state_dtype))
    return x, pool


def f64(t):
    return t.double().cpu().numpy()


def start_row(rows, n, accepted=None):
    """The pool row sequence n starts from: rows[n], or for speculative decode (rows[n] a list)
    rows[n][accepted[n] - 1] (column 0 without accepted); -1 for padding."""
    if not isinstance(rows[n], list):
        return rows[n]
    col = accepted[n] - 1 if accepted is not None else 0
    return rows[n][col] if 0 <= col < len(rows[n]) else -1


def reference_step(x, pool_before, rows, cu=None, flags=SAFE, accepted=None):
    """Reference outputs and new states for sequences whose pool rows are `rows` (-1 = padding):
    [N], the row read and written, or [N][C] (speculative decode: the state after token t goes to
    rows[n][t], the start row is `start_row`)."""
    ref_kwargs = reference.kda_options(flags)
    o = np.zeros(tuple(x["v"].shape))
    new = {}
    for i in range(len(rows)):
        start = start_row(rows, i, accepted)
        if start < 0:
            continue
        sl = (slice(0, 1), slice(cu[i], cu[i + 1])) if cu is not None else (slice(i, i + 1),)
        args = {n: f64(x[n][sl]) for n in ("q", "k", "v", "g", "beta")}
        oi, si, states = reference.kda_recurrent(**args, **{n: f64(x[n]) for n in ("A_log", "dt_bias") if n in x},
                                                 initial_state=f64(pool_before[start])[None], **ref_kwargs,
                                                 intermediate_states=True)
        o[sl] = oi
        if isinstance(rows[i], list):
            new.update((r, states[0, t]) for t, r in enumerate(rows[i][:states.shape[1]]) if r >= 0)
        else:
            new[start] = si[0]
    return o, new


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("T", [1, 2, 7])
@pytest.mark.parametrize("B", [1, 3, 64, 257])
def test_matches_reference_with_random_and_padded_indices(B, T, K, state_dtype, layout):
    H, P = 4, B + 5
    x, pool = make(B, T, H, K, P, state_dtype, seed=B * 100 + T * 10 + K)
    given = in_layout(pool, layout)
    pool = v_view(given, layout)
    perm = torch.randperm(P, device="cuda")[:B]
    pad = torch.rand(B, device="cuda") < 0.25 if B > 1 else torch.zeros(1, dtype=torch.bool, device="cuda")
    idx = torch.where(pad, -1, perm).to(torch.int32 if B % 2 else torch.int64)
    before = pool.clone()
    out = torch.full((B, T, H, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    o = decode(x, layout=layout, initial_state=given, state_indices=idx, out=out)
    assert o is out
    rows = idx.tolist()
    o_ref, new = reference_step(x, before, rows)
    assert torch.isfinite(o).all()
    assert reference.relative_error(f64(o), o_ref) < TOL[state_dtype]
    for r in range(P):
        if r in new:
            err = reference.relative_error(f64(pool[r]), new[r])
            assert err < TOL[state_dtype], f"pool row {r}: {err:.2e}"
        else:
            assert torch.equal(pool[r], before[r]), f"untouched pool row {r} changed"
    padded = [i for i, r in enumerate(rows) if r < 0]
    assert (o[padded] == 0).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_without_indices_row_n_is_sequence_n_and_cu_seqlens_packs(layout):
    H, K = 8, 128
    x, pool = make(3, 2, H, K, 3, "float32", seed=11)
    given = in_layout(pool, layout)
    pool = v_view(given, layout)
    before = pool.clone()
    o = decode(x, layout=layout, initial_state=given)
    o_ref, new = reference_step(x, before, [0, 1, 2])
    assert reference.relative_error(f64(o), o_ref) < 1e-2
    assert all(reference.relative_error(f64(pool[r]), new[r]) < 1e-2 for r in range(3))
    # packed: sequences of 1, 3 and 2 tokens in one row
    xp, pool = make(1, 6, H, K, 4, "float32", seed=12)
    given = in_layout(pool, layout)
    pool = v_view(given, layout)
    before = pool.clone()
    cu = torch.tensor([0, 1, 4, 6], dtype=torch.int32, device="cuda")
    idx = torch.tensor([2, 0, 3], dtype=torch.int32, device="cuda")
    o = decode(xp, layout=layout, initial_state=given, state_indices=idx, cu_seqlens=cu)
    o_ref, new = reference_step(xp, before, [2, 0, 3], cu=[0, 1, 4, 6])
    assert reference.relative_error(f64(o), o_ref) < 1e-2
    assert all(reference.relative_error(f64(pool[r]), new[r]) < 1e-2 for r in (2, 0, 3))
    assert torch.equal(pool[1], before[1])


GATE_FLAGS = {"safe": SAFE,
              "softplus": dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True),
              "none": dict(use_qk_l2norm_in_kernel=True)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gate", ["safe", "softplus", "none"])
def test_decode_continues_a_prefill(gate, layout):
    """Prefill of T tokens then decode of n tokens equals prefill of T + n, in every gate mode and
    either layout (K-first: fla's, prefill and decode on the same pool)."""
    H, K, T, n = 4, 128, 100, 3
    x, _ = make(2, T + n, H, K, 2, "float32", seed=13)
    flags = GATE_FLAGS[gate]
    if gate == "none":   # g is the log-decay (fp32), beta probabilities (fp32): vLLM's decode inputs
        x["g"] = torch.tensor(reference.kda_gate(f64(x["g"]), f64(x["A_log"]), f64(x["dt_bias"]), None, "softplus"),
                              dtype=torch.float32, device="cuda")
        x["beta"] = torch.sigmoid(x["beta"].float())
        del x["A_log"], x["dt_bias"]
    seq = ("q", "k", "v", "g", "beta")
    common = dict(flags, **{n: x[n] for n in ("A_log", "dt_bias") if n in x}, state_v_first=layout == "v_first")
    o_all, s_all = pykda.chunk_kda(*(x[s] for s in seq), **common, output_final_state=True,
                                   initial_state=torch.zeros(2, H, K, K, device="cuda"))
    _, s_pre = pykda.chunk_kda(*(x[s][:, :T] for s in seq), **common, output_final_state=True,
                               initial_state=torch.zeros(2, H, K, K, device="cuda"))
    o_dec, s_ret = pykda.fused_recurrent_kda(*(x[s][:, T:] for s in seq), **common, initial_state=s_pre,
                                             output_final_state=True)
    assert s_ret is s_pre
    assert reference.relative_error(f64(o_dec), f64(o_all[:, T:])) < 1e-2
    assert reference.relative_error(f64(s_pre), f64(s_all)) < 1e-2


def precompute_gate(x):
    """vLLM's decode inputs in place: g the softplus gate's fp32 log-decay, β fp32 sigmoid(b), no
    A_log or dt_bias."""
    x["g"] = torch.tensor(reference.kda_gate(f64(x["g"]), f64(x["A_log"]), f64(x["dt_bias"]), None, "softplus"),
                          dtype=torch.float32, device="cuda")
    x["beta"] = torch.sigmoid(x["beta"].float())
    del x["A_log"], x["dt_bias"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gate", ["softplus", "none"])
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_gate_modes_match_reference(gate, state_dtype, layout):
    """Kimi Linear's gate with decays from e^-1e-3 to exactly 0, and vLLM's precomputed fp32 g
    with fp32 β probabilities, against the float64 recurrence."""
    B, T, H, K, P = 33, 3, 4, 128, 40
    x, pool = make(B, T, H, K, P, state_dtype, seed=61)
    x["A_log"] = x["A_log"].reshape(1, 1, H, 1)
    x["g"] = (torch.rand(x["g"].shape, device="cuda") * 14 - 10).to(torch.bfloat16)
    x["g"][3:6] = 1e4   # decay exactly 0
    flags = GATE_FLAGS[gate]
    if gate == "none":
        precompute_gate(x)
    idx = torch.randperm(P, device="cuda")[:B].to(torch.int32)
    idx[7] = -1
    given = in_layout(pool, layout)
    pool = v_view(given, layout)
    before = pool.clone()
    o = decode(x, flags, layout, initial_state=given, state_indices=idx)
    o_ref, new = reference_step(x, before, idx.tolist(), flags=flags)
    assert torch.isfinite(o).all() and torch.isfinite(pool).all()
    tol = TOL[state_dtype]
    assert reference.relative_error(f64(o), o_ref) < tol
    assert all(reference.relative_error(f64(pool[r]), s) < tol for r, s in new.items())


def test_cuda_graph_capture_and_replay():
    H, K, B = 8, 128, 16
    x, pool = make(B, 1, H, K, B, "float32", seed=14)
    idx = torch.arange(B, device="cuda", dtype=torch.int32).flip(0)
    out = torch.empty(B, 1, H, K, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        decode(x, initial_state=pool, state_indices=idx, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(x, initial_state=pool, state_indices=idx, out=out)
    x2, _ = make(B, 1, H, K, B, "float32", seed=15)
    for n in x:
        x[n].copy_(x2[n])
    before = pool.clone()
    graph.replay()
    torch.cuda.synchronize()
    o_ref, new = reference_step(x, before, idx.tolist())
    assert reference.relative_error(f64(out), o_ref) < 1e-2
    assert all(reference.relative_error(f64(pool[r]), new[r]) < 1e-2 for r in range(B))


def test_check_indices_catches_duplicates_and_out_of_range():
    x, pool = make(3, 1, 4, 64, 4, "float32", seed=16)
    with pytest.raises(ValueError, match="repeats pool rows"):
        decode(x, initial_state=pool, check_indices=True,
                                  state_indices=torch.tensor([1, 1, 2], device="cuda"))
    with pytest.raises(ValueError, match="out of range"):
        decode(x, initial_state=pool, check_indices=True,
                                  state_indices=torch.tensor([1, 4, 2], device="cuda"))
    # without the check an index >= P is skipped as padding: nothing outside the pool is touched
    before = pool.clone()
    o = decode(x, initial_state=pool, state_indices=torch.tensor([9, -1, 7], device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(pool, before) and (o == 0).all()


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rpt, stages", [(1, 2), (2, 3), (4, 2), (8, 2), (8, None)])
def test_every_tile_shape_and_ring_depth_agrees(rpt, stages, state_dtype):
    """The planner's overrides (for sweeps) compute the same thing: small rings wrap many times;
    every rows-per-thread spreads the rows' sums over the lanes differently."""
    B, H, K = 96, 8, 128
    x, pool = make(B, 2, H, K, B + 3, state_dtype, seed=17)
    idx = torch.randperm(B + 3, device="cuda")[:B].to(torch.int32)
    idx[5] = -1
    before = pool.clone()
    o = decode(x, initial_state=pool, state_indices=idx, rows_per_thread=rpt, stages=stages)
    rows = idx.tolist()
    o_ref, new = reference_step(x, before, rows)
    tol = TOL[state_dtype]
    assert reference.relative_error(f64(o), o_ref) < tol
    assert all(reference.relative_error(f64(pool[r]), s) < tol for r, s in new.items())
    assert all(torch.equal(pool[r], before[r]) for r in range(B + 3) if r not in new)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_sequences_with_empty_and_padded_ones(layout):
    """cu_seqlens with zero-length sequences (state untouched) and a padded slot (zero outputs);
    2 tokens staged a tile (the mean length), the rest read from global memory."""
    H, K = 4, 64
    lens = [0, 3, 1, 0, 2, 5]
    cu_list = [0]
    for n in lens:
        cu_list.append(cu_list[-1] + n)
    x, pool = make(1, cu_list[-1], H, K, 8, "bfloat16", seed=18)
    rows = [6, 1, -1, 2, 7, 0]
    given = in_layout(pool, layout)
    pool = v_view(given, layout)
    before = pool.clone()
    out = torch.full_like(x["v"], float("nan"))
    decode(x, layout=layout, initial_state=given, out=out, cu_seqlens=torch.tensor(cu_list, device="cuda"),
           state_indices=torch.tensor(rows, dtype=torch.int32, device="cuda"))
    live = [r if n > 0 else -1 for r, n in zip(rows, lens)]
    o_ref, new = reference_step(x, before, live, cu=cu_list)
    assert torch.isfinite(out).all()
    assert reference.relative_error(f64(out), o_ref) < 2e-2
    assert all(reference.relative_error(f64(pool[r]), s) < 2e-2 for r, s in new.items())
    assert all(torch.equal(pool[r], before[r]) for r in range(8) if r not in new)


def test_torch_parameters_cupy_arrays_and_a_stream_give_the_same_step():
    """The torch hot path (plain tensors and nn.Parameters), the general path (CuPy) and an
    explicit stream agree bit for bit; a host tensor among device ones is named."""
    cupy = pytest.importorskip("cupy")
    H, K, B = 4, 64, 5
    x, pool = make(B, 1, H, K, B + 2, "float32", seed=21)
    idx = torch.tensor([6, 0, -1, 3, 2], device="cuda", dtype=torch.int32)
    pools = [pool.clone() for _ in range(3)]
    outs = [decode(x, initial_state=pools[0], state_indices=idx)]
    params = {n: torch.nn.Parameter(x[n].clone(), requires_grad=False) for n in ("A_log", "dt_bias")}
    s = torch.cuda.Stream()
    outs.append(decode({**x, **params}, initial_state=pools[1], state_indices=idx, stream=s))
    s.synchronize()
    cx = {n: cupy.from_dlpack(t.detach()) for n, t in x.items()}
    o = decode(cx, initial_state=cupy.from_dlpack(pools[2]), state_indices=cupy.from_dlpack(idx))
    outs.append(torch.from_dlpack(o))
    torch.cuda.synchronize()
    for got, st in zip(outs[1:], pools[1:]):
        assert torch.equal(got, outs[0]) and torch.equal(st, pools[0])
    o_ref, new = reference_step(x, pool, idx.tolist())
    assert reference.relative_error(f64(outs[0]), o_ref) < 1e-2
    with pytest.raises(TypeError, match="dt_bias must be a CUDA tensor; got a torch tensor on cpu"):
        decode({**x, "dt_bias": x["dt_bias"].cpu()}, initial_state=pool, state_indices=idx)


# ---- speculative decode: 2-D state_indices [N, C] and num_accepted_tokens (fla's / vLLM's names) ----

def vllm_inputs(x):
    """vLLM's decode inputs: g the log-decay (fp32, Kimi Linear's gate applied), β probabilities (fp32)."""
    x["g"] = torch.tensor(reference.kda_gate(f64(x["g"]), f64(x["A_log"]), f64(x["dt_bias"]), None, "softplus"),
                          dtype=torch.float32, device="cuda")
    x["beta"] = torch.sigmoid(x["beta"].float())
    del x["A_log"], x["dt_bias"]


def spec_table(N, C, P, pad_seqs, pad_cells, dtype):
    """A random [N, C] table of distinct pool rows with padding cells (-1), every sequence in
    `pad_seqs` with all cells -1, and num_accepted_tokens in 1..C whose start cell is a row."""
    rows = torch.randperm(P)
    table = rows[:N * C].reshape(N, C).clone()
    table[torch.rand(N, C) < pad_cells] = -1
    acc = torch.randint(1, C + 1, (N,))
    for n in range(N):
        if n in pad_seqs:
            table[n] = -1
        else:   # the start cell holds a row (the first cell's own, refilled where padded)
            table[n, acc[n] - 1] = rows[n * C + acc[n] - 1]
    return table.to(dtype).cuda(), acc.to(dtype).cuda()


def check_spec_step(x, pool, before, table, acc, flags, tol, cu=None, layout="v_first", **kw):
    """One speculative step on `pool` (in `layout`; `before`: a V-first copy) against
    `reference_step`; outputs poisoned first, rows not written unchanged, padded sequences'
    outputs zero. Returns the reference's new rows."""
    rows, accepted = table.tolist(), acc.tolist() if acc is not None else None
    out = torch.full_like(x["v"], float("nan"))
    o, ret = pykda.fused_recurrent_kda(**x, **flags, state_v_first=layout == "v_first", initial_state=pool,
                                       ssm_state_indices=table, num_accepted_tokens=acc, out=out, cu_seqlens=cu,
                                       output_final_state=True, **kw)
    assert o is out and ret is pool
    pool = v_view(pool, layout)
    o_ref, new = reference_step(x, before, rows, cu=None if cu is None else cu.tolist(), flags=flags,
                                accepted=accepted)
    assert torch.isfinite(o).all() and torch.isfinite(pool).all()
    assert reference.relative_error(f64(o), o_ref) < tol
    for r in range(pool.shape[0]):
        if r in new:
            err = reference.relative_error(f64(pool[r]), new[r])
            assert err < tol, f"pool row {r}: {err:.2e}"
        else:
            assert torch.equal(pool[r], before[r]), f"untouched pool row {r} changed"
    cu_l = cu.tolist() if cu is not None else None
    for n in range(len(rows)):
        if start_row(rows, n, accepted) < 0:   # padding: zero outputs
            sl = (0, slice(cu_l[n], cu_l[n + 1])) if cu is not None else n
            assert (o[sl] == 0).all()
    return new


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gate", ["safe", "softplus", "none"])
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("K", [64, 128])
def test_speculative_step_matches_reference(gate, state_dtype, K, layout):
    """Random [N, T] tables with padding cells and padded sequences, num_accepted_tokens in 1..T,
    int32 and int64: outputs and every row written against the float64 recurrence."""
    for N, T, dtype in ((37, 4, torch.int32), (5, 8, torch.int64), (64, 2, torch.int32)):
        H, P = 4, N * T + 7
        x, pool = make(N, T, H, K, P, state_dtype, seed=N * 7 + T + K)
        if gate == "none":
            vllm_inputs(x)
        table, acc = spec_table(N, T, P, pad_seqs={1, N - 2}, pad_cells=0.2, dtype=dtype)
        check_spec_step(x, in_layout(pool, layout), pool.clone(), table, acc, GATE_FLAGS[gate], TOL[state_dtype],
                        layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_speculative_packed_as_vllm_calls_it(state_dtype, layout):
    """cu_seqlens (vLLM packs its spec tokens): lengths 0..C, a table wider than some sequences,
    a strided view of a wider table, without num_accepted_tokens (column 0)."""
    H, K, C = 4, 128, 4
    lens = [4, 1, 0, 3, 4, 2]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    x, pool = make(1, sum(lens), H, K, 40, state_dtype, seed=71)
    vllm_inputs(x)
    cells, acc = spec_table(len(lens), C, 40, pad_seqs={5}, pad_cells=0.1, dtype=torch.int32)
    wide = torch.full((len(lens), 2 * C), -1, dtype=torch.int32, device="cuda")
    wide[:, :C] = cells
    table = wide[:, :C]   # row stride 2C
    given = in_layout(pool, layout)
    pool = v_view(given, layout)
    check_spec_step(x, given, pool.clone(), table, acc, GATE_FLAGS["none"], TOL[state_dtype], cu=cu, layout=layout)
    check_spec_step(x, given, pool.clone(), table.contiguous(), None, GATE_FLAGS["none"], TOL[state_dtype], cu=cu,
                    layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gate", ["safe", "softplus", "none"])
def test_prefill_then_speculative_steps_equal_sequential_decode(gate, layout):
    """chunk_kda prefill of a prompt into pool rows, then two speculative steps (the second from
    the row of the last accepted draft token of the first, as vLLM runs them): outputs and rows
    equal the float64 recurrence over the whole accepted path and pykda's own one-token steps.
    Prefill and decode share the pool's layout."""
    N, H, K, T0, T = 6, 4, 128, 40, 4
    x, _ = make(N, T0 + 2 * T, H, K, 1, "float32", seed=81)
    if gate == "none":
        vllm_inputs(x)
    flags, seq = GATE_FLAGS[gate], ("q", "k", "v", "g", "beta")
    params = {n: x[n] for n in ("A_log", "dt_bias") if n in x}
    part = lambda a, b: {**{s: x[s][:, a:b] for s in seq}, **params}
    P = N * T + 3
    table = torch.randperm(P, device="cuda")[:N * T].reshape(N, T).to(torch.int32)
    v_first = layout == "v_first"
    pool = torch.zeros(P, H, K, K, device="cuda")
    first = table[:, 0].contiguous()
    pykda.chunk_kda(*(part(0, T0)[s] for s in seq), **params, **flags, state_v_first=v_first, initial_state=pool,
                    state_indices=first)   # the prompt's final state into column 0
    view = v_view(pool, layout)
    # step 1 from column 0 (num_accepted_tokens = 1), step 2 from the last accepted draft of step 1
    acc1 = torch.ones(N, dtype=torch.int32, device="cuda")
    acc2 = torch.randint(1, T + 1, (N,), dtype=torch.int32, device="cuda")
    before = view.clone()
    check_spec_step(part(T0, T0 + T), pool, before, table, acc1, flags, 1e-2, layout=layout)
    before = view.clone()   # step 1's rows
    check_spec_step(part(T0 + T, T0 + 2 * T), pool, before, table, acc2, flags, 1e-2, layout=layout)
    # against the float64 recurrence over the accepted path: prompt, a2 drafts of step 1, step 2
    for n in range(N):
        a2 = int(acc2[n])
        path = {s: torch.cat([x[s][n:n + 1, :T0 + a2], x[s][n:n + 1, T0 + T:]], dim=1) for s in seq}
        o_ref, _, states = reference.kda_recurrent(**{s: f64(t) for s, t in path.items()},
                                                   **{k: f64(v) for k, v in params.items()},
                                                   **reference.kda_options(flags), intermediate_states=True)
        for t in range(T):
            err = reference.relative_error(f64(view[int(table[n, t])]), states[0, T0 + a2 + t])
            assert err < 1e-2, f"sequence {n}, token {t}: {err:.2e}"
        assert reference.relative_error(f64(before[int(table[n, a2 - 1])]), states[0, T0 + a2 - 1]) < 1e-2
    # pykda's one-token steps from the prompt's state give step 1's rows (the same fp32 arithmetic)
    seq_pool = torch.zeros(N, H, K, K, device="cuda")
    pykda.chunk_kda(*(part(0, T0)[s] for s in seq), **params, **flags, state_v_first=v_first, initial_state=seq_pool,
                    state_indices=torch.arange(N, dtype=torch.int32, device="cuda"))
    for t in range(T):
        pykda.fused_recurrent_kda(**part(T0 + t, T0 + t + 1), **flags, state_v_first=v_first, initial_state=seq_pool)
        for n in range(N):
            assert reference.relative_error(f64(v_view(seq_pool, layout)[n]), f64(before[int(table[n, t])])) < 1e-5


# ---- K-first pools (fla's [P, H, K, V]) against V-first ones ----

@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("gate", ["safe", "softplus", "none"])
def test_k_first_and_v_first_pools_give_the_same_step(gate, K, state_dtype):
    """The same inputs on a V-first pool and on its K-first transpose: the same outputs and
    transposed-equal pools (only the sums' order differs), for one token, T = 10 (2 tokens past
    the 8 the ring stages, read from global memory), padding rows, and a speculative step."""
    B, H = 21, 4
    for T, spec in ((1, False), (10, False), (4, True)):
        x, pool = make(B, T, H, K, 4 * B, state_dtype, seed=91 + T + K)
        if gate == "none":
            vllm_inputs(x)
        if spec:
            idx, acc = spec_table(B, T, 4 * B, pad_seqs={3}, pad_cells=0.2, dtype=torch.int32)
            rows = dict(ssm_state_indices=idx, num_accepted_tokens=acc)
        else:
            idx = torch.randperm(4 * B, device="cuda")[:B].to(torch.int32)
            idx[[2, 9]] = -1
            rows = dict(state_indices=idx)
        k_pool = in_layout(pool, "k_first")
        outs = [torch.full_like(x["v"], float("nan")) for _ in LAYOUTS]
        for layout, given, out in zip(LAYOUTS, (pool, k_pool), outs):
            decode(x, GATE_FLAGS[gate], layout, initial_state=given, out=out, **rows)
        torch.cuda.synchronize()
        assert torch.isfinite(outs[1]).all()
        tol = 1e-5 if state_dtype == "float32" else 1e-2   # bf16 pools: a rounding apart at most
        assert reference.relative_error(f64(outs[1]), f64(outs[0])) < 1e-2   # bf16 outputs
        assert reference.relative_error(f64(v_view(k_pool, "k_first")), f64(pool)) < tol
        accepted = rows["num_accepted_tokens"].tolist() if spec else None
        padded = [n for n in range(B) if start_row(idx.tolist(), n, accepted) < 0]
        assert padded and (outs[1][padded] == 0).all()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_pool_view_of_a_larger_cache(layout, state_dtype):
    """The pool as engines keep it: a view of a cache holding two layers' states per slot (rows
    2 states apart). Its rows advance in place bit for bit as a contiguous pool's do, for a step
    and a speculative step, and the other layer's states are never touched."""
    B, H, K, P = 9, 4, 128, 32
    for T, spec in ((1, False), (3, True)):
        x, pool = make(B, T, H, K, P, state_dtype, seed=71 + T)
        pool = in_layout(pool, layout)
        cache = torch.randn(P, 2, *pool.shape[1:], device="cuda").to(pool.dtype)
        cache[:, 0] = pool
        other = cache[:, 1].clone()
        if spec:
            idx, acc = spec_table(B, T, P, pad_seqs={3}, pad_cells=0.2, dtype=torch.int32)
            rows = dict(ssm_state_indices=idx, num_accepted_tokens=acc)
        else:
            idx = torch.randperm(P, device="cuda")[:B].to(torch.int32)
            idx[2] = -1
            rows = dict(state_indices=idx)
        o_view = decode(x, SAFE, layout, initial_state=cache[:, 0], **rows)
        o = decode(x, SAFE, layout, initial_state=pool, **rows)
        assert torch.equal(o_view, o) and torch.equal(cache[:, 0], pool)
        assert torch.equal(cache[:, 1], other), "the other layer's states are not touched"


@pytest.mark.parametrize("stages", [2, 3, None])
def test_k_first_ring_depths_agree(stages):
    """K-first tiles are whole states: only the ring depth can be overridden (and rows_per_thread
    only to the whole-state value); small rings wrap many times."""
    B, H, K = 96, 8, 128
    x, pool = make(B, 2, H, K, B + 3, "float32", seed=19)
    idx = torch.randperm(B + 3, device="cuda")[:B].to(torch.int32)
    idx[5] = -1
    given = in_layout(pool, "k_first")
    view = v_view(given, "k_first")
    before = view.clone()
    o = decode(x, layout="k_first", initial_state=given, state_indices=idx, stages=stages)
    o_ref, new = reference_step(x, before, idx.tolist())
    assert reference.relative_error(f64(o), o_ref) < 1e-2
    assert all(reference.relative_error(f64(view[r]), s) < 1e-2 for r, s in new.items())
    assert all(torch.equal(view[r], before[r]) for r in range(B + 3) if r not in new)
    with pytest.raises(ValueError, match="whole-state tiles"):
        decode(x, layout="k_first", initial_state=given, state_indices=idx, rows_per_thread=8)


@pytest.mark.parametrize("disable", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_target_verify_equals_the_speculative_step(state_dtype, layout, disable):
    """SGLang's target verify (1-D state_indices, intermediate_states_buffer [S, steps, H, ., .] at
    intermediate_state_indices): bit for bit the 2-D speculative step that writes each token's
    state to a row of its own, packed requests of 4 and 3 tokens, a padded request, a request with
    no slot and one with a slot past S (both: nothing cached); the buffer's other cells stay
    poisoned; the pool is only read with disable_state_update, else holds each final state."""
    H, K, P, S, steps = 4, 128, 20, 8, 4
    lens = [4, 4, 3, 4, 4, 4]
    rows, slots = [3, 7, 11, 0, -1, 5], [2, 0, 1, -1, 6, 9]
    N = len(lens)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    x, pool = make(1, sum(lens), H, K, P, state_dtype, seed=93)
    pool = in_layout(pool, layout)
    # the reference: the speculative step on a copy of the pool with a row per (request, token),
    # token 0's row holding the request's start state (num_accepted_tokens 1: the start is column 0)
    spec_pool = torch.cat([pool, torch.zeros(N * steps, *pool.shape[1:], dtype=pool.dtype, device="cuda")])
    table = torch.full((N, steps), -1, dtype=torch.int32)
    for n in range(N):
        if rows[n] >= 0:
            table[n] = torch.arange(P + n * steps, P + (n + 1) * steps)
            spec_pool[P + n * steps] = pool[rows[n]]
    flags = GATE_FLAGS["softplus"]
    o_ref, _ = pykda.fused_recurrent_kda(**x, **flags, state_v_first=layout == "v_first", initial_state=spec_pool,
                                         ssm_state_indices=table.cuda(), cu_seqlens=cu)
    before = pool.clone()
    buf = torch.full((S, steps, H, K, K), float("nan"), dtype=pool.dtype, device="cuda")
    out = torch.full_like(x["v"], float("nan"))
    o, _ = pykda.fused_recurrent_kda(**x, **flags, state_v_first=layout == "v_first", initial_state=pool,
                                     state_indices=torch.tensor(rows, dtype=torch.int32, device="cuda"),
                                     cu_seqlens=cu, out=out, intermediate_states_buffer=buf,
                                     intermediate_state_indices=torch.tensor(slots, device="cuda"),
                                     disable_state_update=disable)
    assert o is out and torch.equal(o, o_ref)
    written = set()
    for n in range(N):
        if rows[n] >= 0 and 0 <= slots[n] < S:
            for t in range(lens[n]):
                assert torch.equal(buf[slots[n], t], spec_pool[P + n * steps + t]), (n, t)
                written.add((slots[n], t))
    for s in range(S):
        for t in range(steps):
            if (s, t) not in written:
                assert torch.isnan(buf[s, t]).all(), f"buffer cell {(s, t)} written"
    for r in range(P):
        n = rows.index(r) if r in rows else None
        if n is None or disable:
            assert torch.equal(pool[r], before[r]), f"pool row {r} changed"
        else:
            assert torch.equal(pool[r], spec_pool[P + n * steps + lens[n] - 1]), f"pool row {r}"


# trees of drafts, as retrieve_parent_token rows (-1: a root, from the pool row's state)
TREES = [[-1, 0, 0, 1, 1, 2],    # branches: two children each
         [-1, 0, 1, 2, 3, 4],    # a chain
         [-1, 0, 0, 0, 0, 0],    # a star
         [-1, 0, -1, 2, 1],      # a second root, and a parent two tokens back
         [-1, 0, 1, 1, 0, 4],    # a padded request (no pool row)
         [-1, 0, 0, 2, 2, 1]]    # a request without a buffer slot: its tokens chain


def tree_paths(parents):
    """Each token's path from its root: the tokens whose updates lead to its state, in order."""
    paths = []
    for t, p in enumerate(parents):
        paths.append((paths[p] if 0 <= p < t else []) + [t])
    return paths


@pytest.mark.parametrize("parent_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_tree_verify_starts_each_token_from_its_parent(state_dtype, layout, parent_dtype):
    """SGLang's target verify of a tree of drafts (retrieve_parent_token [N, steps], a strided
    view; EAGLE with topk > 1): each token's output and stored state are the end of the chain of
    its path from the root, checked against float64 per path and, with fp32 pools, bit for bit
    against pykda running every path as a sequence of its own. A padded request writes zeros and
    nothing else; a request without a buffer slot chains its tokens; the pool is only read; the
    buffer's other cells stay poisoned."""
    H, K, P, S, steps = 4, 128, 16, 8, 6
    rows, slots = [3, 7, 11, 0, -1, 5], [2, 0, 1, 5, 6, -1]
    lens = [len(t) for t in TREES]
    N = len(TREES)
    cu = np.concatenate([[0], np.cumsum(lens)])
    x, pool = make(1, int(cu[-1]), H, K, P, state_dtype, seed=57)
    pool = in_layout(pool, layout)
    table = torch.full((N, 2 * steps), 99, dtype=parent_dtype)   # every other column: the parents
    for n, tree in enumerate(TREES):
        table[n, 0:2 * len(tree):2] = torch.tensor(tree, dtype=parent_dtype)
    parents = table.cuda()[:, ::2]
    rpt = 4 if layout == "v_first" else None   # the same tiles in both calls: bit-equal sums
    flags = GATE_FLAGS["softplus"]
    before = pool.clone()
    buf = torch.full((S, steps, H, K, K), float("nan"), dtype=pool.dtype, device="cuda")
    out = torch.full_like(x["v"], float("nan"))
    pykda.fused_recurrent_kda(**x, **flags, state_v_first=layout == "v_first", initial_state=pool,
                              state_indices=torch.tensor(rows, dtype=torch.int32, device="cuda"),
                              cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"), out=out,
                              intermediate_states_buffer=buf, intermediate_state_indices=torch.tensor(slots, device="cuda"),
                              disable_state_update=True, retrieve_parent_token=parents, rows_per_thread=rpt)
    assert torch.equal(pool, before), "the pool is only read"
    # every (request, token): the path whose chain it ends, float64 from the pool row's state
    ends = []   # (request, token, the path's token positions)
    o_ref = np.zeros(tuple(x["v"].shape))
    for n, tree in enumerate(TREES):
        if rows[n] < 0:
            assert (out[0, cu[n]:cu[n + 1]] == 0).all(), "a padded request's outputs are zeros"
            continue
        cached = 0 <= slots[n] < S
        for t, path in enumerate(tree_paths(tree) if cached else [list(range(i + 1)) for i in range(lens[n])]):
            tok = [int(cu[n]) + i for i in path]
            args = {a: f64(x[a][:, tok]) for a in ("q", "k", "v", "g", "beta")}
            oi, si = reference.kda_recurrent(**args, **{a: f64(x[a]) for a in ("A_log", "dt_bias")},
                                             initial_state=f64(v_view(before, layout)[rows[n]])[None],
                                             **reference.kda_options(flags))
            o_ref[0, tok[-1]] = oi[0, -1]
            if cached:
                ends.append((n, t, tok))
                err = reference.relative_error(f64(v_view(buf[slots[n], t], layout)), si[0])
                assert err < 1e-2, (n, t, err)
    assert reference.relative_error(f64(out), o_ref) < 1e-2
    stored = {(slots[n], t) for n, t, _ in ends}
    for slot in range(S):
        for t in range(steps):
            if (slot, t) not in stored:
                assert torch.isnan(buf[slot, t]).all(), f"buffer cell {(slot, t)} written"
    if state_dtype != "float32":
        return   # a bf16 pool's tree reloads its parent's rounded state: only float64's bound holds
    # fp32: every path as a sequence of its own (its start row a copy of the request's), bit for bit
    chains = torch.cat([pool] + [pool[rows[n]][None] for n, _, _ in ends])
    tok = [i for _, _, path in ends for i in path]
    cu2 = np.concatenate([[0], np.cumsum([len(path) for _, _, path in ends])])
    o2 = torch.full((1, len(tok), H, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    pykda.fused_recurrent_kda(**{a: x[a][:, tok] for a in ("q", "k", "v", "g", "beta")},
                              **{a: x[a] for a in ("A_log", "dt_bias")}, **flags,
                              state_v_first=layout == "v_first", initial_state=chains,
                              state_indices=torch.arange(P, P + len(ends), dtype=torch.int32, device="cuda"),
                              cu_seqlens=torch.tensor(cu2, dtype=torch.int32, device="cuda"), out=o2,
                              rows_per_thread=rpt)
    for m, (n, t, path) in enumerate(ends):
        assert torch.equal(out[0, path[-1]], o2[0, cu2[m + 1] - 1]), (n, t)
        assert torch.equal(buf[slots[n], t], chains[P + m]), (n, t)


@pytest.fixture
def mma_from_one_token(monkeypatch):
    """kda_decode_mma from T = 1 for the test: no prepared call of another test's choice of kernel
    before it, and none of its forced plans left after it, pass or fail. Gives the op module."""
    from pykda.ops import kda_decode as op
    monkeypatch.setattr(op, "MMA_MIN_TOKENS", 1)
    op.PREPARED.clear()
    yield op
    op.PREPARED.clear()


@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("gate", ["safe", "softplus", "none"])
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8])
def test_tensor_core_step_matches_reference_and_the_recurrent_kernel(T, gate, K, mma_from_one_token):
    """kda_decode_mma (the planner's kernel for bf16 V-first pools and 3..8 tokens; T = 1, 2 forced
    here) against the float64 recurrence and, on the same inputs, the recurrent kernel
    (rows_per_thread forces it): outputs poisoned first, padded and int64 rows, steep and exactly
    zero decays, untouched rows kept, and with disable_state_update the pool only read."""
    op = mma_from_one_token
    B, H, P = 37, 3, 45
    x, pool = make(B, T, H, K, P, "bfloat16", seed=700 + 10 * T + K)
    flags = dict(GATE_FLAGS[gate])
    if gate != "safe":   # decays from e^-1e-3 to exactly 0
        x["g"] = (torch.rand(x["g"].shape, device="cuda") * 14 - 10).to(torch.bfloat16)
        x["g"][2:4] = 1e4
    if gate == "none":
        precompute_gate(x)
    idx = torch.randperm(P, device="cuda")[:B].to(torch.int64)
    idx[[5, 11]] = -1
    before = pool.clone()
    out = torch.full((B, T, H, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    o = decode(x, flags, initial_state=pool, state_indices=idx, out=out)
    assert op.PREPARED.last[1].plan.tensor_cores
    o_ref, new = reference_step(x, before, idx.tolist(), flags=flags)
    assert torch.isfinite(o).all() and torch.isfinite(pool).all()
    assert reference.relative_error(f64(o), o_ref) < TOL["bfloat16"]
    for r in range(P):
        if r in new:
            assert reference.relative_error(f64(pool[r]), new[r]) < TOL["bfloat16"], f"pool row {r}"
        else:
            assert torch.equal(pool[r], before[r]), f"untouched pool row {r} changed"
    assert (o[[5, 11]] == 0).all()
    rec_pool = before.clone()
    o_rec = decode(x, flags, initial_state=rec_pool, state_indices=idx, rows_per_thread=1)
    assert reference.relative_error(f64(o), f64(o_rec)) < 5e-3
    assert reference.relative_error(f64(pool), f64(rec_pool)) < 5e-3
    read_only = before.clone()
    o_ro = decode(x, flags, initial_state=read_only, state_indices=idx, disable_state_update=True)
    assert torch.equal(read_only, before) and torch.equal(o_ro, o)


@pytest.mark.parametrize("kernel", ["recurrent", "mma", "speculative"])
def test_rows_below_first_row_are_padding(kernel):
    """first_row=1 (vLLM's null block 0): slots whose index is 0 are padding as -1 ones are
    (zero outputs), row 0 is neither read nor written (NaN there stays NaN, no NaN leaks), and
    every other output and row equals the call with those slots at -1, bit for bit. The
    recurrent kernel (T 1), the tensor-core one (bf16 V-first, T 4) and speculative rows [N, 3]."""
    B, H, K, P = 40, 4, 128, 48
    T, state = (4, "bfloat16") if kernel == "mma" else (1, "float32") if kernel == "recurrent" else (2, "float32")
    x, pool = make(B, T, H, K, P, state, seed=901)
    perm = torch.randperm(P - 1, device="cuda")[:B] + 1   # rows 1..P-1
    pad = torch.zeros(B, dtype=torch.bool, device="cuda")
    pad[[0, 7, 8, 39]] = True
    kw = {}
    if kernel == "speculative":
        table = torch.full((B, 3), -1, dtype=torch.int32, device="cuda")   # only column 0 stored (T 2 > 1 stores
        table[:, 0] = torch.where(pad, 0, perm)                              # token 1's state nowhere)
        null, minus = table, torch.where(table == 0, -1, table)
        kw = dict(num_accepted_tokens=torch.ones(B, dtype=torch.int32, device="cuda"))
    else:
        null = torch.where(pad, 0, perm).to(torch.int32)
        minus = torch.where(pad, -1, perm).to(torch.int32)
    pool[0] = float("nan")
    a, b = pool.clone(), pool.clone()
    o_null = decode(x, initial_state=a, state_indices=null, first_row=1, **kw)
    o_minus = decode(x, initial_state=b, state_indices=minus, **kw)
    if kernel == "mma":
        assert pykda.ops.kda_decode.PREPARED.last[1].plan.tensor_cores
    assert torch.equal(o_null, o_minus) and (o_null[pad] == 0).all() and torch.isfinite(o_null).all()
    assert torch.isnan(a[0]).all() and torch.equal(a[1:], b[1:])
    with pytest.raises(ValueError, match=r"state_indices repeats pool rows \[5\]"):
        dup = null.clone()
        dup[3] = dup[4] = 5   # (many 0 entries are fine: padding)
        decode(x, initial_state=a, state_indices=dup, first_row=1, check_indices=True, **kw)
