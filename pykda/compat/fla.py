"""pykda behind fla's own KDA entry points. fla (fla-core >= 0.6) sends `fla.ops.kda.chunk_kda` and
`fused_recurrent_kda_fwd` through the backends registered with it; `register()` adds pykda as one
(backend type "pykda", tried before fla's others; `FLA_PYKDA=0` turns it off as fla's switches do).
Whatever calls fla (its KimiDeltaAttention layer, a Kimi Linear modeling file, an engine that
imports fla) then runs on pykda's kernels, with fla's arguments and meanings, wherever pykda can
compute what fla would; every other call runs on fla's own kernels, as if pykda were not there:

- devices other than sm_90 (H100, H200: pykda's kernels use its TMA and wgmma), and for chunk_kda
  autograd (an input requiring grad while grad is on: pykda has no backward), are fla's;
- a call pykda's validation refuses (grouped value heads, context parallelism, dtypes or head
  dims pykda does not run, an out-of-place step of several tokens over pool rows, arrays pykda
  cannot read in place, ...) goes to fla's kernels: pykda refuses before any of its kernels
  writes anything, and logs why once per reason (logger `pykda.compat.fla`, INFO). fla then
  computes the call or raises its own error.

fla's meanings kept here: A_log and dt_bias are ignored without `use_gate_in_kernel` and are read in
fp32 (a model cast to bf16 holds them in bf16; fla's kernels read them as fp32 too); varlen
intermediate states without `cu_seqlens_cpu` are counted from a host copy of cu_seqlens (a
synchronisation, as fla's own count makes).
"""
from __future__ import annotations

import inspect
import logging

import torch

try:
    from fla.backends import BaseBackend
    from fla.backends import register as _fla_register
    from fla.ops.kda.chunk import chunk_kda as _fla_chunk_kda
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as _fla_fused_recurrent_kda_fwd
except ImportError as exc:   # fla missing, or one without backend dispatch
    raise ImportError("pykda.compat.fla needs fla with backend dispatch (fla-core >= 0.6: fla.backends)") from exc

from .. import runtime
from ..ops.kda import chunk_kda as _chunk_kda
from ..ops.kda_decode import fused_recurrent_kda as _fused_recurrent_kda

logger = logging.getLogger(__name__)
BACKEND_TYPE = "pykda"
PRIORITY = 2   # fla tries lower first: FlashKDA's backend is 3
_DECLINED_LOGGED_MAX = 256   # distinct reasons logged before the set starts afresh


class _Declined:
    """The reasons pykda declined calls, each logged once (a bounded set)."""

    def __init__(self):
        self.seen: set[tuple[str, str]] = set()

    def log(self, op: str, exc: Exception) -> None:
        key = (op, f"{type(exc).__name__}: {exc}")
        if key in self.seen:
            return
        if len(self.seen) >= _DECLINED_LOGGED_MAX:
            self.seen.clear()
        self.seen.add(key)
        logger.info("pykda declined fla's %s (%s); fla's own kernels run it", op, key[1])


DECLINED = _Declined()


def _fp32_gate_parameters(use_gate_in_kernel: bool, A_log, dt_bias) -> tuple:
    """A_log and dt_bias as pykda reads them: None without the gate in the kernel (fla ignores them
    there), else fp32 (fla's kernels read them as fp32 whatever the model holds)."""
    if not use_gate_in_kernel:
        return None, None
    return tuple(x if x is None or x.dtype == torch.float32 else x.float() for x in (A_log, dt_bias))


def _off_hopper(t) -> str | None:
    """Why pykda's kernels cannot run on t's device (`DeviceInfo.unsupported`: a CUDA device other
    than compute capability 9.0, read once per device), else None. (Anything else pykda's
    validation names.)"""
    return runtime.device_info(t.get_device()).unsupported if t.is_cuda else None


