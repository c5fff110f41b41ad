"""`python -m pykda bench decode`: flash decoding vs torch SDPA (cuDNN, flash) and a
torch.compile matmul-softmax, on PERF.md's decode shapes (single sequences and padded batches);
cold L2, CUDA events, medians.

The SDPA peers read contiguous HND buffers `[B, H, S, D]`; pykda is timed on exactly those
(kv_layout="HND", the same-inputs column that TB/s, % copy and the ratios use) and on NHD copies
`[B, S, H, D]` of them."""
from __future__ import annotations

import itertools
import re

from .. import reference
from ..ops.decode import flash_decode
from . import plot as plotting, settings, timing
from ..progress import progress

SHAPES = [(32, 32, 8192), (32, 32, 16384), (32, 32, 32768), (32, 32, 65536), (32, 32, 131072),
          (32, 32, 131073), (32, 8, 32768), (32, 8, 131072)]
BATCH_SHAPES = [(64, 32, 8, 4096), (256, 32, 8, 1024), (8, 32, 8, 32768)]
QUICK = [(32, 32, 8192), (32, 32, 65536), (32, 8, 131072)]
QUICK_BATCH = [(8, 32, 8, 32768)]
D = 128
REF_ROWS = 1 << 16   # KV rows per float64 reference pass (bounds its memory)


def parse_shapes(text: str):
    """`HQ/HKV:S` (one sequence) or `BxHQ/HKV:S` (a padded batch), comma separated, as _cases rows."""
    rows = []
    for item in text.split(","):
        m = re.fullmatch(r"(?:(\d+)x)?(\d+)/(\d+):(\d+)", item.strip())
        if m is None:
            raise ValueError(f"--shapes: {item!r} is not HQ/HKV:S or BxHQ/HKV:S (e.g. 32/8:100000, 8x32/8:32768)")
        b, hq, hkv, s = (int(g) if g else None for g in m.groups())
        rows.append((b or 1, hq, hkv, s, b is not None))
    return rows


def _cases(quick: bool, shapes: str | None = None):
    """(batch, Hq, Hkv, kv_len, batched op?) rows: single sequences first, then padded batches."""
    if shapes:
        return parse_shapes(shapes)
    single, batch = (QUICK, QUICK_BATCH) if quick else (SHAPES, BATCH_SHAPES)
    return [(1, hq, hkv, s, False) for hq, hkv, s in single] + [(b, hq, hkv, s, True) for b, hq, hkv, s in batch]


def _reference(q, k_nhd, v_nhd):
    """float64 outputs [B, Hq, D] as NumPy, a few sequences per pass."""
    import cupy as cp
    import numpy as np
    step = max(1, REF_ROWS // k_nhd.shape[1])
    parts = []
    for b in range(0, q.shape[0], step):
        o, _ = reference.batch_decode_attention(*(cp.from_dlpack(x[b:b + step].double()) for x in (q, k_nhd, v_nhd)))
        parts.append(cp.asnumpy(o))
    return np.concatenate(parts)


def _sdpa_peer(backend_name, q, k_hnd, v_hnd):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    b, hq, _ = q.shape
    q4 = q.view(b, hq, 1, D)

    def run():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q4, k_hnd, v_hnd, enable_gqa=hq != k_hnd.shape[1])
    try:
        out = run()
    except Exception as exc:   # backend unavailable for this shape
        return None, f"{type(exc).__name__}"
    return run, out


def _compile_peer(q, k, v):
    """Single sequence, Hq == Hkv: q [Hq, D], k, v [S, H, D]."""
    import torch
    if q.shape[0] != k.shape[1]:
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


def _pykda(q, k, v, batched, layout, chunk, stages):
    """A call of pykda's one decode path on these buffers (a single sequence drops the batch dim)."""
    if not batched:
        q, k, v = q[0], k[0], v[0]
    return lambda: flash_decode(q, k, v, batched=batched, kv_layout=layout, chunk_size=chunk, stages=stages)


