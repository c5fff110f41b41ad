"""pykda's ops as torch custom ops (namespace ``pykda``), for ``torch.compile`` and CUDA graphs.

Importing this module (``import pykda.torch_ops``, or touching ``pykda.torch_ops``) registers
``torch.ops.pykda.single_decode_with_kv_cache``, ``batch_decode_with_padded_kv_cache``,
``paged_decode_run`` (``BatchDecodeWithPagedKVCache.run``), ``chunk_kda`` and
``fused_recurrent_kda``; ``import pykda`` alone never imports torch. Each op
has a fake (meta) implementation, so ``torch.compile`` traces it without running it (output
shapes and dtypes from the arguments' shapes, symbolic ones included), and declares the
arguments it writes in place (``mutates_args``), so functionalization and Inductor keep the
writes (Inductor calls the op on the buffers themselves, with no copy when nothing else reads
them). The real implementation is the eager pykda function, which validates the call and
launches on torch's current stream (the capture stream under ``mode="reduce-overhead"``).

Two ways in, with pykda's keywords:

- ``pykda.torch_ops.chunk_kda(...)`` etc.: thin wrappers that return exactly what the eager
  functions return (``o`` or ``(o, lse)``; ``(o, final_state | None)``; ``(o, pool | None)``),
  in place buffers included. Use these in models. Paged decode: make the wrapper
  ``pykda.torch_ops.BatchDecodeWithPagedKVCache`` (a subclass of pykda's), ``plan()`` it on the
  host outside the compiled code as before, and call ``dec.run(q, k_cache, v_cache, out=...,
  return_lse=...)`` inside it: run() hands the plan to ``paged_decode_run`` as tensors (its
  int32 tables and page ids, graph inputs: a new plan's page ids and lengths reach a compiled
  step, and a recorded CUDA graph, without recompiling) and numbers (the fields of its
  ``PagedLayout``, constants of the graph: dynamo guards on them, so a plan with another batch
  size or another longest request compiles the step again; automatic dynamic shapes turn the
  longest request into a symbolic int after one recompile only where the wrapper is a local or
  closure variable of the compiled function, not an ``nn.Module`` attribute or a global).
  Plan with ``max_kv_len=`` (an upper bound on the requests' rows, e.g. the model's context
  length) and the layout stays the same as requests grow: one graph per batch size.
- ``torch.ops.pykda.<op>(...)``: the raw ops. A custom op cannot return (an alias of) one of
  its inputs, so every result slot that the eager function fills in place comes back as an
  EMPTY PLACEHOLDER (0 elements) and the result is in the buffer you passed:

  ===============================  =========================================================
  op                               returns
  ===============================  =========================================================
  single_decode_with_kv_cache      (o, lse): o new [num_qo_heads, head_dim], or a placeholder
                                   with ``out=`` (read ``out``); lse [num_qo_heads] fp32 with
                                   ``return_lse=True``, else a placeholder
  batch_decode_with_padded_kv_cache  the same with a leading batch dim
  paged_decode_run                 the same with a leading batch dim; arguments (q, k_cache,
                                   v_cache, tables, indices, the 12 ``PagedLayout`` fields in
                                   order, out=None, *, return_lse=False): the plan of a
                                   ``BatchDecodeWithPagedKVCache`` is ``dec._tables``,
                                   ``dec._indices``, ``*dec._layout``; v_cache is required
                                   (the wrapper unpacks run()'s ``(k_cache, v_cache)`` pair)
  chunk_kda                        (o, final_state, checkpoints): o as above (``out=``);
                                   final_state new [N, H, K, K] (initial_state's dtype, fp32
                                   without one) only with ``output_final_state=True`` and
                                   neither ``final_state=`` nor ``state_indices``; else a
                                   placeholder: the final states are in ``final_state=`` or,
                                   with ``state_indices``, in the pool rows of ``initial_state``
                                   (in place); checkpoints new [B, ceil(T / E), H, K, K] bf16 with
                                   ``return_intermediate_states=True`` and no
                                   ``intermediate_states=`` buffer (fixed lengths only: with
                                   cu_seqlens their number depends on the lengths, so pass the
                                   buffer), else a placeholder
  fused_recurrent_kda              o (a placeholder with ``out=``); the pool ``initial_state``
                                   is updated in place (read only with
                                   ``disable_state_update``), a target verify's
                                   ``intermediate_states_buffer`` too
  ===============================  =========================================================

Declared mutations: ``out`` (all ops); ``initial_state``, ``final_state`` and
``intermediate_states`` (chunk_kda: the pool is written with ``state_indices``, ``final_state``
when given, which may be ``initial_state`` itself, and the checkpoint buffer); ``initial_state``
and ``intermediate_states_buffer`` (fused_recurrent_kda: the pool, a target verify's buffer).
Under ``mode="reduce-overhead"`` Inductor records CUDA graphs only when the tensors written in
place are static to it: mark pools and ``out=`` buffers with
``torch._dynamo.mark_static_address`` (serving engines do this for their caches); otherwise it
skips the graph ("mutated inputs") and runs the step without one.

Differences from the eager functions, each because an op's arguments are tensors and numbers:
no ``stream=`` (the ops launch on torch's current stream: ``with torch.cuda.stream(s):``;
the paged wrapper's ``run(stream=...)``, or CuPy arrays, take pykda's eager path, untraceable);
chunk_kda's ``cp_context`` must be None; the wrappers drop chunk_kda's ``cu_seqlens_cpu``, a
planning hint only (a CPU tensor in a compiled graph would keep Inductor from recording a CUDA
graph), so the ops plan segments as without it. Tensor arguments that are keyword-only in the eager functions
(``state_indices``, ``out``, ...) may also be given by position to the raw ops (their schemas
keep tensors positional, as ``torch.library.custom_op`` requires); by keyword, calls read the same.

The kernels are forward only: the ops are registered as not differentiable (autograd falls
through), so their results never require grad, as eager pykda's never do, and a model holding
``A_log``/``dt_bias`` as parameters compiles without ``no_grad``.
Eager calls through the ops cost the dispatcher's few microseconds more than pykda's own
functions; under ``torch.compile`` with CUDA graphs the host cost is the replay's.
"""
from typing import Optional, Tuple

