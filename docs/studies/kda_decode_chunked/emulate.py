"""NumPy emulation of a chunked KDA decode step of T tokens (issue 11: T = 2-8 on tensor cores),
against the recurrent kernel (kda_decode as it is) and float64. CPU only.

One head, state S [V, K] (V-first), a bf16 pool: each step reads the bf16 state, runs T tokens
and stores the state rounded to bf16. Per token (DESIGN.md): S <- S diag(d_t); u_t = b_t (v_t -
S k_t); S <- S + u_t k_t^T; o_t = scale S q_t.

Chunked form of one step (d_st = prod_{r=s+1..t} d_r, a product: exact zeros stay exact; G_t = d_0t):
  W  = S0 [G_1 k_1 .. G_T k_T]                   mma, S0 the bf16 state as the A operand
  WQ = S0 [G_1 q_1 .. G_T q_T]                   same mma (N = 2T <= 16)
  A_ts = sum_k k_s k_t d_st (s < t),  B_ts = sum_k k_s q_t d_st (s <= t)   per head, T x T
  U  = (I + diag(b) A)^-1 (b (v - W))            the delta rule's triangular solve, per row
  O  = scale (WQ + U B^T)
  S_T = S0 diag(G_T) + U [k_s d_sT]^T            mma (K-dim = T), accumulated onto S0 G_T (fp32)
Rounding hooks: 'x' (operand G k, G q), 's_op' (the state operand: None, the bf16 pool value
itself, exact in a bf16 mma; 'fp16' beside fp16 X), 'u' (operand U of the update), 'kd' (operand
k d_sT), 'acc' fp32 accumulators.

    python docs/studies/kda_decode_chunked/emulate.py
prints, per T and input, the output and final-state rel-L2 of both forms against float64.
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

np.seterr(all="ignore")
BF16 = ml_dtypes.bfloat16
ROUND = {"bf16": lambda x: np.asarray(x, np.float64).astype(BF16).astype(np.float64),
         "fp16": lambda x: np.asarray(x, np.float64).astype(np.float16).astype(np.float64),
         "fp32": lambda x: np.asarray(x, np.float64).astype(np.float32).astype(np.float64),
         None: lambda x: np.asarray(x, np.float64)}


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def inputs(T, K, seed, kind):
    """q, k (L2-normalised), v, per-token decays d [T, K] and beta [T], as the gate modes make them."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, K)); k = rng.standard_normal((T, K))
    q /= np.linalg.norm(q, axis=1, keepdims=True); k /= np.linalg.norm(k, axis=1, keepdims=True)
    q, k = ROUND["bf16"](q), ROUND["bf16"](k)
    v = ROUND["bf16"](rng.standard_normal((T, K)))
    beta = 1 / (1 + np.exp(-rng.standard_normal(T)))
    g = rng.standard_normal((T, K))
    dt_bias = (3.0 if kind == "softplus-3sigma" else 0.1) * np.random.default_rng(1000 + seed).standard_normal(K)
    a = -np.exp(0.0) * np.log1p(np.exp(g + dt_bias))          # Kimi Linear's gate, A_log = 0
    if kind == "steep":                                         # log-decays down to -60, some exactly 0 decay
        a = a * 20
        a[rng.random((T, K)) < 0.1] = -np.inf
    return q, k, v, np.exp(a), beta


def recurrent_step(S, q, k, v, d, beta, scale, acc="fp32"):
    """The recurrent kernel: fp32 registers, token by token."""
    r = ROUND[acc]
    S = S.copy(); outs = []
    for t in range(len(beta)):
        S = r(S * d[t])
        u = r(beta[t] * (v[t] - r(S @ k[t])))
        S = r(S + np.outer(u, k[t]))
        outs.append(r(scale * (S @ q[t])))
    return S, np.array(outs)


