"""NumPy emulation of the KDA decode step on a bf16 pool with the state arithmetic in packed fp16
(HMUL2 / HFMA2: two state elements an instruction), against the recurrent kernel as it is
(fp32 registers) and float64. CPU only; about two minutes.

The kernel's V-first step, per token (kda_decode.cu.j2): a lane holds ELEMS = 8 consecutive key
elements of RPT rows; q, k raw (the norms folded into q_inv, k_inv);
  S <- S * d                               (per element)
  sk, sq = sum_e S[e] k[e], sum_e S[e] q[e] (a lane's 8 products, then a shuffle sum over 16 lanes)
  u = beta (v - sk k_inv);  S <- S + (u k_inv) k;  o = sq q_inv + u (k^ . q^)
The packed form rounds S * d, each FMA of the lane's partial sums (two half2 chains of four
products, added in fp32 before the shuffles) and the update's FMA to fp16; everything else
stays fp32 as now. The bf16 pool is read into fp16 and stored from fp16.

    python docs/studies/kda_decode_half2/emulate.py
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

np.seterr(all="ignore")
BF16 = ml_dtypes.bfloat16
K, ELEMS = 128, 8


def bf16(x):
    return np.asarray(x, np.float64).astype(BF16).astype(np.float64)


def fp16(x):
    return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)


def fp32(x):
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def inputs(T, seed, kind, v_scale):
    """Raw (un-normalised) bf16 q, k, v, the decays d [T, K] of Kimi Linear's gate and beta [T]."""
    rng = np.random.default_rng(seed)
    q, k = bf16(rng.standard_normal((T, K))), bf16(rng.standard_normal((T, K)))
    v = bf16(v_scale * rng.standard_normal((T, K)))
    beta = 1 / (1 + np.exp(-rng.standard_normal(T)))
    g = rng.standard_normal((T, K))
    a = -np.log1p(np.exp(g + 0.1 * np.random.default_rng(1000 + seed).standard_normal(K)))
    if kind == "steep":   # log-decays down to -60, 10 % exactly 0
        a = a * 20
        a[rng.random((T, K)) < 0.1] = -np.inf
    return q, k, v, np.exp(a), beta


def lane_sums(S, x, half, chains=2):
    """sum_e S[:, e] x[e] as the kernel forms it: per ELEMS = 8 consecutive elements (a V-first
    lane's slice, or 8 key rows of a K-first lane) fp32 FMAs, or `chains` interleaved fp16 chains
    (V-first: the two halves of its pairs; K-first: one chain of 8 rows) added in fp32; then
    those partial sums added in fp32."""
    V = S.shape[0]
    total = np.zeros(V)
    for lane in range(K // ELEMS):
        cols = range(lane * ELEMS, (lane + 1) * ELEMS)
        if half:
            acc = [np.zeros(V) for _ in range(chains)]
            for j, e in enumerate(cols):
                acc[j % chains] = fp16(acc[j % chains] + S[:, e] * fp16(x[e]))
            part = fp32(sum(acc))
        else:
            part = np.zeros(V)
            for e in cols:
                part = fp32(part + S[:, e] * x[e])
        total = fp32(total + part)
    return total


def step(S, q, k, v, d, beta, scale, mode):
    """One decode step of T tokens from state S; mode None (float64), 'fp32' (the kernel), 'half2'
    (V-first) or 'half2-kfirst' (K-first: its column sums' chains run over 8 key rows)."""
    outs = []
    r = fp32 if mode else (lambda x: x)
    for t in range(len(beta)):
        q_inv = scale / np.sqrt(np.sum(q[t] ** 2) + 1e-6)
        k_inv = 1 / np.sqrt(np.sum(k[t] ** 2) + 1e-6)
        qk = np.sum(q[t] * k[t]) * q_inv * k_inv
        if mode is None:
            S = S * d[t]
            sk, sq = S @ k[t], S @ q[t]
        else:
            half, chains = mode.startswith("half2"), 1 if mode == "half2-kfirst" else 2
            S = (fp16 if half else fp32)(S * d[t])
            sk, sq = lane_sums(S, k[t], half, chains), lane_sums(S, q[t], half, chains)
        u = r(beta[t] * (v[t] - r(sk * k_inv)))
        o = r(sq * q_inv + u * qk)
        uk = r(u * k_inv)
        if mode is None:
            S = S + np.outer(uk, k[t])
        elif mode == "fp32":
            S = fp32(S + np.outer(uk, k[t]))
        else:   # uk broadcast as an fp16 pair, one fma.rn.f16x2 per pair
            S = fp16(S + np.outer(fp16(uk), k[t]))
        outs.append(o)
    return S, np.array(outs)


def run(T, steps, seed, kind, v_scale=1.0, s_scale=0.1):
    S0 = bf16(np.random.default_rng(seed).standard_normal((K, K)) * s_scale)
    modes = ("fp32", "half2", "half2-kfirst")
    S = dict.fromkeys(("true",) + modes, S0)
    errs = {m: [] for m in modes}
    for n in range(steps):
        q, k, v, d, beta = inputs(T, seed * 1000 + n, kind, v_scale)
        S["true"], o_true = step(S["true"], q, k, v, d, beta, K ** -0.5, None)
        for m in modes:
            S[m], o = step(S[m], q, k, v, d, beta, K ** -0.5, m)
            S[m] = bf16(S[m])   # the pool
            errs[m].append(rel(bf16(o), o_true))
    return [np.mean(errs[m]) for m in modes] + [rel(S[m], S["true"]) for m in modes]


if __name__ == "__main__":
    print(f"{'T':>2} {'input':>10} {'v scale':>7} | {'out: fp32':>9} {'f16x2':>8} {'K-first':>8} | "
          f"{'state: fp32':>11} {'f16x2':>8} {'K-first':>8}"
          "   (32 steps, bf16 pool; rel-L2 vs float64, outputs averaged over steps, 2 seeds)")
    for T in (1, 4):
        for kind in ("softplus", "steep"):
            for v_scale in (1.0, 30.0):
                res = np.mean([run(T, 32, seed, kind, v_scale) for seed in (1, 2)], axis=0)
                print(f"{T:>2} {kind:>10} {v_scale:7.0f} | {res[0]:9.2e} {res[1]:8.2e} {res[2]:8.2e} | "
                      f"{res[3]:11.2e} {res[4]:8.2e} {res[5]:8.2e}", flush=True)
