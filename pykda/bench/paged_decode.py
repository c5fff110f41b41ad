"""`python -m pykda bench paged-decode`: `BatchDecodeWithPagedKVCache` over shuffled pages of
every size against `batch_decode_with_padded_kv_cache` on a contiguous cache of the same
lengths (every request S rows, `kv_lens` given), both layouts; cold L2, CUDA events, medians.
The error column is the paged output's relative distance from the padded one; host µs is a
run() call's Python time with torch inputs (page 16, NHD). Where FlashInfer is importable, its
`BatchDecodeWithPagedKVCacheWrapper` (CUDA-core path) runs on the same pages, in a second table."""
from __future__ import annotations

import functools

import numpy as np

from .. import reference
from ..ops.decode import flash_decode
from ..ops.paged_decode import PAGE_SIZES, BatchDecodeWithPagedKVCache
from . import timing
from .decode import BATCH_SHAPES, D, QUICK_BATCH, parse_shapes
from ..progress import progress


def _cases(quick: bool, shapes: str | None):
    """(batch, Hq, Hkv, S) rows; S a multiple of every page size."""
    if not shapes:
        return QUICK_BATCH if quick else BATCH_SHAPES
    parsed = parse_shapes(shapes)
    if any(d != D for *_, d, _ in parsed):
        raise ValueError(f"paged-decode --shapes: head dim {D} only")
    if any(uneven for *_, uneven in parsed):
        raise ValueError("paged-decode --shapes: no uneven lengths (S~)")
    rows = [(b, hq, hkv, s) for b, hq, hkv, s, *_ in parsed]
    if any(s % max(PAGE_SIZES) for *_, s in rows):
        raise ValueError(f"paged-decode --shapes: every KV_LEN must be a multiple of {max(PAGE_SIZES)}")
    return rows


def _flashinfer_paged(q, k_pages, v_pages, indptr, indices, last, layout: str, page: int):
    """FlashInfer's paged decode (CUDA cores) on the same page table, or None without FlashInfer
    or where it refuses the call (the table then shows '-')."""
    try:
        import flashinfer
        import torch
        ws = torch.zeros(128 << 20, dtype=torch.uint8, device=q.device)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
        as_i32 = lambda x: torch.as_tensor(x, dtype=torch.int32).to(q.device)   # noqa: E731
        w.plan(as_i32(indptr), as_i32(indices), as_i32(last), q.shape[1], k_pages.shape[2 if layout == "NHD" else 1],
               q.shape[2], page, q_data_type=q.dtype, kv_data_type=k_pages.dtype)
        fn = functools.partial(w.run, q, (k_pages, v_pages))
        fn()
        return fn
    except Exception:   # ImportError, or a call it does not take
        return None


