"""The accuracy inputs of tests/test_kda_gpu.py and pykda/bench/kda.py, generated the same way with
the same seeds, but on torch's CPU generator (the GPU's Philox stream cannot be reproduced here:
same distributions, different draws).  Each returns a dict of heads-first float64 arrays (the bf16 /
fp32 values the kernels see) and the reference's keywords."""
from __future__ import annotations

import os
import numpy as np
import torch

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache")
bf = torch.bfloat16


def _make(B, T, H, K, seed, state=True):
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s, s_=1.0: s_ * torch.randn(*s, generator=gen)
    x = dict(q=rnd(B, T, H, K).to(bf), k=rnd(B, T, H, K).to(bf), v=rnd(B, T, H, K).to(bf),
             g=rnd(B, T, H, K).to(bf), beta=rnd(B, T, H).to(bf),
             A_log=torch.log(1 + 15 * torch.rand(H, generator=gen)), dt_bias=rnd(H, K, s_=0.5))
    s0 = rnd(B, H, K, K, s_=0.05) if state else None
    return x, s0


def safe_s5(seed=11, T=4096, H=8, K=128):
    """test_long_sequence_accuracy: make(1, 4096, 8, 128, seed=11, fp32 state), safe gate lb -5."""
    x, s0 = _make(1, T, H, K, seed)
    return _pack(x, s0, "safe", -5.0)


def stress(seed=21, dt_bias_scale=3.0, T=4096, H=8, K=128):
    """unbounded_inputs (test_unbounded_gate_accuracy)."""
    x, s0 = _make(1, T, H, K, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    x["A_log"] = torch.log(torch.rand(H, generator=gen) * 8 + 0.5)
    x["dt_bias"] = dt_bias_scale * torch.randn(H, K, generator=gen)
    g = torch.empty(1, T, H, K).uniform_(-10.0, 4.0, generator=gen)
    g[:, 1000:1064] = 1e4
    g[:, 2000:2003, :, :5] = 1e4
    x["g"] = g.to(bf)
    k = x["k"].float()
    k[:, 3000:3100] = k[:, 3000:3001] + 1e-3 * k[:, 3000:3100]
    x["k"] = k.to(bf)
    return _pack(x, s0, "softplus", None)


def bench(gate, seed=1, T=4096, H=8, D=128):
    """bench kda's _accuracy: _inputs(8, [4096], True, seed=1)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)
    x = dict(q=rnd(1, T, H, D).to(bf), k=rnd(1, T, H, D).to(bf), v=rnd(1, T, H, D).to(bf),
             g=rnd(1, T, H, D).to(bf), beta=rnd(1, T, H).to(bf))
    dt = torch.exp(torch.empty(H, D).uniform_(np.log(1e-3), np.log(0.1), generator=g))
    x["A_log"] = torch.log(torch.rand(H, generator=g) * 15 + 1)
    x["dt_bias"] = torch.log(torch.expm1(dt))
    h0 = 0.05 * rnd(1, H, D, D)
    return _pack(x, h0, gate, -5.0 if gate == "safe" else None)


def _pack(x, s0, gate, lb):
    f = lambda t: t.double().numpy()
    hf = lambda t: np.ascontiguousarray(np.moveaxis(f(t)[0], 1, 0))   # [1, T, H, K] -> [H, T, K]
    return dict(q=hf(x["q"]), k=hf(x["k"]), v=hf(x["v"]), g=hf(x["g"]), beta=np.ascontiguousarray(f(x["beta"])[0].T),
                A_log=f(x["A_log"]).astype(np.float32), dt_bias=f(x["dt_bias"]).astype(np.float32).reshape(-1, f(x["q"]).shape[-1]),
                S0=f(s0)[0].astype(np.float32).astype(np.float64), gate=gate, lower_bound=lb)


INPUTS = {
    "stress3": lambda seed=21: stress(seed, 3.0),
    "stress0.1": lambda seed=21: stress(seed, 0.1),
    "safe_s5": lambda seed=11: safe_s5(seed),
    "bench_sp": lambda seed=1: bench("softplus", seed),
    "bench_safe": lambda seed=1: bench("safe", seed),
}
H200 = {"stress3": (2.32e-3, 4.6e-4), "stress0.1": (1.83e-3, 3.9e-4), "safe_s5": (1.82e-3, 3.5e-4),
        "bench_sp": (2.51e-3, 5.4e-4), "bench_safe": (3.17e-3, 1.5e-3)}


def reference(name, x, seed):
    """float64 kda_recurrent (cached on disk): o [H, T, V], S [H, V, K]."""
    from pykda import reference as R
    os.makedirs(CACHE, exist_ok=True)
    path = os.path.join(CACHE, f"{name}_{seed}.npz")
    if os.path.exists(path):
        z = np.load(path)
        return z["o"], z["S"]
    t = lambda a: np.moveaxis(a, 0, 1)[None]   # [H, T, K] -> [1, T, H, K]
    o, S = R.kda_recurrent(t(x["q"]), t(x["k"]), t(x["v"]), t(x["g"]), x["beta"].T[None],
                           A_log=x["A_log"].astype(np.float64), dt_bias=x["dt_bias"].astype(np.float64),
                           lower_bound=x["lower_bound"] if x["lower_bound"] is not None else -5.0,
                           initial_state=x["S0"][None], gate=x["gate"], beta_form="logit", qk_norm=True)
    o = np.ascontiguousarray(np.moveaxis(o[0], 1, 0))
    np.savez(path, o=o, S=S[0])
    return o, S[0]
