"""pykda and fla side by side on the device (run on the H200 with the peers staged; skipped
without fla): the calls vLLM makes, passed with the same keywords to both libraries, in fla's
default K-first state layout, give the same outputs and states within the two kernels'
rounding. Prefill: Kimi Linear's gate in the kernel, fp32 β probabilities, int64 cu_seqlens
with cu_seqlens_cpu, gathered initial states. Decode: vLLM's precomputed fp32 log-decay and β,
the pool in place at `ssm_state_indices` (1-D, then 2-D with num_accepted_tokens)."""
import numpy as np
import pytest

import pykda
from pykda import reference

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
fla_kda = pytest.importorskip("fla.ops.kda", reason="fla (a peer) is not importable")
fla_recurrent = pytest.importorskip("fla.ops.kda.fused_recurrent")
H, K = 4, 128
TOL = 5e-3   # pykda and fla each sit ~2e-3 from the float64 recurrence on these inputs


@pytest.fixture(autouse=True)
def fla_on_its_own_kernels(monkeypatch):
    """fla's calls here run fla's kernels even where pykda is registered with fla's dispatch
    (pykda.compat.fla) in this process."""
    monkeypatch.setenv("FLA_PYKDA", "0")


def rel(a, b):
    return reference.relative_error(a.double().cpu().numpy(), b.double().cpu().numpy())


def tokens(T, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")   # noqa: E731
    bf = torch.bfloat16
    x = dict(q=rnd(1, T, H, K).to(bf), k=rnd(1, T, H, K).to(bf), v=rnd(1, T, H, K).to(bf), g=rnd(1, T, H, K).to(bf))
    x["beta"] = torch.sigmoid(rnd(1, T, H))   # fp32 probabilities, as vLLM passes them
    return x, g


@pytest.mark.parametrize("state_v_first", [False, True])
def test_prefill_as_vllm_calls_it(state_v_first):
    lengths = [300, 1, 77, 16]
    x, gen = tokens(sum(lengths), 5)
    A_log = torch.log(1 + 15 * torch.rand(H, generator=gen, device="cuda"))
    dt_bias = 0.5 * torch.randn(H * K, generator=gen, device="cuda")
    h0 = 0.05 * torch.randn(len(lengths), H, K, K, generator=gen, device="cuda")
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64, device="cuda")
    call = dict(A_log=A_log, dt_bias=dt_bias, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, state_v_first=state_v_first, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    with torch.inference_mode():
        o_fla, s_fla = fla_kda.chunk_kda(**x, initial_state=h0.clone(), **call)
        o, s = pykda.chunk_kda(**x, initial_state=h0.clone(), **call)
    assert rel(o, o_fla) <= TOL and rel(s, s_fla) <= TOL, (rel(o, o_fla), rel(s, s_fla))


@pytest.mark.parametrize("spec", [False, True])
def test_decode_as_vllm_calls_it(spec):
    N, P = 16, 48
    T = 3 if spec else 1
    x, gen = tokens(N * T, 9)
    x["g"] = -torch.rand(1, N * T, H, K, generator=gen, device="cuda") * 2   # vLLM's own gate kernel's fp32 output
    pool = 0.05 * torch.randn(P, H, K, K, generator=gen, device="cuda")     # K-first, fla's default
    cu = torch.arange(0, N * T + 1, T, dtype=torch.int32, device="cuda")
    rows = torch.randperm(P, generator=torch.Generator().manual_seed(2))[:N * T].view(N, T).to("cuda", torch.int32)
    if spec:
        call = dict(ssm_state_indices=rows, num_accepted_tokens=torch.randint(
            1, T + 1, (N,), generator=torch.Generator().manual_seed(3)).to("cuda", torch.int32))
    else:   # (no padding rows: fla's kernel reads row -1 unguarded)
        call = dict(ssm_state_indices=rows[:, 0].contiguous())
    pools = [pool.clone(), pool.clone()]
    with torch.inference_mode():
        o_fla, _ = fla_recurrent.fused_recurrent_kda_fwd(**x, initial_state=pools[0], use_qk_l2norm_in_kernel=True,
                                                          cu_seqlens=cu, inplace_final_state=True, **call)
        o, _ = pykda.fused_recurrent_kda(**x, initial_state=pools[1], use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                         inplace_final_state=True, **call)
    assert rel(o, o_fla) <= TOL, rel(o, o_fla)
    assert rel(pools[1], pools[0]) <= TOL, rel(pools[1], pools[0])
