"""GPU test of pykda.compat.vllm against the float64 recurrence (run on the H200): vLLM's prefill
from the raw gate on gathered K-first states, then its decode step on the pool with the gate
precomputed, give what the reference gives for the same tokens."""
import numpy as np
import pytest

from pykda import reference
from pykda.compat import vllm

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
TOL = 5e-3
H, K, P = 2, 128, 7
LENGTHS = [40, 1, 77]
ROWS = [5, 0, 2]


def f64(t):
    return t.double().cpu().numpy()


def test_prefill_then_decode_as_vllms_layer_calls_them():
    gen = torch.Generator(device="cuda").manual_seed(7)
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda")   # noqa: E731
    bf = torch.bfloat16
    A_log = torch.log(1 + 15 * torch.rand(1, 1, H, 1, generator=gen, device="cuda"))   # vLLM's [1, 1, H, 1]
    g_bias = 0.5 * rnd(H * K)
    pool = 0.05 * rnd(P, H, K, K)                                 # K-first [P, H, K, V]
    idx = torch.tensor(ROWS, dtype=torch.int32, device="cuda")
    N, T = len(LENGTHS), sum(LENGTHS)
    pre = dict(q=rnd(1, T, H, K).to(bf), k=rnd(1, T, H, K).to(bf), v=rnd(1, T, H, K).to(bf), g=rnd(1, T, H, K).to(bf),
               b=torch.sigmoid(rnd(1, T, H)))                    # vLLM's β: sigmoid(b) in fp32
    step = dict(q=rnd(1, N, H, K).to(bf), k=rnd(1, N, H, K).to(bf), v=rnd(1, N, H, K).to(bf), g=rnd(1, N, H, K).to(bf),
                b=torch.sigmoid(rnd(1, N, H)))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(LENGTHS)]), dtype=torch.int32, device="cuda")
    before = pool.clone()
    o, last = vllm.chunk_kda_with_fused_gate(q=pre["q"], k=pre["k"], v=pre["v"], raw_g=pre["g"], beta=pre["b"],
                                             A_log=A_log, g_bias=g_bias, initial_state=pool[idx.long()].contiguous(),
                                             output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    pool[idx.long()] = last                                      # vLLM scatters the final states back
    g1 = torch.from_numpy(reference.kda_gate(f64(step["g"]), f64(A_log), f64(g_bias), None, "softplus")).float().cuda()
    o1, returned = vllm.fused_recurrent_kda(q=step["q"], k=step["k"], v=step["v"], g=g1, beta=step["b"],
                                            initial_state=pool, use_qk_l2norm_in_kernel=True,
                                            cu_seqlens=torch.arange(N + 1, dtype=torch.int32, device="cuda"),
                                            ssm_state_indices=idx)
    assert returned is pool
    for n, (a, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        tok = {name: np.concatenate([f64(pre[name][:, a:e]), f64(step[name][:, n:n + 1])], axis=1) for name in pre}
        s0 = f64(before[ROWS[n]]).transpose(0, 2, 1)[None]       # K-first -> the reference's [V, K]
        o_ref, s_ref = reference.kda_recurrent(tok["q"], tok["k"], tok["v"], tok["g"], tok["b"], A_log=f64(A_log),
                                               dt_bias=f64(g_bias), initial_state=s0, gate="softplus",
                                               beta_form="prob", qk_norm=True)
        assert reference.relative_error(f64(o[0, a:e]), o_ref[0, :-1]) <= TOL, n
        assert reference.relative_error(f64(o1[0, n]), o_ref[0, -1]) <= TOL, n
        assert reference.relative_error(f64(pool[ROWS[n]]).transpose(0, 2, 1), s_ref[0]) <= TOL, n
