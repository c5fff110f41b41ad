"""pykda registered with fla's dispatch, on the device (run on the H200 with the peers staged;
skipped without fla): fla's chunk_kda, as fla's KimiDeltaAttention layer calls it, and fla's
serving step `fused_recurrent_kda_fwd` give exactly pykda's own results, close to fla's own
kernels' (pykda switched off with FLA_PYKDA=0); a call with grouped value heads gives fla's."""
import numpy as np
import pytest

import pykda
from pykda import reference

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
fla_kda = pytest.importorskip("fla.ops.kda", reason="fla (a peer) is not importable")
fla_recurrent = pytest.importorskip("fla.ops.kda.fused_recurrent")
pytest.importorskip("fla.backends", reason="this fla has no backend dispatch")
from test_compat_fla import registered  # noqa: E402,F401  (the fixture: pykda registered for one test)

H, K = 4, 128
TOL = 5e-3   # pykda and fla each sit ~2e-3 from the float64 recurrence on these inputs


def rel(a, b):
    return reference.relative_error(a.double().cpu().numpy(), b.double().cpu().numpy())


def layer_call(lengths, heads_v=H, seed=3):
    """Inputs and keywords of fla's layer (fla/layers/kda.py): the raw gate with A_log and dt_bias
    (in bf16, as a model cast to bf16 holds them), β logits, a V-first fp32 state per sequence,
    packed sequences with int64 cu_seqlens."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")   # noqa: E731
    T, N, bf = sum(lengths), len(lengths), torch.bfloat16
    x = dict(q=rnd(1, T, H, K).to(bf), k=rnd(1, T, H, K).to(bf), v=rnd(1, T, heads_v, K).to(bf),
             g=rnd(1, T, heads_v, K).to(bf), beta=rnd(1, T, heads_v).to(bf))
    kw = dict(A_log=torch.log(1 + 15 * torch.rand(heads_v, generator=g, device="cuda")).to(bf),
              dt_bias=(0.5 * rnd(heads_v * K)).to(bf), use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
              use_beta_sigmoid_in_kernel=True, state_v_first=True, output_final_state=True,
              cu_seqlens=torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64, device="cuda"))
    return x, 0.05 * rnd(N, heads_v, K, K), kw


def test_the_layers_prefill_is_pykdas_through_fla(registered, monkeypatch):   # noqa: F811
    x, s0, kw = layer_call([300, 1, 17, 131])
    with torch.inference_mode():
        o, s = fla_kda.chunk_kda(**x, initial_state=s0.clone(), **kw)
        own = dict(kw, A_log=kw["A_log"].float(), dt_bias=kw["dt_bias"].float())
        o_direct, s_direct = pykda.chunk_kda(**x, initial_state=s0.clone(), **own)
        monkeypatch.setenv("FLA_PYKDA", "0")
        monkeypatch.setenv("FLA_FLASH_KDA", "0")   # fla's Triton kernels (FlashKDA cannot run this gate anyway)
        o_fla, s_fla = fla_kda.chunk_kda(**x, initial_state=s0.clone(), **kw)
    assert torch.equal(o, o_direct) and torch.equal(s, s_direct)
    assert rel(o, o_fla) <= TOL and rel(s, s_fla) <= TOL, (rel(o, o_fla), rel(s, s_fla))


def test_grouped_value_heads_stay_on_fla(registered, monkeypatch):   # noqa: F811
    x, s0, kw = layer_call([64, 33], heads_v=2 * H)
    with torch.inference_mode():
        o, s = fla_kda.chunk_kda(**x, initial_state=s0.clone(), **kw)
        monkeypatch.setenv("FLA_PYKDA", "0")
        o_fla, s_fla = fla_kda.chunk_kda(**x, initial_state=s0.clone(), **kw)
    assert torch.equal(o, o_fla) and torch.equal(s, s_fla)


def test_the_serving_step_is_pykdas_through_fla(registered):   # noqa: F811
    g = torch.Generator(device="cuda").manual_seed(4)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")   # noqa: E731
    N, P, bf = 16, 40, torch.bfloat16
    x = dict(q=rnd(1, N, H, K).to(bf), k=rnd(1, N, H, K).to(bf), v=rnd(1, N, H, K).to(bf), g=rnd(1, N, H, K).to(bf),
             beta=rnd(1, N, H).to(bf), A_log=torch.log(1 + 15 * torch.rand(H, generator=g, device="cuda")),
             dt_bias=0.5 * rnd(H * K))
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              state_v_first=True, cu_seqlens=torch.arange(N + 1, dtype=torch.int32, device="cuda"),
              ssm_state_indices=torch.randperm(P, device="cuda")[:N].to(torch.int32))
    pool = 0.05 * rnd(P, H, K, K)
    pools = [pool.clone(), pool.clone()]
    with torch.inference_mode():
        o, final = fla_recurrent.fused_recurrent_kda_fwd(**x, initial_state=pools[0], inplace_final_state=True, **kw)
        o_direct, _ = pykda.fused_recurrent_kda(**x, initial_state=pools[1], **kw)
    assert final is pools[0]
    assert torch.equal(o, o_direct) and torch.equal(pools[0], pools[1])
    reached = reference.relative_error(pools[0].double().cpu().numpy(), pool.double().cpu().numpy())
    assert reached > 1e-3   # the pool was advanced


@pytest.mark.parametrize("tokens", [1, 5])
def test_the_layers_decode_is_pykdas_through_fla(registered, monkeypatch, tokens):   # noqa: F811
    """fla's public fused_recurrent_kda, as fla's layer decodes (one token) and runs short prompts
    (up to 64 tokens): the start states only read, new final states; pykda's target verify of
    the token, or its chunked prefill of the tokens, close to fla's own kernel."""
    g = torch.Generator(device="cuda").manual_seed(6)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")   # noqa: E731
    N, T, bf = 8, tokens, torch.bfloat16
    x = dict(q=rnd(N, T, H, K).to(bf), k=rnd(N, T, H, K).to(bf), v=rnd(N, T, H, K).to(bf), g=rnd(N, T, H, K).to(bf),
             beta=rnd(N, T, H).to(bf), A_log=torch.log(1 + 15 * torch.rand(H, generator=g, device="cuda")),
             dt_bias=0.5 * rnd(H * K))
    kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              state_v_first=True, output_final_state=True)
    s0 = 0.05 * rnd(N, H, K, K)
    kept = s0.clone()
    with torch.inference_mode():
        o, final = fla_recurrent.fused_recurrent_kda(**x, initial_state=s0, **kw)
        monkeypatch.setenv("FLA_PYKDA", "0")
        o_fla, final_fla = fla_recurrent.fused_recurrent_kda(**x, initial_state=s0, **kw)
    assert torch.equal(s0, kept)
    assert rel(o, o_fla) <= TOL and rel(final, final_fla) <= TOL, (rel(o, o_fla), rel(final, final_fla))