def chunked_step(S0, q, k, v, d, beta, scale, x="bf16", u_op="bf16", kd="bf16", acc="fp32", s_op=None):
    T, K = k.shape
    r = ROUND[acc]
    dd = np.ones((T + 1, T + 1, K))   # dd[s, t] = prod_{r=s+1..t} d_r (1-based tokens; s = 0: from the start)
    for s in range(T + 1):
        for t in range(s + 1, T + 1):
            dd[s, t] = dd[s, t - 1] * d[t - 1]
    G = np.array([dd[0, t + 1] for t in range(T)])              # [T, K]
    Xk, Xq = ROUND[x](G * k), ROUND[x](G * q)
    Sx = ROUND[s_op](S0)                                        # the state operand (fp16 beside fp16 X)
    W, WQ = r(Sx @ Xk.T), r(Sx @ Xq.T)                          # [V, T]
    A = np.zeros((T, T)); B = np.zeros((T, T))
    for t in range(T):
        for s in range(T):
            if s < t:
                A[t, s] = r(np.sum(k[s] * k[t] * dd[s + 1, t + 1]))
            if s <= t:
                B[t, s] = r(np.sum(k[s] * q[t] * dd[s + 1, t + 1]))
    M = r(np.linalg.inv(np.eye(T) + beta[:, None] * A))         # forward substitution in fp32, per head
    R = r(beta[None, :] * (v.T - W))                            # [V, T]
    U = r(R @ M.T)
    O = r(scale * (WQ + U @ B.T))
    Kd = ROUND[kd](np.array([k[s] * dd[s + 1, T] for s in range(T)]))   # [T, K]
    S = r(r(S0 * G[-1]) + ROUND[u_op](U) @ Kd)
    return S, O.T


def run(T, steps, seed, kind, pool="bf16", **ops):
    K = 128
    rng = np.random.default_rng(seed)
    S_true = rng.standard_normal((K, K)) * 0.1
    S_rec = S_chk = ROUND[pool](S_true)
    S_true = S_rec.copy()
    scale = K ** -0.5
    e_out = {"rec": [], "chk": []}
    for n in range(steps):
        q, k, v, d, beta = inputs(T, K, seed * 1000 + n, kind)
        S_true, o_true = recurrent_step(S_true, q, k, v, d, beta, scale, acc=None)
        S_rec, o_rec = recurrent_step(S_rec, q, k, v, d, beta, scale)
        S_chk, o_chk = chunked_step(S_chk, q, k, v, d, beta, scale, **ops)
        S_rec, S_chk = ROUND[pool](S_rec), ROUND[pool](S_chk)   # the pool's dtype
        e_out["rec"].append(rel(ROUND["bf16"](o_rec), o_true))
        e_out["chk"].append(rel(ROUND["bf16"](o_chk), o_true))
    return (np.mean(e_out["rec"]), np.mean(e_out["chk"]), rel(S_rec, S_true), rel(S_chk, S_true))


def exact_algebra():
    """With every hook off the chunked step is the recurrence (checks the algebra)."""
    worst = 0.0
    for T in (1, 2, 3, 5, 8):
        for kind in ("softplus", "steep"):
            q, k, v, d, beta = inputs(T, 128, 7, kind)
            S0 = np.random.default_rng(3).standard_normal((128, 128))
            S1, o1 = recurrent_step(S0, q, k, v, d, beta, 0.1, acc=None)
            S2, o2 = chunked_step(S0, q, k, v, d, beta, 0.1, x=None, u_op=None, kd=None, acc=None)
            worst = max(worst, rel(S2, S1), rel(o2, o1))
    return worst


if __name__ == "__main__":
    print(f"chunked step == recurrence in float64 (T 1..8, zero decays included): worst rel {exact_algebra():.1e}")
    print(f"{'T':>2} {'input':>16} {'operands x/u/kd':>21} | {'out rec':>8} {'out chk':>8} | {'state rec':>9} {'state chk':>9}"
          "   (64 steps, bf16 pool; rel-L2 vs float64, outputs averaged over steps)")
    for ops in (dict(x="bf16", u_op="bf16", kd="bf16"), dict(x="fp16", u_op="fp16", kd="fp16", s_op="fp16"),
                dict(x="bf16", u_op="fp16", kd="fp16")):
        label = "/".join(ops[h] for h in ("x", "u_op", "kd")) + ("" if ops.get("s_op") else " S=bf16")
        for T in (1, 2, 4, 8):
            for kind in ("softplus", "softplus-3sigma", "steep"):
                res = [run(T, 64, seed, kind, **ops) for seed in (1, 2)]
                er, ec, sr, sc = np.mean(res, axis=0)
                print(f"{T:>2} {kind:>16} {label:>21} | {er:8.2e} {ec:8.2e} | {sr:9.2e} {sc:9.2e}", flush=True)
    print("fp32 pool (the state stored in fp32), operands fp16, state operand fp16:")
    for T in (1, 4, 8):
        for kind in ("softplus", "softplus-3sigma", "steep"):
            res = [run(T, 64, seed, kind, pool="fp32", x="fp16", u_op="fp16", kd="fp16", s_op="fp16") for seed in (1, 2)]
            er, ec, sr, sc = np.mean(res, axis=0)
            print(f"{T:>2} {kind:>16} {'fp32 pool':>21} | {er:8.2e} {ec:8.2e} | {sr:9.2e} {sc:9.2e}", flush=True)
