"""KDA's variants as fla names them, resolved once per call into a `KdaVariant`: the gate mode,
the β form, the L2-norm flag and the dtypes of g and beta. Prefill and decode share it, so a
keyword means the same in both ops; the kernels take the variant as compile-time constants
(`template_params`, read by `kda_math.cuh`).

Gate modes (fla's `use_gate_in_kernel`, `lower_bound`, `safe_gate`):
- ``use_gate_in_kernel=False``: g is the log-decay itself (bf16 or fp32), e.g. after the engine's
  own gate kernel. A_log and dt_bias must not be given (they would be ignored).
- ``use_gate_in_kernel=True`` and no ``lower_bound``: Kimi Linear's gate
  ``a = -exp(A_log) * softplus(g + dt_bias)``, unbounded below (A_log required).
- ``use_gate_in_kernel=True`` with ``lower_bound``: ``a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``
  (without A_log, ``exp(A_log)`` is 1). ``safe_gate=True`` asks for this form and needs ``lower_bound``.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

from ..runtime.arrays import DeviceArray
from .checks import check_aligned, check_contiguous, check_dtype, check_lower_bound

GATES = {"safe": 0, "softplus": 1, "none": 2}      # KdaGate in kda_math.cuh
BETAS = {"logit": 0, "logit2": 1, "prob": 2}       # KdaBeta
CTYPES = {"bfloat16": "bf16_t", "float32": "float"}
INPUT_DTYPES = tuple(CTYPES)                       # of g and beta


class KdaVariant(NamedTuple):
    gate: str           # a key of GATES
    beta: str           # a key of BETAS
    norm: bool          # L2-normalise q and k in the kernel
    g_dtype: str        # bfloat16 or float32
    beta_dtype: str
    lower_bound: float  # read by the "safe" gate only (0.0 otherwise)

    def template_params(self) -> dict:
        return {"GATE": GATES[self.gate], "BETA": BETAS[self.beta], "NORM": self.norm,
                "G_T": CTYPES[self.g_dtype], "BETA_T": CTYPES[self.beta_dtype]}


class KdaFlags(NamedTuple):
    """fla's keyword flags of a call, hashable (part of a prepared call's key)."""
    use_qk_l2norm_in_kernel: bool = False
    use_gate_in_kernel: bool = False
    use_beta_sigmoid_in_kernel: bool = False
    allow_neg_eigval: bool = False
    safe_gate: bool = False
    lower_bound: float | None = None


# pykda's fused forms before fla's keywords: L2 norm, the bounded gate and sigmoid(beta) in the kernel
SAFE_GATE_FLAGS = KdaFlags(True, True, True, False, True, -5.0)


def resolve_variant(flags: KdaFlags, g: DeviceArray, beta: DeviceArray, A_log: DeviceArray | None,
                    dt_bias: DeviceArray | None, heads: int, head_dim: int) -> KdaVariant:
    """The variant a call asks for; ValueError/TypeError naming the keyword or argument that
    does not fit (A_log and dt_bias are checked here: shapes with H and H*K elements, fp32)."""
    check_dtype(g, "g", INPUT_DTYPES)
    check_dtype(beta, "beta", INPUT_DTYPES)
    if flags.allow_neg_eigval and not flags.use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (β = 2·sigmoid(beta))")
    beta_form = ("logit2" if flags.allow_neg_eigval else "logit") if flags.use_beta_sigmoid_in_kernel else "prob"
    # a lower_bound is checked wherever it is given, also where the gate mode does not read it
    given_lb = check_lower_bound(flags.lower_bound) if flags.lower_bound is not None else None
    lb = 0.0
    if not flags.use_gate_in_kernel:
        for name, a in (("A_log", A_log), ("dt_bias", dt_bias)):
            if a is not None:
                raise ValueError(f"{name} is given but use_gate_in_kernel=False: g would be taken as the log-decay "
                                 f"and {name} ignored; pass use_gate_in_kernel=True to compute the gate in the kernel")
        gate = "none"
    elif given_lb is not None:
        gate, lb = "safe", given_lb
    elif flags.safe_gate:
        raise ValueError("safe_gate=True with use_gate_in_kernel=True needs lower_bound (e.g. -5.0)")
    else:
        gate = "softplus"
        if A_log is None:
            raise ValueError("use_gate_in_kernel=True without lower_bound (Kimi Linear's softplus gate) needs A_log")
    if A_log is not None:
        check_dtype(A_log, "A_log", ("float32",))
        if math.prod(A_log.shape) != heads:
            raise ValueError(f"A_log must hold H = {heads} elements (e.g. [H] or [1, 1, H, 1]); got shape {tuple(A_log.shape)}")
        check_contiguous(A_log, "A_log")
    if dt_bias is not None:
        check_dtype(dt_bias, "dt_bias", ("float32",))
        if math.prod(dt_bias.shape) != heads * head_dim:
            raise ValueError(f"dt_bias must hold H*K = {heads * head_dim} elements ([H, K] or [H*K]); "
                             f"got shape {tuple(dt_bias.shape)}")
        check_contiguous(dt_bias, "dt_bias")
        check_aligned(dt_bias, "dt_bias", 16)   # read in 16-byte pieces
    return KdaVariant(gate, beta_form, bool(flags.use_qk_l2norm_in_kernel), g.dtype, beta.dtype, lb)


def resolve_state_v_first(state_v_first: bool, transpose_state_layout: bool | None) -> bool:
    """The state layout flag, also under fla's deprecated name `transpose_state_layout` (with
    fla's DeprecationWarning; both given as True is fla's ValueError)."""
    if transpose_state_layout is None:
        return state_v_first
    if state_v_first:
        raise ValueError("Cannot pass both state_v_first and the deprecated transpose_state_layout")
    warnings.warn("transpose_state_layout is deprecated and renamed to state_v_first", DeprecationWarning,
                  stacklevel=3)
    return transpose_state_layout
