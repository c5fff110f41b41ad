"""GPU tests of KDA prefill (`chunk_kda`) against the float64 recurrent reference (run on the H200)."""
import numpy as np
import pytest

import pykda
from pykda import reference
from pykda.ops.kda_variant import SAFE_GATE_FLAGS

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
TOL = 1e-2
VARLEN = [1, 15, 16, 17, 0, 1000, 4099]
LOWER_BOUND = {16: -5.0, 32: -2.5}
SAFE = SAFE_GATE_FLAGS._asdict()
# Kimi Linear's gate: -exp(A_log) * softplus(g + dt_bias), unbounded
SOFTPLUS = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)


def make(B, T, H, K, seed, state_dtype=None, N=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape, s=1.0):
        return s * torch.randn(*shape, generator=gen, device="cuda")

    bf = torch.bfloat16
    x = dict(q=rnd(B, T, H, K).to(bf), k=rnd(B, T, H, K).to(bf), v=rnd(B, T, H, K).to(bf),
             g=rnd(B, T, H, K).to(bf), beta=rnd(B, T, H).to(bf),
             A_log=torch.log(1 + 15 * torch.rand(H, generator=gen, device="cuda")),
             dt_bias=rnd(H, K, s=0.5))
    s0 = None
    if state_dtype is not None:
        s0 = rnd(N or B, H, K, K, s=0.05).to(getattr(torch, state_dtype))
    return x, s0


def f64(t):
    return t.double().cpu().numpy()


def ref(x, lower_bound, s0=None, cu=None, scale=None, flags=None):
    flags = dict(SAFE, lower_bound=lower_bound) if flags is None else flags
    gate_args = {n: f64(x[n]) for n in ("A_log", "dt_bias") if x.get(n) is not None}
    return reference.kda_recurrent(
        f64(x["q"]), f64(x["k"]), f64(x["v"]), f64(x["g"]), f64(x["beta"]), **gate_args, scale=scale,
        initial_state=None if s0 is None else f64(s0), cu_seqlens=None if cu is None else cu.cpu().numpy(),
        **reference.kda_options(flags))


def rel(out, expected):
    return reference.relative_error(f64(out), expected)


def cu_of(lengths, dtype=torch.int32):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=dtype, device="cuda")


def run(x, flags=None, **kw):
    """chunk_kda on x's arrays: pykda's bounded gate (SAFE, lower_bound from kw) unless `flags`
    says otherwise; A_log and dt_bias from x where the gate is computed in the kernel."""
    flags = dict(SAFE, lower_bound=kw.pop("lower_bound", SAFE["lower_bound"])) if flags is None else flags
    gate_args = {n: x[n] for n in ("A_log", "dt_bias") if flags.get("use_gate_in_kernel") and x.get(n) is not None}
    return pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **flags, **gate_args, state_v_first=True, **kw)


