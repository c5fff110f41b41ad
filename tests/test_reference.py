"""CPU tests of pykda.reference (NumPy + pytest only, no GPU)."""

import math

import numpy as np
import pytest

from pykda import reference as ref

TOL = 1e-10


# --------------------------------------------------------------------------------------------
# decode attention
# --------------------------------------------------------------------------------------------


def _direct_decode(q, k, v, scale):
    """Loop-per-head softmax attention, written independently of the reference."""
    Hq, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    o = np.zeros((Hq, v.shape[2]))
    lse = np.zeros(Hq)
    for h in range(Hq):
        kvh = h // group
        s = np.array([scale * float(np.dot(q[h], k[j, kvh])) for j in range(k.shape[0])])
        w = np.exp(s)  # small scores: no max subtraction needed
        o[h] = (w[:, None] * v[:, kvh]).sum(0) / w.sum()
        lse[h] = math.log(w.sum())
    return o, lse


@pytest.mark.parametrize("Hq,Hkv", [(8, 2), (4, 4), (6, 1)])
def test_decode_matches_direct_softmax(Hq, Hkv):
    rng = np.random.default_rng(0)
    S, D = 53, 16
    q = rng.standard_normal((Hq, D))
    k = rng.standard_normal((S, Hkv, D))
    v = rng.standard_normal((S, Hkv, D))
    o, lse = ref.decode_attention(q, k, v)
    assert o.shape == (Hq, D) and lse.shape == (Hq,)
    assert o.dtype == np.float64 and lse.dtype == np.float64
    o_d, lse_d = _direct_decode(q, k, v, 1.0 / math.sqrt(D))
    assert ref.relative_error(o, o_d) < 1e-13
    assert ref.relative_error(lse, lse_d) < 1e-13


def test_decode_gqa_groups_and_scale():
    rng = np.random.default_rng(1)
    Hq, Hkv, S, D = 8, 2, 40, 32
    q = rng.standard_normal((Hq, D)).astype(np.float32)
    k = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, D)).astype(np.float32)
    scale = 0.3
    o, lse = ref.decode_attention(q, k, v, scale=scale)
    group = Hq // Hkv
    for j in range(Hkv):
        hs = slice(j * group, (j + 1) * group)
        o_j, lse_j = ref.decode_attention(q[hs], k[:, j : j + 1], v[:, j : j + 1], scale=scale)
        np.testing.assert_allclose(o[hs], o_j, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(lse[hs], lse_j, rtol=1e-13, atol=1e-13)
        # lse is the natural-log logsumexp of the scaled scores of this group's kv head
        s = scale * np.einsum("hd,sd->hs", q[hs].astype(np.float64), k[:, j].astype(np.float64))
        np.testing.assert_allclose(lse[hs], np.log(np.exp(s).sum(-1)), rtol=1e-13)
    # the mapping matters: a different head->kv mapping gives different outputs
    o_wrong, _ = ref.decode_attention(q, k[:, ::-1], v[:, ::-1], scale=scale)
    assert ref.relative_error(o_wrong, o) > 1e-2


def test_decode_large_scores_stable():
    rng = np.random.default_rng(2)
    q = 100.0 * rng.standard_normal((2, 8))
    k = rng.standard_normal((30, 1, 8))
    v = rng.standard_normal((30, 1, 8))
    o, lse = ref.decode_attention(q, k, v)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    s = np.einsum("hd,sd->hs", q, k[:, 0]) / math.sqrt(8)
    m = s.max(-1)
    np.testing.assert_allclose(lse, m + np.log(np.exp(s - m[:, None]).sum(-1)), rtol=1e-13)


def test_batch_decode_matches_single():
    rng = np.random.default_rng(3)
    B, Hq, Hkv, S, D = 3, 4, 2, 17, 8
    q = rng.standard_normal((B, Hq, D))
    k = rng.standard_normal((B, S, Hkv, D))
    v = rng.standard_normal((B, S, Hkv, D))
    o, lse = ref.batch_decode_attention(q, k, v)
    assert o.shape == (B, Hq, D) and lse.shape == (B, Hq)
    for b in range(B):
        o_b, lse_b = _direct_decode(q[b], k[b], v[b], 1.0 / math.sqrt(D))
        assert ref.relative_error(o[b], o_b) < 1e-13
        assert ref.relative_error(lse[b], lse_b) < 1e-13


def test_decode_rejects_bad_gqa():
    with pytest.raises(ValueError):
        ref.decode_attention(np.zeros((6, 8)), np.zeros((4, 4, 8)), np.zeros((4, 4, 8)))


# --------------------------------------------------------------------------------------------
# small pieces
# --------------------------------------------------------------------------------------------


def test_kda_gate_and_l2_normalize():
    g = np.array([[[0.0, 1.0], [-2.0, 0.5]]])  # [1, H=2, K=2]
    A_log = np.array([0.0, math.log(3.0)])
    dt_bias = np.array([[0.0, 0.5], [1.0, -0.5]])
    a = ref.kda_gate(g, A_log, dt_bias, -5.0)
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))
    expected = -5.0 * np.array(
        [[[sig(0.0), sig(1.5)], [sig(3.0 * -1.0), sig(3.0 * 0.0)]]]
    )
    np.testing.assert_allclose(a, expected, rtol=1e-15)
    np.testing.assert_array_equal(ref.kda_gate(g, A_log, dt_bias.reshape(-1), -5.0), a)
    assert ref.sigmoid(-np.inf) == 0.0 and ref.sigmoid(np.inf) == 1.0

    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    y = ref.l2_normalize(x)
    np.testing.assert_allclose(y[0], [3.0 / math.sqrt(25 + 1e-6), 4.0 / math.sqrt(25 + 1e-6)])
    np.testing.assert_array_equal(y[1], [0.0, 0.0])


