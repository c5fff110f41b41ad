"""NumPy emulation of pykda's KDA prefill (kda_prepare + kda_recurrence [+ segment passes]) with a
rounding hook at every place the kernels round.  CPU only; float64 underneath, each hook rounds a
value to the format the kernel stores / feeds it in (ml_dtypes / numpy RN-even, as cvt.rn).

Hooks (cfg keys) and the kernel's format (DEFAULT):
  gate  'fp32'  gate (softplus/sigmoid on the kernel's fp32 formulas), log2-domain cumsum G, the
                per-form decay sums (suffix R, level factors), exp2 (fp32, ftz), gamma
  norm  'fp32'  L2 norms, scale, beta = sigmoid
  prep  'fp32'  prepare's products: qd/kd/ki/kr/kx in fp32, L and Mqk as bf16 hi+lo split mma
                (hi*hi + hi*lo + lo*hi, fp32 accumulate per k16 step), forward substitution fp32
  qd    'bf16'  record qd (operand of S*qd^T)
  kd    'bf16'  record kd (operand of S*kd^T)
  kr    'fp16'  record kr (operand of U^T*kr)
  ab    'fp16'  record (I+L)^-1 diag(beta)
  mqk   'fp16'  record Mqk
  sw    'bf16'  state operand of W^T = S*kd^T  ('bf16x2': SPLIT_S hi+lo, 'fp16', 'fp16x2', 'tf32', None)
  so    'bf16'  state operand of O^T = S*qd^T
  x     'fp16'  X^T = v^T - W^T operand
  u     'fp16'  U^T operand (of U*Mqk^T and U^T*kr)
  acc   'fp32'  every mma accumulator (fp32, rounded after each k16 mma), the fp32 state S*gamma
  out   'bf16'  the output
A hook set to None is full precision (float64).  With every hook None the emulator is the float64
chunked form (checks the algebra vs pykda.reference.kda_recurrent).
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

BF16 = ml_dtypes.bfloat16
LOG2E = 1.4426950408889634
GROWTH_LIMIT = 120.0
HOOKS = ("gate", "norm", "prep", "qd", "kd", "kr", "ab", "mqk", "sw", "so", "x", "u", "acc", "out")
DEFAULT = dict(gate="fp32", norm="fp32", prep="fp32", qd="bf16", kd="bf16", kr="fp16", ab="fp16", mqk="fp16",
               sw="bf16", so="bf16", x="fp16", u="fp16", acc="fp32", out="bf16")
EXACT = {h: None for h in HOOKS}

np.seterr(all="ignore")


def f32(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def bf16(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(BF16).astype(np.float64)


def fp16(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def tf32(x):  # RN to 10 explicit mantissa bits (cvt.rna.tf32 rounds ties away; immaterial here)
    x32 = np.asarray(x, np.float64).astype(np.float32)
    b = x32.view(np.uint32).astype(np.uint64)
    b = ((b + 0xFFF + ((b >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32)
    return b.view(np.float32).astype(np.float64)


def rnd(x, fmt):
    if fmt is None:
        return x
    if fmt == "fp32":
        return f32(x)
    if fmt == "bf16":
        return bf16(x)
    if fmt == "fp16":
        return fp16(x)
    if fmt == "tf32":
        return tf32(x)
    if fmt == "bf16x2":      # hi + lo, both bf16 (what SPLIT_S feeds the mma)
        hi = bf16(x)
        return hi + bf16(x - hi)
    if fmt == "fp16x2":
        hi = fp16(x)
        return hi + fp16(x - hi)
    if callable(fmt):
        return fmt(x)
    raise ValueError(fmt)


def exp2_32(x):
    """ex2.approx.ftz: modelled as exact 2^x rounded to fp32, results below 2^-126 flushed to 0."""
    y = f32(np.exp2(x))
    return np.where(y < 2.0 ** -126, 0.0, y)


# --------------------------------------------------------------------------------------------
# kda_prepare
# --------------------------------------------------------------------------------------------

def _log2_softplus32(x):
    x = x.astype(np.float32)
    L = np.float32(LOG2E)
    xl = x * L
    y = np.exp2(xl).astype(np.float32)
    y = np.where(y < np.float32(2.0 ** -126), np.float32(0), y).astype(np.float32)
    series = y * (L - y * (np.float32(0.5) * L - y * (L / np.float32(3.0))))
    logged = np.log2(np.float32(1) + y)
    below = np.where(x < -4, series, logged)
    return np.where(x > 15, xl, below).astype(np.float32)


def gate_log2(g, A_log, dt_bias, gate, lower_bound, fp32):
    """[H, T, K] log2-decays a*log2(e)."""
    H = g.shape[0]
    aexp64 = np.exp(A_log.astype(np.float64)).reshape(H, 1, 1) if A_log is not None else np.ones((H, 1, 1))
    dtb = dt_bias.reshape(H, 1, -1).astype(np.float64) if dt_bias is not None else 0.0
    if not fp32:
        x = g + dtb
        if gate == "softplus":
            return -aexp64 * np.logaddexp(0.0, x) * LOG2E
        if gate == "safe":
            return lower_bound * LOG2E * np.exp(-np.logaddexp(0.0, -aexp64 * x))
        return g * LOG2E
    g32 = g.astype(np.float32)
    x = (g32 + np.asarray(dtb, np.float32)).astype(np.float32)
    aexp = np.float32(1) if A_log is None else np.exp(A_log.astype(np.float32)).astype(np.float32).reshape(H, 1, 1)
    if gate == "softplus":
        return (-aexp * _log2_softplus32(x)).astype(np.float64)
    if gate == "safe":
        arg = (aexp * x).astype(np.float32)
        e = np.exp2((-arg * np.float32(LOG2E)).astype(np.float32)).astype(np.float32)
        s = (np.float32(1) / (np.float32(1) + e)).astype(np.float32)
        return (np.float32(lower_bound) * np.float32(LOG2E) * s).astype(np.float64)
    return (g32 * np.float32(LOG2E)).astype(np.float64)


def split_dot(A, B, fp32, acc32):
    """sum_d A[..., i, d] B[..., j, d] as kda_prepare's mma: bf16 hi + lo of both operands
    (hi*hi into acc, hi*lo + lo*hi into acc2, fp32 per k16 step), acc + acc2."""
    if not fp32:
        return np.einsum("...id,...jd->...ij", A, B)
    A, B = f32(A), f32(B)
    ah, bh = bf16(A), bf16(B)
    al, bl = bf16(A - ah), bf16(B - bh)
    K = A.shape[-1]
    acc = np.zeros(A.shape[:-1] + (B.shape[-2],))
    acc2 = np.zeros_like(acc)
    for k0 in range(0, K, 16):
        s = slice(k0, k0 + 16)
        mm = lambda x, y: np.einsum("...id,...jd->...ij", x[..., s], y[..., s])
        acc = f32(acc + mm(ah, bh))
        acc2 = f32(acc2 + mm(ah, bl))
        acc2 = f32(acc2 + mm(al, bh))
    return f32(acc + acc2)


def prepare(q, k, g, beta, A_log, dt_bias, gate, lower_bound, scale, cfg, C=16, stats=None):
    """q, k, g [H, T, K] (bf16 values as float64), beta [H, T] (bf16 logits): the records as
    dict of [H, NC, ...] arrays, each already rounded as the record stores it."""
    H, T, K = q.shape
    NC = T // C
    G32, N32, P32 = cfg["gate"] == "fp32", cfg["norm"] == "fp32", cfg["prep"] == "fp32"
    rp = f32 if P32 else (lambda x: x)
    rg = f32 if G32 else (lambda x: x)
    e2 = exp2_32 if G32 else np.exp2
    # norms, scale, beta
    if N32:
        q32, k32 = q.astype(np.float32), k.astype(np.float32)
        sq = np.sum(q32 * q32, -1, dtype=np.float32)
        sk = np.sum(k32 * k32, -1, dtype=np.float32)
        rq = (np.float32(1) / np.sqrt(sq + np.float32(1e-6))).astype(np.float32) * np.float32(scale)
        rk = (np.float32(1) / np.sqrt(sk + np.float32(1e-6))).astype(np.float32)
        qn = (q32 * rq[..., None]).astype(np.float64)
        kn = (k32 * rk[..., None]).astype(np.float64)
        b32 = beta.astype(np.float32)
        bt = (np.float32(1) / (np.float32(1) + np.exp(-b32))).astype(np.float64)
    else:
        qn = scale * q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6)
        kn = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
        bt = np.exp(-np.logaddexp(0.0, -beta))
    a = gate_log2(g, A_log, dt_bias, gate, lower_bound, G32)
    rs = lambda x: x.reshape(H, NC, C, *x.shape[2:])
    qn, kn, a, bt = rs(qn), rs(kn), rs(a), rs(bt)
    # G: sequential fp32 cumsum
    if G32:
        G = np.cumsum(a.astype(np.float32), axis=2, dtype=np.float32).astype(np.float64)
    else:
        G = np.cumsum(a, axis=2)
    GC = G[:, :, -1, :]
    gamma = rg(np.exp2(GC))
    growth = np.all(GC >= -GROWTH_LIMIT, axis=-1)          # [H, NC] (NaN -> growth-free)
    eG = e2(G)
    qd = rp(qn * eG)
    kd = rp(kn * eG)
    lower = np.tril(np.ones((C, C), bool))
    strict = np.tril(np.ones((C, C), bool), -1)
    Lm = np.zeros((H, NC, C, C))
    Mq = np.zeros((H, NC, C, C))
    kr = np.zeros_like(kd)
    # ---- growth-factor form ----
    gi = np.nonzero(growth)
    if gi[0].size:
        kn_g, qd_g, kd_g, G_g = kn[gi], qd[gi], kd[gi], G[gi]
        ki = rp(kn_g * e2(-G_g))
        kr[gi] = rp(ki * gamma[gi][:, None, :])
        Lv = split_dot(kd_g, ki, P32, True)
        Mv = split_dot(qd_g, ki, P32, True)
        Lm[gi] = np.where(strict, rp(Lv * bt[gi][:, :, None]), 0.0)
        Mq[gi] = np.where(lower, Mv, 0.0)
    # ---- growth-free form ----
    fi = np.nonzero(~growth)
    if fi[0].size:
        a_f, kn_f, qn_f = a[fi], kn[fi], qn[fi]                          # [n, C, K]
        if G32:
            a32 = a_f.astype(np.float32)
            R = np.zeros_like(a32)
            s = np.zeros(a32[:, 0].shape, np.float32)
            for m in range(C - 1, -1, -1):
                R[:, m] = s
                s = (s + a32[:, m]).astype(np.float32)
            R = R.astype(np.float64)
        else:
            R = np.cumsum(a_f[:, ::-1], axis=1)[:, ::-1] - a_f
        kr[fi] = rp(kn_f * e2(R))
        es = e2(a_f)
        LEAF = 8
        Lf = np.zeros((a_f.shape[0], C, C))
        Mf = np.zeros_like(Lf)
        bt_f = bt[fi]
        # leaf pairs: E_ij = prod_{m=j+1..i} 2^a_m (fp32 walk), sums over d in fp32 (one rounding)
        for i in range(C):
            leaf0 = i & ~(LEAF - 1)
            E = np.ones_like(kn_f[:, 0])
            Mf[:, i, i] = rp(np.sum(qn_f[:, i] * kn_f[:, i], -1))
            for j in range(i - 1, leaf0 - 1, -1):
                E = rg(E * es[:, j + 1])
                w = rp(kn_f[:, j] * E)
                Lf[:, i, j] = rp(rp(np.sum(kn_f[:, i] * w, -1)) * bt_f[:, i])
                Mf[:, i, j] = rp(np.sum(qn_f[:, i] * w, -1))
        # level pairs (C = 16: one level, r = 8): rows i >= 8 get 2^(sum_{8<m<=i} a), rows j < 8 2^(sum_{j<m<=8} a)
        assert C == 16
        r = 8
        S = np.zeros_like(a_f)
        s = np.zeros_like(a_f[:, 0])
        for i in range(r, C):
            if i > r:
                s = rg(s + a_f[:, i])
            S[:, i] = s
        s = np.zeros_like(a_f[:, 0])
        for j in range(r - 1, -1, -1):
            s = rg(s + a_f[:, j + 1])
            S[:, j] = s
        f = e2(S)
        kx, qx = rp(kn_f * f), rp(qn_f * f)
        Lv = split_dot(kx[:, r:], kx[:, :r], P32, True)
        Mv = split_dot(qx[:, r:], kx[:, :r], P32, True)
        Lf[:, r:, :r] = rp(Lv * bt_f[:, r:, None])
        Mf[:, r:, :r] = Mv
        Lm[fi], Mq[fi] = Lf, Mf
    # (I + L)^-1 by forward substitution (fp32), Ab = A diag(beta)
    if P32:
        Ainv = np.zeros_like(Lm)
        eye = np.eye(C)
        for i in range(C):
            s = np.broadcast_to(eye[i], Lm.shape[:-2] + (C,)).copy()
            for j in range(i):
                s = f32(s - f32(Lm[..., i, j, None] * Ainv[..., j, :]))
            Ainv[..., i, :] = s
        ab = f32(Ainv * bt[..., None, :])
    else:
        Ainv = np.linalg.inv(np.eye(C) + Lm)
        ab = Ainv * bt[..., None, :]
    if stats is not None:
        stats.update(growth_frac=float(growth.mean()), ab_max=float(np.abs(ab).max()), mqk_max=float(np.abs(Mq).max()),
                     kr_max=float(np.abs(kr).max()), qd_max=float(np.abs(qd).max()), kd_max=float(np.abs(kd).max()),
                     kr_sub=float(np.mean((np.abs(kr) < 2.0 ** -14) & (kr != 0))),
                     qd_sub=float(np.mean((np.abs(qd) < 2.0 ** -14) & (qd != 0))),
                     kd_sub=float(np.mean((np.abs(kd) < 2.0 ** -14) & (kd != 0))),
                     qd_min_nz=float(np.abs(qd[qd != 0]).min()) if np.any(qd != 0) else 0.0)
    return dict(qd=rnd(qd, cfg["qd"]), kd=rnd(kd, cfg["kd"]), kr=rnd(kr, cfg["kr"]), ab=rnd(ab, cfg["ab"]),
                mqk=rnd(Mq, cfg["mqk"]), gamma=gamma, growth=growth)


# --------------------------------------------------------------------------------------------
# kda_recurrence
# --------------------------------------------------------------------------------------------

def mma(acc, A, B, acc32, sets=1):
    """acc + A @ B ([..., R, k] @ [..., k, n]) as a chain of k16 mma.sync with fp32 accumulators;
    sets = 2: even and odd k-steps into two accumulators, summed at the end (kda_recurrence's W, O)."""
    if not acc32:
        return acc + A @ B
    k = A.shape[-1]
    accs = [acc] + [np.zeros_like(acc) for _ in range(sets - 1)]
    for n, k0 in enumerate(range(0, k, 16)):
        s = slice(k0, k0 + 16)
        accs[n % sets] = f32(accs[n % sets] + A[..., s] @ B[..., s, :])
    out = accs[0]
    for x in accs[1:]:
        out = f32(out + x)
    return out


def recurrence(rec, v, S0, cfg, want_out=True, stats=None):
    """One chain per leading index. rec: dict of [Bc, n, ...]; v [Bc, n, C, R] (v^T rows, 0 for M
    rows); S0 [Bc, R, K] fp32.  Returns (o [Bc, n, C, R] or None, S [Bc, R, K])."""
    acc32 = cfg["acc"] == "fp32"
    S = f32(S0) if acc32 else S0.copy()
    Bc, n, C, R = v.shape
    o_all = np.zeros((Bc, n, C, R)) if want_out else None
    zero = lambda c: np.zeros((Bc, R, c))
    xmax = umax = smax = 0.0
    for c in range(n):
        qd, kd, kr, ab, mqk, gm = (rec[x][:, c] for x in ("qd", "kd", "kr", "ab", "mqk", "gamma"))
        sw = rnd(S, cfg["sw"])
        W = mma(zero(C), sw, np.swapaxes(kd, -1, -2), acc32, sets=2)              # [Bc, R, C]
        X = rnd(np.swapaxes(v[:, c], -1, -2) - W, cfg["x"])                        # X^T [Bc, R, C]
        U = mma(zero(C), X, np.swapaxes(ab, -1, -2), acc32)                        # U^T = X^T Ab^T
        Uo = rnd(U, cfg["u"])
        if want_out:
            so = rnd(S, cfg["so"])
            O = mma(zero(C), so, np.swapaxes(qd, -1, -2), acc32, sets=2)
            O = mma(O, Uo, np.swapaxes(mqk, -1, -2), acc32)
            o_all[:, c] = np.swapaxes(rnd(O, cfg["out"]), -1, -2)
        S = S * gm[:, None, :]
        if acc32:
            S = f32(S)
        S = mma(S, Uo, kr, acc32)
        if stats is not None:
            xmax, umax, smax = max(xmax, np.abs(X).max()), max(umax, np.abs(U).max()), max(smax, np.abs(S).max())
    if stats is not None:
        stats.update(x_max=max(stats.get("x_max", 0), float(xmax)), u_max=max(stats.get("u_max", 0), float(umax)),
                     s_max=max(stats.get("s_max", 0), float(smax)))
    return o_all, S


def chunk_kda_emu(q, k, v, g, beta, A_log, dt_bias, S0, gate, lower_bound=-5.0, scale=None, cfg=None, C=16,
                  segment_chunks=0, stats=None, rec=None):
    """Inputs heads-first: q, k, v, g [H, T, K], beta [H, T], S0 [H, V, K].  segment_chunks > 0:
    pass 1 ([B; M] maps of every segment but the last), the fp32-accurate scan, pass 2 (as
    chunk_kda plans T=4096 H=8 on the H200: 4 segments of 64 chunks).  Returns (o [H, T, V], S)."""
    cfg = dict(DEFAULT if cfg is None else cfg)
    H, T, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    if rec is None:
        rec = prepare(q, k, g, beta, A_log, dt_bias, gate, lower_bound, scale, cfg, C, stats)
    NC = T // C
    vv = v.reshape(H, NC, C, V)
    acc32 = cfg["acc"] == "fp32"
    if not segment_chunks:
        o, S = recurrence(rec, vv, S0, cfg, True, stats)
        return o.reshape(H, T, V), S
    seg = segment_chunks
    nseg = -(-NC // seg)
    assert NC % seg == 0
    segrec = {x: rec[x].reshape(H, nseg, seg, *rec[x].shape[2:]) for x in ("qd", "kd", "kr", "ab", "mqk", "gamma")}
    pick = lambda js: {x: segrec[x][:, js].reshape(H * len(js), seg, *segrec[x].shape[3:]) for x in segrec}
    vs = vv.reshape(H, nseg, seg, C, V)
    # pass 1: segments 0 .. nseg-2 on [B; M]: B rows from S0 (segment 0) or zero, M rows from I, v = 0 there
    js = list(range(nseg - 1))
    start = np.zeros((H, len(js), V + K, K))
    start[:, 0, :V] = S0
    start[:, :, V:] = np.eye(K)
    vp = np.zeros((H, len(js), seg, C, V + K))
    vp[..., :V] = vs[:, js]
    _, maps = recurrence(pick(js), vp.reshape(H * len(js), seg, C, V + K), start.reshape(H * len(js), V + K, K), cfg,
                         False, stats)
    maps = maps.reshape(H, len(js), V + K, K)
    # scan (fp32-accurate hi+lo products: modelled as exact products rounded to fp32)
    starts = [S0, maps[:, 0, :V]]
    for j in range(1, nseg - 1):
        nxt = starts[-1] @ maps[:, j, V:] + maps[:, j, :V]
        starts.append(f32(nxt) if acc32 else nxt)
    starts = np.stack(starts, 1)                                   # [H, nseg, V, K]
    o, S = recurrence(pick(list(range(nseg))), vs.reshape(H * nseg, seg, C, V), starts.reshape(H * nseg, V, K), cfg,
                      True, stats)
    o = o.reshape(H, nseg * seg * C, V)
    S = S.reshape(H, nseg, V, K)[:, -1]
    return o, S