def run(args):
    import torch
    timer, copy_tbs = timing.start(getattr(args, "flush", "read"))
    rows = []
    for B, hq, hkv, S in progress(_cases(args.quick, getattr(args, "shapes", None)), "bench paged-decode",
                                  label=lambda c: f"{c[0]}x{c[1]}/{c[2]}:{c[3]}", unit="shape"):
        g = torch.Generator(device="cuda").manual_seed(S + B)
        q = torch.randn(B, hq, D, device="cuda", generator=g).to(torch.bfloat16)
        k_hnd = torch.randn(B, hkv, S, D, device="cuda", generator=g).to(torch.bfloat16)
        v_hnd = torch.randn(B, hkv, S, D, device="cuda", generator=g).to(torch.bfloat16)
        lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        nbytes = 2 * B * S * hkv * D * 2 + 2 * B * hq * D * 2
        row = dict(batch=B, hq=hq, hkv=hkv, kv_len=S)
        o_ref = None
        for layout in ("NHD", "HND"):
            k, v = (x if layout == "HND" else x.transpose(1, 2).contiguous() for x in (k_hnd, v_hnd))
            padded = functools.partial(flash_decode, q, k, v, batched=True, kv_layout=layout, kv_lens=lens)
            o_ref = padded().float().cpu().numpy()
            row[f"padded_{layout}"] = timer.median_us(padded)
            del k, v, padded
            for page in PAGE_SIZES:
                # the same rows in shuffled pages: request b's page j is pool page perm[b * n + j]
                n = S // page
                perm = torch.randperm(B * n, generator=torch.Generator().manual_seed(page))
                k_pages, v_pages = (torch.empty_like(x).view(B * n, hkv, page, D) for x in (k_hnd, v_hnd))
                for src, dst in ((k_hnd, k_pages), (v_hnd, v_pages)):
                    dst[perm.cuda()] = src.view(B, hkv, n, page, D).transpose(1, 2).reshape(B * n, hkv, page, D)
                if layout == "NHD":
                    k_pages, v_pages = (x.transpose(1, 2).contiguous() for x in (k_pages, v_pages))
                dec = BatchDecodeWithPagedKVCache(layout)
                indptr = np.arange(B + 1, dtype=np.int32) * n
                dec.plan(indptr, perm.to(torch.int32).cuda(), np.full(B, page, np.int32), hq, hkv, D, page)
                paged = functools.partial(dec.run, q, k_pages, v_pages)
                row[f"err_{layout}_{page}"] = reference.relative_error(paged().float().cpu().numpy(), o_ref)
                row[f"paged_{layout}_{page}"] = timer.median_us(paged)
                fi = _flashinfer_paged(q, k_pages, v_pages, indptr, perm, np.full(B, page, np.int32), layout, page)
                row[f"fi_{layout}_{page}"] = timer.median_us(fi) if fi else None
                if layout == "NHD" and page == 16:
                    row["host_us"] = timing.host_us(paged)
                del k_pages, v_pages, dec, paged, fi
                torch.cuda.empty_cache()
        row["tbs"] = nbytes / row["padded_HND"] / 1e6
        row["pct_copy"] = 100 * row["tbs"] / copy_tbs
        rows.append(row)
        del q, k_hnd, v_hnd
        torch.cuda.empty_cache()
    _print_table(rows)
    return rows


def _print_table(rows):
    print("\nµs per call (paged / padded in brackets), padded = batch_decode_with_padded_kv_cache with kv_lens; "
          "err = paged vs padded output")
    head = f"{'shape':>16} {'layout':>6} {'padded':>8} " + " ".join(f"{'page ' + str(p):>15}" for p in PAGE_SIZES) + \
        f" {'max err':>8} {'host us':>7}"
    print(head)
    for r in rows:
        for layout in ("NHD", "HND"):
            base = r[f"padded_{layout}"]
            line = f"{r['batch']:>4}x{r['hq']}/{r['hkv']}:{r['kv_len']:<6} {layout:>6} {base:8.1f} "
            line += " ".join(f"{r[f'paged_{layout}_{p}']:7.1f} ({r[f'paged_{layout}_{p}'] / base:4.2f})"
                             for p in PAGE_SIZES)
            line += f" {max(r[f'err_{layout}_{p}'] for p in PAGE_SIZES):8.1e} {r['host_us']:7.1f}"
            print(line)
    if not any(r.get(f"fi_{layout}_{p}") for r in rows for layout in ("NHD", "HND") for p in PAGE_SIZES):
        return
    print("\nFlashInfer's BatchDecodeWithPagedKVCacheWrapper (CUDA cores) on the same pages: µs "
          "(its time / pykda's paged time in brackets, > 1: pykda ahead)")
    print(f"{'shape':>16} {'layout':>6} " + " ".join(f"{'page ' + str(p):>15}" for p in PAGE_SIZES))
    for r in rows:
        for layout in ("NHD", "HND"):
            cells = []
            for p in PAGE_SIZES:
                fi = r.get(f"fi_{layout}_{p}")
                cells.append(f"{fi:7.1f} ({fi / r[f'paged_{layout}_{p}']:4.2f})" if fi else f"{'-':>15}")
            print(f"{r['batch']:>4}x{r['hq']}/{r['hkv']}:{r['kv_len']:<6} {layout:>6} " + " ".join(cells))
