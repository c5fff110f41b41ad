"""`python -m pykda bench kda-decode`: the KDA decode step on a pool of states vs fla's
`fused_recurrent_kda`, same inputs; kernel µs (cold L2, CUDA events), host µs per call,
state TB/s (read + write)."""
from __future__ import annotations

import time

from .. import reference
from ..ops.kda_decode import fused_recurrent_kda
from . import timing

BATCHES = (1, 8, 64, 256)
HEADS = (32, 8)
D = 128


def _inputs(B, H, pool_dtype):
    import torch
    g = torch.Generator(device="cuda").manual_seed(B * H)
    rnd = lambda *s: torch.randn(*s, generator=g, device="cuda")
    bf = torch.bfloat16
    x = dict(q=rnd(B, 1, H, D).to(bf), k=rnd(B, 1, H, D).to(bf), v=rnd(B, 1, H, D).to(bf),
             g=rnd(B, 1, H, D).to(bf), beta=rnd(B, 1, H).to(bf),
             A_log=torch.log(torch.rand(H, generator=g, device="cuda") * 15 + 1), dt_bias=0.1 * rnd(H * D))
    pool = (0.1 * rnd(2 * B, H, D, D)).to(getattr(torch, pool_dtype))
    idx = torch.randperm(2 * B, device="cuda")[:B].to(torch.int32)
    return x, pool, idx


def _fla():
    try:
        from fla.ops.kda import fused_recurrent_kda as fla_kda
        return fla_kda
    except Exception:
        return None


def host_us(fn, n=300) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


def run(args):
    import torch
    timer, copy_tbs = timing.start()
    fla_kda = _fla()
    rows = []
    for pool_dtype in ("float32", "bfloat16"):
        for H in HEADS:
            for B in BATCHES:
                x, pool, idx = _inputs(B, H, pool_dtype)
                state_bytes = 2 * B * H * D * D * pool.element_size()
                ours = lambda: fused_recurrent_kda(**x, initial_state=pool, state_indices=idx)
                # correctness on this run's inputs, one step from a saved pool
                before = pool.clone()
                o = ours()
                i0 = int(idx[0])
                o_ref, s_ref = reference.kda_recurrent(
                    *(x[n][:1].double().cpu().numpy() for n in ("q", "k", "v", "g", "beta")),
                    A_log=x["A_log"].double().cpu().numpy(), dt_bias=x["dt_bias"].double().cpu().numpy(),
                    initial_state=before[i0:i0 + 1].double().cpu().numpy())
                err = max(reference.relative_error(o[:1].double().cpu().numpy(), o_ref),
                          reference.relative_error(pool[i0:i0 + 1].double().cpu().numpy(), s_ref))
                us = timer.median_us(ours, warmup=10, repeats=100)
                row = dict(pool=pool_dtype, H=H, B=B, us=us, host_us=host_us(ours), tbs=state_bytes / us / 1e6,
                           pct_copy=100 * state_bytes / us / 1e6 / copy_tbs, err=err, fla_us=None, fla_host_us=None)
                if fla_kda is not None and pool_dtype == "float32":
                    fla_pool = pool.clone()
                    def theirs():
                        return fla_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                       dt_bias=x["dt_bias"], initial_state=fla_pool, ssm_state_indices=idx,
                                       use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                       use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, state_v_first=True,
                                       inplace_final_state=True)
                    try:
                        theirs()
                        row["fla_us"] = timer.median_us(theirs, warmup=10, repeats=100)
                        row["fla_host_us"] = host_us(theirs)
                    except Exception as exc:
                        row["fla_error"] = f"{type(exc).__name__}: {exc}"[:200]
                rows.append(row)
                del x, pool, before
                torch.cuda.empty_cache()
    print(f"\n{'pool':>8} {'H':>3} {'B':>4} {'pykda us':>9} {'host us':>8} {'TB/s':>5} {'%copy':>5} {'err':>7} "
          f"{'fla us':>8} {'fla host':>8} {'x fla':>6}")
    for r in rows:
        fla = f"{r['fla_us']:8.1f} {r['fla_host_us']:8.1f} {r['fla_us'] / r['us']:6.2f}" if r["fla_us"] else \
            f"{'-':>8} {'-':>8} {'-':>6}"
        print(f"{r['pool']:>8} {r['H']:3d} {r['B']:4d} {r['us']:9.1f} {r['host_us']:8.1f} {r['tbs']:5.2f} "
              f"{r['pct_copy']:5.1f} {r['err']:7.1e} {fla}")
    return rows
