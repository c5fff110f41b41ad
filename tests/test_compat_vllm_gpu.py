"""GPU test of pykda.compat.vllm against the float64 recurrence (run on the H200): vLLM's prefill
from the raw gate on gathered states, then its decode step on the pool with the gate
precomputed, give what the reference gives for the same tokens; in today's conventions (V-first
states, row 0 the null block of padded slots, a graph's padded index array) and the older ones
(K-first states)."""
import numpy as np
import pytest

from pykda import reference
from pykda.compat import vllm

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
TOL = 5e-3
H, K, P = 2, 128, 7
LENGTHS = [40, 1, 77]


def f64(t):
    return t.double().cpu().numpy()


@pytest.mark.parametrize("today", [True, False], ids=["today", "before"])
def test_prefill_then_decode_as_vllms_layer_calls_them(today):
    rows = [5, 1, 2] if today else [5, 0, 2]
    gen = torch.Generator(device="cuda").manual_seed(7)
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda")   # noqa: E731
    bf = torch.bfloat16
    A_log = torch.log(1 + 15 * torch.rand(1, 1, H, 1, generator=gen, device="cuda"))   # vLLM's [1, 1, H, 1]
    g_bias = 0.5 * rnd(H * K)
    pool = 0.05 * rnd(P, H, K, K)                                 # [P, H, V, K] today, K-first before
    if today:
        pool[0] = float("nan")                                    # the null block: never read
    idx = torch.tensor(rows, dtype=torch.int32, device="cuda")
    N, T = len(LENGTHS), sum(LENGTHS)
    slots = N + 1 if today else N                                 # today: a padded slot (row 0) as well
    pre = dict(q=rnd(1, T, H, K).to(bf), k=rnd(1, T, H, K).to(bf), v=rnd(1, T, H, K).to(bf), g=rnd(1, T, H, K).to(bf),
               b=torch.sigmoid(rnd(1, T, H)))                    # vLLM's β: sigmoid(b) in fp32
    step = dict(q=rnd(1, slots, H, K).to(bf), k=rnd(1, slots, H, K).to(bf), v=rnd(1, slots, H, K).to(bf),
                g=rnd(1, slots, H, K).to(bf), b=torch.sigmoid(rnd(1, slots, H)))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(LENGTHS)]), dtype=torch.int32, device="cuda")
    before = pool.clone()
    o, last = vllm.chunk_kda_with_fused_gate(q=pre["q"], k=pre["k"], v=pre["v"], raw_g=pre["g"], beta=pre["b"],
                                             A_log=A_log, g_bias=g_bias, initial_state=pool[idx.long()].contiguous(),
                                             output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                             state_v_first=today)
    pool[idx.long()] = last                                      # vLLM scatters the final states back
    g1 = torch.from_numpy(reference.kda_gate(f64(step["g"]), f64(A_log), f64(g_bias), None, "softplus")).float().cuda()
    # today: the graph's index array is longer than its slots (zeros past them) and slot N is padding
    step_idx = torch.cat([idx, torch.zeros(3, dtype=torch.int32, device="cuda")]) if today else idx
    o1, returned = vllm.fused_recurrent_kda(q=step["q"], k=step["k"], v=step["v"], g=g1, beta=step["b"],
                                            initial_state=pool, use_qk_l2norm_in_kernel=True,
                                            cu_seqlens=torch.arange(slots + 1, dtype=torch.int32, device="cuda"),
                                            ssm_state_indices=step_idx, state_v_first=today)
    assert returned is pool
    if today:
        assert (o1[0, N] == 0).all() and torch.isnan(pool[0]).all(), "the padded slot: zeros, row 0 untouched"
    as_vk = (lambda s: s) if today else (lambda s: s.transpose(0, 2, 1))   # the reference's [V, K]
    for n, (a, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        tok = {name: np.concatenate([f64(pre[name][:, a:e]), f64(step[name][:, n:n + 1])], axis=1) for name in pre}
        s0 = as_vk(f64(before[rows[n]]))[None]
        o_ref, s_ref = reference.kda_recurrent(tok["q"], tok["k"], tok["v"], tok["g"], tok["b"], A_log=f64(A_log),
                                               dt_bias=f64(g_bias), initial_state=s0, gate="softplus",
                                               beta_form="prob", qk_norm=True)
        assert reference.relative_error(f64(o[0, a:e]), o_ref[0, :-1]) <= TOL, n
        assert reference.relative_error(f64(o1[0, n]), o_ref[0, -1]) <= TOL, n
        assert reference.relative_error(as_vk(f64(pool[rows[n]])), s_ref[0]) <= TOL, n