try:
    import torch
except ImportError as exc:   # pragma: no cover - the module is imported only on request
    raise ImportError("pykda.torch_ops registers pykda's ops as torch custom ops: it needs torch "
                      "(pykda itself runs without it)") from exc

from .ops import decode as _decode
from .ops import kda as _kda
from .ops import kda_decode as _kda_decode
from .ops import paged_decode as _paged
from .ops.kda_variant import resolve_state_v_first as _resolve_state_v_first

__all__ = ["single_decode_with_kv_cache", "batch_decode_with_padded_kv_cache", "BatchDecodeWithPagedKVCache",
           "chunk_kda", "fused_recurrent_kda"]

Tensor = torch.Tensor


def _placeholder(q: Tensor) -> Tensor:
    """The result slot of a buffer written in place: 0 elements (no memory) on q's device."""
    return q.new_empty((0,))


# The ops are defined on a library of their own (torch.library.define's machinery) rather than
# with the @torch.library.custom_op decorator: custom_op's in-place bookkeeping (its
# ADInplaceOrView kernel) raises IndexError in torch <= 2.11 when an optional argument it
# writes is left at its default (pytorch#176078, fixed in #180621), which is every call
# here without out=. The schema is still inferred from the Python signature (type hints,
# mutates_args) as custom_op infers it; the kernel is the eager function for every device
# (a CPU tensor gets pykda's TypeError), the fake implementation serves FakeTensorMode and
# torch.compile. The kernels are forward only: autograd falls through (torch's way of marking an
# op not differentiable), so results never require grad, as eager pykda's.
_LIB = torch.library.Library("pykda", "DEF")


