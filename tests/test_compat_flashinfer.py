"""pykda.compat.flashinfer offline: FlashInfer's decode calls (its positional orders and
defaults, sm_scale times q_scale and k_scale, the output times v_scale, the LSE in base 2, the
wrapper's plan / run with its workspace and CUDA-graph buffers, the cache as a pair or one
[num_pages, 2, ...] tensor) become pykda's calls, and what pykda cannot honour is refused by name."""
import inspect
import math

import pytest

torch = pytest.importorskip("torch")

from pykda.compat import flashinfer as fi  # noqa: E402

# FlashInfer 0.6's signatures (flashinfer/decode.py): a call by position means the same
SINGLE_POSITIONAL = ("q", "k", "v", "kv_layout", "pos_encoding_mode", "use_tensor_cores", "q_scale", "k_scale",
                     "v_scale", "window_left", "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta", "return_lse")
WRAPPER_POSITIONAL = ("float_workspace_buffer", "kv_layout", "use_cuda_graph", "use_tensor_cores",
                      "paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer", "backend",
                      "jit_args")
PLAN_POSITIONAL = ("indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size")
H, HKV, D = 8, 2, 64


def positional(fn):
    return tuple(n for n, p in inspect.signature(fn).parameters.items()
                 if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and n != "self")


def test_positional_orders_are_flashinfers():
    assert positional(fi.single_decode_with_kv_cache) == SINGLE_POSITIONAL
    assert positional(fi.BatchDecodeWithPagedKVCacheWrapper.__init__) == WRAPPER_POSITIONAL
    assert positional(fi.BatchDecodeWithPagedKVCacheWrapper.plan) == PLAN_POSITIONAL
    assert positional(fi.BatchDecodeWithPagedKVCacheWrapper.run) == ("q", "paged_kv_cache")


@pytest.fixture
def single(monkeypatch):
    """pykda's single decode replaced by a recorder returning o = 1 and LSE = 1 (natural log)."""
    log = []

    def run(q, k, v, **kw):
        log.append((q, k, v, kw))
        o = torch.ones_like(q)
        return (o, torch.ones(q.shape[0])) if kw["return_lse"] else o
    monkeypatch.setattr(fi, "_single_decode", run)
    return log


def test_single_decode_scales_and_lse_as_flashinfers(single):
    q, k = torch.zeros(H, D, dtype=torch.bfloat16), torch.zeros(HKV, 100, D, dtype=torch.bfloat16)
    o = fi.single_decode_with_kv_cache(q, k, k, "HND")
    assert single[-1][3] == dict(kv_layout="HND", scale=1 / math.sqrt(D), return_lse=False) and torch.all(o == 1)
    o, lse = fi.single_decode_with_kv_cache(q, k, k, "HND", q_scale=0.5, k_scale=4.0, v_scale=3.0, sm_scale=0.1,
                                            return_lse=True)
    assert single[-1][3]["scale"] == pytest.approx(0.1 * 0.5 * 4.0)
    assert torch.all(o == 3) and torch.allclose(lse, torch.full((H,), 1 / math.log(2)))   # base 2


@pytest.mark.parametrize("kw, name", [(dict(pos_encoding_mode="ROPE_LLAMA"), "pos_encoding_mode"),
                                      (dict(pos_encoding_mode="ALIBI"), "pos_encoding_mode"),
                                      (dict(window_left=128), "window_left"),
                                      (dict(logits_soft_cap=30.0), "logits_soft_cap")])
def test_single_decode_refuses_what_pykda_does_not_compute(single, kw, name):
    q = torch.zeros(H, D)
    with pytest.raises(ValueError, match=name):
        fi.single_decode_with_kv_cache(q, q, q, **kw)
    assert single == []


class FakePaged:
    """pykda's BatchDecodeWithPagedKVCache as a recorder: run() returns o = 1 and LSE = 1."""
    made = []

    def __init__(self, kv_layout):
        self.kv_layout, self.plans, self.runs = kv_layout, [], []
        FakePaged.made.append(self)

    def plan(self, *args, **kw):
        self.plans.append((args, kw))

    def run(self, q, k_cache, v_cache, *, out=None, return_lse=False):
        self.runs.append((q, k_cache, v_cache, out, return_lse))
        o = torch.ones_like(q) if out is None else out.fill_(1)
        return (o, torch.ones(q.shape[:2])) if return_lse else o


