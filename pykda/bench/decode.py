"""`python -m pykda bench decode`: flash decoding vs torch SDPA (cuDNN, flash), FlashInfer (its
CUDA-core and tensor-core paths, where importable) and a torch.compile matmul-softmax, on PERF.md's
decode shapes (single sequences and padded batches) or `--grid`'s; cold L2, CUDA events, medians.

The peers read contiguous HND buffers `[B, H, S, D]` (FlashInfer's batch as one HND page of S
rows per sequence, each holding its own length); pykda is timed on exactly those
(kv_layout="HND", the same-inputs column that TB/s, % copy and the ratios use) and on NHD copies
`[B, S, H, D]` of them.

`--grid` is issue 13's spread of shapes: head ratios 8/1 … 128/8, D 64/128/256, lengths 1 … 1M
(odd ones too), batches 1 … 256, some with uneven lengths (there only pykda and FlashInfer run:
SDPA has no per-sequence lengths). It ends in a summary line: pykda's time against the best
peer's (worst and median ratio) and, at 64 MB of KV or more, against a copy of the same bytes."""
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
# --grid: (batch, Hq, Hkv, D, longest kv_len, uneven lengths?)
GRID = [(1, hq, hkv, d, s, False) for hq, hkv, d, s in (
    (8, 1, 128, 1048576), (8, 1, 64, 1), (8, 1, 256, 65537), (16, 16, 128, 8192), (16, 16, 64, 100003),
    (16, 16, 256, 32769), (32, 4, 128, 200000), (32, 4, 64, 1000), (32, 8, 128, 4096), (32, 8, 128, 131072),
    (32, 8, 256, 50000), (32, 8, 64, 17), (32, 32, 128, 8192), (32, 32, 128, 65536), (32, 32, 64, 262144),
    (32, 32, 256, 12345), (64, 4, 128, 500000), (64, 4, 256, 99999), (64, 8, 128, 50000), (64, 8, 64, 1048575),
    (128, 8, 128, 65536), (128, 8, 256, 4097))]
GRID += [(b, hq, hkv, d, s, uneven) for b, hq, hkv, d, s, uneven in (
    (2, 64, 4, 128, 500000, False), (2, 32, 4, 128, 200000, True), (4, 16, 16, 64, 65536, True),
    (8, 32, 8, 128, 32768, False), (8, 8, 1, 256, 131072, True), (16, 32, 32, 128, 8191, True),
    (16, 64, 8, 128, 16384, True), (32, 32, 8, 64, 8192, True), (64, 32, 8, 128, 4096, False),
    (64, 32, 8, 128, 8192, True), (64, 128, 8, 128, 2048, True), (128, 16, 16, 128, 3000, True),
    (128, 32, 4, 256, 1024, True), (256, 32, 8, 128, 1024, False), (256, 32, 8, 64, 2048, True),
    (256, 64, 8, 128, 513, True), (256, 8, 1, 128, 4096, True), (32, 64, 4, 128, 65536, True),
    (256, 32, 8, 128, 64, True), (256, 32, 4, 256, 32, True))]   # the last two: batches of one-tile sequences
GRID_COPY_BYTES = 64 << 20   # rows with at least this much KV are also timed against a copy of their bytes


def parse_shapes(text: str):
    """`HQ/HKV:S` (one sequence) or `BxHQ/HKV:S` (a padded batch; `S~`: uneven lengths up to S, as
    the grid's), each with an optional `:D` (head dim, default 128), comma separated: (batch, Hq,
    Hkv, S, batched?, D, uneven?) rows."""
    rows = []
    for item in text.split(","):
        m = re.fullmatch(r"(?:(\d+)x)?(\d+)/(\d+):(\d+)(~?)(?::(\d+))?", item.strip())
        if m is None or (m.group(5) and m.group(1) is None):
            raise ValueError(f"--shapes: {item!r} is not HQ/HKV:S[:D] or BxHQ/HKV:S[~][:D] (e.g. 32/8:100000, "
                             f"8x32/8:32768, 16/16:100003:64, 32x32/8:8192~:64)")
        b, hq, hkv, s, uneven, d = m.groups()
        rows.append((int(b or 1), int(hq), int(hkv), int(s), b is not None, int(d or D), bool(uneven)))
    return rows


