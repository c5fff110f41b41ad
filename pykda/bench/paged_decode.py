"""`python -m pykda bench paged-decode`: `BatchDecodeWithPagedKVCache` over shuffled pages of
every size against `batch_decode_with_padded_kv_cache` on a contiguous cache of the same
lengths (every request S rows, `kv_lens` given), both layouts; cold L2, CUDA events, medians.
The error column is the paged output's relative distance from the padded one; host µs is a
run() call's Python time with torch inputs (page 16, NHD). Where FlashInfer is importable, its
`BatchDecodeWithPagedKVCacheWrapper` (CUDA-core path) runs on the same pages, in a second table.

`--grid`: the batched rows of `bench decode --grid` (D 64/128/256, uneven lengths among them) on
shuffled HND pages of GRID_PAGES rows, pykda's paged run against FlashInfer's paged wrapper on
the same pages (CUDA-core and tensor-core paths) and against pykda's padded kernel at the same
lengths, each checked against the float64 reference; a summary line per page size."""
from __future__ import annotations

import functools

import numpy as np

from .. import reference
from ..ops.decode import flash_decode
from ..ops.paged_decode import PAGE_SIZES, BatchDecodeWithPagedKVCache
from . import timing
from .decode import BATCH_SHAPES, D, GRID, QUICK_BATCH, float64_outputs, grid_inputs, parse_shapes, peers_ahead
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