@pytest.fixture
def paged(monkeypatch):
    FakePaged.made = []
    monkeypatch.setattr(fi, "_PagedDecode", FakePaged)
    return FakePaged.made


def page_table():
    return (torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([4, 1, 0, 2, 3], dtype=torch.int32),
            torch.tensor([16, 3], dtype=torch.int32))


def test_wrapper_plans_and_runs_as_flashinfers(paged):
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 10, dtype=torch.uint8), "HND", use_tensor_cores=True)
    indptr, indices, last = page_table()
    w.plan(indptr, indices, last, H, HKV, D, 16, q_data_type=torch.bfloat16, sm_scale=0.25, non_blocking=True,
           fixed_split_size=None, disable_split_kv=False)
    (dec,) = paged
    assert dec.kv_layout == "HND" and w.use_tensor_cores and not w.is_cuda_graph_enabled
    assert dec.plans == [((indptr, indices, last, H, HKV, D, 16), dict(scale=0.25))]
    cache = torch.zeros(5, 2, HKV, 16, D, dtype=torch.bfloat16)   # one [num_pages, 2, ...] tensor
    q = torch.zeros(2, H, D, dtype=torch.bfloat16)
    lse = torch.empty(2, H)
    o, got = w.run(q, cache, lse=lse, return_lse=True, v_scale=2.0)
    _, k, v, out, want_lse = dec.runs[-1]
    assert k.data_ptr() == cache.data_ptr() and v.data_ptr() == cache[:, 1].data_ptr() and want_lse
    assert got is lse and torch.allclose(lse, torch.full((2, H), 1 / math.log(2))) and torch.all(o == 2)
    k2, v2 = torch.zeros(5, HKV, 16, D, dtype=torch.bfloat16), torch.zeros(5, HKV, 16, D, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    assert w.run(q, (k2, v2), out=out, lse=lse) is out   # lse read only with return_lse, as FlashInfer's
    assert dec.runs[-1][1] is k2 and dec.runs[-1][2] is v2 and dec.runs[-1][4] is False


@pytest.mark.parametrize("kv_layout, page_dim", [("NHD", 1), ("HND", 2)])
def test_wrapper_takes_caches_of_one_row_pages_without_their_page_dim(paged, kv_layout, page_dim):
    """As FlashInfer: pages of one row may come as [num_pages, num_kv_heads, head_dim] caches (SGLang's
    token pool passes its (k_buffer, v_buffer) so) or one [num_pages, 2, num_kv_heads, head_dim]."""
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, kv_layout)
    w.plan(*page_table()[:2], torch.ones(2, dtype=torch.int32), H, HKV, D, 1, q_data_type=torch.bfloat16)
    q = torch.zeros(2, H, D, dtype=torch.bfloat16)
    k, v = torch.zeros(5, HKV, D, dtype=torch.bfloat16), torch.zeros(5, HKV, D, dtype=torch.bfloat16)
    w.run(q, (k, v))
    got_k, got_v = paged[0].runs[-1][1:3]
    assert got_k.shape == got_v.shape == k.unsqueeze(page_dim).shape and got_v.data_ptr() == v.data_ptr()
    both = torch.zeros(5, 2, HKV, D, dtype=torch.bfloat16)
    w.run(q, both)
    got_k, got_v = paged[0].runs[-1][1:3]
    assert got_k.shape == k.unsqueeze(page_dim).shape and got_v.data_ptr() == both[:, 1].data_ptr()


