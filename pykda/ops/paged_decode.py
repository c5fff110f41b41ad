"""Flash decoding over a paged KV cache, in FlashInfer's page-table layout:
`BatchDecodeWithPagedKVCache`.

Request b's pages are `kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`, in order; its last page holds
`kv_last_page_len[b]` rows. The caches are `[num_pages, page_size, num_kv_heads, head_dim]`
("NHD") or `[num_pages, num_kv_heads, page_size, head_dim]` ("HND"). The kernel is the flash
decoding kernel of `decode` with paged addressing (a template flag): pages of 16 rows or more
arrive by TMA, a box per page per tile; smaller pages, and the pages of one-tile CTAs (requests
within a tile: `DecodePlan.gathers`), are gathered row by row with cp.async. A
short call of few CTAs (every request within 64 rows, as for padded caches: `decode.tiny_pays`)
runs decode_tiny, which copies its rows through the page table with cp.async.

`plan()` reads the page table on the host once per batch layout (checks it, counts each
request's rows) and copies the rows and page offsets to a device buffer of its own, and where
decode_tiny or one-tile CTAs may run the layout, each request's first page ids after them
(`page_snapshot`, a kernel of its own: those kernels then read them beside the rows, not after); `run()`
reads only device memory and allocates only its outputs and split workspace (from the framework
of q), so it can be captured in a CUDA graph. validate -> plan -> kernel bound to its constants
(`decode.decode_call`, memoized per arguments' metadata and plan) -> tensor maps + workspace ->
`decode.launch`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .. import runtime
from ..runtime import arrays as device_arrays
from ..runtime.arrays import CallArrays, DeviceArray, is_torch_tensor
from . import decode
from .checks import (Memo, check_aligned, check_dtype, check_inner_contiguous, check_ndim,
                     check_same_device, check_shape, check_stages, is_int, resolve_scale)

PAGE_SIZES = (1, 8, 16, 32, 64, 128)
MAX_ROWS = (1 << 31) - 1   # the kernel's rows per request are int32, never clamped below this


class PagedLayout(NamedTuple):
    """What `plan()` fixed for its `run()` calls (hashable: part of the prepared calls' key)."""
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    kv_layout: str
    max_rows: int          # the longest request's rows, for the chunk split
    device: int
    scale: float
    chunk_size: int | None
    stages: int | None
    snap_width: int        # page ids per request copied after the tables (a short request's), or 0


SNAPSHOT_THREADS = 256


def snapshot_spec(arch: str) -> runtime.KernelSpec:
    """page_snapshot.cu.j2's kernel: plan()'s copy of each request's first page ids."""
    return runtime.KernelSpec.make("page_snapshot", {}, arch)


def snapshot_width(batch: int, q_heads: int, kv_heads: int, head_dim: int, page_size: int, device: int) -> int:
    """Page ids per request that plan() copies after its tables: those of a tile's rows (at least
    decode_tiny's most) where the planner may give a run of this batch and these heads to
    decode_tiny or to one-tile CTAs (short requests, no chunk size or stages asked for), else 0.
    Whatever this plan's lengths and settings: a graph captured on either stays valid for the
    plans of this batch after it."""
    dev = runtime.device_info(device)
    short = decode.DecodeProblem(1, q_heads, kv_heads, head_dim, "bfloat16", batch)
    plan = decode.plan_decode(short, dev.sm_count, dev.smem_per_sm, uneven=True, balanced=None,
                              gathered=decode.is_gathered(page_size), tiny=True)
    rows = max(decode.TINY_ROWS[-1], decode.TILE_ROWS[head_dim])
    return -(-rows // page_size) if plan.tiny or plan.one_tile else 0


def host_int32(x, name: str) -> np.ndarray:
    """A 1-D int32 page-table array on the host (read back from the device if it lives there);
    TypeError names `x` unless it is an int32 array or a sequence of ints."""
    if isinstance(x, (list, tuple)):
        a = np.asarray(x, dtype=np.int64)
        if a.size and (a.min() < -(1 << 31) or a.max() >= 1 << 31):
            raise ValueError(f"{name} must hold int32 values")
        a = a.astype(np.int32)
    elif isinstance(x, np.ndarray):
        a = x
    elif is_torch_tensor(x):
        if str(x.dtype) != "torch.int32":
            raise TypeError(f"{name} must have dtype int32; got {str(x.dtype).removeprefix('torch.')}")
        a = x.detach().cpu().numpy()
    else:
        import cupy
        a = cupy.asnumpy(cupy.asarray(x))
    if a.dtype != np.int32:
        raise TypeError(f"{name} must have dtype int32; got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {tuple(a.shape)}")
    return a


def request_rows(kv_indptr: np.ndarray, kv_last_page_len: np.ndarray, num_indices: int, page_size: int) -> np.ndarray:
    """Rows of each request, (pages - 1) * page_size + last page's rows (0 without pages), after
    checking the table: kv_indptr [batch + 1] non-decreasing within [0, len(kv_indices)], each
    request with pages holding 1..page_size rows in its last page."""
    if kv_indptr.shape[0] < 2:
        raise ValueError(f"kv_indptr must have shape [batch + 1] with batch >= 1; got {tuple(kv_indptr.shape)}")
    batch = kv_indptr.shape[0] - 1
    if kv_last_page_len.shape != (batch,):
        raise ValueError(f"kv_last_page_len must have shape [batch] = ({batch},); got {tuple(kv_last_page_len.shape)}")
    pages = np.diff(kv_indptr.astype(np.int64))
    if kv_indptr[0] < 0 or (pages < 0).any():
        at = 0 if kv_indptr[0] < 0 else int(np.argmax(pages < 0)) + 1
        raise ValueError(f"kv_indptr must be non-decreasing from 0 or more; kv_indptr[{at}] = {kv_indptr[at]}"
                         + (f" < kv_indptr[{at - 1}] = {kv_indptr[at - 1]}" if at else ""))
    if kv_indptr[-1] > num_indices:
        raise ValueError(f"kv_indptr[-1] = {kv_indptr[-1]} exceeds the {num_indices} entries of kv_indices")
    bad = (pages > 0) & ((kv_last_page_len < 1) | (kv_last_page_len > page_size))
    if bad.any():
        b = int(np.argmax(bad))
        raise ValueError(f"kv_last_page_len[{b}] = {kv_last_page_len[b]} must be in [1, page_size = {page_size}] "
                         f"for a request with pages")
    rows = np.where(pages > 0, (pages - 1) * page_size + kv_last_page_len, 0)
    if rows.max() > MAX_ROWS:
        raise ValueError(f"a request of {rows.max()} rows is too long (at most {MAX_ROWS})")
    return rows


def cache_layout(kv_layout: str) -> str:
    return ("[num_pages, page_size, num_kv_heads, head_dim]" if kv_layout == "NHD"
            else "[num_pages, num_kv_heads, page_size, head_dim]")


def validate_paged(q: DeviceArray, k: DeviceArray, v: DeviceArray, out: DeviceArray | None,
                   layout: PagedLayout) -> decode.DecodeProblem:
    """Check q, the caches and out against the plan: dtypes, shapes, strides, alignment, device."""
    pl = layout
    q_layout, kv_text = "[batch, num_qo_heads, head_dim]", cache_layout(pl.kv_layout)
    check_ndim(q, "q", 3, q_layout)
    check_shape(q, "q", (pl.batch, pl.q_heads, pl.head_dim), q_layout)
    check_dtype(q, "q", decode.DTYPES)
    for name, a in (("k_cache", k), ("v_cache", v)):
        check_ndim(a, name, 4, kv_text)
        if a.dtype != q.dtype:
            raise TypeError(f"{name} must have the dtype of q ({q.dtype}); got {a.dtype}")
        page = (pl.page_size, pl.kv_heads) if pl.kv_layout == "NHD" else (pl.kv_heads, pl.page_size)
        check_shape(a, name, (k.shape[0],) + page + (pl.head_dim,), kv_text)
        check_inner_contiguous(a, name)
        check_aligned(a, name, 16)
    if k.shape[0] < 1:
        raise ValueError("k_cache must hold at least one page; got num_pages 0")
    if tuple(v.strides) != tuple(k.strides):   # one set of strides addresses both in the gather
        raise ValueError(f"v_cache must have the strides of k_cache {tuple(k.strides)}; got {tuple(v.strides)}")
    arrays = {"q": q, "k_cache": k, "v_cache": v}
    decode.check_out(out, q, q_layout, arrays)
    if check_same_device(arrays) != pl.device:
        raise ValueError(f"q and the caches must be on the device of plan()'s kv_indices ({pl.device}); got {q.device}")
    return decode.DecodeProblem(kv_len=max(1, pl.max_rows), q_heads=pl.q_heads, kv_heads=pl.kv_heads,
                                head_dim=pl.head_dim, dtype=q.dtype, batch=pl.batch)


def _page_ids(x, name: str, ndim: int, layout: str) -> DeviceArray:
    """A device int32 array of page ids (kv_indices, block_tables): its rank, its rows
    contiguous, 4-byte aligned."""
    a = device_arrays.as_device_array(x, name)
    check_dtype(a, name, ("int32",))
    check_ndim(a, name, ndim, layout)
    check_inner_contiguous(a, name)
    check_aligned(a, name, 4)
    return a


def prepare_paged(q, k, v, out, layout: PagedLayout) -> decode.DecodeCall:
    """Validate a run and make everything its launch needs but the pointers, the outputs, the
    workspace, the tensor maps of the run's caches and the stream."""
    p = validate_paged(q, k, v, out, layout)
    runtime.require_gpu()
    plan, spec = decode.plan_for(p, q.device, layout.chunk_size, layout.stages, layout.page_size, uneven=p.batch > 1,
                                 balanced=None)
    (num_pages, _, _, _), (page_stride, row_stride, head_stride, _) = decode.kv_view(k, True, layout.kv_layout)
    tail_maps = None
    if plan.gathers(layout.page_size):
        k_maps = v_maps = decode.no_map
    else:   # (head_dim, kv_heads, page_size, num_pages) boxes of a page's rows (at most a tile; box-major: 5-D)
        maps = functools.partial(decode.kv_map_pair, k, v, ("k_cache", "v_cache"), True, layout.kv_layout)
        box_rows = min(plan.block_n, layout.page_size)
        k_maps, v_maps = maps(box_rows, spec.param_dict.get("BOX_MAJOR", False))   # as the kernel reads them
        if box_rows > decode.PAGED_TAIL_ROWS:   # a segment's last, partial tile, in boxes of fewer rows
            tail_maps = maps(decode.PAGED_TAIL_ROWS)
    return decode.decode_call(p, plan, spec, q, out, True, k_maps, v_maps, layout.scale, MAX_ROWS,
                              (np.int32(num_pages), np.int64(page_stride), np.int64(row_stride), np.int64(head_stride)),
                              tail_maps=tail_maps, kv_strides=(page_stride, row_stride, head_stride) * 2,
                              page_size=layout.page_size,
                              snap_width=layout.snap_width)


ARGUMENTS = ("q", "k_cache", "v_cache", "out")
REQUIRED = 3
# prepared runs by the arguments' key (CallArrays) and the plan's layout
PREPARED = Memo(lambda arrays, layout: prepare_paged(*arrays.views(), layout))


def run_planned(layout: PagedLayout, tables_ptr: int, indices_ptr: int, q, k_cache, v_cache, out=None,
                return_lse: bool = False, stream=None):
    """`run()` of a plan: its layout and the device pointers of its int32 tables (rows per
    request, then each request's first page entry) and of its page ids. What
    `BatchDecodeWithPagedKVCache.run` and the torch op `pykda::paged_decode_run` launch."""
    arrays = CallArrays((q, k_cache, v_cache, out), ARGUMENTS, REQUIRED)
    call = PREPARED.get((arrays.key, layout), arrays, layout)
    starts = tables_ptr + 4 * layout.batch   # (then the snapshot, where snap_width > 0)
    return decode.launch(call, arrays, stream, out, return_lse, tables_ptr, (starts, indices_ptr))


def planned_pointers(layout: PagedLayout, tables, indices) -> tuple[int, int]:
    """The pointers `run_planned` takes, of a plan's arrays handed back from outside the wrapper
    (the torch op's arguments): `tables` int32, contiguous, at least (2 + snap_width) · batch entries; `indices`
    the int32 page ids the plan read (kv_indices or block_tables, rows contiguous); both 4-byte
    aligned, on the plan's device."""
    t = device_arrays.as_device_array(tables, "tables")
    check_dtype(t, "tables", ("int32",))
    need = (2 + layout.snap_width) * layout.batch
    if t.ndim != 1 or t.shape[0] < need:
        raise ValueError(f"tables must be a 1-D int32 array of at least (2 + snap_width) · batch = {need} entries "
                         f"(plan()'s rows, first page entries and page ids); got shape {tuple(t.shape)}")
    i = device_arrays.as_device_array(indices, "indices")
    check_dtype(i, "indices", ("int32",))
    for name, a in (("tables", t), ("indices", i)):
        check_inner_contiguous(a, name)
        check_aligned(a, name, 4)
        if a.device != layout.device:
            raise ValueError(f"{name} must be on the plan's device ({layout.device}); got device {a.device}")
    return t.ptr, i.ptr


class BatchDecodeWithPagedKVCache:
    """Decode attention of one query token per head for a batch of requests whose KV cache is
    paged (FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` layout):

        dec = pykda.BatchDecodeWithPagedKVCache(kv_layout="NHD")
        dec.plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size)
        o = dec.run(q, k_cache, v_cache)            # once per layer; capturable in a CUDA graph

    kv_indptr [batch + 1] and kv_last_page_len [batch]: int32, on the host or the device (read by
    `plan()`, a synchronisation where they are on the device); kv_indices: int32 on the device,
    contiguous, read by every `run()` (keep it alive and unchanged, or plan again). A request with
    no pages gives zeros and an LSE of -inf; rows past a request's last page row are never used.
    Page sizes 1, 8, 16, 32, 64, 128; bf16/fp16; head_dim 64, 128, 256; num_qo_heads a multiple of
    num_kv_heads. A page id outside [0, num_pages) reads zeros, never other memory.

    CUDA graphs: a graph captured around `run()` stays valid after `plan()` is called again with
    the same batch size and kv_indices buffer (new page ids, lengths up to any size: the kernel
    reads them on the device; the chunk split stays the capture's). `plan()` copies to the device
    on the current stream of kv_indices' framework. torch.compile: `pykda.torch_ops.BatchDecodeWithPagedKVCache`,
    whose `run()` is the torch op `pykda::paged_decode_run` (both launch through `run_planned`).
    """

    def __init__(self, kv_layout: str = "NHD"):
        if kv_layout not in decode.KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {decode.KV_LAYOUTS}; got {kv_layout!r}")
        self.kv_layout = kv_layout
        self._layout: PagedLayout | None = None
        self._tables = None      # device int32 [>= 2 * batch]: rows per request, then first page entries
        self._tables_ptr = 0
        self._tables_at = (-1, 0)   # the device and int32 capacity of _tables
        self._indices = None     # plan()'s kv_indices, kept alive for run()
        self._indices_ptr = 0

    @staticmethod
    def _check_sizes(num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, stages) -> None:
        if page_size not in PAGE_SIZES:
            raise ValueError(f"page_size must be one of {PAGE_SIZES}; got {page_size}")
        if head_dim not in decode.HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {decode.HEAD_DIMS}; got {head_dim}")
        if num_kv_heads < 1 or num_qo_heads < 1 or num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        check_stages(stages)

    def plan(self, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             page_size: int, *, scale: float | None = None, chunk_size: int | None = None,
             stages: int | None = None, max_kv_len: int | None = None) -> None:
        """Check the page table and fix the batch layout for `run()` (see the class). `scale`
        defaults to 1/sqrt(head_dim); `chunk_size` and `stages` override the planner as in
        `batch_decode_with_padded_kv_cache`. `max_kv_len` (>= every request's rows) plans the
        chunk split for that length instead of the longest request's, so that plans of growing
        requests keep one layout (one compiled graph under torch.compile); None: the longest. A
        plan of short requests runs decode_tiny (a few CTAs, within 64 rows) or, within one tile,
        one stage of fewer warps: a graph of it replayed over longer requests is right but slow,
        so plan such graphs with `max_kv_len`."""
        self._check_sizes(num_qo_heads, num_kv_heads, head_dim, page_size, stages)
        indices = _page_ids(kv_indices, "kv_indices", 1, "[num_page_entries]")
        indptr = host_int32(kv_indptr, "kv_indptr")
        rows = request_rows(indptr, host_int32(kv_last_page_len, "kv_last_page_len"), indices.shape[0], page_size)
        self._set_tables(rows, indptr[:-1], kv_indices, indices, num_qo_heads, num_kv_heads, head_dim, page_size,
                         scale, chunk_size, stages, max_kv_len, snapshot=True)

    def plan_block_tables(self, block_tables, seq_lens, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                          page_size: int, *, scale: float | None = None, chunk_size: int | None = None,
                          stages: int | None = None, max_kv_len: int | None = None) -> None:
        """`plan()` for vLLM's block table: request b's pages are `block_tables[b, :]` in order
        (int32 on the device, [batch, max_blocks], rows contiguous; a view of a wider table is
        fine) and it holds `seq_lens[b]` rows (int32, host or device: read here), at most
        max_blocks · page_size. No table is copied: `run()` reads the pages from block_tables
        (keep it alive; a graph captured around `run()` stays valid when its rows change).
        `max_kv_len` as in `plan()`."""
        self._check_sizes(num_qo_heads, num_kv_heads, head_dim, page_size, stages)
        table = _page_ids(block_tables, "block_tables", 2, "[batch, max_blocks]")
        batch, max_blocks = table.shape
        rows = host_int32(seq_lens, "seq_lens")
        if rows.shape != (batch,):
            raise ValueError(f"seq_lens must have shape [batch] = ({batch},); got {tuple(rows.shape)}")
        bad = (rows < 0) | (rows > max_blocks * page_size)
        if bad.any():
            b = int(np.argmax(bad))
            raise ValueError(f"seq_lens[{b}] = {rows[b]} must be in [0, max_blocks · page_size = "
                             f"{max_blocks * page_size}]")
        starts = np.arange(batch, dtype=np.int64) * table.strides[0]
        if batch and starts[-1] > MAX_ROWS:
            raise ValueError(f"block_tables is too large: row {batch - 1} starts at entry {starts[-1]} (at most "
                             f"{MAX_ROWS})")
        self._set_tables(rows, starts, block_tables, table, num_qo_heads, num_kv_heads, head_dim, page_size, scale,
                         chunk_size, stages, max_kv_len, snapshot=False)

    def _set_tables(self, rows, starts, pages_obj, pages: DeviceArray, num_qo_heads, num_kv_heads, head_dim,
                    page_size, scale, chunk_size, stages, max_kv_len, snapshot: bool) -> None:
        """Fix the batch layout and copy each request's rows and first page entry to the device
        (rewritten in place while they fit); run() reads request b's pages from pages[starts[b]:].
        `snapshot` (a table that run() may not reread: plan()'s kv_indices, not a block table
        whose rows change under a graph): each request's first page ids after them too, where
        decode_tiny or one-tile CTAs may run the layout (`snapshot_width`)."""
        batch = rows.shape[0]
        longest = int(rows.max()) if batch else 0
        if max_kv_len is not None:
            if not is_int(max_kv_len) or not longest <= max_kv_len <= MAX_ROWS:
                raise ValueError(f"max_kv_len must be an int from the longest request's rows ({longest}) to "
                                 f"{MAX_ROWS}; got {max_kv_len!r}")
            longest = int(max_kv_len)
        decode.check_grid(decode.DecodeProblem(1, num_qo_heads, num_kv_heads, head_dim, "bfloat16", batch))
        runtime.require_gpu()
        width = snapshot_width(batch, num_qo_heads, num_kv_heads, head_dim, page_size, pages.device) if snapshot else 0
        layout = PagedLayout(batch, num_qo_heads, num_kv_heads, head_dim, page_size, self.kv_layout,
                             longest, pages.device, resolve_scale(scale, head_dim), chunk_size, stages, width)
        tables = np.concatenate([rows, starts]).astype(np.int32)
        size = tables.size + batch * width   # (then the page ids, written on the device)
        if self._tables_at[0] != pages.device or self._tables_at[1] < size:   # else rewritten in place
            self._tables = device_arrays.empty_like_framework(pages, (size,), "int32")
            self._tables_ptr = device_arrays.as_device_array(self._tables, "tables").ptr
            self._tables_at = (pages.device, size)
        stream = device_arrays.launch_stream(pages)
        device_arrays.copy_from_host(self._tables_ptr, tables, pages.device, stream)
        if width:   # each request's first page ids after the tables, read from kv_indices on the device
            kernel = runtime.get_kernel(snapshot_spec(runtime.device_info(pages.device).arch), pages.device,
                                        "page_snapshot")
            kernel.launch((-(-batch * width // SNAPSHOT_THREADS), 1, 1), (SNAPSHOT_THREADS, 1, 1),
                          (self._tables_ptr, pages.ptr, np.int32(batch), np.int32(width),
                           np.int32(decode.page_shift(page_size))), 0, stream)
        self._indices, self._indices_ptr = pages_obj, pages.ptr
        self._layout = layout

    def run(self, q, k_cache, v_cache=None, *, out=None, return_lse: bool = False, stream=None):
        """o [batch, num_qo_heads, head_dim] (in q's framework, or `out`), and with `return_lse`
        the natural-log LSE [batch, num_qo_heads] fp32. q [batch, num_qo_heads, head_dim]; the
        caches as the class says (strided views allowed, e.g. of one [num_pages, 2, ...] buffer,
        with equal strides); `(k_cache, v_cache)` may come as one tuple."""
        if self._layout is None:
            raise RuntimeError("BatchDecodeWithPagedKVCache: call plan() before run()")
        if v_cache is None and isinstance(k_cache, tuple):
            k_cache, v_cache = k_cache
        return self._launch(q, k_cache, v_cache, out, return_lse, stream)

    def _launch(self, q, k_cache, v_cache, out, return_lse: bool, stream):
        """run()'s launch once the plan and the caches are known (pykda.torch_ops' subclass
        routes it through the torch op)."""
        return run_planned(self._layout, self._tables_ptr, self._indices_ptr, q, k_cache, v_cache, out, return_lse,
                           stream)
