"""pykda.compat.sglang offline: each SGLang call becomes the pykda call with SGLang's meanings
(V-first pools in place, β probabilities in prefill and logits in decode, the gate in the kernel
exactly when A_log is given), and what pykda cannot honour is refused by name."""
import pytest

from pykda.compat import sglang

torch = pytest.importorskip("torch")


@pytest.fixture
def calls(monkeypatch):
    """The pykda ops as recorders: each call's positional and keyword arguments."""
    log = []

    def recorder(name):
        def op(*args, **kwargs):
            log.append((name, args, kwargs))
            return "o", "state"
        return op
    monkeypatch.setattr(sglang, "_chunk_kda", recorder("chunk_kda"))
    monkeypatch.setattr(sglang, "_fused_recurrent_kda", recorder("fused_recurrent_kda"))
    return log


def tokens(N=3, H=2, K=64):
    q, k, v = (torch.zeros(1, N, H, K) for _ in range(3))
    return q, k, v


@pytest.mark.parametrize("gate", ["softplus", "bounded", "precomputed"])
def test_prefill_keeps_sglangs_meanings(calls, gate):
    q, k, v = tokens()
    pool, idx, cu = torch.zeros(5, 2, 64, 64), torch.tensor([4, -1, 0]), torch.tensor([0, 1, 2, 3])
    A_log = None if gate == "precomputed" else torch.zeros(2)
    o = sglang.chunk_kda(q, k, v, "g", "beta", initial_state=pool, initial_state_indices=idx,
                         use_qk_l2norm_in_kernel=True, cu_seqlens=cu, A_log=A_log, dt_bias="dt",
                         lower_bound=-5.0 if gate == "bounded" else None)
    assert o == "o"   # the output alone, as SGLang's returns
    ((name, args, kw),) = calls
    assert name == "chunk_kda" and args[3:] == ("g", "beta")
    assert kw["initial_state"] is pool and kw["state_indices"] is idx and "final_state" not in kw
    assert kw["state_v_first"] is True and kw["use_qk_l2norm_in_kernel"] is True and kw["cu_seqlens"] is cu
    assert not kw.get("use_beta_sigmoid_in_kernel"), "prefill's β are probabilities"
    expected = {"softplus": dict(use_gate_in_kernel=True, safe_gate=False, lower_bound=None),
                "bounded": dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0),
                "precomputed": {}}[gate]
    assert {n: kw[n] for n in ("use_gate_in_kernel", "safe_gate", "lower_bound") if n in kw} == expected


def test_prefill_without_indices_updates_the_state_in_place(calls):
    q, k, v = tokens()
    s = torch.zeros(3, 2, 64, 64)
    sglang.chunk_kda(q, k, v, "g", "beta", initial_state=s)
    kw = calls[0][2]
    assert kw["initial_state"] is s and kw["final_state"] is s and "state_indices" not in kw


@pytest.mark.parametrize("kw, message", [
    (dict(initial_state_indices=torch.tensor([0])), "initial_state_indices is given without initial_state"),
    (dict(lower_bound=-5.0), "lower_bound is given without A_log"),
    (dict(output_final_state=True), "arguments pykda does not take: output_final_state"),
])
def test_prefill_refuses_by_name(calls, kw, message):
    q, k, v = tokens()
    with pytest.raises(ValueError, match=message):
        sglang.chunk_kda(q, k, v, "g", "beta", **kw)
    assert not calls


def decode_args(**over):
    q, k, v = tokens()
    a = dict(A_log=torch.zeros(2), a=torch.zeros(3, 2 * 64), dt_bias="dt", softplus_beta=1.0, softplus_threshold=20.0,
             q=q, k=k, v=v, b=torch.zeros(3, 2), initial_state_source="pool", initial_state_indices="idx",
             use_qk_l2norm_in_kernel=True, cu_seqlens="cu", is_kda=True)
    a.update(over)
    return a


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_decode_keeps_sglangs_meanings(calls, lower_bound):
    o = sglang.fused_sigmoid_gating_delta_rule_update(**decode_args(lower_bound=lower_bound))
    assert o == "o"
    ((name, args, kw),) = calls
    assert name == "fused_recurrent_kda"
    g, beta = args[3], args[4]
    assert tuple(g.shape) == (1, 3, 2, 64) and tuple(beta.shape) == (1, 3, 2), "a and b reshaped to q's tokens"
    assert kw["initial_state"] == "pool" and kw["state_indices"] == "idx" and kw["cu_seqlens"] == "cu"
    assert kw["use_beta_sigmoid_in_kernel"] is True, "decode's b are logits"
    assert kw["state_v_first"] is True and kw["use_gate_in_kernel"] is True
    assert kw["safe_gate"] is (lower_bound is not None) and kw["lower_bound"] == lower_bound


@pytest.mark.parametrize("over, message", [
    (dict(is_kda=False), "is_kda=False is SGLang's gated delta net"),
    (dict(softplus_beta=2.0), "softplus_beta must be 1.0"),
    (dict(softplus_threshold=10.0), "softplus_threshold >= 15"),
    (dict(disable_state_update=True), "target-verify arguments .*disable_state_update"),
    (dict(intermediate_states_buffer="buf", cache_steps=4), "intermediate_states_buffer, cache_steps"),
    (dict(A_log=None), "A_log is required"),
    (dict(stream=3), "arguments pykda does not take: stream"),
])
def test_decode_refuses_by_name(calls, over, message):
    with pytest.raises(ValueError, match=message):
        sglang.fused_sigmoid_gating_delta_rule_update(**decode_args(**over))
    assert not calls