def test_wrapper_takes_flashinfers_deprecated_positional_plan_options(paged):
    """FlashInfer's order (o_data_type sixth, sm_scale eighth), up to its 16 options: vLLM's
    fast_plan_decode passes 15 of them."""
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(*page_table(), H, HKV, D, 16, "NONE", -1, None, "bfloat16", None, None, None, 0.5)
    assert paged[0].plans[-1][1] == dict(scale=0.5)
    w.plan(*page_table(), H, HKV, D, 16, "NONE", -1, None, torch.bfloat16, torch.bfloat16, torch.bfloat16,
           torch.bfloat16, 0.25, None, None, True, None, None, -1, False)   # vLLM's fast_plan_decode call
    assert paged[0].plans[-1][1] == dict(scale=0.25)
    assert (w._window_left, w._logits_soft_cap, w._sm_scale) == (-1, 0.0, 0.25), "what vLLM asserts before run()"
    w.vllm_first_call = False   # (vLLM's flag after its first plan: plans keep going through plan())
    assert w.vllm_first_call is True and w.is_cuda_graph_enabled is False
    with pytest.raises(ValueError, match="window_left"):
        w.plan(*page_table(), H, HKV, D, 16, "NONE", 64)
    with pytest.raises(ValueError, match="o_data_type"):
        w.plan(*page_table(), H, HKV, D, 16, "NONE", -1, None, "bfloat16", None, torch.float32)
    with pytest.raises(TypeError, match="at most 16"):
        w.plan(*page_table(), H, HKV, D, 16, *([None] * 17))


@pytest.mark.parametrize("plan_kw, name", [(dict(pos_encoding_mode="ROPE_LLAMA"), "pos_encoding_mode"),
                                           (dict(logits_soft_cap=50.0), "logits_soft_cap"),
                                           (dict(q_len_per_req=2), "q_len_per_req"),
                                           (dict(kv_data_type=torch.float8_e4m3fn), "kv_data_type"),
                                           (dict(o_data_type=torch.float32), "o_data_type"),
                                           (dict(block_tables=torch.zeros(2, 3, dtype=torch.int32)), "block_tables")])
def test_wrapper_plan_refuses_what_pykda_does_not_compute(paged, plan_kw, name):
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None)
    with pytest.raises(ValueError, match=name):
        w.plan(*page_table(), H, HKV, D, 16, **plan_kw)
    assert paged[0].plans == []


@pytest.mark.parametrize("run_kw, name", [(dict(q_scale=0.5), "q_scale"), (dict(k_scale=2.0), "k_scale"),
                                         (dict(sinks=torch.zeros(H)), "sinks"), (dict(q_len_per_req=4), "q_len_per_req"),
                                         (dict(window_left=32), "window_left"),
                                         (dict(kv_cache_sf=torch.zeros(1)), "kv_cache_sf")])
def test_wrapper_run_refuses_what_pykda_does_not_compute(paged, run_kw, name):
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None)
    w.plan(*page_table(), H, HKV, D, 16, q_data_type="bfloat16")
    cache = torch.zeros(5, 2, 16, HKV, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=name):
        w.run(torch.zeros(2, H, D, dtype=torch.bfloat16), cache, **run_kw)
    with pytest.raises(ValueError, match="plan"):   # a cache of another dtype than planned
        w.run(torch.zeros(2, H, D), cache.float())
    assert paged[0].runs == []