def _cases(quick: bool, shapes: str | None = None, grid: bool = False):
    """(batch, Hq, Hkv, kv_len, batched op?, D, uneven lengths?) rows: single sequences first, then
    padded batches; --grid's, or PERF.md's at D 128."""
    if grid:
        return [(b, hq, hkv, s, b > 1, d, uneven) for b, hq, hkv, d, s, uneven in GRID]
    if shapes:
        return parse_shapes(shapes)
    single, batch = (QUICK, QUICK_BATCH) if quick else (SHAPES, BATCH_SHAPES)
    return [(1, hq, hkv, s, False, D, False) for hq, hkv, s in single] + \
        [(b, hq, hkv, s, True, D, False) for b, hq, hkv, s in batch]


def uneven_lengths(batch: int, longest: int, seed: int):
    """Lengths 1 .. longest, the first one `longest` (seeded; the same in every run)."""
    import numpy as np
    lens = np.random.default_rng(seed).integers(1, longest + 1, size=batch)
    lens[0] = longest
    return lens


def grid_inputs(B: int, hq: int, hkv: int, d: int, S: int, uneven: bool):
    """A row's seeded bf16 inputs, as every grid run makes them: q [B, Hq, D], K and V [B, Hkv, S, D]
    (HND, what the peers read), and each sequence's rows (`uneven_lengths`, or S each), NumPy."""
    import numpy as np
    import torch
    g = torch.Generator(device="cuda").manual_seed(S + hkv + B + d)
    q = torch.randn(B, hq, d, device="cuda", generator=g).to(torch.bfloat16)
    k_hnd = torch.randn(B, hkv, S, d, device="cuda", generator=g).to(torch.bfloat16)
    v_hnd = torch.randn(B, hkv, S, d, device="cuda", generator=g).to(torch.bfloat16)
    return q, k_hnd, v_hnd, uneven_lengths(B, S, seed=S + B) if uneven else np.full(B, S)


def float64_outputs(q, k_nhd, v_nhd, lens=None):
    """float64 outputs [B, Hq, D] as NumPy (one sequence per pass with `lens`, each its own
    length); CuPy's pool is emptied after, for the torch tensors of the next shape."""
    import cupy as cp
    import numpy as np
    if lens is None:
        o = _reference_rows(q, k_nhd, v_nhd)
    else:
        o = np.concatenate([_reference_rows(q[b:b + 1], k_nhd[b:b + 1, :n], v_nhd[b:b + 1, :n])
                            for b, n in enumerate(lens)])
    cp.get_default_memory_pool().free_all_blocks()
    return o


def _reference_rows(q, k_nhd, v_nhd):
    """float64 outputs of sequences of k's full length, one KV head (and its group of query
    heads) of a few sequences per pass, about REF_ROWS KV rows each."""
    import cupy as cp
    import numpy as np
    hkv = k_nhd.shape[2]
    group = q.shape[1] // hkv
    step = max(1, REF_ROWS // max(k_nhd.shape[1], 1))
    parts = []
    for b in range(0, q.shape[0], step):
        heads = [reference.batch_decode_attention(*(cp.from_dlpack(x.double()) for x in (
            q[b:b + step, h * group:(h + 1) * group], k_nhd[b:b + step, :, h:h + 1], v_nhd[b:b + step, :, h:h + 1])))[0]
            for h in range(hkv)]
        parts.append(cp.asnumpy(cp.concatenate(heads, axis=1)))
    return np.concatenate(parts)


def _sdpa_peer(backend_name, q, k_hnd, v_hnd):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    b, hq, d = q.shape
    q4 = q.view(b, hq, 1, d)

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
        s = torch.einsum("hd,shd->hs", q.float(), k.float()) * q.shape[-1] ** -0.5
        return torch.einsum("hs,shd->hd", torch.softmax(s, -1).to(v.dtype).float(), v.float()).to(v.dtype)
    try:
        out = attn(q, k, v)
    except Exception as exc:
        return None, f"{type(exc).__name__}"
    return (lambda: attn(q, k, v)), out


def _flashinfer_peers(q, k_hnd, v_hnd, lens, batched):
    """FlashInfer's CUDA-core ("fi") and tensor-core ("fi-tc") decode on the same HND buffers, as
    {name: (fn, out) or (None, why)}; {} without FlashInfer. A single sequence: its
    single_decode_with_kv_cache; a batch: its paged wrapper with one page of S rows per sequence,
    the last (only) page holding the sequence's length."""
    try:
        import flashinfer
    except ImportError:
        return {}
    import torch
    B, hkv, S, d = k_hnd.shape
    hq = q.shape[1]
    peers = {}
    for name, tc in (("fi", False), ("fi-tc", True)):
        try:
            if not batched:
                def fn(tc=tc):
                    return flashinfer.single_decode_with_kv_cache(q[0], k_hnd[0], v_hnd[0], kv_layout="HND",
                                                                  use_tensor_cores=tc)
            else:
                ws = torch.zeros(128 << 20, dtype=torch.uint8, device=q.device)
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tc)
                last = torch.as_tensor(lens if lens is not None else [S] * B, dtype=torch.int32, device=q.device)
                w.plan(torch.arange(B + 1, dtype=torch.int32, device=q.device),
                       torch.arange(B, dtype=torch.int32, device=q.device), last, hq, hkv, d, S,
                       q_data_type=q.dtype, kv_data_type=k_hnd.dtype)

                def fn(w=w):
                    return w.run(q, (k_hnd, v_hnd))
            peers[name] = (fn, fn())
        except Exception as exc:   # a shape or path FlashInfer does not take
            peers[name] = (None, f"{type(exc).__name__}")
    return peers


