"""FlashInfer's decode signatures over pykda's flash decoding, so that a call site written for
FlashInfer switches by its import: `from pykda.compat.flashinfer import
single_decode_with_kv_cache, BatchDecodeWithPagedKVCacheWrapper` (and
`CUDAGraphBatchDecodeWithPagedKVCacheWrapper`; `begin_forward`, `run_return_lse`, the deprecated
`forward` / `forward_return_lse` that SGLang's decode still calls, and `end_forward`).

FlashInfer's conventions, kept here:
- its positional orders and defaults, `sm_scale` (default 1/sqrt(head_dim)) times `q_scale` and
  `k_scale`, the output times `v_scale` afterwards, as FlashInfer's own;
- the LSE (`return_lse`, or written into `lse=`) in base 2, as FlashInfer's kernels return it
  (pykda's is natural-log: it is multiplied by log2 e);
- the wrapper takes FlashInfer's workspace buffer and keeps it unused (pykda takes its scratch from
  the caller's allocator), and with `use_cuda_graph` the indptr / indices / last_page_len buffers
  it is given: `plan()` copies the page table into them and `run()` reads the pages from the
  indices buffer, so a captured run replays whatever the last plan of that batch size wrote;
- the wrapper's attributes that SGLang's `fast_decode_plan` (its CUDA-graph replays and draft
  steps) reads and writes in place of `plan()`: the three page-table buffers under FlashInfer's
  names, `_fixed_batch_size`, `device`, the workspace buffers, and `_cached_module`, whose
  `plan(...)` takes FlashInfer's compiled plan arguments (`FastPlanModule`) and plans pykda
  again from the page table already in the wrapper's buffers;
- the paged cache as a `(k_cache, v_cache)` pair or one `[num_pages, 2, ...]` tensor, for pages
  of one row also without the page dim (`_cache_pair`).
`use_tensor_cores`, `backend`, `fixed_split_size`, `disable_split_kv`, `non_blocking` and
`enable_pdl` choose FlashInfer's kernels and schedules and change no result: pykda's planner
chooses its own. What pykda cannot honour (RoPE or ALiBi in the kernel, sliding windows, a logits
soft cap, attention sinks, fp8 caches, several query tokens a request, FlashInfer's other
backends' arguments) raises ValueError by name; none is dropped silently.
"""
from __future__ import annotations

import functools
import math

from ..ops.decode import single_decode_with_kv_cache as _single_decode
from ..ops.paged_decode import BatchDecodeWithPagedKVCache as _PagedDecode
from . import no_extra

LOG2E = 1.0 / math.log(2.0)   # FlashInfer's LSE = pykda's natural-log LSE · log2 e
KV_DTYPES = ("float16", "bfloat16")


def _dtype_name(dtype) -> str | None:
    """A torch dtype or FlashInfer's string for one, as a name ("bfloat16"); None stays None."""
    return None if dtype is None else str(dtype).replace("torch.", "")


def _cache_dtype(name: str, dtype: str | None) -> str:
    """The cache dtype named by argument `name` (a name, as `_dtype_name` gives), if pykda reads it."""
    if dtype not in KV_DTYPES:
        raise ValueError(f"{name} {dtype}: pykda reads {' or '.join(KV_DTYPES)} caches")
    return dtype


def _no_positional_features(pos_encoding_mode: str, window_left, logits_soft_cap) -> None:
    """Refuse, by name, FlashInfer's features that change the attention itself."""
    if pos_encoding_mode != "NONE":
        raise ValueError(f"pos_encoding_mode={pos_encoding_mode!r}: pykda applies no position encoding in the "
                         "kernel (rotate q and k before caching them: 'NONE')")
    if window_left not in (None, -1):
        raise ValueError(f"window_left={window_left}: pykda attends to the whole cache (-1)")
    if logits_soft_cap:
        raise ValueError(f"logits_soft_cap={logits_soft_cap}: pykda has no soft cap (None or 0)")


