"""fp16 range of the state operand: max|S| vs max|X|, max|U| (already fp16 in the kernel) on the
inputs and on long-memory variants (beta logits +4, decays ~1), v scaled up until something overflows."""
import numpy as np
import kda_emu as E, inputs as I
FIX = {**E.DEFAULT, "so": "fp16", "qd": "fp16", "sw": "fp16", "kd": "fp16"}
def go(tag, x, cfg, vs=1.0, H=2):
    st = {}
    sl = lambda a: a[:H]
    o, S = E.chunk_kda_emu(sl(x["q"]), sl(x["k"]), E.bf16(vs * sl(x["v"])), sl(x["g"]), x["beta"][:H] + x.get("db", 0), x["A_log"][:H],
                           x["dt_bias"][:H], vs * sl(x["S0"]), x["gate"], x["lower_bound"] or -5.0, cfg=cfg, stats=st)
    print(f"{tag:28s} v x{vs:<7g} finite out {np.isfinite(o).all()!s:5} max|v| {np.abs(vs*x['v'][:H]).max():9.3g} "
          f"max|S| {st['s_max']:9.3g} max|X| {st['x_max']:9.3g} max|U| {st['u_max']:9.3g}", flush=True)
for name in ("stress3", "bench_safe"):
    x = I.INPUTS[name]()
    go(name, x, FIX)
    x["db"] = 4.0
    go(name + " beta+4", x, FIX)
    for vs in (3000.0, 10000.0):
        go(name + " beta+4 kernel", x, E.DEFAULT, vs)
        go(name + " beta+4 fix", x, FIX, vs)
