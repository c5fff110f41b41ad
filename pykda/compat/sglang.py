"""SGLang's KDA calls (its `fla` kernels' signatures, as its Kimi Linear backend makes them) on
pykda's ops: `from pykda.compat.sglang import chunk_kda, fused_sigmoid_gating_delta_rule_update`,
or the whole kernel object SGLang's KDA backend dispatches to (`KDAKernel`, the methods of its
`TritonKDAKernel`: decode, extend, packed_decode, target_verify).

SGLang's conventions, kept here:
- state pools are V-first, `[P, H, V, K]`, updated in place at `initial_state_indices` (negative:
  padding); a pool may be a view whose rows lie further apart (pykda reads the row stride);
- prefill (`chunk_kda`) takes β as probabilities and computes the gate in the kernel when
  `A_log` is given (Kimi Linear's softplus gate, or with `lower_bound` the bounded one), else
  takes `g` as the log-decay; it returns the output only, or with `output_intermediate_states`
  also the states at every 64-token chunk boundary (SGLang's `h`, [1, NT, H, V, K]);
- decode (`fused_sigmoid_gating_delta_rule_update`, `is_kda=True`) takes the raw gate `a` and β
  as logits (`b`), and returns the output only; its target-verify form (`target_verify`: each
  draft token's state into `intermediate_states_buffer` [S, steps, H, V, K] at the request's
  `intermediate_state_indices` slot, the pool left as it was with `disable_state_update`) runs
  chains of drafts and trees (`retrieve_parent_token`: each token from its parent's state).
Arguments pykda cannot honour raise ValueError by name; none is dropped silently.
"""
from __future__ import annotations

import numpy as np

from ..ops.kda import chunk_kda as _chunk_kda
from ..ops.kda_decode import fused_recurrent_kda as _fused_recurrent_kda
from . import no_extra

SOFTPLUS_THRESHOLD_MIN = 15.0   # pykda's softplus is exact to fp32 there (kda_math.cuh); a lower threshold is not
SGLANG_CHUNK = 64               # SGLang's chunk: the spacing of its intermediate states
SOFTPLUS_THRESHOLD = 20.0       # what SGLang's KDA decode passes
FLA_CHUNK_TABLES = ("chunk_indices", "chunk_offsets")   # fla's varlen chunk tables, derived from cu_seqlens


def _gate_flags(A_log, lower_bound) -> dict:
    """pykda's gate keywords for SGLang's: the gate in the kernel exactly when A_log is given."""
    if A_log is None:
        if lower_bound is not None:
            raise ValueError("lower_bound is given without A_log: the bounded gate is computed from A_log")
        return {}
    return dict(use_gate_in_kernel=True, safe_gate=lower_bound is not None, lower_bound=lower_bound)


def chunk_kda(q, k, v, g, beta, scale: float | None = None, initial_state=None, initial_state_indices=None,
              use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, A_log=None, dt_bias=None,
              lower_bound: float | None = None, output_intermediate_states: bool = False, beta_is_raw: bool = False,
              cu_seqlens_cpu=None, **kwargs):
    """SGLang's prefill: q, k, v [1, T, H, K] bf16 packed by `cu_seqlens`; g the raw gate (with
    A_log) or the log-decay; beta [1, T, H] probabilities (logits with `beta_is_raw`: sigmoid in
    the kernel); the pool `initial_state` [P, H, V, K] read and written in place at rows
    `initial_state_indices` [N] (without indices: row n, a [N, H, V, K] state updated in place).
    Returns o [1, T, H, V]; with `output_intermediate_states`, (o, h): h the state before every
    64-token chunk of each sequence, [1, Σ ceil(len / 64), H, V, K] in bf16 as SGLang's (with
    cu_seqlens their number comes from `cu_seqlens_cpu`, a host copy of it, or else is read
    back: a synchronisation, as SGLang's own chunk indices make). fla's precomputed chunk
    tables (`chunk_indices`, `chunk_offsets`) are taken and not needed: the kernels find their
    chunks from cu_seqlens."""
    for name in FLA_CHUNK_TABLES:
        kwargs.pop(name, None)
    no_extra("chunk_kda", kwargs)
    if initial_state is None and initial_state_indices is not None:
        raise ValueError("initial_state_indices is given without initial_state (the pool)")
    pool = dict(initial_state=initial_state)
    if initial_state_indices is not None:
        pool["state_indices"] = initial_state_indices
    elif initial_state is not None:
        pool["final_state"] = initial_state   # updated in place, as the pool would be
    checkpoints = {}
    if output_intermediate_states:
        checkpoints = dict(return_intermediate_states=True, checkpoint_every=SGLANG_CHUNK)
        if cu_seqlens is not None and cu_seqlens_cpu is None:
            cu_seqlens_cpu = cu_seqlens.cpu()
    r = _chunk_kda(q, k, v, g, beta, scale=scale, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                   use_beta_sigmoid_in_kernel=bool(beta_is_raw), state_v_first=True, cu_seqlens=cu_seqlens,
                   cu_seqlens_cpu=cu_seqlens_cpu if cu_seqlens is not None else None, A_log=A_log, dt_bias=dt_bias,
                   **_gate_flags(A_log, lower_bound), **pool, **checkpoints)
    return (r[0], r[2]) if output_intermediate_states else r[0]


def fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, softplus_beta: float, softplus_threshold: float, q, k,
                                           v, b, initial_state_source, initial_state_indices,
                                           scale: float | None = None, use_qk_l2norm_in_kernel: bool = False,
                                           cu_seqlens=None, is_kda: bool = False, lower_bound: float | None = None,
                                           disable_state_update: bool = False, intermediate_states_buffer=None,
                                           intermediate_state_indices=None, cache_steps=None,
                                           retrieve_parent_token=None, **kwargs):
    """SGLang's decode step for KDA (`is_kda=True`): q, k, v [B, T, H, K] (decode: [1, N, H, K]
    with `cu_seqlens`), the raw gate `a` (q's element count, any shape that reshapes to q's) and
    β logits `b` (reshaping to [B, T, H]); Kimi Linear's gate -exp(A_log) · softplus(a + dt_bias)
    (or, with `lower_bound`, the bounded one); the pool `initial_state_source` [P, H, V, K] advanced
    in place at rows `initial_state_indices` [N] (padding rows, negative: zero outputs, no state
    written), or with `disable_state_update` only read. Target verify: the state after draft token
    t < cache_steps of request n goes to `intermediate_states_buffer[intermediate_state_indices[n], t]`
    (buffer [S, cache_steps, H, V, K] in the pool's dtype); with `retrieve_parent_token` [N, T]
    (a tree of drafts) token t starts from the state after its parent's token (-1: the pool row's).
    Returns o [B, T, H, V]."""
    no_extra("fused_sigmoid_gating_delta_rule_update", kwargs)
    if not is_kda:
        raise ValueError("is_kda=False is SGLang's gated delta net (a scalar gate per head): pykda runs KDA only")
    if softplus_beta != 1.0 or softplus_threshold < SOFTPLUS_THRESHOLD_MIN:
        raise ValueError(f"pykda's softplus has beta 1 and is exact past {SOFTPLUS_THRESHOLD_MIN:g}: softplus_beta "
                         f"must be 1.0 and softplus_threshold >= {SOFTPLUS_THRESHOLD_MIN:g}; got {softplus_beta}, "
                         f"{softplus_threshold}")
    if intermediate_states_buffer is None and cache_steps is not None:
        raise ValueError("cache_steps is given without intermediate_states_buffer (the steps are the buffer's)")
    if intermediate_states_buffer is not None and cache_steps is not None and \
            cache_steps != intermediate_states_buffer.shape[1]:
        raise ValueError(f"cache_steps ({cache_steps}) must be intermediate_states_buffer's steps (its dim 1, "
                         f"{intermediate_states_buffer.shape[1]})")
    if A_log is None:
        raise ValueError("A_log is required: the gate is computed from the raw gate a in the kernel")
    o, _ = _fused_recurrent_kda(q, k, v, a.reshape(tuple(q.shape)), b.reshape(tuple(q.shape[:3])), A_log=A_log,
                                dt_bias=dt_bias, scale=scale, initial_state=initial_state_source,
                                state_indices=initial_state_indices, cu_seqlens=cu_seqlens,
                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel=True,
                                state_v_first=True, **_gate_flags(A_log, lower_bound),
                                intermediate_states_buffer=intermediate_states_buffer,
                                intermediate_state_indices=intermediate_state_indices,
                                disable_state_update=disable_state_update, retrieve_parent_token=retrieve_parent_token)
    return o


def _off_only(name: str, kwargs: dict) -> None:
    """Options SGLang's backend passes to every kernel (None or False where off: ring buffers,
    state tracking, is_spec_decode): refused by name when set."""
    no_extra(name, {n: x for n, x in kwargs.items() if x is not None and x is not False})


