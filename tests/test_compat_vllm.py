"""pykda.compat.vllm offline: each call of vLLM's vendored KDA signatures becomes the pykda call
with vLLM's meanings (today's V-first states and null block 0, or the older K-first states; g
the log-decay or the raw gate with A_log and g_bias, β probabilities, the decode pool in place,
vLLM's positional order and defaults), and what pykda cannot honour is refused by name."""
import inspect

import pytest

from pykda.compat import vllm

torch = pytest.importorskip("torch")

# vLLM's vendored signatures (vllm/third_party/flash_linear_attention/ops/kda.py): a call by position means
# the same
VLLM_POSITIONAL = {
    "chunk_kda": ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
                  "use_qk_l2norm_in_kernel", "cu_seqlens"),
    "chunk_kda_with_fused_gate": ("q", "k", "v", "raw_g", "beta", "A_log", "g_bias", "scale", "initial_state",
                                  "output_final_state", "lower_bound", "use_qk_l2norm_in_kernel", "cu_seqlens"),
    "fused_recurrent_kda": ("q", "k", "v", "g", "beta", "scale", "initial_state", "inplace_final_state",
                            "use_qk_l2norm_in_kernel", "cu_seqlens", "ssm_state_indices"),
}


@pytest.fixture
def calls(monkeypatch):
    log = []

    def recorder(name):
        def op(*args, **kwargs):
            log.append((name, args, kwargs))
            return "o", "state"
        return op
    monkeypatch.setattr(vllm, "_chunk_kda", recorder("chunk_kda"))
    monkeypatch.setattr(vllm, "_fused_recurrent_kda", recorder("fused_recurrent_kda"))
    return log


@pytest.mark.parametrize("name", sorted(VLLM_POSITIONAL))
def test_positional_order_and_defaults_are_vllms(name):
    params = inspect.signature(getattr(vllm, name)).parameters
    positional = tuple(n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    assert positional == VLLM_POSITIONAL[name]
    if name == "fused_recurrent_kda":
        assert params["use_qk_l2norm_in_kernel"].default is True and params["inplace_final_state"].default is True


@pytest.fixture(params=[True, False], ids=["today", "before"])
def generation(request, monkeypatch):
    """The installed vLLM's conventions (vllm_keeps_v_first), each generation in turn."""
    monkeypatch.setattr(vllm, "vllm_keeps_v_first", lambda: request.param)
    return request.param


def test_the_installed_vllm_picks_the_conventions(monkeypatch):
    """vllm_keeps_v_first: today's where vLLM vendors fla under vllm.third_party, the older ones where it
    does not; today's without vLLM."""
    import importlib.util
    found = {}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: found.get(name, None))
    for present, today in (({}, True), ({"vllm": 1}, False), ({"vllm": 1, "vllm.third_party.flash_linear_attention": 1},
                                                              True)):
        found.clear(), found.update(present), vllm.vllm_keeps_v_first.cache_clear()
        assert vllm.vllm_keeps_v_first() is today
    vllm.vllm_keeps_v_first.cache_clear()