def _flashinfer_paged(q, k_pages, v_pages, indptr, indices, last, layout: str, page: int, tensor_cores=False):
    """FlashInfer's paged decode (CUDA cores, or its tensor-core path) on the same page table, or
    None without FlashInfer or where it refuses the call (the table then shows '-')."""
    try:
        import flashinfer
        import torch
        ws = torch.zeros(128 << 20, dtype=torch.uint8, device=q.device)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=tensor_cores)
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
    if getattr(args, "grid", False):
        return run_grid(timer)
    rows = []
    for B, hq, hkv, S in progress(timing.in_time(_cases(args.quick, getattr(args, "shapes", None))), "bench paged-decode",
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


GRID_PAGES = (16, 64, 1)   # FlashInfer's and vLLM's usual page, a large one (issue 13 names both), SGLang's token pool


def shuffled_pages(xs, lens, page: int, seed: int, placement=None):
    """The first lens[b] rows of each request of every x [B, Hkv, S, D] in `xs` (K and V) as HND
    pages [P, Hkv, page, D] in one shuffled pool layout (rows past a request's length in its last
    page: zeros or the cache's own): (the pages of each x, kv_indptr, kv_indices, kv_last_page_len),
    the tables as int32 numpy / torch. `placement(pages_per_request)`, where given, returns the pool
    page of every (request, page) in request order (a permutation of the pool) instead of the
    seeded shuffle."""
    import torch
    B, hkv, S, d = xs[0].shape
    n = [-(-int(length) // page) for length in lens]
    perm = (torch.randperm(sum(n), generator=torch.Generator().manual_seed(seed)) if placement is None
            else placement(n)).to(xs[0].device)

    def pages_of(x):
        padded = torch.nn.functional.pad(x, (0, 0, 0, max(n) * page - S)) if max(n) * page > S else x
        ordered = torch.cat([padded[b, :, :n[b] * page].reshape(hkv, n[b], page, d).transpose(0, 1) for b in range(B)])
        pages = torch.empty_like(ordered)
        pages[perm] = ordered
        return pages
    indptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    last = np.array([int(length) - (k - 1) * page for length, k in zip(lens, n)], np.int32)
    return [pages_of(x) for x in xs], indptr, perm.to(torch.int32), last


def run_grid(timer):
    """--grid: the batched rows of bench decode's grid on shuffled pages (module docstring)."""
    import torch
    rows = []
    cases = [(b, hq, hkv, s, d, uneven) for b, hq, hkv, d, s, uneven in GRID if b > 1]
    for B, hq, hkv, S, d, uneven in progress(timing.in_time(cases), "bench paged-decode --grid", unit="shape",
                                              label=lambda c: f"{c[0]}x{c[1]}/{c[2]}:{c[3]}{'~' if c[5] else ''} D={c[4]}"):
        q, k_hnd, v_hnd, lens = grid_inputs(B, hq, hkv, d, S, uneven)
        kv_lens = torch.as_tensor(lens, dtype=torch.int32).to(q.device)
        o_ref = float64_outputs(q, k_hnd.transpose(1, 2).contiguous(), v_hnd.transpose(1, 2).contiguous(),
                                lens if uneven else None)
        row = dict(batch=B, hq=hq, hkv=hkv, kv_len=S, D=d, uneven=uneven)
        padded = functools.partial(flash_decode, q, k_hnd, v_hnd, batched=True, kv_layout="HND", kv_lens=kv_lens)
        row["err_padded"] = reference.relative_error(padded().float().cpu().numpy(), o_ref)
        row["padded"] = timer.median_us(padded)
        for page in GRID_PAGES:
            (k_pages, v_pages), indptr, indices, last = shuffled_pages((k_hnd, v_hnd), lens, page, seed=page)
            dec = BatchDecodeWithPagedKVCache("HND")
            dec.plan(indptr, indices, last, hq, hkv, d, page)
            paged = functools.partial(dec.run, q, k_pages, v_pages)
            row[f"err_{page}"] = reference.relative_error(paged().float().cpu().numpy(), o_ref)
            row[f"paged_{page}"] = timer.median_us(paged)
            for name, tc in (("fi", False), ("fi-tc", True)):
                fi = _flashinfer_paged(q, k_pages, v_pages, indptr, indices, last, "HND", page, tensor_cores=tc)
                row[f"{name}_{page}"] = timer.median_us(fi) if fi else None
                row[f"err_{name}_{page}"] = (reference.relative_error(fi().float().cpu().numpy(), o_ref)
                                             if fi else None)
            del k_pages, v_pages, dec, paged
            torch.cuda.empty_cache()
        rows.append(row)
        del q, k_hnd, v_hnd
        torch.cuda.empty_cache()
    _print_grid(rows)
    return rows


def _print_grid(rows):
    print("\nµs per call, HND pages shuffled in the pool; x = the faster FlashInfer path's µs / pykda's paged µs "
          "(> 1: pykda ahead); padded = pykda's padded kernel at the same lengths; err: pykda paged vs float64")
    head = f"{'shape':>24} {'padded':>7}"
    for page in GRID_PAGES:
        head += f" | p{page:<3} {'pykda':>7} {'/pad':>5} {'fi':>7} {'fi-tc':>7} {'x':>5} {'err':>7}"
    print(head)
    for r in rows:
        line = f"{r['batch']:>4}x{r['hq']}/{r['hkv']}:{r['kv_len']}{'~' if r['uneven'] else ''} D{r['D']:<3}"
        line = f"{line:>24} {r['padded']:7.1f}"
        for page in GRID_PAGES:
            us = r[f"paged_{page}"]
            fi = [r[f"{n}_{page}"] for n in ("fi", "fi-tc")]
            best = min((x for x in fi if x), default=None)
            cells = " ".join(f"{x:7.1f}" if x else f"{'-':>7}" for x in fi)
            line += (f" | {'':4} {us:7.1f} {us / r['padded']:5.2f} {cells} "
                     f"{(f'{best / us:5.2f}' if best else '    -')} {r[f'err_{page}']:7.1e}")
        print(line)
    for line in grid_summary(rows):
        print(line)


def grid_summary(rows) -> list:
    """A line per page size: the faster FlashInfer path's µs over pykda's (worst, median, and the
    rows where it leads) and pykda's paged time over its padded time (least, most)."""
    import statistics
    lines = []
    for page in GRID_PAGES:
        ratios = []
        for r in rows:
            best = min(((r[f"{n}_{page}"], n) for n in ("fi", "fi-tc") if r[f"{n}_{page}"]), default=None)
            if best:
                ratios.append((best[0] / r[f"paged_{page}"], f"{r['batch']}x{r['hq']}/{r['hkv']}:{r['kv_len']} D={r['D']}",
                               best[1]))
        vs_padded = [r[f"paged_{page}"] / r["padded"] for r in rows]
        line = f"paged grid, pages of {page}: {len(rows)} shapes; paged / padded µs {min(vs_padded):.2f}-{max(vs_padded):.2f}"
        if ratios:
            ratios.sort()
            line += (f"; FlashInfer µs / pykda µs: worst {ratios[0][0]:.2f} ({ratios[0][1]}), "
                     f"median {statistics.median(x for x, _, _ in ratios):.2f} over {len(ratios)} shapes"
                     + peers_ahead(ratios))
        lines.append(line)
    return lines
