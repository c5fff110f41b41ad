"""GPU tests of pykda.compat.sglang against the float64 recurrence (run on the H200): SGLang's
prefill on a pool view, then its decode step, give what the reference gives for the same
tokens, with SGLang's meanings of β (probabilities in prefill, logits in decode) and the gate."""
import numpy as np
import pytest

from pykda import reference
from pykda.compat import sglang

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
TOL = 5e-3
H, K, P = 2, 128, 7
LENGTHS = [40, 1, 77]
ROWS = [5, -1, 2]   # sequence 1 is padding


def f64(t):
    return t.double().cpu().numpy()


def cu_of(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device="cuda")


def inputs(T, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda")   # noqa: E731
    bf = torch.bfloat16
    return dict(q=rnd(1, T, H, K).to(bf), k=rnd(1, T, H, K).to(bf), v=rnd(1, T, H, K).to(bf),
                g=rnd(1, T, H, K).to(bf), b=rnd(1, T, H).to(bf))


def verify_inputs(seed, x_seed, n_tokens):
    """Target verify's inputs: Kimi Linear's gate parameters, an fp32 pool, and n_tokens of
    SGLang's decode inputs (x, and a: the gate's input)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    A_log = torch.log(1 + 15 * torch.rand(H, generator=gen, device="cuda"))
    dt_bias = 0.5 * torch.randn(H * K, generator=gen, device="cuda")
    pool = 0.05 * torch.randn(P, H, K, K, generator=gen, device="cuda")
    x = inputs(n_tokens, x_seed)
    a = torch.randn(1, n_tokens, H * K, generator=gen, device="cuda").to(torch.bfloat16)
    return A_log, dt_bias, pool, x, a


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_prefill_then_decode_as_sglang_calls_them(lower_bound):
    gen = torch.Generator(device="cuda").manual_seed(3)
    A_log = torch.log(1 + 15 * torch.rand(H, generator=gen, device="cuda"))
    dt_bias = 0.5 * torch.randn(H * K, generator=gen, device="cuda")
    cache = 0.05 * torch.randn(P, 2, H, K, K, generator=gen, device="cuda")   # two layers per slot
    pool = cache[:, 1]                                                           # this layer's rows
    before, other_layer = pool.clone(), cache[:, 0].clone()
    idx = torch.tensor(ROWS, dtype=torch.int32, device="cuda")
    N = len(LENGTHS)
    pre, step = inputs(sum(LENGTHS), 11), inputs(N, 12)
    o = sglang.chunk_kda(pre["q"], pre["k"], pre["v"], pre["g"], torch.sigmoid(pre["b"].float()),
                         initial_state=pool, initial_state_indices=idx, use_qk_l2norm_in_kernel=True,
                         cu_seqlens=cu_of(LENGTHS), A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
    o1 = sglang.fused_sigmoid_gating_delta_rule_update(
        A_log, step["g"].reshape(N, H * K), dt_bias, 1.0, 20.0, step["q"], step["k"], step["v"],
        step["b"].reshape(N, H), pool, idx, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_of([1] * N), is_kda=True,
        lower_bound=lower_bound)

    # the reference: each sequence's prefill tokens then its decode token, from its pool row
    opts = dict(gate="softplus" if lower_bound is None else "safe", lower_bound=lower_bound, beta_form="logit",
                qk_norm=True)
    s0 = np.stack([f64(before[r]) if r >= 0 else np.zeros((H, K, K)) for r in ROWS])
    cu = np.concatenate([[0], np.cumsum(LENGTHS)])
    for n, (a, e) in enumerate(zip(cu[:-1], cu[1:])):
        tok = {name: np.concatenate([f64(pre[name][:, a:e]), f64(step[name][:, n:n + 1])], axis=1) for name in pre}
        o_ref, s_ref = reference.kda_recurrent(tok["q"], tok["k"], tok["v"], tok["g"], tok["b"], A_log=f64(A_log),
                                               dt_bias=f64(dt_bias), initial_state=s0[n:n + 1], **opts)
        if ROWS[n] < 0:   # padding: zero outputs, no row touched
            assert not o1[0, n].any()
            continue
        assert reference.relative_error(f64(o[0, a:e]), o_ref[0, :-1]) <= TOL, n
        assert reference.relative_error(f64(o1[0, n]), o_ref[0, -1]) <= TOL, n
        assert reference.relative_error(f64(pool[ROWS[n]]), s_ref[0]) <= TOL, n
    untouched = [r for r in range(P) if r not in ROWS]
    assert torch.equal(pool[untouched], before[untouched]) and torch.equal(cache[:, 0], other_layer)


def test_kernel_object_packed_decode_equals_its_decode():
    """KDAKernel.packed_decode (q, k, v read in place from the convolution's output) gives decode's
    outputs and pool rows bit for bit; extend's chunk states are pykda's checkpoints every 64."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    B = 4
    A_log = torch.log(1 + 15 * torch.rand(H, generator=gen, device="cuda"))
    dt_bias = 0.5 * torch.randn(H * K, generator=gen, device="cuda")
    pool = 0.05 * torch.randn(P, H, K, K, generator=gen, device="cuda")
    idx = torch.tensor([3, 0, -1, 6], dtype=torch.int32, device="cuda")
    mixed = torch.randn(B, 3 * H * K, generator=gen, device="cuda").to(torch.bfloat16)
    a = torch.randn(B, H * K, generator=gen, device="cuda").to(torch.bfloat16)
    b = torch.randn(B, H, generator=gen, device="cuda").to(torch.bfloat16)
    kernel = sglang.KDAKernel()
    pool_packed = pool.clone()
    o_packed = kernel.packed_decode(mixed, a, b, A_log=A_log, dt_bias=dt_bias, scale=K ** -0.5, ssm_states=pool_packed,
                                    cache_indices=idx, num_v_heads=H, head_v_dim=K)
    q, k, v = (mixed[:, i * H * K:(i + 1) * H * K].reshape(1, B, H, K).contiguous() for i in range(3))
    o = kernel.decode(q, k, v, a, b, A_log=A_log, dt_bias=dt_bias, ssm_states=pool, cache_indices=idx,
                      query_start_loc=cu_of([1] * B))
    assert o_packed.shape == o.shape == (1, B, H, K)
    assert torch.equal(o_packed, o) and torch.equal(pool_packed, pool)

    pre = inputs(sum(LENGTHS), 13)
    rows = torch.tensor([1, 4, 5], dtype=torch.int32, device="cuda")
    starts = pool[rows.long()].clone()
    o_ext, h = kernel.extend(pre["q"], pre["k"], pre["v"], pre["g"], torch.sigmoid(pre["b"].float()), ssm_states=pool,
                             cache_indices=rows, query_start_loc=cu_of(LENGTHS), A_log=A_log, dt_bias=dt_bias,
                             return_intermediate_states=True)
    assert h.shape == (1, sum(-(-n // 64) for n in LENGTHS), H, K, K) and torch.isfinite(h).all()
    assert h.dtype == torch.bfloat16   # SGLang's (fla's), beside the fp32 pool
    firsts = np.cumsum([0] + [-(-n // 64) for n in LENGTHS[:-1]])   # each sequence's first chunk state: its start
    assert torch.equal(h[0, firsts], starts.to(torch.bfloat16))


def test_kernel_object_target_verify_equals_decoding_the_drafts_one_by_one():
    """KDAKernel.target_verify on 3 requests of 4 draft tokens (one padded): the state after each
    draft in the buffer at the request's slot equals the pool row after that many one-token decode
    steps, the outputs those steps' outputs (fp32 pools: bit for bit); the pool is not written."""
    N, T, S = 3, 4, 5
    A_log, dt_bias, pool, x, a = verify_inputs(9, 17, N * T)
    rows, slots = [4, -1, 1], [3, 0, 2]
    idx = torch.tensor(rows, dtype=torch.int32, device="cuda")
    buf = torch.full((S, T, H, K, K), float("nan"), device="cuda")
    kernel = sglang.KDAKernel()
    before = pool.clone()
    o = kernel.target_verify(A_log, dt_bias, x["q"], x["k"], x["v"], a, x["b"], ssm_states=pool, cache_indices=idx,
                             query_start_loc=cu_of([T] * N), intermediate_states_buffer=buf,
                             intermediate_state_indices=torch.tensor(slots, dtype=torch.int32, device="cuda"),
                             cache_steps=T, retrieve_parent_token=None)
    assert torch.equal(pool, before), "target verify reads the pool only"
    step_pool = pool.clone()
    for t in range(T):   # token t of every request, one decode step
        sel = [n * T + t for n in range(N)]
        o_t = kernel.decode(*(x[n][:, sel] for n in ("q", "k", "v")), a[:, sel], x["b"][:, sel], A_log=A_log,
                            dt_bias=dt_bias, ssm_states=step_pool, cache_indices=idx, query_start_loc=cu_of([1] * N))
        assert torch.equal(o[:, sel], o_t), t
        for n in range(N):
            if rows[n] >= 0:
                assert torch.equal(buf[slots[n], t], step_pool[rows[n]]), (n, t)
    assert torch.isnan(buf[slots[1]]).all() and torch.isnan(buf[4]).all(), "a padded request caches nothing"


def test_kernel_object_target_verify_of_a_tree_decodes_each_draft_from_its_parent():
    """KDAKernel.target_verify with retrieve_parent_token (EAGLE's tree, topk > 1) on 2 requests of
    4 drafts (parents -1, 0, 0, 1 and -1, 0, 1, 1): each draft's output and buffered state equal
    one decode step from its parent's buffered state (a root: from the pool row), bit for bit (fp32
    pool); the pool is not written."""
    N, T, S = 2, 4, 3
    A_log, dt_bias, pool, x, a = verify_inputs(10, 21, N * T)
    rows, slots, trees = [6, 2], [2, 0], [[-1, 0, 0, 1], [-1, 0, 1, 1]]
    parents = torch.tensor(trees, dtype=torch.int64, device="cuda")
    buf = torch.full((S, T, H, K, K), float("nan"), device="cuda")
    kernel = sglang.KDAKernel()
    before = pool.clone()
    o = kernel.target_verify(A_log, dt_bias, x["q"], x["k"], x["v"], a, x["b"], ssm_states=pool,
                             cache_indices=torch.tensor(rows, dtype=torch.int32, device="cuda"),
                             query_start_loc=cu_of([T] * N), intermediate_states_buffer=buf,
                             intermediate_state_indices=torch.tensor(slots, dtype=torch.int32, device="cuda"),
                             cache_steps=T, retrieve_parent_token=parents)
    assert torch.equal(pool, before), "target verify reads the pool only"
    one = torch.zeros(1, dtype=torch.int32, device="cuda")
    for n, tree in enumerate(trees):
        for t, p in enumerate(tree):
            start = (before[rows[n]] if p < 0 else buf[slots[n], p]).clone()[None]
            tok = [n * T + t]
            o_t = kernel.decode(*(x[m][:, tok] for m in ("q", "k", "v")), a[:, tok], x["b"][:, tok], A_log=A_log,
                                dt_bias=dt_bias, ssm_states=start, cache_indices=one, query_start_loc=cu_of([1]))
            assert torch.equal(o[:, tok], o_t), (n, t)
            assert torch.equal(buf[slots[n], t], start[0]), (n, t)
    assert torch.isnan(buf[1]).all(), "an unused slot stays poisoned"