def _register(name: str, mutates_args: tuple):
    """Define `pykda::name` with the decorated function as its kernel; returns the function
    (with `register_fake` to add the fake implementation)."""
    def define(fn):
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")   # not differentiable: results never require grad
        fn.register_fake = lambda fake: torch.library.register_fake(f"pykda::{name}", fake, lib=_LIB)
        return fn
    return define


# ---------------------------------------------------------------------------------------------
# flash decoding
# ---------------------------------------------------------------------------------------------

def _decode_results(q: Tensor, out: Optional[Tensor], return_lse: bool) -> Tuple[Tensor, Tensor]:
    """Fake results: o and lse of q's rows (o contiguous in q's dtype, lse fp32), placeholders
    where the call writes `out` or returns no LSE."""
    o = q.new_empty(q.shape) if out is None else _placeholder(q)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32) if return_lse else _placeholder(q)
    return o, lse


def _decode_op(fn, q, k, v, kv_lens, out, kv_layout, scale, return_lse, chunk_size, stages, **extra):
    if kv_lens is not None:
        extra["kv_lens"] = kv_lens
    r = fn(q, k, v, kv_layout=kv_layout, scale=scale, out=out, return_lse=return_lse, chunk_size=chunk_size,
           stages=stages, **extra)
    o, lse = r if return_lse else (r, None)
    return (o if out is None else _placeholder(q)), (lse if return_lse else _placeholder(q))


@_register("single_decode_with_kv_cache", mutates_args=("out",))
def _single_decode_op(q: Tensor, k: Tensor, v: Tensor, out: Optional[Tensor] = None, *, kv_layout: str = "NHD",
                      scale: Optional[float] = None, return_lse: bool = False, chunk_size: Optional[int] = None,
                      stages: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """pykda.single_decode_with_kv_cache as a torch op: returns (o, lse), each a placeholder
    (0 elements) where `out` was written or no LSE was asked for."""
    return _decode_op(_decode.single_decode_with_kv_cache, q, k, v, None, out, kv_layout, scale, return_lse,
                      chunk_size, stages)


@_single_decode_op.register_fake
def _(q, k, v, out=None, *, kv_layout="NHD", scale=None, return_lse=False, chunk_size=None, stages=None):
    return _decode_results(q, out, return_lse)


@_register("batch_decode_with_padded_kv_cache", mutates_args=("out",))
def _batch_decode_op(q: Tensor, k: Tensor, v: Tensor, kv_lens: Optional[Tensor] = None, out: Optional[Tensor] = None,
                     *, kv_layout: str = "NHD", scale: Optional[float] = None, return_lse: bool = False,
                     chunk_size: Optional[int] = None, stages: Optional[int] = None,
                     balanced: Optional[bool] = None) -> Tuple[Tensor, Tensor]:
    """pykda.batch_decode_with_padded_kv_cache as a torch op: returns (o, lse), each a
    placeholder (0 elements) where `out` was written or no LSE was asked for."""
    return _decode_op(_decode.batch_decode_with_padded_kv_cache, q, k, v, kv_lens, out, kv_layout, scale,
                      return_lse, chunk_size, stages, balanced=balanced)


@_batch_decode_op.register_fake
def _(q, k, v, kv_lens=None, out=None, *, kv_layout="NHD", scale=None, return_lse=False, chunk_size=None,
      stages=None, balanced=None):
    return _decode_results(q, out, return_lse)


@_register("paged_decode_run", mutates_args=("out",))
def _paged_decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, tables: Tensor, indices: Tensor, batch: int,
                     q_heads: int, kv_heads: int, head_dim: int, page_size: int, kv_layout: str, max_rows: int,
                     device: int, scale: float, chunk_size: Optional[int], stages: Optional[int], snap_width: int,
                     out: Optional[Tensor] = None, *, return_lse: bool = False) -> Tuple[Tensor, Tensor]:
    """pykda.BatchDecodeWithPagedKVCache.run as a torch op, the plan given by its tensors (the
    wrapper's int32 `_tables` and its page ids `_indices`) and the fields of its `PagedLayout`
    (batch ... snap_width, in order); returns (o, lse), each a placeholder (0 elements) where `out`
    was written or no LSE was asked for."""
    layout = _paged.PagedLayout(batch, q_heads, kv_heads, head_dim, page_size, kv_layout, max_rows, device, scale,
                                chunk_size, stages, snap_width)
    tables_ptr, indices_ptr = _paged.planned_pointers(layout, tables, indices)
    r = _paged.run_planned(layout, tables_ptr, indices_ptr, q, k_cache, v_cache, out, return_lse)
    o, lse = r if return_lse else (r, None)
    return (o if out is None else _placeholder(q)), (lse if return_lse else _placeholder(q))