def _scale(head_dim: int, sm_scale, q_scale, k_scale) -> float:
    """FlashInfer's logits scale: sm_scale (1/sqrt(head_dim) by default) times q_scale and k_scale."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    for s in (q_scale, k_scale):
        if s is not None:
            scale *= float(s)
    return scale


def _as_flashinfer(o, lse_e, v_scale, lse_out=None):
    """pykda's output and natural-log LSE as FlashInfer returns them: o times v_scale (in place),
    the LSE in base 2 (into `lse_out` where given)."""
    if v_scale is not None and v_scale != 1:
        o.mul_(v_scale)
    if lse_e is None:
        return o
    lse = lse_e.mul_(LOG2E)
    return o, (lse if lse_out is None else lse_out.copy_(lse))


def single_decode_with_kv_cache(q, k, v, kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                                use_tensor_cores: bool = False, q_scale: float | None = None,
                                k_scale: float | None = None, v_scale: float | None = None, window_left: int = -1,
                                logits_soft_cap: float | None = None, sm_scale: float | None = None,
                                rope_scale: float | None = None, rope_theta: float | None = None,
                                return_lse: bool = False):
    """FlashInfer's single-request decode: q [num_qo_heads, head_dim]; k, v [kv_len, num_kv_heads,
    head_dim] (NHD) or [num_kv_heads, kv_len, head_dim] (HND). Returns o, or (o, lse) with the LSE
    in base 2 ([num_qo_heads] fp32). rope_scale and rope_theta are read by FlashInfer only with
    a RoPE mode, which pykda refuses."""
    del use_tensor_cores, rope_scale, rope_theta   # (see the module docstring)
    _no_positional_features(pos_encoding_mode, window_left, logits_soft_cap)
    r = _single_decode(q, k, v, kv_layout=kv_layout, scale=_scale(q.shape[-1], sm_scale, q_scale, k_scale),
                       return_lse=return_lse)
    return _as_flashinfer(*(r if return_lse else (r, None)), v_scale)


def _cache_pair(paged_kv_cache, kv_layout: str):
    """FlashInfer's paged cache argument as pykda's (k_cache, v_cache) of four dims: a (k, v) pair
    or one [num_pages, 2, ...] tensor, and, as FlashInfer takes them for pages of one row,
    caches without the page dim ([num_pages, num_kv_heads, head_dim] each, or one [num_pages, 2,
    num_kv_heads, head_dim]: SGLang's token pool passes its (k_buffer, v_buffer) so)."""
    k, v = paged_kv_cache if isinstance(paged_kv_cache, tuple) else (paged_kv_cache[:, 0], paged_kv_cache[:, 1])
    page_dim = 1 if kv_layout == "NHD" else 2
    return tuple(c.unsqueeze(page_dim) if c.ndim == 3 else c for c in (k, v))


# FlashInfer's plan() keywords that choose its kernels and schedules only (results unchanged)
PLAN_SCHEDULE_ONLY = ("non_blocking", "fixed_split_size", "disable_split_kv", "rope_scale", "rope_theta")
# plan()'s optional arguments FlashInfer takes by position after page_size (its deprecated order, as
# vLLM's fast_plan_decode still passes them)
PLAN_POSITIONAL = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type",
                   "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking",
                   "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv", "q_len_per_req")