def test_cuda_graph_mode_copies_the_page_table_into_its_buffers(paged):
    """use_cuda_graph: plan() copies the table into the given buffers and plans on them (the
    indices a view at the buffer's start: the pointer a captured run reads every replay)."""
    bufs = (torch.zeros(3, dtype=torch.int32), torch.zeros(64, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer"):
        fi.BatchDecodeWithPagedKVCacheWrapper(None, use_cuda_graph=True)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD", True, False, *bufs)
    indptr, indices, last = page_table()
    w.plan(indptr, indices, last, H, HKV, D, 16, q_data_type="bfloat16")
    args = paged[0].plans[-1][0]
    assert args[0] is bufs[0] and args[2] is bufs[2] and args[1].data_ptr() == bufs[1].data_ptr()
    assert torch.equal(bufs[0], indptr) and torch.equal(bufs[1][:5], indices) and torch.equal(args[1], indices)
    with pytest.raises(ValueError, match="batch size is fixed"):
        w.plan(torch.tensor([0, 5], dtype=torch.int32), indices, last[:1], H, HKV, D, 16, q_data_type="bfloat16")
    with pytest.raises(ValueError, match="exceed"):
        w.plan(torch.tensor([0, 40, 65], dtype=torch.int32), torch.zeros(65, dtype=torch.int32), last, H, HKV, D, 16,
               q_data_type="bfloat16")


def test_flashinfers_other_names(paged):
    """begin_forward is plan, run_return_lse is run with return_lse, end_forward does nothing, and
    the CUDA-graph wrapper is the wrapper with use_cuda_graph and its buffers (FlashInfer's order)."""
    bufs = (torch.zeros(3, dtype=torch.int32), torch.zeros(8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    w = fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(None, *bufs, "HND", True)
    assert w.is_cuda_graph_enabled and w.use_tensor_cores and paged[0].kv_layout == "HND"
    assert positional(fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper.__init__) == (
        "workspace_buffer", "indptr_buffer", "indices_buffer", "last_page_len_buffer", "kv_layout", "use_tensor_cores")
    w.begin_forward(*page_table(), H, HKV, D, 16, q_data_type="bfloat16", sm_scale=0.3)
    assert paged[0].plans[-1][1] == dict(scale=0.3) and paged[0].plans[-1][0][0] is bufs[0]
    o, lse = w.run_return_lse(torch.zeros(2, H, D, dtype=torch.bfloat16), torch.zeros(5, 2, HKV, 16, D,
                                                                                     dtype=torch.bfloat16))
    assert paged[0].runs[-1][4] is True and tuple(lse.shape) == (2, H)
    assert w.end_forward() is None


def test_flashinfers_deprecated_forward_as_sglang_calls_it(paged):
    """SGLang's decode: begin_forward without sm_scale, then per layer forward(q, kv_buffer,
    sm_scale=layer.scaling, logits_soft_cap=layer.logit_cap, k_scale=None, v_scale=None); the
    plan's scale stands where the layer's equals it to float rounding, and another is refused."""
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    cache = torch.zeros(5, 2, 16, HKV, D, dtype=torch.bfloat16)
    q = torch.zeros(2, H, D, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="plan"):
        w.forward(q, cache)
    w.begin_forward(*page_table(), H, HKV, D, 16, "NONE", data_type=torch.bfloat16)
    o = w.forward(q, cache, sm_scale=D ** -0.5, logits_soft_cap=0.0, k_scale=None, v_scale=None)
    assert torch.all(o == 1) and paged[0].plans[-1][1] == dict(scale=1 / math.sqrt(D))
    o, lse = w.forward_return_lse(q, cache)
    assert paged[0].runs[-1][4] is True and tuple(lse.shape) == (2, H)
    with pytest.raises(ValueError, match="sm_scale"):
        w.forward(q, cache, sm_scale=0.2)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        w.forward(q, cache, logits_soft_cap=30.0)
    assert len(paged[0].runs) == 2


@pytest.mark.parametrize("tensor_cores, flashinfers", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("graph", [False, True])
def test_sglang_fast_decode_plan_plans_from_the_wrappers_buffers(paged, graph, tensor_cores, flashinfers):
    """SGLang's fast_decode_plan (or FlashInfer's own) after a first plan(): `_cached_module.plan`
    in FlashInfer's CUDA-core or tensor-core form (15 or 19 arguments) plans pykda again from the
    page table in the wrapper's buffers (with use_cuda_graph, written there by SGLang; else its
    own arrays), at the first plan's scale and cache dtype (the CUDA-core form's empty tensor's)."""
    from sglang_fast_plan import fast_decode_plan
    bufs = (torch.zeros(3, dtype=torch.int32), torch.zeros(64, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(8, dtype=torch.uint8), "NHD", graph, tensor_cores,
                                              *(bufs if graph else (None,) * 3))
    assert w._cached_module is None and w._fixed_batch_size == (2 if graph else 0)
    assert w.device == torch.device("cpu")
    w.plan(*page_table(), H, HKV, D, 16, q_data_type=torch.float16, sm_scale=0.3)
    indptr, indices, last = torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([7, 2, 9, 5],
                                                                                    dtype=torch.int32), \
        torch.tensor([5, 16], dtype=torch.int32)
    if graph:   # SGLang writes the new table into the wrapper's buffers, then plans
        w._paged_kv_indptr_buf.copy_(indptr)
        w._paged_kv_indices_buf[:4].copy_(indices)
        w._paged_kv_last_page_len_buf.copy_(last)
        fast_decode_plan(w, w._paged_kv_indptr_buf, w._paged_kv_indices_buf, w._paged_kv_last_page_len_buf, H, HKV,
                         D, 16, kv_dtype=torch.float16, flashinfers=flashinfers)
    else:
        fast_decode_plan(w, indptr, indices, last, H, HKV, D, 16, kv_dtype=torch.float16, flashinfers=flashinfers)
    args, kw = paged[0].plans[-1]
    assert len(paged[0].plans) == 2 and kw == dict(scale=0.3) and args[3:] == (H, HKV, D, 16)
    assert torch.equal(args[0], indptr) and torch.equal(args[1], indices) and torch.equal(args[2], last)
    assert args[0].device.type == "cpu"   # the host copy fast_decode_plan made
    if graph:   # the pages a captured run reads: the buffer's, at its start
        assert args[1].data_ptr() == bufs[1].data_ptr() and args[2].data_ptr() == bufs[2].data_ptr()
    assert w._kv_dtype == "float16" and w._plan_info is None
    cache = torch.zeros(10, 2, 16, HKV, D, dtype=torch.float16)
    assert torch.all(w.forward(torch.zeros(2, H, D, dtype=torch.float16), cache, sm_scale=0.3) == 1)


def test_sglang_fast_decode_plan_refuses_what_pykda_does_not_compute(paged):
    from sglang_fast_plan import fast_decode_plan
    w = fi.BatchDecodeWithPagedKVCacheWrapper(None)
    with pytest.raises(AttributeError):   # as FlashInfer's: no plan module before the first plan()
        fast_decode_plan(w, *page_table(), H, HKV, D, 16)
    w.plan(*page_table(), H, HKV, D, 16, q_data_type=torch.bfloat16)
    with pytest.raises(ValueError, match="window_left"):
        fast_decode_plan(w, *page_table(), H, HKV, D, 16, window_left=128)
    with pytest.raises(ValueError, match="empty_kv_data"):
        fast_decode_plan(w, *page_table(), H, HKV, D, 16, kv_dtype=torch.float32)
    module, ws, empty = w._cached_module, (None, None, None), torch.empty(0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim_vo"):
        module.plan(*ws, page_table()[0], 2, H, HKV, 16, False, -1, 0.0, D, 2 * D, empty, empty)
    with pytest.raises(ValueError, match="batch_size"):
        module.plan(*ws, page_table()[0], 3, H, HKV, 16, False, -1, 0.0, D, D, empty, empty)
    longer = torch.tensor([0, 2, 5, 5, 5], dtype=torch.int32)   # SGLang's global_override_indptr_cpu: the first 3 read
    module.plan(*ws, longer, 2, H, HKV, 16, False, -1, 0.0, D, D, empty, empty)
    assert torch.equal(paged[0].plans[-1][0][0], longer[:3])
    with pytest.raises(ValueError, match="one query token"):   # the tensor-core form, 2 query rows a request
        module.plan(*ws, torch.tensor([0, 2, 4]), page_table()[0], torch.tensor([31, 35]), 4, 2, H, HKV, 16, False,
                    D, D, True)
    w._use_tensor_cores = True
    with pytest.raises(ValueError, match="window_left"):   # FlashInfer's own fast_decode_plan, tensor-core form
        fast_decode_plan(w, *page_table(), H, HKV, D, 16, window_left=128, flashinfers=True)
    with pytest.raises(TypeError, match="plan arguments by position"):
        module.plan(*ws, page_table()[0], 2)
    assert len(paged[0].plans) == 2