def test_prefill_as_vllms_layer_calls_it(calls, generation):
    """vLLM's Kimi Linear prefill: the raw gate with A_log [1, 1, H, 1] and g_bias, fp32 β
    probabilities, gathered states (V-first today, K-first before), cu_seqlens."""
    s0, cu, A_log = torch.zeros(3, 2, 64, 64), torch.tensor([0, 1, 2, 3]), torch.zeros(1, 1, 2, 1)
    assert vllm.chunk_kda_with_fused_gate(q="q", k="k", v="v", raw_g="g1", beta="beta", A_log=A_log, g_bias="dt",
                                          initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          cu_seqlens=cu) == ("o", "state")
    name, args, kw = calls[-1]
    assert name == "chunk_kda" and args == ("q", "k", "v", "g1", "beta")
    assert kw["use_gate_in_kernel"] is True and kw["A_log"] is A_log and kw["dt_bias"] == "dt"
    assert kw["initial_state"] is s0 and kw["output_final_state"] is True and kw["cu_seqlens"] is cu
    assert kw["state_v_first"] is generation and not kw.get("use_beta_sigmoid_in_kernel") and kw["lower_bound"] is None
    vllm.chunk_kda_with_fused_gate("q", "k", "v", "g1", "beta", A_log, "dt", None, s0, True, -5.0, True, cu)
    assert calls[-1][2]["lower_bound"] == -5.0 and calls[-1][2]["use_qk_l2norm_in_kernel"] is True
    vllm.chunk_kda("q", "k", "v", "g", "beta", 0.5, s0, True, True, cu)   # by position, vLLM's order
    name, args, kw = calls[-1]
    assert args[3] == "g" and not kw.get("use_gate_in_kernel") and kw["scale"] == 0.5 and kw["cu_seqlens"] is cu
    assert kw["use_qk_l2norm_in_kernel"] is True and kw["initial_state"] is s0 and kw["state_v_first"] is generation
    vllm.chunk_kda("q", "k", "v", "g", "beta", state_v_first=not generation)   # a call's own choice
    assert calls[-1][2]["state_v_first"] is (not generation)


def test_decode_as_vllms_layer_calls_it(calls, generation):
    """vLLM's decode step: today a V-first pool with row 0 the null block (first_row=1) and the
    graph's padded index array cut to the sequences of cu_seqlens; before, K-first and as given."""
    pool, idx, cu = torch.zeros(5, 2, 64, 64), torch.tensor([3, 0, 4, 0]), torch.tensor([0, 1, 2])
    o, state = vllm.fused_recurrent_kda(q="q", k="k", v="v", g="g1", beta="beta", initial_state=pool,
                                        use_qk_l2norm_in_kernel=True, cu_seqlens=cu, ssm_state_indices=idx)
    name, args, kw = calls[-1]
    assert name == "fused_recurrent_kda" and args == ("q", "k", "v", "g1", "beta")
    assert kw["initial_state"] is pool and kw["cu_seqlens"] is cu
    assert kw["ssm_state_indices"].tolist() == ([3, 0] if generation else [3, 0, 4, 0])
    assert kw["state_v_first"] is generation and kw["first_row"] == (1 if generation else 0)
    assert kw["inplace_final_state"] is True and kw["output_final_state"] is True
    assert not kw.get("use_gate_in_kernel") and not kw.get("use_beta_sigmoid_in_kernel")
    q = torch.zeros(3, 1, 2, 64)   # no cu_seqlens: q's batch is N
    vllm.fused_recurrent_kda(q, "k", "v", "g", "beta", initial_state=pool, ssm_state_indices=idx,
                             num_accepted_tokens=torch.tensor([1, 1, 1, 1]))
    kw = calls[-1][2]
    assert kw["use_qk_l2norm_in_kernel"] is True, "vLLM's default"
    assert kw["num_accepted_tokens"].tolist() == [1] * (3 if generation else 4)
    assert kw["ssm_state_indices"].tolist() == ([3, 0, 4] if generation else [3, 0, 4, 0])


@pytest.mark.parametrize("call, message", [
    (lambda: vllm.chunk_kda("q", "k", "v", "g", "b", chunk_indices="ci"), "chunk_kda: arguments pykda does not take"),
    (lambda: vllm.chunk_kda_with_fused_gate("q", "k", "v", "g", "b", "A", "dt", safe_gate=True),
     "arguments pykda does not take: safe_gate"),
    (lambda: vllm.fused_recurrent_kda("q", "k", "v", "g"), "beta is required"),
    (lambda: vllm.fused_recurrent_kda("q", "k", "v", "g", "b", retrieve_parent_token="p"),
     "arguments pykda does not take: retrieve_parent_token"),
])
def test_what_pykda_cannot_honour_is_named(calls, call, message):
    with pytest.raises(ValueError, match=message):
        call()
    assert not calls