def _grad_needed(*tensors) -> bool:
    """Whether autograd would record a call on these tensors."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


class _PykdaBackend(BaseBackend):
    backend_type = BACKEND_TYPE
    package_name = "pykda"
    env_var = "FLA_PYKDA"
    priority = PRIORITY


class ChunkKdaBackend(_PykdaBackend):
    """fla's `chunk_kda` (its positional order and keywords) on pykda's `chunk_kda`."""
    _fla = staticmethod(inspect.unwrap(_fla_chunk_kda))   # fla's own chunk_kda, past its dispatch

    def chunk_kda_verifier(self, q, k, v, g, beta, scale=None, initial_state=None, *args, **kwargs):
        why = _off_hopper(q)
        if why is None and _grad_needed(q, k, v, g, beta, initial_state, kwargs.get("A_log"), kwargs.get("dt_bias")):
            why = "autograd records this call and pykda has no backward"
        return why is None, why

    def chunk_kda(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                  allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                  return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                  cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
        given = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                     use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                     use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                     safe_gate=safe_gate, lower_bound=lower_bound, disable_recompute=disable_recompute,
                     return_intermediate_states=return_intermediate_states, state_v_first=state_v_first,
                     cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, cp_context=cp_context,
                     use_graph=use_graph, max_num_seqs=max_num_seqs, **kwargs)
        ours = dict(given)
        ours["A_log"], ours["dt_bias"] = _fp32_gate_parameters(use_gate_in_kernel, kwargs.get("A_log"),
                                                               kwargs.get("dt_bias"))
        if return_intermediate_states and cu_seqlens is not None and cu_seqlens_cpu is None:
            ours["cu_seqlens_cpu"] = cu_seqlens.cpu()   # the states' count: a synchronisation, as fla's own makes
        try:
            return _chunk_kda(q, k, v, g, beta, **ours)
        except (ValueError, TypeError) as exc:   # refused before any of pykda's kernels writes
            DECLINED.log("chunk_kda", exc)
        return self._fla(q, k, v, g, beta, **given)


def _out_of_place_step(q, k, v, g, beta, kw: dict):
    """fla's out-of-place step (its public fused_recurrent_kda, as its layer decodes and runs prompts
    of up to 64 tokens: the start states only read, the final states new fp32 arrays). One token a
    sequence from start states runs as pykda's target verify of the token (`_verify_one_token`),
    anything else as pykda's chunked prefill of the tokens (`chunk_kda`: the same recurrence in
    chunks, reading its start states and making new final ones)."""
    state = kw["initial_state"]
    if state is not None and kw["cu_seqlens"] is None and q.ndim == 4 and q.shape[1] == 1:
        return _verify_one_token(q, k, v, g, beta, kw)
    if kw["ssm_state_indices"] is not None or kw["num_accepted_tokens"] is not None:
        raise ValueError("fla's out-of-place step over ssm_state_indices stores every token's state")
    if state is not None and state.dtype != torch.float32:
        raise TypeError(f"fla's new final states are fp32 and pykda's keep the start states' dtype ({state.dtype})")
    names = ("scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel", "use_gate_in_kernel",
             "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "lower_bound", "state_v_first", "cu_seqlens", "A_log",
             "dt_bias", "out")
    extra = set(kw) - set(names) - {"inplace_final_state", "ssm_state_indices", "num_accepted_tokens"}
    if extra:
        raise TypeError(f"arguments pykda's chunk_kda does not take: {', '.join(sorted(extra))}")
    return _chunk_kda(q, k, v, g, beta, **{n: kw[n] for n in names})


def _verify_one_token(q, k, v, g, beta, kw: dict):
    """One token a sequence out of place as pykda's target verify of it: the start states (pool
    rows, or row n for sequence n) read, not written, and the state after the token into slot n
    of a new fp32 buffer for sequence n, as many bytes as the step in place."""
    state = kw["initial_state"]
    step = dict(kw, inplace_final_state=True, output_final_state=False, disable_state_update=True)
    final = None
    if kw["output_final_state"]:
        if state.dtype != torch.float32:
            raise TypeError(f"fla's new final states are fp32 and pykda writes the pool's dtype ({state.dtype})")
        final = torch.empty((q.shape[0], *state.shape[1:]), dtype=torch.float32, device=state.device)
        step.update(intermediate_states_buffer=final.unsqueeze(1),
                    intermediate_state_indices=torch.arange(q.shape[0], dtype=torch.int32, device=state.device))
    o, _ = _fused_recurrent_kda(q, k, v, g, beta, **step)
    return o, final


class RecurrentKdaBackend(_PykdaBackend):
    """fla's `fused_recurrent_kda_fwd` on pykda: in place (the serving step: the pool advanced) on
    `fused_recurrent_kda`, or out of place (fla's public fused_recurrent_kda) as `_out_of_place_step`
    says. (fla's other dispatched KDA functions find no method here.)"""
    _fla = staticmethod(inspect.unwrap(_fla_fused_recurrent_kda_fwd))

    def fused_recurrent_kda_fwd_verifier(self, q, *args, **kwargs):
        why = _off_hopper(q)
        return why is None, why

    def fused_recurrent_kda_fwd(self, q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                                output_final_state=False, inplace_final_state=True, state_v_first=False,
                                cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None,
                                **kwargs):
        given = dict(A_log=A_log, dt_bias=dt_bias, initial_state=initial_state, scale=scale,
                     output_final_state=output_final_state, inplace_final_state=inplace_final_state,
                     state_v_first=state_v_first, cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                     num_accepted_tokens=num_accepted_tokens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                     use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                     allow_neg_eigval=allow_neg_eigval, lower_bound=lower_bound, out=out, **kwargs)
        ours = dict(given)
        ours["A_log"], ours["dt_bias"] = _fp32_gate_parameters(use_gate_in_kernel, A_log, dt_bias)
        try:
            if inplace_final_state:   # fla returns the pool it advanced
                return _fused_recurrent_kda(q, k, v, g, beta, **dict(ours, output_final_state=True))
            return _out_of_place_step(q, k, v, g, beta, ours)
        except (ValueError, TypeError) as exc:
            DECLINED.log("fused_recurrent_kda_fwd", exc)
        return self._fla(q, k, v, g, beta, **given)


def register() -> None:
    """Register pykda with fla's dispatch: in `chunk_kda`'s registry and in the "kda" operation
    registry (fused_recurrent_kda_fwd). fla keeps one backend per type in a registry, so calling it
    again changes nothing."""
    _fla_register(_fla_chunk_kda)(ChunkKdaBackend)
    _fla_register("kda")(RecurrentKdaBackend)