@_paged_decode_op.register_fake
def _(q, k_cache, v_cache, tables, indices, batch, q_heads, kv_heads, head_dim, page_size, kv_layout, max_rows,
      device, scale, chunk_size, stages, snap_width, out=None, *, return_lse=False):
    return _decode_results(q, out, return_lse)


# ---------------------------------------------------------------------------------------------
# KDA prefill
# ---------------------------------------------------------------------------------------------

def _returns(output_final_state: bool, state_indices, final_state, return_intermediate_states: bool,
             intermediate_states) -> Tuple[bool, bool]:
    """chunk_kda returns a new final-state tensor, and a new checkpoints tensor (rather than
    filling a buffer in place)."""
    return (output_final_state and final_state is None and state_indices is None,
            return_intermediate_states and intermediate_states is None)


@_register("chunk_kda", mutates_args=("initial_state", "out", "final_state", "intermediate_states"))
def _chunk_kda_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, scale: Optional[float] = None,
                  initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                  use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                  use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
                  lower_bound: Optional[float] = None, state_v_first: bool = False,
                  cu_seqlens: Optional[Tensor] = None, cu_seqlens_cpu: Optional[Tensor] = None,
                  A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                  state_indices: Optional[Tensor] = None, has_initial_state: Optional[Tensor] = None,
                  out: Optional[Tensor] = None, final_state: Optional[Tensor] = None,
                  intermediate_states: Optional[Tensor] = None, *, chunk_size: int = 16,
                  warps: Optional[int] = None, stages: Optional[int] = None, segment_chunks: Optional[int] = None,
                  disable_recompute: bool = False,
                  use_graph: bool = False, max_num_seqs: Optional[int] = None,
                  return_intermediate_states: bool = False,
                  checkpoint_every: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """pykda.chunk_kda as a torch op: returns (o, final_state, checkpoints), each a placeholder
    (0 elements) where the call writes a buffer in place (`out`; `final_state`, or the pool rows
    of `initial_state` with `state_indices`; `intermediate_states`) or returns none."""
    r = _kda.chunk_kda(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
        use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, state_v_first=state_v_first,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, A_log=A_log, dt_bias=dt_bias,
        state_indices=state_indices, has_initial_state=has_initial_state, out=out, final_state=final_state,
        chunk_size=chunk_size, warps=warps, stages=stages, segment_chunks=segment_chunks,
        disable_recompute=disable_recompute, use_graph=use_graph, max_num_seqs=max_num_seqs,
        return_intermediate_states=return_intermediate_states, checkpoint_every=checkpoint_every,
        intermediate_states=intermediate_states)
    o, fs, ckpt = r if return_intermediate_states else (*r, None)
    new_fs, new_ckpt = _returns(output_final_state, state_indices, final_state, return_intermediate_states,
                                intermediate_states)
    return ((o if out is None else _placeholder(q)), (fs if new_fs else _placeholder(q)),
            (ckpt if new_ckpt else _placeholder(q)))


