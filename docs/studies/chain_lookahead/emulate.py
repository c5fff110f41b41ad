"""lookahead.patch's roundings, emulated: kda_rounding's emulator (`kda_emu`: the records as kda_prepare
rounds them, main's recurrence) beside the recurrence as the patch computes it, both against the float64
chunk recurrence (one sequence, H heads, softplus gate). It answers, before any GPU run, how much
rounding γ⊙kd and Rᵀ = kd·krᵀ to fp16 (instead of the updated state) moves the output and the state.

    PYTHONPATH=. python docs/studies/chain_lookahead/emulate.py
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kda_rounding"))
import kda_emu as E  # noqa: E402

from pykda.reference import relative_error  # noqa: E402

# main's roundings: kda_emu.DEFAULT with S·qdᵀ and S·kdᵀ in fp16 (kda_rounding/range_check.py's FIX)
KERNEL = {**E.DEFAULT, "so": "fp16", "qd": "fp16", "sw": "fp16", "kd": "fp16"}


def recurrence_lookahead(rec, v, S0, cfg):
    """kda_emu.recurrence as lookahead.patch walks it: chunk c's Oᵀ and chunk c + 1's
    Wᵀ = S·(γ_c⊙kd_{c+1})ᵀ + Uᵀ·(kd_{c+1}·kr_cᵀ)ᵀ from one fp16 copy of S (before c's update),
    γ⊙kd and kd·krᵀ rounded to fp16 as the producer warp stores them."""
    T = lambda x: np.swapaxes(x, -1, -2)   # noqa: E731
    Bc, n, C, R = v.shape
    zero = lambda c: np.zeros((Bc, R, c))   # noqa: E731
    S = E.f32(S0)
    W = E.mma(zero(C), E.rnd(S, cfg["sw"]), T(rec["kd"][:, 0]), True)
    o_all = np.zeros((Bc, n, C, R))
    for c in range(n):
        qd, kr, ab, mqk, gm = (rec[x][:, c] for x in ("qd", "kr", "ab", "mqk", "gamma"))
        s16 = E.rnd(S, cfg["sw"])
        U = E.rnd(E.mma(zero(C), E.rnd(T(v[:, c]) - W, cfg["x"]), T(ab), True), cfg["u"])
        O = E.mma(E.mma(zero(C), s16, T(qd), True), U, T(mqk), True)
        o_all[:, c] = T(E.rnd(O, cfg["out"]))
        if c + 1 < n:
            kd1 = rec["kd"][:, c + 1]
            Rt = E.fp16(E.mma(np.zeros((Bc, C, C)), kd1, T(kr), True))
            W = E.mma(E.mma(zero(C), s16, T(E.fp16(kd1 * gm[:, None, :])), True), U, T(Rt), True)
        S = E.mma(E.f32(S * gm[:, None, :]), U, kr, True)
    return o_all, S


def case(T, decay_scale, seed, H=2, K=128, C=16):
    rng = np.random.default_rng(seed)
    q, k, v, g = (E.bf16(rng.normal(size=(H, T, K))) for _ in range(4))
    beta = E.bf16(rng.normal(size=(H, T)))
    A_log = np.log(np.full(H, decay_scale))
    S0 = E.f32(0.1 * rng.normal(size=(H, K, K)))
    args = (q, k, g, beta, A_log, None, "softplus", -5.0, K ** -0.5)
    exact = E.prepare(*args, E.EXACT, C)
    o_ref, s_ref = E.recurrence(exact, v.reshape(H, T // C, C, K), S0, E.EXACT)
    rec = E.prepare(*args, KERNEL, C)
    o_main, s_main = E.recurrence(rec, v.reshape(H, T // C, C, K), S0, KERNEL)
    o_look, s_look = recurrence_lookahead(rec, v.reshape(H, T // C, C, K), S0, KERNEL)
    return [relative_error(*p) for p in ((o_main, o_ref), (s_main, s_ref), (o_look, o_ref), (s_look, s_ref),
                                         (o_look, o_main))]


if __name__ == "__main__":
    print(f"{'T':>6} {'decays':>6} | {'main out':>9} {'state':>9} | {'lookahead out':>13} {'state':>9} | "
          f"{'lookahead vs main':>17}")
    for T, ds in [(1024, 1.0), (4096, 1.0), (4096, 0.1), (4096, 8.0)]:
        r = case(T, ds, seed=T + int(10 * ds))
        print(f"{T:>6} {'x' + str(ds):>6} | {r[0]:9.2e} {r[1]:9.2e} | {r[2]:13.2e} {r[3]:9.2e} | {r[4]:17.2e}")
