"""pykda.compat.sglang offline: each SGLang call becomes the pykda call with SGLang's meanings
(V-first pools in place, β probabilities in prefill and logits in decode, the gate in the kernel
exactly when A_log is given), and what pykda cannot honour is refused by name."""
import pytest

from pykda.compat import sglang

torch = pytest.importorskip("torch")


@pytest.fixture
def tensor_outputs():
    """Asks `calls` for decode outputs that are tensors (packed_decode transposes its o)."""


@pytest.fixture
def calls(monkeypatch, request):
    """The pykda ops as recorders: each call's positional and keyword arguments (decode's o a tensor
    of v's shape for the tests that name `tensor_outputs`)."""
    log = []
    tensor_outputs = "tensor_outputs" in request.fixturenames

    def recorder(name):
        def op(*args, **kwargs):
            log.append((name, args, kwargs))
            if name == "fused_recurrent_kda" and tensor_outputs:   # o has v's shape
                return torch.zeros(args[2].shape), None
            return ("o", "state", "h") if kwargs.get("return_intermediate_states") else ("o", "state")
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
    (dict(intermediate_states_buffer=torch.zeros(2, 4, 2, 64, 64), cache_steps=3), r"cache_steps \(3\) must be"),
    (dict(cache_steps=4), "cache_steps is given without intermediate_states_buffer"),
    (dict(A_log=None), "A_log is required"),
    (dict(stream=3), "arguments pykda does not take: stream"),
])
def test_decode_refuses_by_name(calls, over, message):
    with pytest.raises(ValueError, match=message):
        sglang.fused_sigmoid_gating_delta_rule_update(**decode_args(**over))
    assert not calls


def test_prefill_returns_the_chunk_states_when_asked(calls):
    """output_intermediate_states (SGLang's radix-track snapshots): (o, h), h pykda's checkpoints every
    64 tokens; their number comes from a host copy of cu_seqlens."""
    q, k, v = tokens()
    pool, idx, cu = torch.zeros(5, 2, 64, 64), torch.tensor([4, -1, 0]), torch.tensor([0, 1, 2, 3])
    assert sglang.chunk_kda(q, k, v, "g", "beta", initial_state=pool, initial_state_indices=idx, cu_seqlens=cu,
                            output_intermediate_states=True) == ("o", "h")
    kw = calls[-1][2]
    assert kw["return_intermediate_states"] is True and kw["checkpoint_every"] == 64
    assert torch.equal(kw["cu_seqlens_cpu"], cu) and kw["cu_seqlens"] is cu
    assert sglang.chunk_kda(q, k, v, "g", "beta", initial_state=pool, initial_state_indices=idx,
                            output_intermediate_states=False) == "o"
    assert "return_intermediate_states" not in calls[-1][2]


