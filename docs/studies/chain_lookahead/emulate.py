"""The recurrence's dataflow in NumPy, with fp16 roundings where kda_recurrence rounds: main's loop
against lookahead.patch's, each against the same chunk recurrence in float64 (one head, one sequence).
It answers, before any GPU run, how much the lookahead's different roundings (γ⊙kd and Rᵀ = kd·krᵀ in
fp16, instead of the updated state) move the output and the final state.

    python docs/studies/chain_lookahead/emulate.py
"""
import numpy as np

f16 = lambda x: x.astype(np.float16).astype(np.float32)   # noqa: E731
f32 = lambda x: x.astype(np.float32)                       # noqa: E731


def chunk_records(q, k, a, beta, C, scale):
    """Per chunk: kd, qd, kr (fp16 as the record), Ab, Mqk (fp16), γ (fp32); exact float64 besides."""
    recs = []
    for c0 in range(0, len(q), C):
        qc, kc, ac, bc = q[c0:c0 + C], k[c0:c0 + C], a[c0:c0 + C], beta[c0:c0 + C]
        G = np.cumsum(ac, 0)                      # log2 decays, [C, K]
        kd, qd = kc * 2.0 ** G, scale * qc * 2.0 ** G
        kr = kc * 2.0 ** (G[-1] - G)
        D = 2.0 ** (G[:, None, :] - G[None, :, :])                  # [i, j, d], i >= j used only
        L = np.tril(bc[:, None] * np.einsum("id,jd,ijd->ij", kc, kc, D), -1)
        M = np.tril(scale * np.einsum("id,jd,ijd->ij", qc, kc, D))
        Ab = np.linalg.inv(np.eye(len(qc)) + L) * bc[None, :]
        recs.append(dict(kd=kd, qd=qd, kr=kr, Ab=Ab, M=M, g=2.0 ** G[-1]))
    return recs


def exact(recs, v, S, C):
    out = []
    for c, r in enumerate(recs):
        vc = v[c * C:(c + 1) * C]
        U = r["Ab"] @ (vc - r["kd"] @ S.T)
        out.append(r["qd"] @ S.T + r["M"] @ U)
        S = S * r["g"][None, :] + U.T @ r["kr"]
    return np.concatenate(out), S


def main_loop(recs, v, S, C):
    """main: W and O from fp16(S) each chunk; U, then S = S·γ + fp16(U)ᵀ·kr (fp32)."""
    S = f32(S)
    out = []
    for c, r in enumerate(recs):
        kd, qd, kr, Ab, M = (f16(r[x]) for x in ("kd", "qd", "kr", "Ab", "M"))
        Sh = f16(S)
        W, O = kd @ Sh.T, qd @ Sh.T
        X = f16(f16(v[c * C:(c + 1) * C]) - W)
        Uh = f16(Ab @ X)
        out.append(O + M @ Uh)
        S = f32(S * f32(r["g"])[None, :] + Uh.T @ kr)
    return np.concatenate(out), S


def lookahead_loop(recs, v, S, C):
    """lookahead.patch: O_c and W_{c+1} from the same fp16(S_c); W_{c+1} = fp16(S_c)·fp16(γ_c⊙kd_{c+1})ᵀ
    + fp16(U_c)·fp16(kd_{c+1}·kr_cᵀ)ᵀ (the producer's product, fp32 sums rounded to fp16)."""
    S = f32(S)
    out = []
    W = f16(recs[0]["kd"]) @ f16(S).T
    for c, r in enumerate(recs):
        kd, qd, kr, Ab, M = (f16(r[x]) for x in ("kd", "qd", "kr", "Ab", "M"))
        Sh = f16(S)
        X = f16(f16(v[c * C:(c + 1) * C]) - W)
        Uh = f16(Ab @ X)
        out.append(qd @ Sh.T + M @ Uh)
        if c + 1 < len(recs):
            kd1 = f16(recs[c + 1]["kd"])
            kdg = f16(kd1 * f32(r["g"])[None, :])
            R = f16(kd1 @ kr.T)                      # [C_{c+1}, C_c]
            W = kdg @ Sh.T + R @ Uh
        S = f32(S * f32(r["g"])[None, :] + Uh.T @ kr)
    return np.concatenate(out), S


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def case(T, K, C, gate_scale, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(T, K)), rng.normal(size=(T, K))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.normal(size=(T, K))
    a = -gate_scale * np.log2(np.e) * np.log1p(np.exp(rng.normal(size=(T, K)) - 2.0))   # softplus-gate decays
    beta = 1.0 / (1.0 + np.exp(-rng.normal(size=T)))
    S0 = 0.1 * rng.normal(size=(K, K))
    recs = chunk_records(q, k, a, beta, C, K ** -0.5)
    o_ref, s_ref = exact(recs, v, S0, C)
    o_m, s_m = main_loop(recs, v, S0, C)
    o_l, s_l = lookahead_loop(recs, v, S0, C)
    return rel(o_m, o_ref), rel(s_m, s_ref), rel(o_l, o_ref), rel(s_l, s_ref), rel(o_l, o_m)


if __name__ == "__main__":
    print(f"{'T':>6} {'gate x':>6} | {'main out':>9} {'state':>9} | {'lookahead out':>13} {'state':>9} | {'lookahead vs main':>17}")
    for T, gs in [(1024, 1.0), (4096, 1.0), (4096, 0.1), (4096, 8.0)]:
        r = case(T, 128, 16, gs, seed=T + int(10 * gs))
        print(f"{T:>6} {gs:>6} | {r[0]:9.2e} {r[1]:9.2e} | {r[2]:13.2e} {r[3]:9.2e} | {r[4]:17.2e}")
