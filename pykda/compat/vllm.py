"""vLLM's KDA calls (the signatures of its vendored `vllm.model_executor.layers.fla.ops.kda`, as
its Kimi Linear layer makes them) on pykda's ops: `from pykda.compat.vllm import chunk_kda,
chunk_kda_with_fused_gate, fused_recurrent_kda`.

vLLM's conventions, kept here:
- states are fla's K-first `[N, H, K, V]` (vLLM's recurrent-state cache; its kernels index
  them so), fp32 or bf16;
- `chunk_kda` and `fused_recurrent_kda` take g as the log-decay (vLLM's `fused_kda_gate` ran
  before) and β as probabilities; `chunk_kda_with_fused_gate` takes the raw gate `raw_g` with
  `A_log` and `g_bias` (vLLM's name for dt_bias): Kimi Linear's -exp(A_log)·softplus(raw_g + g_bias);
- the positional order and defaults are vLLM's (they differ from fla's: `fused_recurrent_kda`
  normalises q and k by default and takes `inplace_final_state` seventh), and the decode step
  updates the pool `initial_state` in place at `ssm_state_indices`.
Arguments pykda cannot honour raise ValueError by name; none is dropped silently.
"""
from __future__ import annotations

from ..ops.kda import chunk_kda as _chunk_kda
from ..ops.kda_decode import fused_recurrent_kda as _fused_recurrent_kda
from . import no_extra


def chunk_kda(q, k, v, g, beta, scale: float | None = None, initial_state=None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, **kwargs):
    """vLLM's prefill with the gate precomputed: g [1, T, H, K] the log-decay, beta [1, T, H]
    probabilities, packed by `cu_seqlens`; `initial_state` [N, H, K, V] (zeros where None).
    Returns (o [1, T, H, V], the final states [N, H, K, V] or None)."""
    no_extra("chunk_kda", kwargs)
    return _chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                      cu_seqlens=cu_seqlens)


def chunk_kda_with_fused_gate(q, k, v, raw_g, beta, A_log, g_bias, scale: float | None = None, initial_state=None,
                              output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                              cu_seqlens=None, **kwargs):
    """vLLM's prefill from the raw gate: `raw_g` [1, T, H, K] with `A_log` (H elements, e.g.
    [1, 1, H, 1]) and `g_bias` ([H·K], or None) computed into Kimi Linear's gate in the kernel;
    β probabilities (vLLM passes sigmoid(b) in fp32). Returns (o, final states or None)."""
    no_extra("chunk_kda_with_fused_gate", kwargs)
    return _chunk_kda(q, k, v, raw_g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                      use_gate_in_kernel=True, cu_seqlens=cu_seqlens, A_log=A_log, dt_bias=g_bias)


def fused_recurrent_kda(q, k, v, g, beta=None, scale: float | None = None, initial_state=None,
                        inplace_final_state: bool = True, use_qk_l2norm_in_kernel: bool = True, cu_seqlens=None,
                        ssm_state_indices=None, **kwargs):
    """vLLM's decode step: g the log-decay, β probabilities, the pool `initial_state` [P, H, K, V]
    advanced in place at rows `ssm_state_indices` ([N], or [N, T] for speculative tokens, with
    `num_accepted_tokens` as in pykda's `fused_recurrent_kda`). Returns (o, the pool)."""
    accepted = kwargs.pop("num_accepted_tokens", None)
    no_extra("fused_recurrent_kda", kwargs)
    if beta is None:
        raise ValueError("fused_recurrent_kda: beta is required (β per token, probabilities)")
    return _fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True,
                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                ssm_state_indices=ssm_state_indices, num_accepted_tokens=accepted,
                                inplace_final_state=inplace_final_state)