class KDAKernel:
    """SGLang's KDA kernel object (its `LinearAttnKernelBase` methods, as `TritonKDAKernel` has
    them) on pykda's ops: its backend's `KDAKernelDispatcher` can hold one for decode and extend.
    Pools V-first [P, H, V, K], updated in place at `cache_indices`."""
    supports_packed_decode = True

    def decode(self, q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices, query_start_loc,
               lower_bound: float | None = None, **kwargs):
        """q, k, v [1, N, H, K] packed by `query_start_loc`; `a` the raw gate, `b` β logits (with
        `lower_bound`, the bounded gate). Returns o [1, N, H, V]."""
        _off_only("KDAKernel.decode", kwargs)
        return fused_sigmoid_gating_delta_rule_update(A_log, a, dt_bias, 1.0, SOFTPLUS_THRESHOLD, q, k, v, b,
                                                      ssm_states, cache_indices, use_qk_l2norm_in_kernel=True,
                                                      cu_seqlens=query_start_loc, is_kda=True, lower_bound=lower_bound)

    def packed_decode(self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices, num_v_heads,
                      head_v_dim, lower_bound: float | None = None, **kwargs):
        """One token per sequence from the short convolution's output `mixed_qkv` [B, q | k | v]
        (read in place: q, k and v are views of its columns); `a` the raw gate ([B, H·K] or
        [B, H, K]; with `lower_bound`, the bounded gate), `b` β logits ([B, H]). Returns o [1, B, H, V]."""
        _off_only("KDAKernel.packed_decode", kwargs)   # (SGLang's replayssm ring buffers: None when off)
        B, H, V = mixed_qkv.shape[0], num_v_heads, head_v_dim
        K = ssm_states.shape[-1]
        if mixed_qkv.shape[1] != 2 * H * K + H * V:
            raise ValueError(f"mixed_qkv must be [B, q | k | v] = [B, {2 * H * K + H * V}] for {H} heads of "
                             f"K = {K}, V = {V}; got {tuple(mixed_qkv.shape)}")
        q, k, v = (mixed_qkv[:, i * H * K:i * H * K + H * d].view(B, 1, H, d) for i, d in enumerate((K, K, V)))
        o, _ = _fused_recurrent_kda(q, k, v, a.reshape(B, 1, H, K), b.reshape(B, 1, H), A_log=A_log, dt_bias=dt_bias,
                                    scale=scale, initial_state=ssm_states, state_indices=cache_indices,
                                    use_qk_l2norm_in_kernel=True, **_gate_flags(A_log, lower_bound),
                                    use_beta_sigmoid_in_kernel=True, state_v_first=True)
        return o.transpose(0, 1)

    def extend(self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, A_log=None, dt_bias=None,
               lower_bound: float | None = None, return_intermediate_states: bool = False, beta_is_raw: bool = False,
               extend_seq_lens_cpu=None, **kwargs):
        """SGLang's `chunk_kda` on the pool (see `chunk_kda` here; β logits with `beta_is_raw`):
        o, or (o, h) with `return_intermediate_states`. `extend_seq_lens_cpu` (the lengths on the
        host, where SGLang has them) is a planning hint, as fla's cu_seqlens_cpu."""
        for name in FLA_CHUNK_TABLES:
            kwargs.pop(name, None)
        _off_only("KDAKernel.extend", kwargs)
        cu_cpu = None
        if extend_seq_lens_cpu is not None:
            cu_cpu = np.concatenate([[0], np.cumsum(np.asarray(extend_seq_lens_cpu, dtype=np.int64))])
        return chunk_kda(q, k, v, g, beta, initial_state=ssm_states, initial_state_indices=cache_indices,
                         use_qk_l2norm_in_kernel=True, cu_seqlens=query_start_loc, A_log=A_log, dt_bias=dt_bias,
                         lower_bound=lower_bound, output_intermediate_states=return_intermediate_states,
                         beta_is_raw=beta_is_raw, cu_seqlens_cpu=cu_cpu)

    def target_verify(self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
                      intermediate_states_buffer, intermediate_state_indices, cache_steps, retrieve_parent_token=None,
                      lower_bound: float | None = None, **kwargs):
        """The draft tokens of each request (packed by `query_start_loc`) from its pool row, which
        stays as it was; the state after each token into `intermediate_states_buffer` at the
        request's slot; with `retrieve_parent_token` (a tree of drafts), each token from its
        parent's state. Returns o [1, N, H, V]."""
        _off_only("KDAKernel.target_verify", kwargs)
        return fused_sigmoid_gating_delta_rule_update(
            A_log, a, dt_bias, 1.0, SOFTPLUS_THRESHOLD, q, k, v, b, ssm_states, cache_indices,
            use_qk_l2norm_in_kernel=True, cu_seqlens=query_start_loc, is_kda=True, disable_state_update=True,
            intermediate_states_buffer=intermediate_states_buffer,
            intermediate_state_indices=intermediate_state_indices, cache_steps=cache_steps,
            retrieve_parent_token=retrieve_parent_token, lower_bound=lower_bound)