def test_gate_modes_and_beta_forms():
    g = np.array([[[0.0, 30.0], [-40.0, 0.5]]])  # [1, H=2, K=2]
    A_log = np.array([0.0, math.log(3.0)])
    dt_bias = np.array([[0.0, 0.5], [1.0, -0.5]])
    sp = lambda x: math.log1p(math.exp(x)) if x < 30 else x + math.log1p(math.exp(-x))
    expected = -np.array([[[sp(0.0), sp(30.5)], [3.0 * sp(-39.0), 3.0 * sp(0.0)]]])
    np.testing.assert_allclose(ref.kda_gate(g, A_log, dt_bias, None, "softplus"), expected, rtol=1e-14)
    assert (ref.kda_gate(np.full((1, 2, 2), 800.0), A_log, None, None, "softplus") < -700).all()   # no overflow
    np.testing.assert_array_equal(ref.kda_gate(g, None, None, None, "none"), g)
    # safe gate without A_log: exp(A_log) = 1
    np.testing.assert_allclose(ref.kda_gate(g, None, None, -2.0), -2.0 * ref.sigmoid(g))
    b = np.array([-1.0, 0.0, 2.0])
    np.testing.assert_allclose(ref.kda_beta(b, "logit2"), 2.0 * ref.sigmoid(b))
    np.testing.assert_array_equal(ref.kda_beta(b, "prob"), b)
    with pytest.raises(ValueError, match="gate"):
        ref.kda_gate(g, A_log, dt_bias, -5.0, "tanh")
    with pytest.raises(ValueError, match="beta form"):
        ref.kda_beta(b, "softmax")


def test_kda_options_follow_fla_keywords():
    assert ref.kda_options({}) == dict(gate="none", beta_form="prob", qk_norm=False, lower_bound=None)
    assert ref.kda_options(dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True))["gate"] == "softplus"
    safe = ref.kda_options(dict(use_gate_in_kernel=True, lower_bound=-5.0, use_beta_sigmoid_in_kernel=True,
                                allow_neg_eigval=True, use_qk_l2norm_in_kernel=True))
    assert safe == dict(gate="safe", beta_form="logit2", qk_norm=True, lower_bound=-5.0)