def run(args):
    import torch
    timer, copy_tbs = timing.start(getattr(args, "flush", "read"))
    chunks, stages = settings(args.chunk_size), settings(args.stages)
    sweep = len(chunks) > 1 or len(stages) > 1
    with_peers = not sweep or bool(getattr(args, "plot", None))   # a plot draws the peers beside the sweep
    points = list(itertools.product(chunks, stages))
    rows = []
    for B, hq, hkv, S, batched in progress(_cases(args.quick, getattr(args, "shapes", None)), "bench decode",
                                           label=lambda case: shape_label(*case[:4]), unit="shape"):
        g = torch.Generator(device="cuda").manual_seed(S + hkv + B)
        q = torch.randn(B, hq, D, device="cuda", generator=g).to(torch.bfloat16)
        k_hnd = torch.randn(B, hkv, S, D, device="cuda", generator=g).to(torch.bfloat16)   # what the peers read
        v_hnd = torch.randn(B, hkv, S, D, device="cuda", generator=g).to(torch.bfloat16)
        k_nhd, v_nhd = k_hnd.transpose(1, 2).contiguous(), v_hnd.transpose(1, 2).contiguous()
        nbytes = 2 * B * S * hkv * D * 2 + 2 * B * hq * D * 2
        o_ref = _reference(q, k_nhd, v_nhd)

        def error(o):
            return reference.relative_error(o.float().reshape(B, hq, D).cpu().numpy(), o_ref)
        peers = {}
        if with_peers:
            for name, backend in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION")):
                peers[name] = _sdpa_peer(backend, q, k_hnd, v_hnd)
            if not batched:
                peers["compile"] = _compile_peer(q[0], k_nhd[0], v_nhd[0])
        peer_us = {n: (timer.median_us(fn) if fn else None) for n, (fn, _) in peers.items()}
        peer_err = {n: (error(o) if fn else None) for n, (fn, o) in peers.items()}
        for chunk, st in (progress(points, "settings", label=_settings_label) if sweep else points):
            nhd = _pykda(q, k_nhd, v_nhd, batched, "NHD", chunk, st)
            hnd = _pykda(q, k_hnd, v_hnd, batched, "HND", chunk, st)
            err_nhd, err_hnd = error(nhd()), error(hnd())
            us_nhd, us = timer.median_us(nhd), timer.median_us(hnd)
            rows.append(dict(batch=B, hq=hq, hkv=hkv, kv_len=S, chunk_size=chunk, stages=st,
                             us=us, us_nhd=us_nhd, tbs=nbytes / us / 1e6, pct_copy=100 * nbytes / us / 1e6 / copy_tbs,
                             err=err_hnd, err_nhd=err_nhd,
                             peers={n: dict(us=peer_us[n], err=peer_err[n]) for n in peers}))
            del nhd, hnd
        del q, k_hnd, v_hnd, k_nhd, v_nhd
        torch.cuda.empty_cache()
    _print_table(rows, sweep)
    return rows


def shape_label(batch, hq, hkv, kv_len) -> str:
    return f"{hq}/{hkv} S={kv_len}" + (f" B={batch}" if batch > 1 else "")


def _settings_label(point) -> str:
    chunk, st = point
    return f"chunk {chunk or 'auto'} stages {st or 'auto'}"


def _fastest_peer(row):
    """(name, µs) of the fastest peer timed on the row's shape, or None."""
    timed = sorted((p["us"], name) for name, p in row.get("peers", {}).items() if p.get("us"))
    return (timed[0][1], timed[0][0]) if timed else None


def plot(rows, path, device=None):
    """--plot: µs and TB/s (pykda on the peers' HND buffers) against chunk size / stages, one line
    per shape, its fastest peer dashed."""
    return plotting.sweep(path, rows, ("chunk_size", "stages"),
                          shape=lambda r: shape_label(r["batch"], r["hq"], r["hkv"], r["kv_len"]), peer=_fastest_peer,
                          title=f"pykda bench decode on the peers' HND buffers, bf16, D={D}"
                                + (f", {device}" if device else ""))


def _print_table(rows, sweep):
    peers = sorted({n for r in rows for n in r["peers"]})
    head = f"{'Hq/Hkv':>7} {'B':>4} {'kv_len':>7} " + ("chunk stg " if sweep else "") + \
        f"{'NHD us':>8} {'HND us':>8} {'TB/s':>5} {'%copy':>5} {'err':>7} " + \
        " ".join(f"{p + ' us':>10} {'x':>5}" for p in peers)
    print("\nTB/s, % copy, err and the ratios x (peer us / pykda us) are pykda on the peers' HND buffers")
    print(head)
    for r in rows:
        line = f"{r['hq']:>3}/{r['hkv']:<3} {r['batch']:>4} {r['kv_len']:>7} "
        if sweep:
            line += f"{str(r['chunk_size'] or 'auto'):>5} {str(r['stages'] or 'd'):>3} "
        line += f"{r['us_nhd']:8.1f} {r['us']:8.1f} {r['tbs']:5.2f} {r['pct_copy']:5.1f} " \
                f"{max(r['err'], r['err_nhd']):7.1e} "
        for p in peers:
            pu = r["peers"].get(p, {}).get("us")   # compile: single sequences only
            line += f"{pu:10.1f} {pu / r['us']:5.2f} " if pu else f"{'-':>10} {'-':>5} "
        print(line)