class BatchDecodeWithPagedKVCacheWrapper:
    """FlashInfer's paged batch decode wrapper (plan / run) on pykda's `BatchDecodeWithPagedKVCache`."""

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend: str = "auto", jit_args=None):
        if jit_args is not None:
            raise ValueError("jit_args: FlashInfer's custom JIT kernels are not pykda's")
        buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        if use_cuda_graph and any(b is None for b in buffers):
            raise ValueError("use_cuda_graph=True needs paged_kv_indptr_buffer, paged_kv_indices_buffer and "
                             "paged_kv_last_page_len_buffer (the plans' page tables, read by the captured runs)")
        del backend   # (see the module docstring)
        self._use_cuda_graph, self._use_tensor_cores = bool(use_cuda_graph), bool(use_tensor_cores)
        self._decode = _PagedDecode(kv_layout)
        self._kv_dtype, self._scale = None, None   # plan()'s
        # FlashInfer's record of plan()'s attention options, which vLLM's decode asserts before run()
        self._window_left, self._logits_soft_cap, self._sm_scale = -1, 0.0, None
        # FlashInfer's state that SGLang's fast_decode_plan reads and writes (the module docstring):
        # the page table's buffers (with use_cuda_graph the given ones, else plan()'s arrays), the
        # workspace (kept unused; pykda has no int workspace), and the plan module after a plan()
        self._paged_kv_indptr_buf, self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf = buffers
        self._fixed_batch_size = buffers[0].shape[0] - 1 if use_cuda_graph else 0
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = self._pin_memory_int_workspace_buffer = None
        self.device = next((getattr(b, "device") for b in (float_workspace_buffer, *buffers)
                            if hasattr(b, "device")), None)
        self._cached_module, self._plan_info = None, None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    @property
    def vllm_first_call(self) -> bool:
        """Always True: vLLM's fast_plan_decode then plans through plan() (its other path writes
        FlashInfer's private plan state, which this wrapper has not; plan() here is as fast and
        keeps a captured run() valid)."""
        return True

    @vllm_first_call.setter
    def vllm_first_call(self, value) -> None:
        del value

    def plan(self, indptr, indices, last_page_len, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             page_size: int, *deprecated_positional_args, pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: float | None = None, q_data_type="float16", kv_data_type=None, data_type=None,
             sm_scale: float | None = None, **kwargs) -> None:
        """FlashInfer's plan(): request b's pages are indices[indptr[b]:indptr[b + 1]], its last page
        holding last_page_len[b] rows (int32, host or device)."""
        if deprecated_positional_args:
            if len(deprecated_positional_args) > len(PLAN_POSITIONAL):
                raise TypeError(f"plan() takes at most {len(PLAN_POSITIONAL)} optional arguments by position")
            given = dict(zip(PLAN_POSITIONAL, deprecated_positional_args))
            return self.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                             **{**dict(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                       logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                       kv_data_type=kv_data_type, data_type=data_type, sm_scale=sm_scale),
                                **kwargs, **given})
        for name in PLAN_SCHEDULE_ONLY:
            kwargs.pop(name, None)
        if kwargs.pop("window_right", 0) not in (0, -1):
            raise ValueError("window_right: pykda attends to the whole cache")
        q_len = kwargs.pop("q_len_per_req", 1)
        if q_len not in (None, 1):
            raise ValueError(f"q_len_per_req={q_len}: pykda decodes one query token a request")
        o_dtype = _dtype_name(kwargs.pop("o_data_type", None))
        if o_dtype not in (None, _dtype_name(q_data_type)):
            raise ValueError(f"o_data_type {o_dtype}: pykda's output has q's dtype ({_dtype_name(q_data_type)})")
        no_extra("BatchDecodeWithPagedKVCacheWrapper.plan", {n: x for n, x in kwargs.items() if x is not None})
        _no_positional_features(pos_encoding_mode, window_left, logits_soft_cap)
        kv = _cache_dtype("kv_data_type",
                          _dtype_name(kv_data_type) or _dtype_name(data_type) or _dtype_name(q_data_type))
        if self._use_cuda_graph:
            indptr, indices, last_page_len = self._into_buffers(indptr, indices, last_page_len)
        else:
            self._paged_kv_indptr_buf, self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf = \
                indptr, indices, last_page_len
        self._window_left, self._logits_soft_cap, self._sm_scale = window_left, logits_soft_cap or 0.0, sm_scale
        self._plan_pykda(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, kv,
                         _scale(head_dim, sm_scale, None, None))

    def _plan_pykda(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, kv_dtype,
                    scale) -> None:
        """pykda's plan of a checked page table, recorded for run() and for fast_decode_plan."""
        self._decode.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                          scale=scale)
        self._kv_dtype, self._scale = kv_dtype, scale
        self._cached_module = FastPlanModule(self)

    def _into_buffers(self, indptr, indices, last_page_len):
        """The page table copied into the graph's buffers, as FlashInfer does (views of them:
        run() reads the pages from the indices buffer, the same pointer every plan)."""
        indptr_buf, indices_buf, last_buf = \
            self._paged_kv_indptr_buf, self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf
        if indptr.shape[0] != indptr_buf.shape[0]:
            raise ValueError(f"the batch size is fixed with use_cuda_graph: indptr has {indptr.shape[0]} entries, "
                             f"paged_kv_indptr_buffer {indptr_buf.shape[0]}")
        if indices.shape[0] > indices_buf.shape[0]:
            raise ValueError(f"indices ({indices.shape[0]} entries) exceed paged_kv_indices_buffer "
                             f"({indices_buf.shape[0]})")
        indptr_buf.copy_(indptr)
        last_buf.copy_(last_page_len)
        indices_buf[:indices.shape[0]].copy_(indices)
        return indptr_buf, indices_buf[:indices.shape[0]], last_buf

    def run(self, q, paged_kv_cache, *args, q_scale: float | None = None, k_scale: float | None = None,
            v_scale: float | None = None, out=None, lse=None, return_lse: bool = False, enable_pdl=None,
            window_left: int | None = None, sinks=None, q_len_per_req: int | None = None, **kwargs):
        """FlashInfer's run(): q [batch, num_qo_heads, head_dim]; the cache as a (k, v) pair or one
        [num_pages, 2, ...] tensor. Returns o, or (o, lse) with the LSE in base 2 ([batch,
        num_qo_heads] fp32; into `lse` where given: FlashInfer reads `lse` only with return_lse).
        q_scale and k_scale must be None or 1: pykda fixes the logits scale at plan() (sm_scale)."""
        del enable_pdl
        if args:
            raise ValueError("run() takes its options by keyword (FlashInfer's positional forms are deprecated)")
        no_extra("BatchDecodeWithPagedKVCacheWrapper.run", {n: x for n, x in kwargs.items() if x is not None})
        if sinks is not None:
            raise ValueError("sinks: pykda has no attention sinks")
        if q_len_per_req not in (None, 1):
            raise ValueError(f"q_len_per_req={q_len_per_req}: pykda decodes one query token a request")
        _no_positional_features("NONE", window_left, None)
        for name, s in (("q_scale", q_scale), ("k_scale", k_scale)):
            if s is not None and s != 1:
                raise ValueError(f"{name}={s}: pykda's logits scale is fixed at plan() (sm_scale there)")
        k_cache, v_cache = _cache_pair(paged_kv_cache, self._decode.kv_layout)
        if _dtype_name(k_cache.dtype) != self._kv_dtype:
            raise ValueError(f"the cache is {_dtype_name(k_cache.dtype)}; plan() was told {self._kv_dtype}")
        r = self._decode.run(q, k_cache, v_cache, out=out, return_lse=return_lse)
        return _as_flashinfer(*(r if return_lse else (r, None)), v_scale, lse)

    def forward(self, q, paged_kv_cache, pos_encoding_mode: str = "NONE", q_scale: float | None = None,
                k_scale: float | None = None, v_scale: float | None = None, window_left: int = -1,
                logits_soft_cap: float | None = None, sm_scale: float | None = None, rope_scale: float | None = None,
                rope_theta: float | None = None, return_lse: bool = False):
        """FlashInfer's deprecated forward (SGLang's decode calls it after begin_forward): run() with
        the attention options given here. pykda fixes the logits scale at plan(), so `sm_scale`
        (None: 1/sqrt(head_dim)) must be the plan's, to float rounding."""
        del rope_scale, rope_theta   # (read by FlashInfer only with a RoPE mode, refused here)
        _no_positional_features(pos_encoding_mode, window_left, logits_soft_cap)
        if self._scale is None:
            raise RuntimeError("BatchDecodeWithPagedKVCacheWrapper: call plan() (begin_forward) before forward()")
        asked = _scale(q.shape[-1], sm_scale, None, None)
        if not math.isclose(asked, self._scale, rel_tol=1e-6):
            raise ValueError(f"sm_scale {asked} differs from plan()'s {self._scale}: pykda fixes the logits scale "
                             "at plan(); pass sm_scale there (begin_forward)")
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)

    # FlashInfer's other names for the same calls
    begin_forward = plan
    run_return_lse = functools.partialmethod(run, return_lse=True)
    forward_return_lse = functools.partialmethod(forward, return_lse=True)

    def end_forward(self) -> None:
        """FlashInfer's deprecated end of a forward: nothing to do."""