def test_relative_error():
    assert ref.relative_error([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert ref.relative_error([3.0, 4.0], [0.0, 0.0]) == math.inf
    assert ref.relative_error([0.0, 0.0], [0.0, 0.0]) == 0.0
    assert ref.relative_error([np.nan, 1.0], [1.0, 1.0]) == math.inf
    assert ref.relative_error([np.inf, 1.0], [1.0, 1.0]) == math.inf
    assert abs(ref.relative_error([1.0, 0.0], [0.0, 1.0]) - math.sqrt(2.0)) < 1e-15


# --------------------------------------------------------------------------------------------
# KDA: recurrent vs chunked
# --------------------------------------------------------------------------------------------


def _kda_inputs(rng, B, T, H, K, V, with_state, N=None):
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    v = rng.standard_normal((B, T, H, V))
    g = rng.standard_normal((B, T, H, K))
    beta = rng.standard_normal((B, T, H))
    params = dict(
        A_log=np.log(rng.uniform(1.0, 16.0, H)),
        dt_bias=0.1 * rng.standard_normal((H, K)),
    )
    N = B if N is None else N
    s0 = 0.05 * rng.standard_normal((N, H, V, K)) if with_state else None
    return (q, k, v, g, beta), params, s0


CHUNK_CASES = [(16, -5.0), (32, -2.0)]


@pytest.mark.parametrize("chunk_size,lower_bound", CHUNK_CASES)
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("K,V", [(16, 16), (32, 32), (16, 32)])
def test_chunked_matches_recurrent(K, V, with_state, chunk_size, lower_bound):
    rng = np.random.default_rng(10 * K + V + with_state + chunk_size)
    B, T, H = 2, 37, 3
    x, p, s0 = _kda_inputs(rng, B, T, H, K, V, with_state)
    o_r, s_r = ref.kda_recurrent(*x, **p, lower_bound=lower_bound, initial_state=s0)
    o_c, s_c = ref.kda_chunked(
        *x, **p, lower_bound=lower_bound, initial_state=s0, chunk_size=chunk_size
    )
    assert o_r.shape == (B, T, H, V) and s_r.shape == (B, H, V, K)
    assert o_c.shape == o_r.shape and s_c.shape == s_r.shape
    assert o_r.dtype == np.float64 and s_c.dtype == np.float64
    assert ref.relative_error(o_c, o_r) < TOL
    assert ref.relative_error(s_c, s_r) < TOL
    # non-degenerate: outputs and state are of order one, and the initial state matters
    assert np.linalg.norm(o_r) > 1.0 and np.linalg.norm(s_r) > 1.0
    if with_state:
        o_0, _ = ref.kda_recurrent(*x, **p, lower_bound=lower_bound)
        assert ref.relative_error(o_0, o_r) > 1e-4


@pytest.mark.parametrize("chunk_size", [16, 32])
@pytest.mark.parametrize("gate,beta_form,qk_norm", [("softplus", "logit", True), ("none", "prob", False),
                                                     ("softplus", "logit2", True)])
def test_chunked_matches_recurrent_unbounded(gate, beta_form, qk_norm, chunk_size):
    """Decays from e^-1e-3 to exactly 0 inside one chunk (the softplus gate, or g as the
    log-decay): the chunked form has no growth factor, so it stays finite and exact."""
    rng = np.random.default_rng(7 + chunk_size)
    B, T, H, K = 2, 70, 2, 16
    x, p, s0 = _kda_inputs(rng, B, T, H, K, K, True)
    q, k, v, g, beta = x
    g = rng.uniform(-12.0, 6.0, g.shape)
    g[0, 20:40] = 1e4                       # softplus: decays of e^-1e4 (0 in float64) for 20 tokens
    if gate == "none":
        g = -np.exp(rng.uniform(np.log(1e-3), np.log(60.0), g.shape))
        g[1, 5:9] = -800.0                   # exp(-800) == 0
        p = {}
    if beta_form == "prob":
        beta = rng.uniform(0.0, 1.0, beta.shape)
    if not qk_norm:
        q, k = ref.l2_normalize(q), ref.l2_normalize(k)
    kw = dict(p, gate=gate, beta_form=beta_form, qk_norm=qk_norm, initial_state=s0)
    o_r, s_r = ref.kda_recurrent(q, k, v, g, beta, **kw)
    o_c, s_c = ref.kda_chunked(q, k, v, g, beta, **kw, chunk_size=chunk_size)
    assert np.isfinite(o_c).all() and np.isfinite(s_c).all()
    assert ref.relative_error(o_c, o_r) < TOL
    assert ref.relative_error(s_c, s_r) < TOL
    assert np.linalg.norm(o_r) > 1.0


@pytest.mark.parametrize("chunk_size,lower_bound", CHUNK_CASES)
@pytest.mark.parametrize("with_state", [False, True])
def test_varlen(with_state, chunk_size, lower_bound):
    rng = np.random.default_rng(7 + chunk_size + with_state)
    cu = np.array([0, 1, 16, 17, 17, 50], dtype=np.int32)
    N, T, H, K, V = len(cu) - 1, int(cu[-1]), 3, 16, 16
    x, p, s0 = _kda_inputs(rng, 1, T, H, K, V, with_state, N=N)
    kw = dict(**p, lower_bound=lower_bound, initial_state=s0, cu_seqlens=cu)
    o_r, s_r = ref.kda_recurrent(*x, **kw)
    o_c, s_c = ref.kda_chunked(*x, **kw, chunk_size=chunk_size)
    assert o_r.shape == (1, T, H, V) and s_r.shape == (N, H, V, K)
    assert ref.relative_error(o_c, o_r) < TOL
    assert ref.relative_error(s_c, s_r) < TOL

    # zero-length sequence 3 ([17, 17)): final state is its initial state, exactly
    expected = np.zeros((H, V, K)) if s0 is None else s0[3]
    np.testing.assert_array_equal(s_r[3], expected)
    np.testing.assert_array_equal(s_c[3], expected)

    # each sequence equals running it alone from its own start (state does not leak across)
    for n in range(N):
        a, b = int(cu[n]), int(cu[n + 1])
        if a == b:
            continue
        xs = tuple(t[:, a:b] for t in x)
        s0n = None if s0 is None else s0[n : n + 1]
        o_n, s_n = ref.kda_chunked(
            *xs, **p, lower_bound=lower_bound, initial_state=s0n, chunk_size=chunk_size
        )
        assert ref.relative_error(o_n, o_r[:, a:b]) < TOL
        assert ref.relative_error(s_n[0], s_r[n]) < TOL


@pytest.mark.parametrize("varlen", [False, True])
def test_intermediate_states_are_the_states_of_each_prefix(varlen):
    """kda_recurrent(intermediate_states=True): the state after token t is the final state of
    the sequence's first t + 1 tokens (speculative decode stores each one); o and the final state
    are those of the plain call; a zero-length sequence adds none."""
    rng = np.random.default_rng(11)
    cu = np.array([0, 3, 3, 7]) if varlen else None
    B, T, N = (1, 7, 3) if varlen else (2, 5, 2)
    x, p, s0 = _kda_inputs(rng, B, T, 2, 8, 8, True, N=N)
    o, s, states = ref.kda_recurrent(*x, **p, initial_state=s0, cu_seqlens=cu, intermediate_states=True)
    o_plain, s_plain = ref.kda_recurrent(*x, **p, initial_state=s0, cu_seqlens=cu)
    np.testing.assert_array_equal(o, o_plain)
    np.testing.assert_array_equal(s, s_plain)
    assert states.shape == (B, T, 2, 8, 8)
    ranges = [(0, n, int(cu[n]), int(cu[n + 1])) for n in range(N)] if varlen else [(b, b, 0, T) for b in range(B)]
    for row, n, a, e in ranges:
        for t in range(a, e):
            _, s_t = ref.kda_recurrent(*(y[row:row + 1, a:t + 1] for y in x), **p, initial_state=s0[n:n + 1])
            np.testing.assert_allclose(states[row, t], s_t[0], rtol=1e-12, atol=1e-12)
        if e > a:
            np.testing.assert_array_equal(states[row, e - 1], s[n])


def test_float32_inputs_accepted():
    rng = np.random.default_rng(5)
    x, p, s0 = _kda_inputs(rng, 1, 20, 2, 16, 16, True)
    x32 = tuple(t.astype(np.float32) for t in x)
    x64 = tuple(t.astype(np.float64) for t in x32)
    o32, s32 = ref.kda_chunked(*x32, **p, initial_state=s0.astype(np.float32))
    o64, s64 = ref.kda_recurrent(*x64, **p, initial_state=s0.astype(np.float32).astype(np.float64))
    assert o32.dtype == np.float64
    assert ref.relative_error(o32, o64) < TOL and ref.relative_error(s32, s64) < TOL


# --------------------------------------------------------------------------------------------
# KDA: the affine map of a token range (segments, ranks)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gate", ["safe", "softplus"])
@pytest.mark.parametrize("K,V", [(8, 8), (8, 6)])
def test_affine_map_gives_the_final_state_from_any_initial_state(K, V, gate):
    rng = np.random.default_rng(K + V + len(gate))
    B, T, H = 2, 29, 3
    x, p, _ = _kda_inputs(rng, B, T, H, K, V, False)
    M, Bm = ref.kda_affine_map(*x, **p, gate=gate)
    assert M.shape == (B, H, K, K) and Bm.shape == (B, H, V, K)
    for _ in range(2):
        s0 = rng.standard_normal((B, H, V, K))
        _, s = ref.kda_recurrent(*x, **p, gate=gate, initial_state=s0)
        assert ref.relative_error(s0 @ M + Bm, s) < TOL


def test_affine_maps_compose_across_a_split():
    """The map of [0, T) is the map of [0, t) followed by that of [t, T): (M1 M2, B1 M2 + B2); a
    zero-length range is the identity map."""
    rng = np.random.default_rng(7)
    T, H, K = 40, 2, 8
    x, p, _ = _kda_inputs(rng, 1, T, H, K, K, False)
    M, Bm = ref.kda_affine_map(*x, **p)
    Ms, Bs = ref.kda_affine_map(*x, **p, cu_seqlens=np.array([0, 13, 13, T]))
    assert ref.relative_error(Ms[1], np.broadcast_to(np.eye(K), (H, K, K))) == 0 and not Bs[1].any()
    assert ref.relative_error(Ms[0] @ Ms[2], M[0]) < TOL
    assert ref.relative_error(Bs[0] @ Ms[2] + Bs[2], Bm[0]) < TOL


# --------------------------------------------------------------------------------------------
# KDA: sanity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [ref.kda_recurrent, ref.kda_chunked])
def test_no_write_no_decay_keeps_state(fn):
    rng = np.random.default_rng(4)
    B, T, H, K, V = 2, 21, 2, 8, 8
    x, p, s0 = _kda_inputs(rng, B, T, H, K, V, True)
    q, k, v, g, _ = x
    beta = np.full((B, T, H), -np.inf)  # beta = sigmoid(-inf) = 0: no writes
    o, s = fn(q, k, v, g, beta, **p, lower_bound=0.0, initial_state=s0)  # a = 0: no decay
    np.testing.assert_array_equal(s, s0)
    qn = ref.l2_normalize(q)
    expected = np.einsum("bhvk,bthk->bthv", s0, qn) / math.sqrt(K)
    np.testing.assert_allclose(o, expected, rtol=1e-12, atol=1e-14)

    # with decay but no writes the state decays by exp(sum of a over time), per key dim
    o, s = fn(q, k, v, g, beta, **p, lower_bound=-0.5, initial_state=s0)
    a_sum = ref.kda_gate(g, p["A_log"], p["dt_bias"], -0.5).sum(axis=1)  # [B, H, K]
    np.testing.assert_allclose(s, s0 * np.exp(a_sum)[:, :, None, :], rtol=1e-12)


@pytest.mark.parametrize("fn", [ref.kda_recurrent, ref.kda_chunked])
def test_one_token_by_hand(fn):
    # H = 1, K = V = 2. gate: A_log = 0, dt_bias = 0, g = 0 -> sigmoid(0) = 1/2, so with
    # lower_bound = -2 ln 2, a = -ln 2 and exp(a) = 1/2. beta logit 0 -> beta = 1/2.
    q = np.array([3.0, 4.0]).reshape(1, 1, 1, 2)
    k = np.array([1.0, 0.0]).reshape(1, 1, 1, 2)
    v = np.array([1.0, -1.0]).reshape(1, 1, 1, 2)
    g = np.zeros((1, 1, 1, 2))
    beta = np.zeros((1, 1, 1))
    S0 = np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 1, 2, 2)  # S[v, k]
    o, S = fn(
        q, k, v, g, beta, A_log=np.zeros(1), dt_bias=np.zeros((1, 2)),
        lower_bound=-2.0 * math.log(2.0), initial_state=S0,
    )
    c = 1.0 / math.sqrt(1.0 + 1e-6)  # k̂ = [c, 0]
    # decayed state [[0.5, 1], [1.5, 2]]; S k̂ = [0.5c, 1.5c]; err = v - S k̂
    e0, e1 = 1.0 - 0.5 * c, -1.0 - 1.5 * c
    S_exp = np.array([[0.5 + 0.5 * e0 * c, 1.0], [1.5 + 0.5 * e1 * c, 2.0]])
    qn = np.array([3.0, 4.0]) / math.sqrt(25.0 + 1e-6)
    o_exp = (S_exp @ qn) / math.sqrt(2.0)
    np.testing.assert_allclose(S[0, 0], S_exp, rtol=1e-14)
    np.testing.assert_allclose(o[0, 0, 0], o_exp, rtol=1e-14)


def test_bad_cu_seqlens():
    rng = np.random.default_rng(6)
    x, p, _ = _kda_inputs(rng, 2, 10, 1, 4, 4, False)
    with pytest.raises(ValueError):  # B must be 1 with cu_seqlens
        ref.kda_recurrent(*x, **p, cu_seqlens=np.array([0, 10]))
    x1 = tuple(t[:1] for t in x)
    with pytest.raises(ValueError):  # must end at T
        ref.kda_chunked(*x1, **p, cu_seqlens=np.array([0, 4, 8]))