def test_kernel_object_decode_and_extend_as_sglangs_backend_calls_them(calls):
    """KDAKernel has the methods SGLang's KDAKernelDispatcher calls on its TritonKDAKernel, with their
    meanings: decode takes the raw gate and β logits, extend the pool at cache_indices."""
    kernel = sglang.KDAKernel()
    q, k, v = tokens()
    a, b, pool, idx, qsl = torch.zeros(3, 2 * 64), torch.zeros(3, 2), torch.zeros(5, 2, 64, 64), "idx", "qsl"
    kernel.decode(q, k, v, a, b, A_log=torch.zeros(2), dt_bias="dt", ssm_states=pool, cache_indices=idx,
                  query_start_loc=qsl)
    name, args, kw = calls[-1]
    assert name == "fused_recurrent_kda" and tuple(args[3].shape) == (1, 3, 2, 64) and tuple(args[4].shape) == (1, 3, 2)
    assert kw["initial_state"] is pool and kw["state_indices"] == idx and kw["cu_seqlens"] == qsl
    assert kw["use_beta_sigmoid_in_kernel"] and kw["use_gate_in_kernel"] and kw["use_qk_l2norm_in_kernel"]
    assert kw["state_v_first"] is True
    for want_h in (False, True):
        r = kernel.extend(q, k, v, "g", "beta", ssm_states=pool, cache_indices=torch.tensor([0, 1, 2]),
                          query_start_loc=torch.tensor([0, 1, 2, 3]), A_log=torch.zeros(2), dt_bias="dt",
                          lower_bound=-5.0, return_intermediate_states=want_h)
        assert r == (("o", "h") if want_h else "o")
        name, args, kw = calls[-1]
        assert name == "chunk_kda" and kw["initial_state"] is pool and tuple(kw["state_indices"]) == (0, 1, 2)
        assert kw["safe_gate"] is True and kw["lower_bound"] == -5.0 and not kw.get("use_beta_sigmoid_in_kernel")
    buf = torch.zeros(4, 3, 2, 64, 64)
    kernel.target_verify(torch.zeros(2), "dt", q, k, v, a, b, ssm_states=pool, cache_indices=idx, query_start_loc=qsl,
                         intermediate_states_buffer=buf, intermediate_state_indices="slots", cache_steps=3,
                         retrieve_parent_token=None)
    name, args, kw = calls[-1]
    assert name == "fused_recurrent_kda" and kw["initial_state"] is pool and kw["state_indices"] == idx
    assert kw["intermediate_states_buffer"] is buf and kw["intermediate_state_indices"] == "slots"
    assert kw["disable_state_update"] is True and kw["cu_seqlens"] == qsl and kw["use_beta_sigmoid_in_kernel"]
    assert kw["use_gate_in_kernel"] and not kw["safe_gate"]
    kernel.target_verify(torch.zeros(2), "dt", q, k, v, a, b, ssm_states=pool, cache_indices=idx, query_start_loc=qsl,
                         intermediate_states_buffer=buf, intermediate_state_indices="slots", cache_steps=3,
                         lower_bound=-5.0)   # a bounded-gate model's
    assert calls[-1][2]["safe_gate"] is True and calls[-1][2]["lower_bound"] == -5.0
    kernel.decode(q, k, v, a, b, A_log=torch.zeros(2), dt_bias="dt", ssm_states=pool, cache_indices=idx,
                  query_start_loc=qsl, lower_bound=-5.0)
    assert calls[-1][2]["safe_gate"] is True and calls[-1][2]["lower_bound"] == -5.0
    assert calls[-1][2]["retrieve_parent_token"] is None
    kernel.target_verify(torch.zeros(2), "dt", q, k, v, a, b, ssm_states=pool, cache_indices=idx,
                         query_start_loc=qsl, intermediate_states_buffer=buf, intermediate_state_indices="i",
                         cache_steps=3, retrieve_parent_token="tree")   # EAGLE's topk > 1: a tree of drafts
    assert calls[-1][2]["retrieve_parent_token"] == "tree"


def test_extend_as_sglangs_newer_dispatcher_calls_it(calls, tensor_outputs):
    """The dispatcher's newer keywords: β logits (`beta_is_raw`), the host lengths as the planning
    hint, fla's chunk tables (taken, not needed), and its options off (None, False)."""
    q, k, v = tokens()
    pool = torch.zeros(5, 2, 64, 64)
    sglang.KDAKernel().extend(q, k, v, "g", "beta", ssm_states=pool, cache_indices=torch.tensor([0, 1, 2]),
                              query_start_loc=torch.tensor([0, 1, 2, 3]), A_log=torch.zeros(2), dt_bias="dt",
                              lower_bound=-5.0, beta_is_raw=True, extend_seq_lens_cpu=[1, 1, 1], is_spec_decode=False,
                              return_intermediate_states=False, track_state=None, track_chunk_idx=None,
                              chunk_indices="ci", chunk_offsets="co")
    kw = calls[-1][2]
    assert kw["use_beta_sigmoid_in_kernel"] is True and kw["cu_seqlens_cpu"].tolist() == [0, 1, 2, 3]
    sglang.KDAKernel().extend(q, k, v, "g", "beta", ssm_states=pool, cache_indices=torch.tensor([0, 1, 2]),
                              query_start_loc=torch.tensor([0, 1, 2, 3]), beta_is_raw=False, extend_seq_lens_cpu=None)
    kw = calls[-1][2]
    assert kw["use_beta_sigmoid_in_kernel"] is False and kw["cu_seqlens_cpu"] is None
    o = sglang.KDAKernel().packed_decode(torch.zeros(3, 3 * 2 * 64), torch.zeros(3, 2, 64), torch.zeros(3, 1, 2),
                                         A_log=torch.zeros(2), dt_bias="dt", scale=0.125, ssm_states=pool,
                                         cache_indices="idx", num_v_heads=2, head_v_dim=64, lower_bound=-5.0,
                                         cache_ring=False)
    assert calls[-1][2]["safe_gate"] is True and calls[-1][2]["lower_bound"] == -5.0 and o is not None