# FlashInfer's compiled plan module's arguments, by position, as fast_decode_plan passes them (SGLang's
# own, and FlashInfer's flashinfer.decode.fast_decode_plan that newer SGLang takes): the CUDA-core
# decode plan's 15, and the tensor-core (prefill) plan's, 15 (SGLang's) or all 19 (FlashInfer's)
CORE_PLAN = ("float_workspace", "int_workspace", "pinned_int_workspace", "indptr_host", "batch_size",
             "num_qo_heads", "num_kv_heads", "page_size", "enable_cuda_graph", "window_left", "logits_soft_cap",
             "head_dim_qk", "head_dim_vo", "empty_q_data", "empty_kv_data")
TENSOR_CORE_PLAN = ("float_workspace", "int_workspace", "pinned_int_workspace", "qo_indptr_host", "indptr_host",
                    "kv_lens_host", "total_num_rows", "batch_size", "num_qo_heads", "num_kv_heads", "page_size",
                    "enable_cuda_graph", "head_dim_qk", "head_dim_vo", "causal", "window_left", "fixed_split_size",
                    "disable_split_kv", "num_colocated_ctas")


class FastPlanModule:
    """A planned wrapper's `_cached_module`: FlashInfer's compiled plan module as SGLang's
    fast_decode_plan calls it, `plan(*args)` in any of FlashInfer's positional forms
    (`CORE_PLAN`, `TENSOR_CORE_PLAN`), once the caller has written the page table into the
    wrapper's buffers (with use_cuda_graph; else set the buffers to its own arrays). pykda plans
    again from those buffers: request b's pages `_paged_kv_indices_buf[indptr[b]:indptr[b + 1]]`
    (indptr: the host copy passed), its last page's rows `_paged_kv_last_page_len_buf[b]` (read
    back from the device), the cache dtype of `empty_kv_data` (the tensor-core form names none:
    the last plan's stands) and the last plan's logits scale (fast_decode_plan passes its
    sm_scale to neither). Returns None, which the caller keeps as `_plan_info`."""

    def __init__(self, wrapper: BatchDecodeWithPagedKVCacheWrapper):
        self._wrapper = wrapper

    def plan(self, *args) -> None:
        tensor_cores = len(args) > 4 and hasattr(args[4], "shape")   # the kv indptr there, else the batch size
        forms = (len(CORE_PLAN), len(TENSOR_CORE_PLAN)) if tensor_cores else (len(CORE_PLAN),)
        if len(args) not in forms:
            raise TypeError(f"plan() takes FlashInfer's plan arguments by position ({' or '.join(map(str, forms))} of "
                            f"them); got {len(args)}")
        a = dict(zip(TENSOR_CORE_PLAN if tensor_cores else CORE_PLAN, args))
        w, batch, head_dim = self._wrapper, int(a["batch_size"]), a["head_dim_qk"]
        _no_positional_features("NONE", a.get("window_left", -1), a.get("logits_soft_cap"))
        if tensor_cores:   # (causal or not: one query token at each request's end sees the whole cache)
            if a["total_num_rows"] != batch:
                raise ValueError(f"total_num_rows {a['total_num_rows']} != batch_size {batch}: pykda decodes one "
                                 "query token a request")
            kv = w._kv_dtype
        else:
            kv = _cache_dtype("empty_kv_data", _dtype_name(a["empty_kv_data"].dtype))
        if a["head_dim_vo"] != head_dim:
            raise ValueError(f"head_dim_vo {a['head_dim_vo']} != head_dim_qk {head_dim}: pykda's V has K's head dim")
        indptr = a["indptr_host"][:batch + 1]   # (as FlashInfer's: SGLang's global_override_indptr_cpu may be longer)
        if indptr.shape[0] != batch + 1:
            raise ValueError(f"indptr_host has {indptr.shape[0]} entries; batch_size {batch} needs {batch + 1}")
        w._plan_pykda(indptr, w._paged_kv_indices_buf[:int(indptr[-1])], w._paged_kv_last_page_len_buf[:batch],
                      a["num_qo_heads"], a["num_kv_heads"], head_dim, a["page_size"], kv, w._scale)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph wrapper: the wrapper with use_cuda_graph and its three buffers."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout: str = "NHD",
                 use_tensor_cores: bool = False):
        super().__init__(workspace_buffer, kv_layout, True, use_tensor_cores, indptr_buffer, indices_buffer,
                         last_page_len_buffer)