def _pykda(q, k, v, batched, layout, chunk, stages, lens=None):
    """A call of pykda's one decode path on these buffers (a single sequence drops the batch dim)."""
    if not batched:
        q, k, v = q[0], k[0], v[0]
    return lambda: flash_decode(q, k, v, batched=batched, kv_layout=layout, kv_lens=lens, chunk_size=chunk,
                                stages=stages)


def run(args):
    import torch
    timer, copy_tbs = timing.start(getattr(args, "flush", "read"))
    chunks, stages = settings(args.chunk_size), settings(args.stages)
    sweep = len(chunks) > 1 or len(stages) > 1
    with_peers = not sweep or bool(getattr(args, "plot", None))   # a plot draws the peers beside the sweep
    grid = bool(getattr(args, "grid", False))
    points = list(itertools.product(chunks, stages))
    rows = []
    for B, hq, hkv, S, batched, d, uneven in progress(
            timing.in_time(_cases(args.quick, getattr(args, "shapes", None), grid)), "bench decode",
            label=lambda case: shape_label(*case[:4]) + f" D={case[5]}" + (" uneven" if case[6] else ""), unit="shape"):
        q, k_hnd, v_hnd, lens = grid_inputs(B, hq, hkv, d, S, uneven)   # k, v HND: what the peers read
        k_nhd, v_nhd = k_hnd.transpose(1, 2).contiguous(), v_hnd.transpose(1, 2).contiguous()
        rows_read = int(lens.sum())
        lens = lens if uneven else None   # None: every sequence S rows, no kv_lens
        kv_lens = torch.as_tensor(lens, dtype=torch.int32).to(q.device) if uneven else None
        nbytes = 2 * rows_read * hkv * d * 2 + 2 * B * hq * d * 2
        o_ref = float64_outputs(q, k_nhd, v_nhd, lens)

        def error(o):
            return reference.relative_error(o.float().reshape(B, hq, d).cpu().numpy(), o_ref)
        peers = {}
        if with_peers:
            if not uneven:   # SDPA and the compiled matmul have no per-sequence lengths
                for name, backend in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION")):
                    peers[name] = _sdpa_peer(backend, q, k_hnd, v_hnd)
                if not batched:
                    peers["compile"] = _compile_peer(q[0], k_nhd[0], v_nhd[0])
            peers.update(_flashinfer_peers(q, k_hnd, v_hnd, lens, batched))
        peer_us = {n: (timer.median_us(fn) if fn else None) for n, (fn, _) in peers.items()}
        peer_err = {n: (error(o) if fn else None) for n, (fn, o) in peers.items()}
        # the reference: a copy moving as many bytes as the kernel reads (half of them read, half written)
        same_us = timer.copy_us(nbytes // 2) if grid and nbytes >= GRID_COPY_BYTES else None
        for chunk, st in (progress(points, "settings", label=_settings_label) if sweep else points):
            nhd = _pykda(q, k_nhd, v_nhd, batched, "NHD", chunk, st, kv_lens)
            hnd = _pykda(q, k_hnd, v_hnd, batched, "HND", chunk, st, kv_lens)
            err_nhd, err_hnd = error(nhd()), error(hnd())
            us_nhd, us = timer.median_us(nhd), timer.median_us(hnd)
            rows.append(dict(batch=B, hq=hq, hkv=hkv, kv_len=S, D=d, uneven=uneven, chunk_size=chunk, stages=st,
                             us=us, us_nhd=us_nhd, tbs=nbytes / us / 1e6, pct_copy=100 * nbytes / us / 1e6 / copy_tbs,
                             pct_same=100 * same_us / us if same_us else None, err=err_hnd, err_nhd=err_nhd,
                             peers={n: dict(us=peer_us[n], err=peer_err[n]) for n in peers}))
            del nhd, hnd
        del q, k_hnd, v_hnd, k_nhd, v_nhd
        torch.cuda.empty_cache()
    _print_table(rows, sweep)
    if grid:
        print(grid_summary(rows))
    return rows


def grid_summary(rows) -> str:
    """One line: pykda's time against the best peer's on each row (peer µs / pykda µs, > 1 is
    pykda ahead), worst and median, the rows where a peer is ahead (the ratio and the peer), and
    the kernel's bandwidth as a share of a copy moving the same bytes (reads + writes) on the
    large rows."""
    import statistics
    ratios = sorted((best[1] / r["us"], shape_label(r["batch"], r["hq"], r["hkv"], r["kv_len"]) + f" D={r['D']}",
                     best[0]) for r in rows if (best := _fastest_peer(r)))
    line = f"grid: {len(rows)} shapes"
    if ratios:
        line += (f"; best peer µs / pykda µs: worst {ratios[0][0]:.2f} ({ratios[0][1]}), "
                 f"median {statistics.median(x for x, _, _ in ratios):.2f} over {len(ratios)} shapes with a peer")
        line += peers_ahead(ratios)
    same = [r["pct_same"] for r in rows if r.get("pct_same")]
    if same:
        line += (f"; at >= {GRID_COPY_BYTES >> 20} MB of KV, {min(same):.0f}-{max(same):.0f} % of the bandwidth of a "
                 f"copy moving as many bytes")
    return line


def peers_ahead(ratios) -> str:
    """A summary's clause naming the rows where a peer leads (a ratio below 1.00 to two places),
    from (peer µs / pykda µs, row, peer) sorted worst first; empty where none does."""
    behind = [f"{label} {x:.2f} ({peer})" for x, label, peer in ratios if round(x, 2) < 1]
    return f"; a peer ahead on {len(behind)}: " + ", ".join(behind) if behind else ""


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
    head = f"{'Hq/Hkv':>7} {'B':>4} {'kv_len':>7} {'D':>3} " + ("chunk stg " if sweep else "") + \
        f"{'NHD us':>8} {'HND us':>8} {'TB/s':>5} {'%copy':>5} {'err':>7} " + \
        " ".join(f"{p + ' us':>10} {'x':>5}" for p in peers)
    print("\nTB/s, % copy, err and the ratios x (peer us / pykda us) are pykda on the peers' HND buffers; "
          "kv_len~: uneven lengths up to kv_len")
    print(head)
    for r in rows:
        line = f"{r['hq']:>3}/{r['hkv']:<3} {r['batch']:>4} {r['kv_len']:>7}{'~' if r.get('uneven') else ' '}" \
               f"{r.get('D', D):>3} "
        if sweep:
            line += f"{str(r['chunk_size'] or 'auto'):>5} {str(r['stages'] or 'd'):>3} "
        line += f"{r['us_nhd']:8.1f} {r['us']:8.1f} {r['tbs']:5.2f} {r['pct_copy']:5.1f} " \
                f"{max(r['err'], r['err_nhd']):7.1e} "
        for p in peers:
            pu = r["peers"].get(p, {}).get("us")   # compile: single sequences only
            line += f"{pu:10.1f} {pu / r['us']:5.2f} " if pu else f"{'-':>10} {'-':>5} "
        print(line)