@pytest.mark.parametrize("state", [None, "float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["batch", "varlen"])
@pytest.mark.parametrize("C", [16, 32])
@pytest.mark.parametrize("K", [64, 128])
def test_matches_reference(K, C, layout, state):
    lb = LOWER_BOUND[C]
    if layout == "batch":
        B, T, cu, N = 3, 333, None, 3
    else:
        B, T, N = 1, sum(VARLEN), len(VARLEN)
        cu = cu_of(VARLEN, torch.int64 if K == 64 else torch.int32)
    x, s0 = make(B, T, 2, K, seed=K + C + len(layout) + (state or "").__len__(), state_dtype=state, N=N)
    out = torch.full((B, T, 2, K), float("nan"), dtype=torch.bfloat16, device="cuda")
    o, fs = run(x, lower_bound=lb, initial_state=s0, output_final_state=state is not None, cu_seqlens=cu,
                out=out, chunk_size=C)
    assert o is out
    o_ref, s_ref = ref(x, lb, s0, cu)
    assert torch.isfinite(o).all(), "every output row written"
    err = rel(o, o_ref)
    assert err <= TOL, f"out relative L2 error {err:.2e}"
    if state is not None:
        assert fs.dtype == s0.dtype and fs.shape == s0.shape
        serr = rel(fs, s_ref)
        assert serr <= TOL, f"final state relative L2 error {serr:.2e}"
    else:
        assert fs is None


@pytest.mark.parametrize("C", [16, 32])
def test_long_sequence_accuracy(C):
    lb = LOWER_BOUND[C]
    x, s0 = make(1, 4096, 8, 128, seed=11, state_dtype="float32")
    o, fs = run(x, lower_bound=lb, initial_state=s0, output_final_state=True, chunk_size=C)
    o_ref, s_ref = ref(x, lb, s0)
    err, serr = rel(o, o_ref), rel(fs, s_ref)
    print(f"\nT=4096 H=8 K=128 C={C}: out {err:.2e} state {serr:.2e}")
    assert err <= TOL and serr <= TOL, (err, serr)


@pytest.mark.parametrize("warps, stages, C", [(2, 2, 16), (4, 3, 16), (8, 4, 16), (8, 2, 32), (4, 3, 32)])
def test_planner_overrides_give_the_same_answer(warps, stages, C):
    lengths = [77, 0, 300, 16]
    lb = LOWER_BOUND[C]
    x, s0 = make(1, sum(lengths), 3, 128, seed=warps * 10 + stages, state_dtype="float32", N=4)
    cu = cu_of(lengths)
    o, fs = run(x, cu_seqlens=cu, initial_state=s0, output_final_state=True, warps=warps, stages=stages,
                chunk_size=C, lower_bound=lb)
    # the same product path on either side (serially: mma.sync below 8 warps, wgmma at 8 for C 16), other
    # V splits or pipeline depth
    other = {1: 2, 2: 1, 4: 2, 8: 8}[warps]
    o1, fs1 = run(x, cu_seqlens=cu, initial_state=s0, output_final_state=True, warps=other, chunk_size=C,
                  lower_bound=lb, stages=None if other != warps else 3)
    assert torch.equal(o, o1) and torch.equal(fs, fs1), "V splits and pipeline depths change nothing: identical results"
    o_ref, s_ref = ref(x, lb, s0, cu)
    assert rel(o, o_ref) <= TOL and rel(fs, s_ref) <= TOL


def test_chunk_slots_past_grid_y():
    """More chunk slots than grid y holds (65535): kda_prepare's grid takes them in two z planes
    (prepare_grid), the last CTA past the slots. Two sequences of 32769 chunks in one batch
    (65538 slots, the second sequence in the z = 1 plane) give what each gives alone (32769 slots,
    one plane), bit for bit: the same kernels (serial walk, one warp) on the same chunks."""
    T = 16 * 32768 + 16
    x, s0 = make(2, T, 1, 64, seed=21, state_dtype="float32")
    out = torch.full((2, T, 1, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
    kw = dict(flags=SOFTPLUS, output_final_state=True, segment_chunks=0, warps=1)
    o, fs = run(x, initial_state=s0, out=out, **kw)
    for b in range(2):
        one = {n: (t[b:b + 1] if t.dim() >= 3 else t) for n, t in x.items()}
        o1, fs1 = run(one, initial_state=s0[b:b + 1], **kw)
        assert torch.equal(o[b:b + 1], o1) and torch.equal(fs[b:b + 1], fs1), b


def test_small_against_reference_no_state():   # the racecheck case (-k small)
    x, _ = make(1, 40, 1, 64, seed=3)
    o, _ = run(x)
    assert rel(o, ref(x, -5.0)[0]) <= TOL


@pytest.mark.parametrize("split", [256, 301])
def test_final_state_feeds_the_next_call(split):
    x, s0 = make(2, 700, 2, 128, seed=5, state_dtype="float32")
    o_all, s_all = run(x, initial_state=s0, output_final_state=True)
    first = {n: (t[:, :split] if t.dim() >= 3 else t) for n, t in x.items()}
    second = {n: (t[:, split:] if t.dim() >= 3 else t) for n, t in x.items()}
    o1, s1 = run(first, initial_state=s0, output_final_state=True)
    o2, s2 = run(second, initial_state=s1, output_final_state=True)
    o_cat = torch.cat([o1, o2], dim=1)
    if split % 16 == 0:   # same chunks: the fp32 state round trip is exact
        assert torch.equal(o_cat, o_all) and torch.equal(s2, s_all)
    else:
        assert rel(o_cat, f64(o_all)) <= 5e-3 and rel(s2, f64(s_all)) <= 5e-3


def test_final_state_may_alias_initial_state():
    lengths = [5, 40, 0, 33]
    x, s0 = make(1, sum(lengths), 2, 64, seed=6, state_dtype="float32", N=len(lengths))
    cu = cu_of(lengths)
    o, fs = run(x, initial_state=s0, output_final_state=True, cu_seqlens=cu)
    buf = s0.clone()
    o2, fs2 = run(x, initial_state=buf, final_state=buf, cu_seqlens=cu)
    assert fs2 is buf and torch.equal(buf, fs) and torch.equal(o, o2)
    assert torch.equal(fs[2], s0[2]), "a zero-length sequence keeps its initial state"


def test_rows_outside_the_sequences_stay_poisoned():
    T = 64
    cu = torch.tensor([3, 20, 20, 50], dtype=torch.int32, device="cuda")
    x, _ = make(1, T, 2, 128, seed=7)
    out = torch.full((1, T, 2, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    run(x, cu_seqlens=cu, out=out)
    assert torch.isnan(out[:, :3]).all() and torch.isnan(out[:, 50:]).all()
    assert torch.isfinite(out[:, 3:50]).all()
    o_ref = reference.kda_recurrent(*(f64(x[n][:, 3:50]) for n in ("q", "k", "v", "g", "beta")),
                                    A_log=f64(x["A_log"]), dt_bias=f64(x["dt_bias"]),
                                    cu_seqlens=np.array([0, 17, 17, 47]), **reference.kda_options(SAFE))[0]
    assert rel(out[:, 3:50], o_ref) <= TOL


def test_nan_stays_in_its_sequence():
    lengths = [50, 37, 64]
    x, s0 = make(1, sum(lengths), 2, 128, seed=8, state_dtype="float32", N=3)
    cu = cu_of(lengths)
    o_clean, s_clean = run(x, cu_seqlens=cu, initial_state=s0, output_final_state=True)
    for name in ("q", "k", "v", "g", "beta"):
        y = {n: t.clone() for n, t in x.items()}
        y[name][0, 60] = float("nan")   # inside sequence 1
        o, s = run(y, cu_seqlens=cu, initial_state=s0, output_final_state=True)
        assert torch.equal(o[:, :50], o_clean[:, :50]) and torch.equal(o[:, 87:], o_clean[:, 87:]), name
        assert torch.equal(s[0], s_clean[0]) and torch.equal(s[2], s_clean[2]), name
        assert torch.isnan(o[:, 60:87]).any(), name


def test_strided_inputs_are_read_in_place():
    B, T, H, K = 2, 100, 3, 64
    x, _ = make(B, T, H, K, seed=9)
    qkvg = torch.randn(B, T, 4, H, K, device="cuda").to(torch.bfloat16)
    for i, n in enumerate(("q", "k", "v", "g")):
        qkvg[:, :, i] = x[n]
    beta_big = torch.randn(B, T, 2 * H, device="cuda").to(torch.bfloat16)
    beta_big[..., ::2] = x["beta"]
    y = dict(x, q=qkvg[:, :, 0], k=qkvg[:, :, 1], v=qkvg[:, :, 2], g=qkvg[:, :, 3], beta=beta_big[..., ::2],
             dt_bias=x["dt_bias"].reshape(H * K))
    out = torch.empty(B, T, H, 2 * K, device="cuda", dtype=torch.bfloat16)[..., :K]
    o_ref, _ = run(x)
    o, _ = run(y, out=out)
    assert torch.equal(o, o_ref)


def test_heads_broadcast_from_one_are_read_in_place():
    """q, k and g expanded from one head (stride 0 over H) give what their copies give."""
    x, _ = make(1, 300, 4, 128, seed=11)
    y = dict(x, **{n: x[n][:, :, :1].expand(x[n].shape) for n in ("q", "k", "g")})
    o, _ = run(y, flags=SOFTPLUS)
    o_ref, _ = run({n: t.contiguous() for n, t in y.items()}, flags=SOFTPLUS)
    assert torch.equal(o, o_ref)


def test_scale_and_default_state_dtype():
    x, _ = make(1, 50, 2, 128, seed=10)
    o, fs = run(x, scale=0.3, output_final_state=True)
    o_ref, s_ref = ref(x, -5.0, scale=0.3)
    assert fs.dtype == torch.float32
    assert rel(o, o_ref) <= TOL and rel(fs, s_ref) <= TOL


def test_cuda_graph_capture_and_replay():
    lengths = [100, 0, 257]
    x, s0 = make(1, sum(lengths), 4, 128, seed=12, state_dtype="float32", N=3)
    cu = cu_of(lengths)
    out = torch.empty_like(x["v"])
    fs = torch.empty_like(s0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(x, cu_seqlens=cu, initial_state=s0, out=out, final_state=fs)   # warm-up
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(x, cu_seqlens=cu, initial_state=s0, out=out, final_state=fs)
    y, s1 = make(1, sum(lengths), 4, 128, seed=13, state_dtype="float32", N=3)
    for n in x:
        x[n].copy_(y[n])
    s0.copy_(s1)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    o_ref, s_ref = ref(y, -5.0, s1, cu)
    assert rel(out, o_ref) <= TOL and rel(fs, s_ref) <= TOL


def test_bad_inputs_raise_before_launch():
    x, _ = make(1, 32, 2, 128, seed=14)
    with pytest.raises(ValueError, match="chunk_size must be one of"):
        run(x, chunk_size=48)
    with pytest.raises(TypeError, match="q must have dtype bfloat16"):
        run(dict(x, q=x["q"].half()))
    with pytest.raises(TypeError, match="q must be a CUDA tensor"):
        run(dict(x, q=x["q"].cpu()))


# ---- gate modes, β forms, the norm flag, state layouts and the state pool (fla's keywords) ----

def variant_inputs(x, gate, g_dtype, beta_form, beta_dtype, norm, seed):
    """x's arrays reshaped for a variant: g as the log-decay for gate "none" (decays e^-1e-3 ... e^-60),
    beta as probabilities for "prob", q and k pre-normalised without the in-kernel norm; A_log
    as vLLM holds it, [1, 1, H, 1]."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    y = dict(x)
    H = x["q"].shape[2]
    y["A_log"] = x["A_log"].reshape(1, 1, H, 1)
    if gate == "none":
        u = torch.rand(x["g"].shape, generator=gen, device="cuda")
        y["g"] = (-torch.exp(np.log(1e-3) + u * (np.log(60.0) - np.log(1e-3)))).to(getattr(torch, g_dtype))
    if beta_form == "prob":
        y["beta"] = torch.rand(x["beta"].shape, generator=gen, device="cuda").to(getattr(torch, beta_dtype))
    if not norm:
        for n in ("q", "k"):
            y[n] = torch.nn.functional.normalize(x[n].float(), dim=-1).to(torch.bfloat16)
    return y


def flags_of(gate, beta_form, norm):
    return dict(use_qk_l2norm_in_kernel=norm, use_gate_in_kernel=gate != "none",
                use_beta_sigmoid_in_kernel=beta_form != "prob", allow_neg_eigval=beta_form == "logit2",
                lower_bound=-5.0 if gate == "safe" else None, safe_gate=gate == "safe")


VARIANTS = [("softplus", "bfloat16", "logit", "bfloat16", True), ("safe", "bfloat16", "logit", "bfloat16", True),
            ("none", "float32", "prob", "float32", True), ("none", "bfloat16", "prob", "bfloat16", False),
            ("softplus", "bfloat16", "logit2", "bfloat16", False), ("none", "float32", "logit", "bfloat16", True)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("C", [16, 32])
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("state", ["float32", "bfloat16"])
def test_variants_match_reference(variant, C, K, state):
    gate, g_dtype, beta_form, beta_dtype, norm = variant
    lengths = [1, 0, 37, 16, 300, 2]
    x, s0 = make(1, sum(lengths), 2, K, seed=C + K + len(gate), state_dtype=state, N=len(lengths))
    y = variant_inputs(x, gate, g_dtype, beta_form, beta_dtype, norm, seed=K)
    flags = flags_of(gate, beta_form, norm)
    cu = cu_of(lengths)
    out = torch.full_like(x["v"], float("nan"))
    o, fs = run(y, flags, cu_seqlens=cu, initial_state=s0, output_final_state=True, chunk_size=C, out=out)
    o_ref, s_ref = ref(y, None, s0, cu, flags=flags)
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert rel(o, o_ref) <= TOL and rel(fs, s_ref) <= TOL, (rel(o, o_ref), rel(fs, s_ref))


def long_memory(x):
    """Inputs whose state remembers across slices (so that a wrong start shows): small β (logits
    − 4) and decays of about 1 on half the key dims (dt_bias −20: softplus ≈ 2e-9)."""
    x["beta"] = (x["beta"].float() - 4).to(torch.bfloat16)
    x["dt_bias"][:, ::2] = -20.0
    return x


def unbounded_inputs(T, H, K, seed, dt_bias_scale=3.0):
    """Kimi Linear's gate driven hard: per-token log-decays from about -1e-3 to -60, whole chunks
    whose decay is exactly 0 (softplus(1e4) · e^A_log), large dt_bias, and runs of nearly
    collinear keys."""
    x, s0 = make(1, T, H, K, seed, state_dtype="float32")
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    x["A_log"] = torch.log(torch.rand(H, generator=gen, device="cuda") * 8 + 0.5)
    x["dt_bias"] = dt_bias_scale * torch.randn(H, K, generator=gen, device="cuda")
    g = torch.empty(1, T, H, K, device="cuda").uniform_(-10.0, 4.0, generator=gen)
    g[:, 1000:1064] = 1e4                 # four chunks of 16 with a zero decay on every key dim
    g[:, 2000:2003, :, :5] = 1e4          # a few zero decays on a few dims
    x["g"] = g.to(torch.bfloat16)
    k = x["k"].float()
    k[:, 3000:3100] = k[:, 3000:3001] + 1e-3 * k[:, 3000:3100]   # nearly collinear keys
    x["k"] = k.to(torch.bfloat16)
    return x, s0


# out tolerance: the bf16 rounding of the exact output alone is 1.66e-3 (rel-L2) on these inputs;
# with S·qdᵀ and S·kdᵀ in fp16 the kernels add little to it (CPU emulation, docs/studies/kda_rounding:
# 1.71-1.72e-3; with bf16 operands it was 2.21-2.32e-3 measured on the H200)
@pytest.mark.parametrize("C", [16, 32])
@pytest.mark.parametrize("dt_bias_scale, out_tol", [(0.1, 2e-3), (3.0, 2e-3)])
def test_unbounded_gate_accuracy(C, dt_bias_scale, out_tol):
    x, s0 = unbounded_inputs(4096, 8, 128, seed=21, dt_bias_scale=dt_bias_scale)
    a = reference.kda_gate(f64(x["g"]), f64(x["A_log"]), f64(x["dt_bias"]), None, "softplus")
    assert a.max() > -1e-2 and a.min() < -60 and (np.exp(a) == 0).any(), "the decays span the range"
    o, fs = run(x, SOFTPLUS, initial_state=s0, output_final_state=True, chunk_size=C)
    o_ref, s_ref = ref(x, None, s0, flags=SOFTPLUS)
    err, serr = rel(o, o_ref), rel(fs, s_ref)
    print(f"\nsoftplus gate T=4096 H=8 K=128 C={C} dt_bias {dt_bias_scale}·randn: out {err:.2e} state {serr:.2e}")
    assert torch.isfinite(o).all() and torch.isfinite(fs).all()
    assert err <= out_tol and serr <= 2e-3, (err, serr)


def pool_case(lengths, seed, state, index_dtype=torch.int32, P=11, H=2, K=128):
    """Five sequences on a random pool of P rows: the inputs, the pool and a copy of it, the rows
    (sequence 2 padding), has_initial_state (False for sequence 3) and cu_seqlens."""
    x, _ = make(1, sum(lengths), H, K, seed=seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    pool = (0.05 * torch.randn(P, H, K, K, generator=gen, device="cuda")).to(getattr(torch, state))
    idx = torch.tensor([7, 2, -1, 9, 0], dtype=index_dtype, device="cuda")
    has = torch.tensor([True, True, True, False, True], device="cuda")
    return x, pool, pool.clone(), idx, has, cu_of(lengths)


@pytest.mark.parametrize("state", ["float32", "bfloat16"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_prefill_on_the_state_pool(state, index_dtype):
    P = 11
    x, pool, before, idx, has, cu = pool_case([40, 0, 1, 77, 16], 31, state, index_dtype, P)
    o, fs = run(x, SOFTPLUS, cu_seqlens=cu, initial_state=pool, state_indices=idx, has_initial_state=has,
                output_final_state=True)
    assert fs is pool
    s0 = torch.stack([before[7], before[2], torch.zeros_like(before[0]), torch.zeros_like(before[0]), before[0]])
    o_ref, s_ref = ref(x, None, s0, cu, flags=SOFTPLUS)
    assert rel(o, o_ref) <= TOL
    for n, row in enumerate(idx.tolist()):
        if row >= 0:
            assert rel(pool[row], s_ref[n]) <= TOL, n
    untouched = [r for r in range(P) if r not in idx.tolist()]
    assert torch.equal(pool[untouched], before[untouched]), "rows no sequence names are not touched"
    # the same call on a contiguous initial_state gives the same outputs, bit for bit
    o2, _ = run(x, SOFTPLUS, cu_seqlens=cu, initial_state=s0.to(pool.dtype), output_final_state=True)
    assert torch.equal(o, o2)


@pytest.mark.parametrize("v_first", [True, False])
def test_prefill_on_a_pool_view(v_first):
    """The pool as engines keep it: a view of a cache whose slots also hold other layers' states
    (rows 3 states apart). The view's rows are read and written in place, bit for bit as in a
    contiguous pool, and nothing else in the cache changes."""
    P = 11
    x, pool, before, idx, has, cu = pool_case([40, 0, 1, 77, 16], 31, "float32", torch.int32, P)
    cache = torch.randn(P, 3, *pool.shape[1:], device="cuda")
    cache[:, 1] = pool
    cache_before = cache.clone()
    view = cache[:, 1]
    def call(states, **kw):
        return pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **SOFTPLUS, A_log=x["A_log"],
                               dt_bias=x["dt_bias"], state_v_first=v_first, cu_seqlens=cu, initial_state=states,
                               state_indices=idx, has_initial_state=has, **kw)
    o, fs = call(view, output_final_state=True)
    o2, _ = call(pool)
    assert fs is view and torch.equal(o, o2) and torch.equal(view, pool)
    assert torch.equal(cache[:, 0::2], cache_before[:, 0::2]), "the other layers' states are not touched"


def test_state_layouts_agree():
    lengths = [33, 64, 5]
    x, s0 = make(1, sum(lengths), 2, 64, seed=41, state_dtype="float32", N=3)
    cu = cu_of(lengths)
    o_v, s_v = run(x, SOFTPLUS, cu_seqlens=cu, initial_state=s0, output_final_state=True)
    flags = dict(SOFTPLUS)
    o_k, s_k = pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **flags, A_log=x["A_log"],
                               dt_bias=x["dt_bias"], initial_state=s0.transpose(-1, -2).contiguous(),
                               output_final_state=True, cu_seqlens=cu)   # fla's default: [N, H, K, V]
    assert torch.equal(o_v, o_k) and torch.equal(s_v, s_k.transpose(-1, -2))


def test_fla_style_call_as_vllm_makes_it():
    """vLLM's prefill: its own gate kernel's fp32 log-decay, sigmoid(b) in fp32, A_log [1, 1, H, 1],
    cu_seqlens int64, the state pool gathered by index (here: read and written in place)."""
    lengths = [300, 17, 1]
    x, _ = make(1, sum(lengths), 4, 128, seed=51)
    a = reference.kda_gate(f64(x["g"]), f64(x["A_log"]), f64(x["dt_bias"]), None, "softplus")
    g32 = torch.tensor(a, dtype=torch.float32, device="cuda")
    beta32 = torch.sigmoid(x["beta"].float())
    pool = torch.zeros(8, 4, 128, 128, device="cuda")
    idx = torch.tensor([3, 5, 1], device="cuda")
    o, _ = pykda.chunk_kda(x["q"], x["k"], x["v"], g32, beta32, initial_state=pool, state_indices=idx,
                           output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True,
                           cu_seqlens=cu_of(lengths, torch.int64))
    o2, s2 = run(x, SOFTPLUS, cu_seqlens=cu_of(lengths), output_final_state=True)
    assert rel(o, f64(o2)) <= 2e-3 and rel(pool[idx], f64(s2)) <= 2e-3
