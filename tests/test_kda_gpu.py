"""GPU tests of KDA prefill (`chunk_kda`) against the float64 recurrent reference (run on the H200)."""
import numpy as np
import pytest

import pykda
from pykda import reference

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
TOL = 1e-2
VARLEN = [1, 15, 16, 17, 0, 1000, 4099]
LOWER_BOUND = {16: -5.0, 32: -2.5}


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


def ref(x, lower_bound, s0=None, cu=None, scale=None):
    return reference.kda_recurrent(
        f64(x["q"]), f64(x["k"]), f64(x["v"]), f64(x["g"]), f64(x["beta"]), A_log=f64(x["A_log"]),
        dt_bias=f64(x["dt_bias"]), lower_bound=lower_bound, scale=scale,
        initial_state=None if s0 is None else f64(s0), cu_seqlens=None if cu is None else cu.cpu().numpy())


def rel(out, expected):
    return reference.relative_error(f64(out), expected)


def cu_of(lengths, dtype=torch.int32):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=dtype, device="cuda")


def run(x, **kw):
    return pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"], **kw)


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
    o1, fs1 = run(x, cu_seqlens=cu, initial_state=s0, output_final_state=True, warps=1, chunk_size=C, lower_bound=lb)
    assert torch.equal(o, o1) and torch.equal(fs, fs1), "V splits are independent: identical results"
    o_ref, s_ref = ref(x, lb, s0, cu)
    assert rel(o, o_ref) <= TOL and rel(fs, s_ref) <= TOL


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
                                    cu_seqlens=np.array([0, 17, 17, 47]))[0]
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
    with pytest.raises(ValueError, match="chunk_size=32"):
        run(x, chunk_size=32, lower_bound=-5.0)
    with pytest.raises(TypeError, match="q must have dtype bfloat16"):
        run(dict(x, q=x["q"].half()))
    with pytest.raises(TypeError, match="q must be a CUDA tensor"):
        run(dict(x, q=x["q"].cpu()))