@_chunk_kda_op.register_fake
def _(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
      use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
      lower_bound=None, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, A_log=None, dt_bias=None,
      state_indices=None, has_initial_state=None, out=None, final_state=None, intermediate_states=None, *,
      chunk_size=16, warps=None, stages=None, segment_chunks=None, disable_recompute=False, use_graph=False,
      max_num_seqs=None, return_intermediate_states=False, checkpoint_every=None):
    B, T, H, K = q.shape
    o = q.new_empty((B, T, H, K), dtype=torch.bfloat16) if out is None else _placeholder(q)
    new_fs, new_ckpt = _returns(output_final_state, state_indices, final_state, return_intermediate_states,
                                intermediate_states)
    # the states' dtype (validate_kda): initial_state's, else final_state's, else fp32
    dtype = next((s.dtype for s in (initial_state, final_state) if s is not None), torch.float32)
    fs = _placeholder(q)
    if new_fs:
        n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
        fs = q.new_empty((n, H, K, K), dtype=dtype)
    ckpt = _placeholder(q)
    if new_ckpt:
        if cu_seqlens is not None:   # rows from the lengths' values: data the fake cannot see
            raise ValueError("return_intermediate_states with cu_seqlens under torch.ops.pykda needs an "
                             "intermediate_states buffer (the number of checkpoints depends on the lengths)")
        every = _kda.kernel_chunk(chunk_size)[1] if checkpoint_every is None else checkpoint_every
        ckpt = q.new_empty((B, -(-T // every), H, K, K), dtype=torch.bfloat16)   # fla's, whatever the states'
    return o, fs, ckpt


# ---------------------------------------------------------------------------------------------
# KDA decode
# ---------------------------------------------------------------------------------------------

@_register("fused_recurrent_kda", mutates_args=("initial_state", "out", "intermediate_states_buffer"))
def _fused_recurrent_kda_op(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, A_log: Optional[Tensor] = None,
                            dt_bias: Optional[Tensor] = None, scale: Optional[float] = None,
                            initial_state: Optional[Tensor] = None, output_final_state: bool = False,
                            use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
                            use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False,
                            lower_bound: Optional[float] = None, state_v_first: bool = False,
                            cu_seqlens: Optional[Tensor] = None, state_indices: Optional[Tensor] = None,
                            out: Optional[Tensor] = None, ssm_state_indices: Optional[Tensor] = None,
                            num_accepted_tokens: Optional[Tensor] = None, *, safe_gate: bool = False,
                            check_indices: bool = False, rows_per_thread: Optional[int] = None,
                            stages: Optional[int] = None, inplace_final_state: bool = True,
                            intermediate_states_buffer: Optional[Tensor] = None,
                            intermediate_state_indices: Optional[Tensor] = None,
                            disable_state_update: bool = False,
                            retrieve_parent_token: Optional[Tensor] = None, first_row: int = 0) -> Tensor:
    """pykda.fused_recurrent_kda as a torch op: updates the pool `initial_state` in place (and
    the target-verify buffer) and returns o (a placeholder, 0 elements, with `out`);
    `output_final_state` changes nothing here (the eager function returns the pool itself: read
    `initial_state`)."""
    o, _ = _kda_decode.fused_recurrent_kda(
        q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, cu_seqlens,
        safe_gate=safe_gate, state_indices=state_indices, ssm_state_indices=ssm_state_indices,
        num_accepted_tokens=num_accepted_tokens, inplace_final_state=inplace_final_state, out=out,
        check_indices=check_indices, rows_per_thread=rows_per_thread, stages=stages,
        intermediate_states_buffer=intermediate_states_buffer, intermediate_state_indices=intermediate_state_indices,
        disable_state_update=disable_state_update, retrieve_parent_token=retrieve_parent_token, first_row=first_row)
    return o if out is None else _placeholder(q)


@_fused_recurrent_kda_op.register_fake
def _(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None, output_final_state=False,
      use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
      allow_neg_eigval=False, lower_bound=None, state_v_first=False, cu_seqlens=None, state_indices=None, out=None,
      ssm_state_indices=None, num_accepted_tokens=None, *, safe_gate=False, check_indices=False, rows_per_thread=None,
      stages=None, inplace_final_state=True, intermediate_states_buffer=None, intermediate_state_indices=None,
      disable_state_update=False, retrieve_parent_token=None, first_row=0):
    return torch.empty_like(v, memory_format=torch.contiguous_format) if out is None else _placeholder(q)


# the op overloads the wrappers call (what torch.compile records)
_SINGLE = torch.ops.pykda.single_decode_with_kv_cache.default
_BATCH = torch.ops.pykda.batch_decode_with_padded_kv_cache.default
_PAGED = torch.ops.pykda.paged_decode_run.default
_CHUNK = torch.ops.pykda.chunk_kda.default
_RECURRENT = torch.ops.pykda.fused_recurrent_kda.default


# ---------------------------------------------------------------------------------------------
# wrappers: pykda's signatures and return values, through the ops
# ---------------------------------------------------------------------------------------------

def single_decode_with_kv_cache(q, k, v, *, kv_layout: str = "NHD", scale: Optional[float] = None, out=None,
                                return_lse: bool = False, chunk_size: Optional[int] = None,
                                stages: Optional[int] = None):
    """`pykda.single_decode_with_kv_cache` through torch.ops.pykda (traceable by torch.compile);
    same arguments but `stream` (torch's current stream is used), same results."""
    o, lse = _SINGLE(q, k, v, out, kv_layout=kv_layout, scale=scale, return_lse=return_lse,
                     chunk_size=chunk_size, stages=stages)
    o = o if out is None else out
    return (o, lse) if return_lse else o


def batch_decode_with_padded_kv_cache(q, k, v, *, kv_layout: str = "NHD", kv_lens=None, scale: Optional[float] = None,
                                      out=None, return_lse: bool = False, chunk_size: Optional[int] = None,
                                      stages: Optional[int] = None, balanced: Optional[bool] = None):
    """`pykda.batch_decode_with_padded_kv_cache` through torch.ops.pykda (traceable by
    torch.compile); same arguments but `stream` (torch's current stream is used), same results."""
    o, lse = _BATCH(q, k, v, kv_lens, out, kv_layout=kv_layout, scale=scale, return_lse=return_lse,
                    chunk_size=chunk_size, stages=stages, balanced=balanced)
    o = o if out is None else out
    return (o, lse) if return_lse else o


class BatchDecodeWithPagedKVCache(_paged.BatchDecodeWithPagedKVCache):
    """`pykda.BatchDecodeWithPagedKVCache` whose `run()` goes through torch.ops.pykda.paged_decode_run
    (traceable by torch.compile): plan on the host as before (outside the compiled code), then
    call `run()` in it; same arguments, same results.

        dec = pykda.torch_ops.BatchDecodeWithPagedKVCache("NHD")
        dec.plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size)
        step = torch.compile(lambda q: dec.run(q, k_cache, v_cache), fullgraph=True)

    The plan reaches the op as tensors (its int32 tables and the page ids: graph inputs, so a new
    plan's page ids and lengths are seen without recompiling) and numbers (its `PagedLayout`:
    constants of the graph, guarded, so a plan with another batch, longest request, ... compiles
    again). `run()` takes pykda's eager path where the op cannot: `stream=` given, or an array
    that is not a torch tensor (CuPy inputs, or a plan made from CuPy kv_indices)."""

    def _launch(self, q, k_cache, v_cache, out, return_lse: bool, stream):
        if stream is not None or not _all_tensors(q, k_cache, v_cache, self._tables, self._indices) or not (
                out is None or isinstance(out, Tensor)):
            return super()._launch(q, k_cache, v_cache, out, return_lse, stream)
        o, lse = _PAGED(q, k_cache, v_cache, self._tables, self._indices, *self._layout, out, return_lse=return_lse)
        o = o if out is None else out
        return (o, lse) if return_lse else o


def _all_tensors(*xs) -> bool:
    for x in xs:
        if not isinstance(x, Tensor):
            return False
    return True


def chunk_kda(q, k, v, g, beta, scale: Optional[float] = None, initial_state=None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
              use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
              lower_bound: Optional[float] = None, disable_recompute: bool = False,
              return_intermediate_states: bool = False, state_v_first: bool = False, cu_seqlens=None,
              cu_seqlens_cpu=None, cp_context=None, use_graph: bool = False, max_num_seqs: Optional[int] = None, *,
              A_log=None, dt_bias=None, state_indices=None, has_initial_state=None, out=None, final_state=None,
              chunk_size: int = 16, warps: Optional[int] = None, stages: Optional[int] = None,
              segment_chunks: Optional[int] = None, checkpoint_every: Optional[int] = None, intermediate_states=None,
              transpose_state_layout: Optional[bool] = None):
    """`pykda.chunk_kda` through torch.ops.pykda (traceable by torch.compile); same arguments
    but `stream` (torch's current stream is used), same results: (o or `out`, the new final
    state, `final_state`, the pool `initial_state` (with `state_indices` and
    `output_final_state`) or None[, checkpoints or `intermediate_states`]). `cu_seqlens_cpu` is
    dropped (the op plans without it), so checkpoints with `cu_seqlens` need an
    `intermediate_states` buffer."""
    if cp_context is not None:   # not a tensor: cannot cross the op's boundary
        raise ValueError("cp_context (fla's context parallelism) is not supported by chunk_kda")
    if return_intermediate_states and cu_seqlens is not None and intermediate_states is None:
        # (the eager function would ask for cu_seqlens_cpu, which the op cannot take)
        raise ValueError("pykda.torch_ops.chunk_kda: return_intermediate_states with cu_seqlens needs an "
                         "intermediate_states buffer (the number of checkpoints depends on the lengths; the op "
                         "plans without cu_seqlens_cpu)")
    del cu_seqlens_cpu
    state_v_first = _resolve_state_v_first(state_v_first, transpose_state_layout)
    o, fs, ckpt = _CHUNK(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                         use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                         state_v_first, cu_seqlens, None, A_log, dt_bias, state_indices, has_initial_state, out,
                         final_state, intermediate_states, chunk_size=chunk_size, warps=warps, stages=stages,
                         segment_chunks=segment_chunks, disable_recompute=disable_recompute, use_graph=use_graph,
                         max_num_seqs=max_num_seqs, return_intermediate_states=return_intermediate_states,
                         checkpoint_every=checkpoint_every)
    if out is not None:
        o = out
    if state_indices is not None:
        fs = initial_state if output_final_state else None
    elif final_state is not None:
        fs = final_state
    elif not output_final_state:
        fs = None
    if not return_intermediate_states:
        return o, fs
    return o, fs, (ckpt if intermediate_states is None else intermediate_states)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale: Optional[float] = None, initial_state=None,
                        output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                        use_gate_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                        allow_neg_eigval: bool = False, lower_bound: Optional[float] = None,
                        state_v_first: bool = False, cu_seqlens=None, *, safe_gate: bool = False, state_indices=None,
                        ssm_state_indices=None, num_accepted_tokens=None, inplace_final_state: bool = True,
                        out=None, check_indices: bool = False, rows_per_thread: Optional[int] = None,
                        stages: Optional[int] = None, transpose_state_layout: Optional[bool] = None,
                        intermediate_states_buffer=None, intermediate_state_indices=None,
                        disable_state_update: bool = False, retrieve_parent_token=None, first_row: int = 0):
    """`pykda.fused_recurrent_kda` through torch.ops.pykda (traceable by torch.compile); same
    arguments but `stream` (torch's current stream is used), same results: (o or `out`, the
    pool `initial_state` (updated in place) if `output_final_state` else None)."""
    state_v_first = _resolve_state_v_first(state_v_first, transpose_state_layout)
    o = _RECURRENT(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                   use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                   lower_bound, state_v_first, cu_seqlens, state_indices, out, safe_gate=safe_gate,
                   check_indices=check_indices, rows_per_thread=rows_per_thread, stages=stages,
                   ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                   inplace_final_state=inplace_final_state, intermediate_states_buffer=intermediate_states_buffer,
                   intermediate_state_indices=intermediate_state_indices, disable_state_update=disable_state_update,
                   retrieve_parent_token=retrieve_parent_token, first_row=first_row)
    return (o if out is None else out), (initial_state if output_final_state else None)
