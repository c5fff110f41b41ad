"""Float64 references for pykda's kernels (NumPy; the decode one also runs on CuPy arrays).

* Softmax decode attention (``decode_attention``, ``batch_decode_attention``,
  ``paged_decode_attention``): one query token per head against a KV cache (paged or not), with
  grouped-query attention.
* Kimi Delta Attention (KDA): the naive per-token recurrence (``kda_recurrent``) and the
  chunked form the kernels implement (``kda_chunked``), written independently of each other;
  they agree to ~1e-12, which checks the chunked algebra of DESIGN.md.
* ``relative_error``: the metric GPU results are judged by, ``||out - ref|| / ||ref||``.

Everything is computed in float64 whatever the input dtype (bf16 arrives as float32 from the
caller). Layouts follow DESIGN.md: q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``,
beta ``[B, T, H]`` (logits), state ``[N, H, V, K]`` (value-major, ``S[v, k]``).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "decode_attention",
    "batch_decode_attention",
    "paged_decode_attention",
    "sigmoid",
    "softplus",
    "kda_gate",
    "kda_beta",
    "kda_options",
    "l2_normalize",
    "kda_recurrent",
    "kda_chunked",
    "relative_error",
]

_LOG2E = 1.4426950408889634  # log2(e)


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _array_module(x):
    """numpy, or cupy for CuPy arrays (the decode reference runs on either)."""
    if type(x).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


# --------------------------------------------------------------------------------------------
# Softmax decode attention
# --------------------------------------------------------------------------------------------


def batch_decode_attention(q, k, v, scale=None):
    """Decode attention with a batch dim: q ``[B, Hq, D]``, k, v ``[B, S, Hkv, Dk/Dv]``.

    Query head ``i`` attends with kv head ``i // (Hq // Hkv)``. ``scale`` defaults to
    ``1/sqrt(D)``. Returns ``(o [B, Hq, Dv], lse [B, Hq])`` in float64, ``lse`` being the
    natural-log logsumexp of the scaled scores. With ``S == 0``: ``o = 0``, ``lse = -inf``.
    CuPy inputs are computed on the GPU (still float64), for sizes too large for the host.
    """
    xp = _array_module(q)
    q, k, v = (xp.asarray(x, dtype=xp.float64) for x in (q, k, v))
    if q.ndim != 3 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"expected q [B,Hq,D], k/v [B,S,Hkv,D]; got {q.shape}, {k.shape}, {v.shape}")
    B, Hq, D = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"shape mismatch: q {q.shape}, k {k.shape}, v {v.shape}")
    Hkv = k.shape[2]
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    if scale is None:
        scale = 1.0 / xp.sqrt(D)
    if k.shape[1] == 0:
        return xp.zeros((B, Hq, v.shape[3])), xp.full((B, Hq), -xp.inf)
    qg = q.reshape(B, Hkv, Hq // Hkv, D)   # each KV head's group of query heads, K and V never copied per head
    s = scale * xp.einsum("bkgd,bskd->bkgs", qg, k)  # [B, Hkv, G, S]
    m = s.max(axis=-1, keepdims=True)
    p = xp.exp(s - m)
    l = p.sum(axis=-1)
    o = xp.einsum("bkgs,bskd->bkgd", p, v) / l[..., None]
    lse = m[..., 0] + xp.log(l)
    return o.reshape(B, Hq, v.shape[3]), lse.reshape(B, Hq)


def decode_attention(q, k, v, scale=None):
    """Single-sequence decode attention: q ``[Hq, D]``, k, v ``[S, Hkv, D]`` -> ``(o, lse)``.

    ``o = softmax(scale * q K^T) V`` per query head (GQA: query head ``i`` uses kv head
    ``i // (Hq // Hkv)``); ``o`` is ``[Hq, Dv]`` float64, ``lse`` ``[Hq]`` the natural-log
    logsumexp of the scaled scores. ``scale`` defaults to ``1/sqrt(D)``.
    """
    xp = _array_module(q)
    q, k, v = (xp.asarray(x, dtype=xp.float64) for x in (q, k, v))
    if q.ndim != 2 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"expected q [Hq,D], k/v [S,Hkv,D]; got {q.shape}, {k.shape}, {v.shape}")
    o, lse = batch_decode_attention(q[None], k[None], v[None], scale)
    return o[0], lse[0]


def paged_decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout="NHD",
                           scale=None):
    """Decode attention over a paged cache (FlashInfer's page table): q ``[B, Hq, D]``; request
    ``b`` reads pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` of k/v ``[P, page, Hkv, D]``
    ("NHD") or ``[P, Hkv, page, D]`` ("HND"), all rows but the last page's past
    ``kv_last_page_len[b]``. Page-table arrays on the host. Returns ``(o [B, Hq, D], lse [B, Hq])``
    float64 (on the module of q); a request without pages gives zeros and ``-inf``."""
    xp = _array_module(q)
    if kv_layout == "HND":
        k_cache, v_cache = (xp.swapaxes(x, 1, 2) for x in (k_cache, v_cache))
    outs = []
    for b in range(q.shape[0]):
        pages = np.asarray(kv_indices[kv_indptr[b]:kv_indptr[b + 1]], dtype=np.int64)
        rows = max(len(pages) - 1, 0) * k_cache.shape[1] + (kv_last_page_len[b] if len(pages) else 0)
        k, v = (x[xp.asarray(pages)].reshape((-1,) + tuple(x.shape[2:]))[:rows] for x in (k_cache, v_cache))
        outs.append(decode_attention(q[b], k, v, scale))
    return xp.stack([o for o, _ in outs]), xp.stack([lse for _, lse in outs])


# --------------------------------------------------------------------------------------------
# KDA pieces
# --------------------------------------------------------------------------------------------


def sigmoid(x):
    """Numerically stable float64 logistic function (``sigmoid(-inf) == 0`` exactly)."""
    x = _f64(x)
    return np.exp(-np.logaddexp(0.0, -x))


def softplus(x):
    """``log(1 + exp(x))`` in float64, without overflow."""
    return np.logaddexp(0.0, _f64(x))


def kda_gate(g, A_log, dt_bias, lower_bound, gate="safe"):
    """KDA log-decay (natural log, float64) of one of the gate modes:

    - ``"safe"``: ``lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h]))``, in ``(lower_bound, 0)``;
    - ``"softplus"`` (Kimi Linear's): ``-exp(A_log[h]) * softplus(g + dt_bias[h])``, unbounded below;
    - ``"none"``: ``g`` itself (precomputed by the caller).

    g ``[..., H, K]``; A_log H elements in any shape (None: ``exp(A_log) = 1``); dt_bias ``H*K``
    elements (None: 0). Result has g's shape.
    """
    g = _f64(g)
    if gate == "none":
        return g
    H, K = g.shape[-2:]
    a_exp = np.exp(_f64(A_log).reshape(H))[:, None] if A_log is not None else np.ones((H, 1))
    x = g + (_f64(dt_bias).reshape(H, K) if dt_bias is not None else 0.0)
    if gate == "softplus":
        return -a_exp * softplus(x)
    if gate == "safe":
        return float(lower_bound) * sigmoid(a_exp * x)
    raise ValueError(f"gate must be 'safe', 'softplus' or 'none'; got {gate!r}")


def kda_beta(beta, form="logit"):
    """β from what the caller passed: ``"logit"`` sigmoid, ``"logit2"`` 2·sigmoid, ``"prob"`` as is."""
    if form == "logit":
        return sigmoid(beta)
    if form == "logit2":
        return 2.0 * sigmoid(beta)
    if form == "prob":
        return _f64(beta)
    raise ValueError(f"beta form must be 'logit', 'logit2' or 'prob'; got {form!r}")


def kda_options(flags: dict) -> dict:
    """This module's ``gate``, ``beta_form``, ``qk_norm`` and ``lower_bound`` for a KDA call's
    fla keywords (``use_gate_in_kernel``, ``lower_bound``, ``use_beta_sigmoid_in_kernel``,
    ``allow_neg_eigval``, ``use_qk_l2norm_in_kernel``; absent ones at fla's defaults)."""
    if not flags.get("use_gate_in_kernel"):
        gate = "none"
    else:
        gate = "safe" if flags.get("lower_bound") is not None else "softplus"
    if flags.get("use_beta_sigmoid_in_kernel"):
        beta_form = "logit2" if flags.get("allow_neg_eigval") else "logit"
    else:
        beta_form = "prob"
    return dict(gate=gate, beta_form=beta_form, qk_norm=bool(flags.get("use_qk_l2norm_in_kernel")),
                lower_bound=flags.get("lower_bound"))


def l2_normalize(x, eps=1e-6):
    """``x / sqrt(sum(x**2, -1) + eps)`` in float64."""
    x = _f64(x)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def _kda_prepare(q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, cu_seqlens,
                 gate="safe", beta_form="logit", qk_norm=True):
    """Validate, convert to float64, apply norms/gates; return per-token tensors + sequences.

    Returns ``(qn, kn, v, a, b, scale, S0, seqs)`` where qn, kn, a are ``[B, T, H, K]``,
    v ``[B, T, H, V]``, b ``[B, T, H]``, S0 ``[N, H, V, K]`` and seqs is ``None`` (fixed
    length: sequence n is batch row n) or a list of ``(start, end)`` token ranges of row 0.
    """
    q, k, v, g, beta = _f64(q), _f64(k), _f64(v), _f64(g), _f64(beta)
    if q.ndim != 4:
        raise ValueError(f"q must be [B, T, H, K], got {q.shape}")
    B, T, H, K = q.shape
    if k.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"q, k, g must share a shape: {q.shape}, {k.shape}, {g.shape}")
    if v.ndim != 4 or v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V], got {v.shape}")
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must be [B, T, H], got {beta.shape}")
    V = v.shape[3]
    if scale is None:
        scale = K ** -0.5

    if cu_seqlens is None:
        seqs = None
        N = B
    else:
        if B != 1:
            raise ValueError(f"cu_seqlens needs batch size 1, got B={B}")
        cu = np.asarray(cu_seqlens)
        if cu.ndim != 1 or cu.size < 1 or not np.issubdtype(cu.dtype, np.integer):
            raise ValueError("cu_seqlens must be a 1-D integer array [N+1]")
        if cu[0] != 0 or cu[-1] != T or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at T={T}: {cu}")
        seqs = [(int(cu[i]), int(cu[i + 1])) for i in range(cu.size - 1)]
        N = len(seqs)

    if initial_state is None:
        S0 = np.zeros((N, H, V, K))
    else:
        S0 = _f64(initial_state)
        if S0.shape != (N, H, V, K):
            raise ValueError(f"initial_state must be [N, H, V, K] = {(N, H, V, K)}, got {S0.shape}")
        S0 = S0.copy()

    qn = l2_normalize(q) if qk_norm else q
    kn = l2_normalize(k) if qk_norm else k
    a = kda_gate(g, A_log, dt_bias, lower_bound, gate)
    b = kda_beta(beta, beta_form)
    return qn, kn, v, a, b, float(scale), S0, seqs


def _run_sequences(step_fn, qn, kn, v, a, b, S0, seqs):
    """Apply ``step_fn(qn, kn, v, a, b, S) -> (o, S, *per_token)`` (arrays ``[n, T, H, ...]``) per
    sequence; each per-token result (the states after each token) is placed like ``o``."""
    if seqs is None:
        return step_fn(qn, kn, v, a, b, S0)
    S = np.empty_like(S0)
    per_token = None
    for n, (s, e) in enumerate(seqs):
        sl = (slice(0, 1), slice(s, e))
        o_n, S[n : n + 1], *rest = step_fn(qn[sl], kn[sl], v[sl], a[sl], b[sl], S0[n : n + 1])
        if per_token is None:   # o, then the rest: [1, T, H, ...] each
            per_token = [np.zeros(v.shape[:2] + x.shape[2:]) for x in (o_n, *rest)]
        for whole, part in zip(per_token, (o_n, *rest)):
            whole[sl] = part
    if per_token is None:
        return np.zeros(v.shape), S
    return (per_token[0], S, *per_token[1:])


# --------------------------------------------------------------------------------------------
# KDA: naive recurrence
# --------------------------------------------------------------------------------------------


def kda_recurrent(
    q, k, v, g, beta, *, A_log=None, dt_bias=None, lower_bound=-5.0, scale=None, initial_state=None,
    cu_seqlens=None, gate="safe", beta_form="logit", qk_norm=True, intermediate_states=False,
):
    """Naive per-token KDA recurrence (float64), vectorized over batch and heads.

    q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``, beta ``[B, T, H]``. Per token:
    ``S = S * exp(a)`` (decay along K), ``S += β * outer(v - S k̂, k̂)``,
    ``o = scale * S q̂`` with ``a = kda_gate(g, A_log, dt_bias, lower_bound, gate)``,
    ``β = kda_beta(beta, beta_form)`` and ``q̂, k̂`` L2-normalized (as given when not ``qk_norm``).
    ``scale`` defaults to ``K**-0.5``. With ``cu_seqlens`` (int ``[N+1]``, B must be 1) the
    sequences are the token ranges ``[cu[i], cu[i+1])``; otherwise N = B.
    ``initial_state`` ``[N, H, V, K]`` (None: zeros).
    Returns ``(o [B, T, H, V], final_state [N, H, V, K])``, both float64; with
    ``intermediate_states`` also the state after every token, ``[B, T, H, V, K]`` (speculative
    decode stores each one).
    """
    qn, kn, v, a, b, scale, S0, seqs = _kda_prepare(
        q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, cu_seqlens, gate, beta_form, qk_norm
    )
    decay = np.exp(a)

    def run(qn, kn, v, decay, b, S):
        S = S.copy()  # [n, H, V, K]
        o = np.empty(v.shape)
        states = np.empty(v.shape[:3] + S.shape[-2:]) if intermediate_states else None
        for t in range(v.shape[1]):
            S *= decay[:, t, :, None, :]
            k_t = kn[:, t, :, :, None]  # [n, H, K, 1]
            err = v[:, t] - (S @ k_t)[..., 0]  # [n, H, V]
            S += (b[:, t, :, None] * err)[..., None] * kn[:, t, :, None, :]
            o[:, t] = scale * (S @ qn[:, t, :, :, None])[..., 0]
            if intermediate_states:
                states[:, t] = S
        return (o, S, states) if intermediate_states else (o, S)

    return _run_sequences(run, qn, kn, v, decay, b, S0, seqs)


def kda_affine_map(
    q, k, v, g, beta, *, A_log=None, dt_bias=None, lower_bound=-5.0, cu_seqlens=None, gate="safe", beta_form="logit",
    qk_norm=True,
):
    """The affine map of each sequence's token range (DESIGN.md, "Segments and ranks"): its final
    state from any initial state S0 is ``S0 · M + B`` (per head, states ``[V, K]`` as in
    ``kda_recurrent``). ``B`` is the state reached from zero; ``M`` the identity's rows carried
    through the recurrence with no value term. Inputs as ``kda_recurrent``'s (no ``scale``: the
    map does not depend on q). Returns ``(M [N, H, K, K], B [N, H, V, K])``, float64."""
    _, kn, v, a, b, _, S0, seqs = _kda_prepare(
        q, k, v, g, beta, A_log, dt_bias, lower_bound, None, None, cu_seqlens, gate, beta_form, qk_norm
    )
    decay = np.exp(a)
    N, H, V, K = S0.shape
    ranges = [(n, 0, v.shape[1]) for n in range(N)] if seqs is None else [(0, s, e) for s, e in seqs]
    M = np.broadcast_to(np.eye(K), (N, H, K, K)).copy()
    Bs = np.zeros((N, H, V, K))
    for n, (row, s, e) in enumerate(ranges):
        for t in range(s, e):
            kt = kn[row, t]  # [H, K]
            for S, vt in ((Bs[n], v[row, t]), (M[n], 0.0)):
                S *= decay[row, t][:, None, :]
                err = vt - (S @ kt[:, :, None])[..., 0]
                S += (b[row, t][:, None] * err)[..., None] * kt[:, None, :]
    return M, Bs


# --------------------------------------------------------------------------------------------
# KDA: chunked form
# --------------------------------------------------------------------------------------------


def _neumann_inverse(L):
    """``(I + L)^-1`` for strictly lower-triangular ``L [..., C, C]`` as the product
    ``(I - L)(I + L^2)(I + L^4)...`` = ``I - L^(2^m)``, exact once ``2^m >= C`` (L nilpotent)."""
    C = L.shape[-1]
    eye = np.eye(C)
    A = eye - L
    Lp = L @ L
    p = 2
    while p < C:
        A = A @ (eye + Lp)
        Lp = Lp @ Lp
        p *= 2
    return A


def kda_chunked(
    q, k, v, g, beta, *, A_log=None, dt_bias=None, lower_bound=-5.0, scale=None, initial_state=None,
    cu_seqlens=None, chunk_size=16, gate="safe", beta_form="logit", qk_norm=True,
):
    """Chunked KDA (DESIGN.md's chunked form, as the kernels compute it), float64.

    Same arguments and results as :func:`kda_recurrent`, plus ``chunk_size`` C. Each sequence
    is chunked from its own start; a partial last chunk is padded with ``a = 0, k = 0, v = 0,
    beta = 0`` rows whose outputs are discarded. Per chunk (base 2, ``G = cumsum(a*log2 e)``,
    ``gamma = 2^G_C``, ``D_ij = 2^(G_i - G_j)`` for ``i >= j``: a decay, never a growth factor, so
    any gate works)::

        qd = scale*q̂*2^G   kd = k̂*2^G   kr = k̂*2^(G_C-G)
        L_ij = beta_i sum_d k̂_i k̂_j D_ij (i > j);  A = (I+L)^-1 by the Neumann product
        Mqk_ij = scale sum_d q̂_i k̂_j D_ij (i >= j);  U = A diag(beta) (v - kd S^T)
        o = qd S^T + Mqk U;  S = S diag(gamma) + U^T kr
    """
    C = int(chunk_size)
    if C < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    qn, kn, v, a, b, scale, S0, seqs = _kda_prepare(
        q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, initial_state, cu_seqlens, gate, beta_form, qk_norm
    )
    lower = np.tril(np.ones((C, C), dtype=bool))
    strict = np.tril(np.ones((C, C)), -1)

    def run(qn, kn, v, a, b, S):
        n, T, H, K = qn.shape
        Vd = v.shape[3]
        Tp = -(-T // C) * C  # padded length

        def pad_heads_first(x):  # [n, T, H, ...] -> [n, H, Tp, ...], zero rows past T
            out = np.zeros((n, Tp) + x.shape[2:])
            out[:, :T] = x
            return np.moveaxis(out, 2, 1)

        qn, kn, v, a, b = (pad_heads_first(x) for x in (qn, kn, v, a, b))
        S = S.copy()  # [n, H, V, K]
        o = np.empty((n, H, Tp, Vd))
        for c0 in range(0, Tp, C):
            c = slice(c0, c0 + C)
            G = np.cumsum(a[:, :, c] * _LOG2E, axis=2)  # [n, H, C, K]
            GC = G[:, :, -1:, :]  # [n, H, 1, K]
            qd = scale * qn[:, :, c] * np.exp2(G)
            kd = kn[:, :, c] * np.exp2(G)
            kr = kn[:, :, c] * np.exp2(GC - G)
            diff = G[:, :, :, None, :] - G[:, :, None, :, :]  # [n, H, i, j, K]: G_i - G_j
            D = np.exp2(np.where(lower[:, :, None], diff, -np.inf))  # 0 above the diagonal
            beta_c = b[:, :, c]  # [n, H, C]
            kk = np.einsum("nhid,nhjd,nhijd->nhij", kn[:, :, c], kn[:, :, c], D)
            L = strict * kk * beta_c[..., :, None]
            A = _neumann_inverse(L)
            Mqk = scale * np.einsum("nhid,nhjd,nhijd->nhij", qn[:, :, c], kn[:, :, c], D)
            ST = np.swapaxes(S, -1, -2)  # [n, H, K, V]
            U = A @ (beta_c[..., None] * (v[:, :, c] - kd @ ST))  # [n, H, C, V]
            o[:, :, c] = qd @ ST + Mqk @ U
            S = S * np.exp2(GC) + np.swapaxes(U, -1, -2) @ kr
        return np.moveaxis(o[:, :, :T], 1, 2), S

    return _run_sequences(run, qn, kn, v, a, b, S0, seqs)


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def relative_error(out, ref) -> float:
    """``||out - ref|| / ||ref||`` (Frobenius, float64). Any NaN gives ``inf`` (a failure);
    entries equal in both (including matching infinities) count as zero error; with
    ``ref == 0`` the result is 0 if ``out`` is also 0, else ``inf``."""
    out, ref = _f64(out), _f64(ref)
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: {out.shape} vs {ref.shape}")
    if np.isnan(out).any() or np.isnan(ref).any():
        return float("inf")
    same = out == ref
    diff = np.where(same, 0.0, out - ref)
    if np.isnan(diff).any() or np.isinf(diff).any():
        return float("inf")
    num = float(np.linalg.norm(diff))
    den = float(np.linalg.norm(np.where(np.isinf(ref), 0.0, ref)))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
