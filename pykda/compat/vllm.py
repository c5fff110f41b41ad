"""vLLM's KDA calls (the signatures of its vendored fla KDA ops, as its Kimi Linear layer makes
them) on pykda's ops: `from pykda.compat.vllm import chunk_kda, chunk_kda_with_fused_gate,
fused_recurrent_kda`.

vLLM's conventions, kept here, in its two generations of vendored fla:
- today's (`vllm.third_party.flash_linear_attention`): states V-first `[N, H, V, K]`, and pool
  row 0 is the null block of padded decode slots (an index <= 0: zero outputs, no state read or
  written; `first_row=1` in pykda's terms); the decode's `ssm_state_indices` may be longer than
  its sequences (a CUDA graph's padded batch): only the first N are read;
- before (`vllm.model_executor.layers.fla`): fla's K-first `[N, H, K, V]`, every index a row.
`vllm_keeps_v_first()` tells them apart by what the installed vLLM vendors (today's without vLLM); each
call's `state_v_first` keyword overrides it (True: today's conventions, False: the older ones).
And in both:
- `chunk_kda` and `fused_recurrent_kda` take g as the log-decay (vLLM's `fused_kda_gate` ran
  before) and β as probabilities; `chunk_kda_with_fused_gate` takes the raw gate `raw_g` with
  `A_log` and `g_bias` (vLLM's name for dt_bias): Kimi Linear's -exp(A_log)·softplus(raw_g + g_bias),
  or with `lower_bound` lower_bound·sigmoid(exp(A_log)·(raw_g + g_bias));
- the positional order and defaults are vLLM's (they differ from fla's: `fused_recurrent_kda`
  normalises q and k by default and takes `inplace_final_state` eighth), and the decode step
  updates the pool `initial_state` in place at `ssm_state_indices`.
Arguments pykda cannot honour raise ValueError by name; none is dropped silently.
"""
from __future__ import annotations

import functools
import importlib.util

from ..ops.kda import chunk_kda as _chunk_kda
from ..ops.kda_decode import fused_recurrent_kda as _fused_recurrent_kda
from . import no_extra


@functools.lru_cache(maxsize=None)
def vllm_keeps_v_first() -> bool:
    """Whether the installed vLLM's KDA kernels keep today's conventions (its fla vendored under
    `vllm.third_party.flash_linear_attention`: V-first states, row 0 the null block): True, or
    the older ones (under `vllm.model_executor.layers.fla`: K-first, every index a row): False.
    Without vLLM installed: True."""
    if importlib.util.find_spec("vllm") is None:
        return True
    try:
        return importlib.util.find_spec("vllm.third_party.flash_linear_attention") is not None
    except ModuleNotFoundError:   # (no vllm.third_party package)
        return False


def _v_first(state_v_first: bool | None) -> bool:
    return vllm_keeps_v_first() if state_v_first is None else bool(state_v_first)


def chunk_kda(q, k, v, g, beta, scale: float | None = None, initial_state=None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, *, state_v_first: bool | None = None,
              **kwargs):
    """vLLM's prefill with the gate precomputed: g [1, T, H, K] the log-decay, beta [1, T, H]
    probabilities, packed by `cu_seqlens`; `initial_state` [N, H, V, K] today, [N, H, K, V] before
    (zeros where None). Returns (o [1, T, H, V], the final states in that layout or None)."""
    no_extra("chunk_kda", kwargs)
    return _chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                      cu_seqlens=cu_seqlens, state_v_first=_v_first(state_v_first))


def chunk_kda_with_fused_gate(q, k, v, raw_g, beta, A_log, g_bias, scale: float | None = None, initial_state=None,
                              output_final_state: bool = False, lower_bound: float | None = None,
                              use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, *,
                              state_v_first: bool | None = None, **kwargs):
    """vLLM's prefill from the raw gate: `raw_g` [1, T, H, K] with `A_log` (H elements, e.g.
    [1, 1, H, 1]) and `g_bias` ([H·K], or None) computed into Kimi Linear's gate in the kernel
    (the bounded sigmoid form with `lower_bound`); β probabilities (vLLM passes sigmoid(b) in
    fp32); states as `chunk_kda`. Returns (o, final states or None)."""
    no_extra("chunk_kda_with_fused_gate", kwargs)
    return _chunk_kda(q, k, v, raw_g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                      use_gate_in_kernel=True, lower_bound=lower_bound, cu_seqlens=cu_seqlens, A_log=A_log,
                      dt_bias=g_bias, state_v_first=_v_first(state_v_first))


def fused_recurrent_kda(q, k, v, g, beta=None, scale: float | None = None, initial_state=None,
                        inplace_final_state: bool = True, use_qk_l2norm_in_kernel: bool = True, cu_seqlens=None,
                        ssm_state_indices=None, *, state_v_first: bool | None = None, **kwargs):
    """vLLM's decode step: g the log-decay, β probabilities, the pool `initial_state` ([P, H, V, K]
    today, [P, H, K, V] before) advanced in place at rows `ssm_state_indices` ([N], or [N, T] for
    speculative tokens, with `num_accepted_tokens` as in pykda's `fused_recurrent_kda`; today
    an index <= 0 is a padded slot, and entries past the N sequences of `cu_seqlens` (or of q's
    batch) are not read). Returns (o, the pool)."""
    accepted = kwargs.pop("num_accepted_tokens", None)
    no_extra("fused_recurrent_kda", kwargs)
    if beta is None:
        raise ValueError("fused_recurrent_kda: beta is required (β per token, probabilities)")
    today = _v_first(state_v_first)
    if today and ssm_state_indices is not None:   # a graph's padded batch: its first N slots
        n = (cu_seqlens.shape[0] - 1) if cu_seqlens is not None else q.shape[0]
        ssm_state_indices = ssm_state_indices[:n]
        accepted = accepted[:n] if accepted is not None else None
    return _fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True,
                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                ssm_state_indices=ssm_state_indices, num_accepted_tokens=accepted,
                                inplace_final_state=inplace_final_state, state_v_first=today, first_row=int(today))
