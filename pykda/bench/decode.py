"""`python -m pykda bench decode`: flash decoding vs torch SDPA (cuDNN, flash) and a
torch.compile matmul-softmax, on PERF.md's decode shapes; cold L2, CUDA events, medians."""
from __future__ import annotations

import itertools


from .. import reference
from ..ops.decode import single_decode_with_kv_cache
from . import timing

SHAPES = [(32, 32, 8192), (32, 32, 16384), (32, 32, 32768), (32, 32, 65536), (32, 32, 131072),
          (32, 32, 131073), (32, 8, 32768), (32, 8, 131072)]
QUICK = [(32, 32, 8192), (32, 32, 65536), (32, 8, 131072)]
D = 128


def _ints(text):
    """A comma list of settings; 0 means the planner's choice."""
    return [None] if not text else [int(x) or None for x in text.split(",")]


def _sdpa_peer(backend_name, q, k, v, hq, hkv):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    q4 = q.view(1, hq, 1, D)
    k4, v4 = k.permute(1, 0, 2).contiguous()[None], v.permute(1, 0, 2).contiguous()[None]   # [1, H, S, D]

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=hq != hkv)
    try:
        out = run()
    except Exception as exc:   # backend unavailable for this shape
        return None, f"{type(exc).__name__}"
    return run, out.view(hq, D)


def _compile_peer(q, k, v, hq, hkv):
    import torch
    if hq != hkv:
        return None, "n/a"

    @torch.compile(dynamic=False)
    def attn(q, k, v):
        s = torch.einsum("hd,shd->hs", q.float(), k.float()) * D ** -0.5
        return torch.einsum("hs,shd->hd", torch.softmax(s, -1).to(v.dtype).float(), v.float()).to(v.dtype)
    try:
        out = attn(q, k, v)
    except Exception as exc:
        return None, f"{type(exc).__name__}"
    return (lambda: attn(q, k, v)), out


def run(args):
    import cupy as cp
    import torch
    timer, copy_tbs = timing.start()
    shapes = QUICK if args.quick else SHAPES
    chunks, stages = _ints(args.chunk_size), _ints(args.stages)
    sweep = len(chunks) > 1 or len(stages) > 1
    rows = []
    for hq, hkv, S in shapes:
        g = torch.Generator(device="cuda").manual_seed(S + hkv)
        q = torch.randn(hq, D, device="cuda", generator=g).to(torch.bfloat16)
        k = torch.randn(S, hkv, D, device="cuda", generator=g).to(torch.bfloat16)
        v = torch.randn(S, hkv, D, device="cuda", generator=g).to(torch.bfloat16)
        nbytes = 2 * S * hkv * D * 2 + 2 * hq * D * 2
        o_ref, _ = reference.decode_attention(*(cp.from_dlpack(x.double()) for x in (q, k, v)))
        o_ref = cp.asnumpy(o_ref)
        peers = {}
        if not sweep:
            for name, backend in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION")):
                peers[name] = _sdpa_peer(backend, q, k, v, hq, hkv)
            peers["compile"] = _compile_peer(q, k, v, hq, hkv)
        peer_us = {n: (timer.median_us(fn) if fn else None) for n, (fn, _) in peers.items()}
        peer_err = {n: (reference.relative_error(o.float().cpu().numpy(), o_ref) if fn else None)
                    for n, (fn, o) in peers.items()}
        for chunk, st in itertools.product(chunks, stages):
            fn = lambda: single_decode_with_kv_cache(q, k, v, chunk_size=chunk, stages=st)
            err = reference.relative_error(fn().float().cpu().numpy(), o_ref)
            us = timer.median_us(fn)
            row = dict(hq=hq, hkv=hkv, kv_len=S, chunk_size=chunk, stages=st, us=us, tbs=nbytes / us / 1e6,
                       pct_copy=100 * nbytes / us / 1e6 / copy_tbs, err=err,
                       peers={n: dict(us=peer_us[n], err=peer_err[n]) for n in peers})
            rows.append(row)
            del fn
        del q, k, v
        torch.cuda.empty_cache()
    _print_table(rows, sweep)
    return rows


def _print_table(rows, sweep):
    peers = sorted({n for r in rows for n in r["peers"]})
    head = f"{'Hq/Hkv':>7} {'kv_len':>7} " + ("chunk stg " if sweep else "") + \
        f"{'pykda us':>9} {'TB/s':>5} {'%copy':>5} {'err':>7} " + \
        " ".join(f"{p + ' us':>10} {'x':>5}" for p in peers)
    print("\n" + head)
    for r in rows:
        line = f"{r['hq']:>3}/{r['hkv']:<3} {r['kv_len']:>7} "
        if sweep:
            line += f"{str(r['chunk_size'] or 'auto'):>5} {str(r['stages'] or 'd'):>3} "
        line += f"{r['us']:9.1f} {r['tbs']:5.2f} {r['pct_copy']:5.1f} {r['err']:7.1e} "
        for p in peers:
            pu = r["peers"][p]["us"]
            line += f"{pu:10.1f} {pu / r['us']:5.2f} " if pu else f"{'-':>10} {'-':>5} "
        print(line)