def test_packed_decode_reads_q_k_v_in_place_from_the_convolution_output(calls, tensor_outputs):
    """packed_decode: q, k and v are views of mixed_qkv's columns (no copy), one token per sequence;
    o comes back [1, B, H, V] as SGLang's packed kernel returns it."""
    B, H, K = 3, 2, 64
    mixed = torch.randn(B, 3 * H * K)
    pool = torch.zeros(5, H, K, K)
    o = sglang.KDAKernel().packed_decode(mixed, torch.zeros(B, H, K), torch.zeros(B, 1, H), A_log=torch.zeros(H),
                                         dt_bias="dt", scale=0.125, ssm_states=pool, cache_indices="idx",
                                         num_v_heads=H, head_v_dim=K, replayssm_d=None, replayssm_write_pos=None)
    assert tuple(o.shape) == (1, B, H, K)
    name, (q, k, v, g, beta), kw = calls[-1]
    for i, x in enumerate((q, k, v)):
        assert tuple(x.shape) == (B, 1, H, K) and x.data_ptr() == mixed.data_ptr() + i * H * K * mixed.element_size()
        assert torch.equal(x.reshape(B, H * K), mixed[:, i * H * K:(i + 1) * H * K])
    assert tuple(g.shape) == (B, 1, H, K) and tuple(beta.shape) == (B, 1, H)
    assert kw["scale"] == 0.125 and kw["initial_state"] is pool and kw["state_indices"] == "idx"
    assert kw["use_gate_in_kernel"] and kw["use_beta_sigmoid_in_kernel"] and kw["state_v_first"]


@pytest.mark.parametrize("method, extra, message", [
    ("packed_decode", dict(replayssm_d="ring"), "arguments pykda does not take: replayssm_d"),
    ("packed_decode", dict(num_v_heads=3), r"mixed_qkv must be \[B, q \| k \| v\]"),
    ("decode", dict(stream=1), "arguments pykda does not take: stream"),
    ("extend", dict(track_state="h"), "arguments pykda does not take: track_state"),
    ("extend", dict(is_spec_decode=True), "arguments pykda does not take: is_spec_decode"),
    ("packed_decode", dict(cache_ring=True), "arguments pykda does not take: cache_ring"),
])
def test_kernel_object_refuses_what_it_cannot_honour(calls, method, extra, message):
    B, H, K = 3, 2, 64
    q, k, v = tokens()
    common = dict(ssm_states=torch.zeros(5, H, K, K), cache_indices="idx")
    args = {"packed_decode": ((torch.zeros(B, 3 * H * K), torch.zeros(B, H * K), torch.zeros(B, H)),
                              dict(A_log=torch.zeros(H), dt_bias="dt", scale=0.1, num_v_heads=H, head_v_dim=K)),
            "decode": ((q, k, v, torch.zeros(B, H * K), torch.zeros(B, H)),
                       dict(A_log=torch.zeros(H), dt_bias="dt", query_start_loc="qsl")),
            "extend": ((q, k, v, "g", "beta"), dict(query_start_loc=torch.tensor([0, 1, 2, 3])))}[method]
    with pytest.raises(ValueError, match=message):
        getattr(sglang.KDAKernel(), method)(*args[0], **{**common, **args[1], **extra})
    assert not calls
