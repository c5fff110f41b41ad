"""CPU tests of BatchDecodeWithPagedKVCache: the page-table checks of plan(), the argument checks
of run(), and the launch sequence offline (fake device, kernels and tensor maps; no GPU needed)."""
import numpy as np
import pytest

import pykda
from pykda import registry
from pykda.ops import decode, paged_decode
from pykda.ops.paged_decode import request_rows
from pykda.runtime import arrays
from fakes import BASE, device_array as arr, offline_runtime
from test_batch_decode_checks import _KINDS, kernel_parameters

H200 = dict(sm_count=132, smem_per_sm=233472)
TABLES, INDICES, K, V = BASE * 2, BASE * 5, BASE * 6, BASE * 7   # fake addresses (outputs are at BASE * 2)


@pytest.fixture
def offline(monkeypatch):
    """The runtime faked (launches, tensor maps, workspaces and host-to-device copies logged)."""
    log = dict(launches=[], maps=[], workspaces=[], copies=[])

    def workspace(ref, stream, nbytes):
        log["workspaces"].append(nbytes)
        return None, BASE * 4
    offline_runtime(monkeypatch, log["launches"], workspace, log["maps"])
    monkeypatch.setattr(arrays, "copy_from_host", lambda ptr, host, dev, stream: log["copies"].append((ptr, host.copy())))
    paged_decode.PREPARED.clear()
    yield log
    paged_decode.PREPARED.clear()


def table(lens, page_size):
    """kv_indptr, kv_indices (a fake device array) and kv_last_page_len of requests of `lens` rows."""
    pages = [-(-n // page_size) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], np.int32)
    return indptr, arr((max(int(indptr[-1]), 1),), "int32", ptr=INDICES), last


def planned(lens=(100, 0, 33), hq=32, hkv=8, d=128, page_size=16, layout="NHD", **kw):
    dec = pykda.BatchDecodeWithPagedKVCache(layout)
    indptr, indices, last = table(lens, page_size)
    dec.plan(indptr, indices, last, hq, hkv, d, page_size, **kw)
    return dec


def caches(num_pages=50, page_size=16, hkv=8, d=128, layout="NHD", dtype="bfloat16"):
    shape = (num_pages, page_size, hkv, d) if layout == "NHD" else (num_pages, hkv, page_size, d)
    return arr(shape, dtype, ptr=K), arr(shape, dtype, ptr=V)


def test_request_rows_count_full_pages_and_the_last_one():
    indptr = np.array([0, 3, 3, 4], np.int32)
    assert request_rows(indptr, np.array([5, 0, 16], np.int32), 4, 16).tolist() == [37, 0, 16]


@pytest.mark.parametrize("case, exc, message", [
    ("falls", ValueError, r"kv_indptr must be non-decreasing from 0 or more; kv_indptr\[2\] = 1 < kv_indptr\[1\] = 3"),
    ("negative", ValueError, r"kv_indptr must be non-decreasing from 0 or more; kv_indptr\[0\] = -1"),
    ("beyond", ValueError, r"kv_indptr\[-1\] = 5 exceeds the 4 entries of kv_indices"),
    ("last0", ValueError, r"kv_last_page_len\[0\] = 0 must be in \[1, page_size = 16\]"),
    ("last17", ValueError, r"kv_last_page_len\[2\] = 17 must be in \[1, page_size = 16\]"),
    ("last_shape", ValueError, r"kv_last_page_len must have shape \[batch\] = \(3,\); got \(2,\)"),
    ("empty", ValueError, r"kv_indptr must have shape \[batch \+ 1\] with batch >= 1; got \(1,\)"),
])
def test_bad_page_tables_name_the_argument(case, exc, message):
    indptr, last = np.array([0, 3, 3, 4], np.int32), np.array([5, 0, 16], np.int32)
    if case == "falls":
        indptr = np.array([0, 3, 1, 4], np.int32)
    elif case == "negative":
        indptr = np.array([-1, 3, 3, 4], np.int32)
    elif case == "beyond":
        indptr = np.array([0, 3, 3, 5], np.int32)
    elif case == "last0":
        last = np.array([0, 0, 16], np.int32)
    elif case == "last17":
        last = np.array([5, 0, 17], np.int32)
    elif case == "last_shape":
        last = last[:2]
    elif case == "empty":
        indptr = indptr[:1]
    with pytest.raises(exc, match=message):
        request_rows(indptr, last, 4, 16)


@pytest.mark.parametrize("case, exc, message", [
    ("page_size", ValueError, r"page_size must be one of \(1, 8, 16, 32, 64, 128\); got 4"),
    ("head_dim", ValueError, r"head_dim must be one of \(64, 128, 256\); got 96"),
    ("ratio", ValueError, r"num_qo_heads \(30\) must be a multiple of num_kv_heads \(8\)"),
    ("stages", ValueError, "stages must be in 2..8; got 1"),
    ("indptr_dtype", TypeError, "kv_indptr must have dtype int32; got int64"),
    ("indptr_rank", ValueError, r"kv_indptr must be 1-D; got shape \(2, 2\)"),
    ("last_dtype", TypeError, "kv_last_page_len must have dtype int32; got float32"),
    ("indices_dtype", TypeError, "kv_indices must have dtype int32; got int64"),
    ("indices_host", TypeError, "kv_indices must be a GPU array"),
    ("indices_rank", ValueError, r"kv_indices must be 1-D \[num_page_entries\]"),
    ("indices_strided", ValueError, "kv_indices must be contiguous"),
    ("grid", ValueError, "batch 70000 is too large"),
])
def test_bad_plan_arguments_name_the_argument(offline, case, exc, message):
    indptr, indices, last = table([100, 0, 33], 16)
    args = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16)
    kw = {}
    if case == "page_size":
        args["page_size"] = 4
    elif case == "head_dim":
        args["head_dim"] = 96
    elif case == "ratio":
        args["num_qo_heads"] = 30
    elif case == "stages":
        kw["stages"] = 1
    elif case == "indptr_dtype":
        indptr = indptr.astype(np.int64)
    elif case == "indptr_rank":
        indptr = np.zeros((2, 2), np.int32)
    elif case == "last_dtype":
        last = last.astype(np.float32)
    elif case == "indices_dtype":
        indices = arr((10,), "int64")
    elif case == "indices_host":
        indices = np.zeros(10, np.int32)
    elif case == "indices_rank":
        indices = arr((10, 1), "int32")
    elif case == "indices_strided":
        indices = arr((10,), "int32", strides=(2,))
    elif case == "grid":
        indptr, indices, last = table([1] * 70000, 16)
        args.update(num_qo_heads=8, num_kv_heads=8)
    dec = pykda.BatchDecodeWithPagedKVCache()
    with pytest.raises(exc, match=message):
        dec.plan(indptr, indices, last, **args, **kw)
    assert offline["copies"] == [], "nothing reaches the device before the checks pass"


def test_page_tables_may_be_lists(offline):
    dec = pykda.BatchDecodeWithPagedKVCache()
    dec.plan([0, 2, 2], arr((2,), "int32", ptr=INDICES), [3, 0], 8, 8, 64, 16)
    ((_, tables),) = offline["copies"]
    assert tables.tolist() == [19, 0, 0, 2]


def test_plan_copies_each_requests_first_page_ids_where_short_kernels_may_run(offline, monkeypatch):
    """plan() of a batch that decode_tiny or one-tile CTAs may run (short requests): rows and first
    page entries to the device, then page_snapshot writes each request's page ids of a tile's rows
    (64 at head dim 128) after them, from kv_indices (the GPU test checks the ids). Block tables
    (their rows may change under a graph) and batches that neither kernel takes (CTAs of 16 query
    heads, too many for decode_tiny) copy none; a plan of long requests, max_kv_len, a chunk size
    or stages copy them still (a graph captured on an earlier plan's short kernel reads them)."""
    lens = [1000, 0, 33, 64]
    made = []
    real = arrays.empty_like_framework
    monkeypatch.setattr(arrays, "empty_like_framework", lambda ref, shape, dtype: made.append(shape) or real(ref, shape, dtype))
    for page_size in (1, 16, 128):
        offline["copies"].clear(), offline["launches"].clear(), made.clear()
        dec = planned(lens, page_size=page_size)
        width = -(-64 // page_size)
        indptr, _, _ = table(lens, page_size)
        ((tables_ptr, tables),) = offline["copies"]
        assert tables_ptr == TABLES and tables.tolist() == lens + indptr[:-1].tolist()
        assert made == [(4 * (2 + width),)], "room for the page ids after the tables"
        ((name, grid, block, smem, args, spec),) = offline["launches"]
        assert name == "page_snapshot" and spec == paged_decode.snapshot_spec("sm_90a")
        assert args == (TABLES, INDICES, 4, width, page_size.bit_length() - 1)
        assert block == (paged_decode.SNAPSHOT_THREADS, 1, 1) and smem == 0
        assert grid == (-(-4 * width // paged_decode.SNAPSHOT_THREADS), 1, 1)
        assert dec._layout.snap_width == width
    for kw in (dict(max_kv_len=1000), dict(chunk_size=64), dict(stages=2)):
        offline["copies"].clear(), offline["launches"].clear()
        assert planned(lens, **kw)._layout.snap_width == 4 and offline["launches"][0][0] == "page_snapshot"
    assert planned([1] * 300, hkv=8)._layout.snap_width == 4, "2400 units: one-tile CTAs, not decode_tiny"
    assert planned([1] * 300, hq=64, hkv=4)._layout.snap_width == 0, "1200 units of 16 heads: neither"
    offline["copies"].clear(), offline["launches"].clear()
    dec = pykda.BatchDecodeWithPagedKVCache()
    dec.plan_block_tables(arr((3, 4), "int32", ptr=INDICES), np.array([5, 0, 64], np.int32), 32, 8, 128, 16)
    assert dec._layout.snap_width == 0 and offline["launches"] == [] and len(offline["copies"][0][1]) == 6


def test_run_before_plan_is_refused():
    with pytest.raises(RuntimeError, match=r"call plan\(\) before run\(\)"):
        pykda.BatchDecodeWithPagedKVCache().run(arr((3, 32, 128)), *caches())


def test_bad_layout_is_refused_by_name():
    with pytest.raises(ValueError, match=r"kv_layout must be one of \('NHD', 'HND'\); got 'NDH'"):
        pykda.BatchDecodeWithPagedKVCache("NDH")


@pytest.mark.parametrize("case, exc, message", [
    ("q_shape", ValueError, r"q must have shape \[batch, num_qo_heads, head_dim\] = \(3, 32, 128\); got \(4, 32, 128\)"),
    ("q_rank", ValueError, r"q must be 3-D \[batch, num_qo_heads, head_dim\]"),
    ("q_dtype", TypeError, "q must have dtype bfloat16 or float16; got float32"),
    ("k_dtype", TypeError, r"k_cache must have the dtype of q \(bfloat16\); got float16"),
    ("k_rank", ValueError, r"k_cache must be 4-D \[num_pages, page_size, num_kv_heads, head_dim\]"),
    ("k_page", ValueError, r"k_cache must have shape \[num_pages, page_size, num_kv_heads, head_dim\] = "
                           r"\(50, 16, 8, 128\); got \(50, 32, 8, 128\)"),
    ("k_hnd_as_nhd", ValueError, r"k_cache must have shape \[num_pages, page_size"),
    ("v_strides", ValueError, r"v_cache must have the strides of k_cache \(16384, 1024, 128, 1\); got \(32768"),
    ("v_shape", ValueError, r"v_cache must have shape \[num_pages, .*\(50, 16, 8, 128\); got \(49, 16, 8, 128\)"),
    ("no_pages", ValueError, "k_cache must hold at least one page"),
    ("misaligned", ValueError, "v_cache must start at a 16-byte aligned address"),
    ("inner", ValueError, "k_cache must be contiguous in its last dimension"),
    ("out_shape", ValueError, r"out must have shape \[batch, num_qo_heads, head_dim\]"),
    ("out_dtype", TypeError, "out must have the dtype of q"),
    ("device", ValueError, "all arrays must be on one device"),
    ("plan_device", ValueError, r"q and the caches must be on the device of plan\(\)'s kv_indices \(0\); got 1"),
])
def test_bad_run_arguments_raise_before_any_launch(offline, case, exc, message):
    dec = planned()
    q, out = arr((3, 32, 128)), None
    k, v = caches()
    if case == "q_shape":
        q = arr((4, 32, 128))
    elif case == "q_rank":
        q = arr((3, 32, 128, 1))
    elif case == "q_dtype":
        q = arr((3, 32, 128), "float32")
    elif case == "k_dtype":
        k, _ = caches(dtype="float16")
    elif case == "k_rank":
        k = arr((50, 16, 1024))
    elif case == "k_page":
        k, v = caches(page_size=32)
    elif case == "k_hnd_as_nhd":
        k, v = caches(layout="HND")
    elif case == "v_strides":
        v = arr(k.shape, strides=(2 * 16 * 8 * 128, 8 * 128, 128, 1), ptr=V)
    elif case == "v_shape":
        v = arr((49, 16, 8, 128), ptr=V)
    elif case == "no_pages":
        k, v = caches(num_pages=0)
    elif case == "misaligned":
        v = arr(k.shape, ptr=V + 8)
    elif case == "inner":
        k = arr(k.shape, strides=(16 * 8 * 256, 8 * 256, 256, 2), ptr=K)
    elif case == "out_shape":
        out = arr((3, 32, 64))
    elif case == "out_dtype":
        out = arr((3, 32, 128), "float16")
    elif case == "device":
        v = arr(k.shape, ptr=V, device=1)
    elif case == "plan_device":
        q, out = arr((3, 32, 128), device=1), None
        k, v = (arr(x.shape, ptr=x.ptr, device=1) for x in (k, v))
    planned_launches = list(offline["launches"])   # plan()'s own (page_snapshot)
    with pytest.raises(exc, match=message):
        dec.run(q, k, v, out=out)
    assert offline["launches"] == planned_launches


def test_max_kv_len_fixes_the_split_as_requests_grow(offline):
    """plan(max_kv_len=L): the chunk split of L rows whatever the longest request, so plans of
    growing requests keep one layout (one compiled graph); below the longest, or not an int: refused."""
    hq, hkv, d = 32, 8, 128
    layouts = []
    for lens in ([100, 0, 33], [101, 7, 34], [900, 5, 1]):
        dec = planned(lens, hq, hkv, d, max_kv_len=4096)
        layouts.append(dec._layout)
        dec.run(arr((3, hq, d)), *caches())
    assert len(set(layouts)) == 1 and layouts[0].max_rows == 4096
    p = decode.DecodeProblem(4096, hq, hkv, d, "bfloat16", 3)
    # (a batch of requests: lengths of their own; few long ones: the balanced split)
    plan = decode.plan_decode(p, **H200, uneven=True, balanced=None)
    spec = decode.decode_spec(p, plan, "sm_90a", 16)
    launches = [launch for launch in offline["launches"] if launch[0] != "page_snapshot"]   # (each plan()'s)
    assert plan.balanced and [launch[0] for launch in launches] == ["decode_partial", "decode_merge"] * 3
    partials = {(launch[1], launch[4][-4], launch[5]) for launch in launches[0::2]}   # grid, chunk, kernel
    assert partials == {(plan.grid(p), plan.chunk, spec)}, "the split of 4096 rows, each time"
    merges = {(launch[1], launch[4][2:7], launch[5]) for launch in launches[1::2]}   # grid, tables to CTAs, kernel
    rows_per_cta = decode.MERGE_WARPS // plan.merge_warps
    n_rows = 3 * hq   # 3 x 8 units, fewer than the CTAs: a row per (unit, head of a group)
    assert merges == {((-(-n_rows // rows_per_cta), d // 32, 1), (TABLES, paged_decode.MAX_ROWS, hq, plan.balanced,
                                                                 plan.chunk), spec)}, \
        "merged over the same shares"
    assert {launch[4][-3:] for launch in launches[1::2]} == {(n_rows, hkv, 3)}, "rows (B · q_heads: by unit), KV heads, batch"
    assert planned([100, 0, 33], hq, hkv, d)._layout.max_rows == 100, "without it: the longest request"
    for bad in (99, 1 << 31, 100.0, True):
        with pytest.raises(ValueError, match=r"max_kv_len must be an int from the longest request's rows \(100\)"):
            planned([100, 0, 33], hq, hkv, d, max_kv_len=bad)


@pytest.mark.parametrize("page_size", [1, 8, 16, 64, 128])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_run_is_a_partial_launch_then_a_merge_with_the_page_table(offline, page_size, layout):
    B, hq, hkv, d, P = 3, 32, 8, 128, 50
    lens = [1000, 0, 33]
    dec = planned(lens, hq, hkv, d, page_size, layout, chunk_size=64)   # 16 chunks: more than a cluster
    ((tables_ptr, tables),) = offline["copies"]
    indptr, _, _ = table(lens, page_size)
    assert tables_ptr == TABLES and tables.tolist() == lens + indptr[:-1].tolist(), "rows, then first page entries"
    k, v = caches(P, page_size, hkv, d, layout)
    assert [launch[0] for launch in offline["launches"]] == ["page_snapshot"], "plan()'s copy of the first ids"
    offline["launches"].clear()
    o, lse = dec.run(arr((B, hq, d)), (k, v), return_lse=True)   # the caches as a pair, as FlashInfer takes them
    assert tuple(o.shape) == (B, hq, d) and tuple(lse.shape) == (B, hq)
    (name, grid, block, smem, args, spec), (merge, merge_grid, merge_block, merge_smem, merge_args, merge_spec) = \
        offline["launches"]
    p = decode.DecodeProblem(1000, hq, hkv, d, "bfloat16", B)
    plan = decode.plan_decode(p, **H200, chunk_size=64, gathered=decode.is_gathered(page_size))
    assert spec == decode.decode_spec(p, plan, "sm_90a", page_size) and smem == plan.smem
    assert spec.param_dict["PAGE"] == page_size and spec.param_dict["GATHER"] == (page_size < 16)
    # ceil(1000 / 64) = 16 chunks (the longest request's), the last of 40 rows
    assert name == "decode_partial" and grid == (16, hkv, B) and block == (160, 1, 1)
    assert [_KINDS[type(a)] for a in args] == kernel_parameters("decode_partial", spec.param_dict)
    assert args[7] == TABLES and args[8] == paged_decode.MAX_ROWS, "rows per request from the plan, never clamped"
    n_part = B * hq * 16   # partial rows: 16 chunks
    assert args[13:15] == (BASE * 4, BASE * 4 + n_part * d * 4), "the partial outputs (fp32), then their LSE"
    assert args[19:23] == (TABLES + 4 * B, INDICES, K, V)
    page, row, head = (page_size * hkv * d, hkv * d, d) if layout == "NHD" else (hkv * page_size * d, d, page_size * d)
    assert args[23:] == (P, page, row, head, 64, hkv, B, dec._layout.snap_width), \
        "the pages' count and strides, the chunk, KV heads, batch, the page ids per request after the tables"
    assert merge == "decode_merge" and merge_spec == spec
    # 16 chunks: four warps per (query row, 32 columns), two rows a CTA
    assert (merge_grid, merge_block, merge_smem) == ((B * hq // 2, d // 32, 1), (256, 1, 1), 0)
    assert [_KINDS[type(a)] for a in merge_args] == kernel_parameters("decode_merge", spec.param_dict)
    assert merge_args == (*args[13:15], TABLES, paged_decode.MAX_ROWS, hq, 16, 64, *args[15:19], 4, B * hq, hkv, B) and \
        args[18] != 0, "the workspace, the rows per request, heads, chunks and chunk; out, its strides and the LSE; " \
                       "warps per row, rows, KV heads, batch"
    if page_size < 16:   # gathered: no tensor maps
        assert offline["maps"] == [] and args[3] == args[4] == args[5] == args[6] == bytes(128)
    elif page_size <= decode.PAGED_TAIL_ROWS:   # box-major tiles: (64, page_size, head_dim / 64, kv_heads,
        # num_pages) in boxes of a page's rows of every 64-column sub-tile, one copy a page for K and V
        assert offline["maps"] == [(n, (64, page_size, d // 64, hkv, P), (row * 2, 128, head * 2, page * 2),
                                    (64, page_size, d // 64, 1, 1)) for n in ("k_cache", "v_cache")]
        assert spec.param_dict.get("BOX_MAJOR") is True and "TAIL_ROWS" not in spec.param_dict
    else:   # (head_dim, kv_heads, page_size, num_pages) in boxes of a page's rows, at most a tile; boxes of more
            # than PAGED_TAIL_ROWS rows, a segment's last tile in boxes of that many (the tail maps)
        boxes = dict.fromkeys((min(page_size, plan.block_n), min(page_size, decode.PAGED_TAIL_ROWS)))
        assert offline["maps"] == [(n, (d, hkv, page_size, P), (head * 2, row * 2, page * 2), (64, 1, box, 1))
                                   for box in boxes for n in ("k_cache", "v_cache")]
        assert spec.param_dict.get("TAIL_ROWS") == (decode.PAGED_TAIL_ROWS if len(boxes) == 2 else None)
        assert "BOX_MAJOR" not in spec.param_dict
    assert offline["workspaces"] == [n_part * (d + 1) * 4], "one workspace: the partials and their LSEs"


@pytest.mark.parametrize("page_size", [1, 16, 128])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_short_run_of_few_ctas_is_one_decode_tiny_launch_through_the_page_table(offline, page_size, layout):
    """Requests within 64 rows (decode_tiny's most, as for padded caches), few units: one decode_tiny
    launch (the padded calls' kernel) reading the plan's rows per request and first page entries,
    the page ids, the page count and log2 of the page size, with the pages' strides as its (batch,
    row, head) strides; no workspace, no merge. A request of one row more keeps the pipeline."""
    B, hq, hkv, d, P = 3, 32, 8, 128, 50
    most = decode.TINY_ROWS[-1]
    lens = [17, 0, most]
    dec = planned(lens, hq, hkv, d, page_size, layout)
    k, v = caches(P, page_size, hkv, d, layout)
    o, lse = dec.run(arr((B, hq, d)), k, v, return_lse=True)
    assert tuple(o.shape) == (B, hq, d) and tuple(lse.shape) == (B, hq)
    (snapshot, *_), (name, grid, block, smem, args, spec) = offline["launches"]   # plan()'s, then run()'s
    p = decode.DecodeProblem(most, hq, hkv, d, "bfloat16", B)
    plan = decode.plan_decode(p, **H200, uneven=True, tiny=True)
    assert snapshot == "page_snapshot"
    assert plan.tiny and spec == decode.decode_spec(p, plan, "sm_90a") and spec.template == "decode_tiny"
    assert name == "decode_tiny" and grid == (1, hkv, B) and block == (plan.threads, 1, 1) and smem == plan.smem
    assert [_KINDS[type(a)] for a in args] == kernel_parameters("decode_tiny", spec.param_dict, "decode_tiny")
    page, row, head = (page_size * hkv * d, hkv * d, d) if layout == "NHD" else (hkv * page_size * d, d, page_size * d)
    assert args[3:11] == (K, V, page, row, head, page, row, head)
    assert args[11:13] == (TABLES, paged_decode.MAX_ROWS), "rows per request from the plan, never clamped"
    assert args[19:] == (TABLES + 4 * B, INDICES, P, page_size.bit_length() - 1, -(-most // page_size)), \
        "first page entries, page ids, pages, log2 of the page size, the page ids copied after the entries"
    assert all(p & (p - 1) == 0 for p in paged_decode.PAGE_SIZES), "decode_tiny finds a row's page by shifts"
    assert offline["workspaces"] == []
    planned([17, 0, most + 1], hq, hkv, d, page_size, layout).run(arr((B, hq, d)), k, v)
    assert offline["launches"][-1][0] == "decode_partial"


def test_plan_again_rewrites_the_tables_in_place_while_they_fit(offline, monkeypatch):
    made = []
    real = arrays.empty_like_framework
    monkeypatch.setattr(arrays, "empty_like_framework", lambda ref, shape, dtype: made.append(shape) or real(ref, shape, dtype))
    dec = planned([100, 0, 33])
    indptr, indices, last = table([5, 17, 1], 16)
    dec.plan(indptr, indices, last, 32, 8, 128, 16)   # same batch: the same buffer (a captured graph sees it)
    indptr, indices, last = table([5, 17], 16)
    dec.plan(indptr, indices, last, 32, 8, 128, 16)   # smaller: still fits
    # rows, first entries, and 4 page ids of decode_tiny's 64 rows a request
    assert made == [(18,)] and [c[1].tolist() for c in offline["copies"]][1:] == [[5, 17, 1, 0, 1, 3], [5, 17, 0, 1]]
    indptr, indices, last = table([5, 17, 1, 1], 16)
    dec.plan(indptr, indices, last, 32, 8, 128, 16)
    assert made == [(18,), (24,)]


def test_paged_variants_are_registered():
    specs = set(registry.specs("decode", "sm_90a"))
    for page in paged_decode.PAGE_SIZES:
        for d in decode.HEAD_DIMS:
            p = decode.DecodeProblem(1000, 32, 8, d, "float16", 8)
            plan = decode.plan_decode(p, **H200, gathered=decode.is_gathered(page))
            assert decode.decode_spec(p, plan, "sm_90a", page) in specs


def test_block_tables_plan_reads_pages_in_place(offline):
    """vLLM's block table: rows per request from seq_lens, request b's first page entry at
    b · the table's row stride (a view of a wider table), no page-id copy; then decode_partial
    reads the table in place, and decode_merge the rows per request."""
    B, hq, hkv, d, max_blocks = 3, 32, 8, 128, 70
    table = arr((B, max_blocks), "int32", strides=(100, 1), ptr=INDICES)   # rows of a table of 100 entries
    dec = pykda.BatchDecodeWithPagedKVCache("NHD")
    dec.plan_block_tables(table, [1000, 0, 33], hq, hkv, d, 16)
    ((tables_ptr, tables),) = offline["copies"]
    assert tables_ptr == TABLES and tables.tolist() == [1000, 0, 33, 0, 100, 200]
    k, v = caches(50, 16, hkv, d)
    dec.run(arr((B, hq, d)), k, v)
    assert decode.plan_decode(decode.DecodeProblem(1000, hq, hkv, d, "bfloat16", B), **H200).split
    (name, *_, args, _), (merge, *_, merge_args, _) = offline["launches"]
    assert name == "decode_partial" and args[7] == TABLES and args[19:21] == (TABLES + 4 * B, INDICES)
    assert merge == "decode_merge" and merge_args[2] == TABLES


@pytest.mark.parametrize("case, exc, message", [
    ("dtype", TypeError, "block_tables must have dtype int32; got int64"),
    ("rank", ValueError, r"block_tables must be 2-D \[batch, max_blocks\]"),
    ("inner", ValueError, "block_tables must be contiguous in its last dimension"),
    ("lens_shape", ValueError, r"seq_lens must have shape \[batch\] = \(3,\); got \(2,\)"),
    ("too_long", ValueError, r"seq_lens\[1\] = 161 must be in \[0, max_blocks · page_size = 160\]"),
    ("negative", ValueError, r"seq_lens\[0\] = -1 must be in"),
    ("page_size", ValueError, "page_size must be one of"),
])
def test_bad_block_tables_name_the_argument(offline, case, exc, message):
    table, lens, page = arr((3, 10), "int32", ptr=INDICES), [5, 17, 0], 16
    if case == "dtype":
        table = arr((3, 10), "int64", ptr=INDICES)
    elif case == "rank":
        table = arr((30,), "int32", ptr=INDICES)
    elif case == "inner":
        table = arr((3, 10), "int32", strides=(20, 2), ptr=INDICES)
    elif case == "lens_shape":
        lens = [5, 17]
    elif case == "too_long":
        lens = [5, 161, 0]
    elif case == "negative":
        lens = [-1, 17, 0]
    elif case == "page_size":
        page = 4
    with pytest.raises(exc, match=message):
        pykda.BatchDecodeWithPagedKVCache("NHD").plan_block_tables(table, lens, 32, 8, 128, page)
    assert offline["copies"] == [] and offline["launches"] == []
