"""GPU tests of BatchDecodeWithPagedKVCache against the float64 reference (run on the H200).

Random page tables: pages shuffled over a larger pool, a few full prefix pages shared by
several requests, requests with no pages, last pages partly filled. Every page no request reads,
and every row past a request's end in its last page, holds NaN; the outputs start as NaN."""
import itertools

import numpy as np
import pytest

import pykda
from pykda import reference, runtime
from pykda.ops import decode as pd

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
TOL = {"bfloat16": 1e-2, "float16": 2e-3}


def page_table(lens, page_size, seed, shared=2, spare=5):
    """kv_indptr, kv_indices, kv_last_page_len (NumPy int32) and the pool's page count: pages
    shuffled, the first `shared` (full) pages common to every request that has more pages."""
    rng = np.random.default_rng(seed)
    pages = [-(-n // page_size) for n in lens]
    n_share = sum(p > shared for p in pages)
    prefix_pages = shared if n_share > 1 else 0
    n_pool = sum(pages) - prefix_pages * (n_share - 1) + spare
    pool = rng.permutation(n_pool)
    prefix, rest = pool[:prefix_pages], iter(pool[prefix_pages:])
    indices = []
    for p in pages:
        own = prefix.tolist() if p > prefix_pages and prefix_pages else []
        indices += own + [int(next(rest)) for _ in range(p - len(own))]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], np.int32)
    return indptr, np.array(indices, np.int32), last, n_pool


def make(lens, page_size, hq, hkv, d, dtype, layout, seed):
    """q, the NHD/HND caches with NaN wherever no request reads, and the page table."""
    indptr, indices, last, n_pool = page_table(lens, page_size, seed)
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = (2 * torch.randn(len(lens), hq, d, generator=g, device="cuda")).to(dt)
    k, v = (torch.randn(n_pool, page_size, hkv, d, generator=g, device="cuda").to(dt) for _ in range(2))
    used = torch.zeros(n_pool, page_size, dtype=torch.bool)
    for b in range(len(lens)):
        for j, page in enumerate(indices[indptr[b]:indptr[b + 1]]):
            used[page, : (last[b] if j == indptr[b + 1] - indptr[b] - 1 else page_size)] = True
    k[~used.cuda()], v[~used.cuda()] = float("nan"), float("nan")
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    return q, k, v, (indptr, indices, last)


def expected(q, k, v, tables, layout, scale=None):
    indptr, indices, last = tables
    o, lse = reference.paged_decode_attention(*(cp.from_dlpack(x.double().contiguous()) for x in (q, k, v)), indptr,
                                              indices, last, layout, scale)
    return cp.asnumpy(o), cp.asnumpy(lse)


def check(o, lse, ref, lens, dtype):
    o, lse = o.float().cpu().numpy(), lse.cpu().numpy()
    assert np.isfinite(o).all(), "every output element written, no unused row read"
    for b, n in enumerate(lens):
        if n == 0:
            assert (o[b] == 0).all() and (lse[b] == -np.inf).all(), "a request without pages gives zeros, LSE -inf"
            continue
        err = reference.relative_error(o[b].astype(np.float64), ref[0][b])
        assert err < TOL[dtype], f"request {b} ({n} rows): relative L2 error {err:.2e}"
        assert np.abs(lse[b] - ref[1][b]).max() < 2e-3


def decode(q, k, v, tables, page_size, layout, hkv, **plan_kw):
    dec = pykda.BatchDecodeWithPagedKVCache(layout)
    indptr, indices, last = tables
    dec.plan(torch.from_numpy(indptr), torch.from_numpy(indices).cuda(), torch.from_numpy(last), q.shape[1], hkv,
             q.shape[2], page_size, **plan_kw)
    out = torch.full_like(q, float("nan"))
    o, lse = dec.run(q, k, v, out=out, return_lse=True)
    assert o is out and lse.dtype == torch.float32
    return o, lse


PAGES, HEADS, DIMS, DTYPES = [1, 8, 16, 32, 64, 128], [(8, 8), (32, 8), (64, 8)], [64, 128, 256], ["bfloat16", "float16"]
# every page size in both layouts, with groups 1/4/8 (transposed), each head dim and dtype among them
CASES = [(page, layout, *HEADS[i % 3], DIMS[i // 3 % 3], DTYPES[i // 2 % 2])
         for i, (page, layout) in enumerate(itertools.product(PAGES, ("NHD", "HND")))] + [
    (8, "HND", 64, 4, 128, "bfloat16"), (32, "HND", 64, 4, 64, "float16"), (128, "HND", 64, 4, 256, "bfloat16")]   # groups of 16


@pytest.mark.parametrize("page_size, layout, hq, hkv, d, dtype", CASES)
def test_matches_reference(page_size, layout, hq, hkv, d, dtype):
    lens = [1000, 0, 1, 3 * page_size, 300, page_size + 1, 0, 2500]
    q, k, v, tables = make(lens, page_size, hq, hkv, d, dtype, layout, seed=page_size + d)
    o, lse = decode(q, k, v, tables, page_size, layout, hkv)
    check(o, lse, expected(q, k, v, tables, layout), lens, dtype)


TINY_CASES = [(1, "NHD", 32, 8, 128, "bfloat16"), (8, "HND", 8, 8, 64, "float16"), (16, "NHD", 64, 8, 128, "bfloat16"),
              (16, "HND", 16, 4, 256, "float16"), (64, "HND", 16, 16, 128, "bfloat16"), (128, "NHD", 8, 1, 64, "bfloat16")]


@pytest.mark.parametrize("page_size, layout, hq, hkv, d, dtype", TINY_CASES)
def test_short_requests_take_decode_tiny(page_size, layout, hq, hkv, d, dtype):
    """Requests within decode_tiny's 64 rows, few CTAs: decode_tiny copies their rows through the page
    table (shuffled pages, shared prefix pages, an empty request, last pages partly filled, NaN in
    every row no request reads)."""
    most = pd.TINY_ROWS[-1]
    lens = [17, 0, 1, most, 31, min(page_size + 1, most)]
    p = pd.DecodeProblem(max(lens), hq, hkv, d, dtype, len(lens))
    assert pd.plan_for(p, 0, None, None, page_size, uneven=True, balanced=None)[0].tiny
    q, k, v, tables = make(lens, page_size, hq, hkv, d, dtype, layout, seed=page_size + d + hq)
    o, lse = decode(q, k, v, tables, page_size, layout, hkv)
    check(o, lse, expected(q, k, v, tables, layout), lens, dtype)


ONE_TILE_CASES = [(16, "NHD", 128), (16, "HND", 256), (64, "HND", 64), (128, "NHD", 128)]


@pytest.mark.parametrize("page_size, layout, d", ONE_TILE_CASES)
def test_one_tile_ctas_gather_pages_of_every_size(page_size, layout, d):
    """A batch of many requests within a tile (more units than decode_tiny takes): one-tile CTAs,
    which gather their rows with cp.async on pages of any size (not TMA boxes); lengths 0..64
    (0, 1, 64 and a page and one row among them), shuffled and shared pages, NaN elsewhere."""
    lens = [0, 1, 64, min(page_size + 1, 64), 33] + np.random.default_rng(page_size + d).integers(0, 65, 35).tolist()
    plan, spec = pd.plan_for(pd.DecodeProblem(64, 32, 8, d, "bfloat16", len(lens)), 0, None, None, page_size,
                             uneven=True, balanced=None)
    assert plan.one_tile and not plan.tiny and spec.param_dict["GATHER"] and spec.param_dict["SELF_GATHER"], plan
    q, k, v, tables = make(lens, page_size, 32, 8, d, "bfloat16", layout, seed=page_size + d + 5)
    o, lse = decode(q, k, v, tables, page_size, layout, 8)
    check(o, lse, expected(q, k, v, tables, layout), lens, "bfloat16")


def test_a_one_tile_graph_replays_longer_requests():
    """A graph captured on one-tile CTAs (gathered pages of 16) and replayed after a plan of longer
    requests: each CTA then walks its request's tiles through its one stage."""
    page_size, hq, hkv, d, batch = 16, 32, 8, 128, 40   # 320 units: more than decode_tiny takes
    first = np.random.default_rng(1).integers(0, 65, batch).tolist()
    later = np.random.default_rng(2).integers(0, 400, batch).tolist()
    capacity = sum(-(-n // page_size) for n in later) + 16
    q = torch.empty(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.empty(capacity, page_size, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    indices = torch.zeros(capacity, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    dec = pykda.BatchDecodeWithPagedKVCache()

    def load(lens, seed):
        q2, k2, v2, (indptr, idx, last) = make(lens, page_size, hq, hkv, d, "bfloat16", "NHD", seed)
        k.fill_(float("nan")), v.fill_(float("nan"))
        k[: k2.shape[0]], v[: k2.shape[0]] = k2, v2
        q.copy_(q2)
        indices[: len(idx)] = torch.from_numpy(idx).cuda()
        dec.plan(indptr, indices, last, hq, hkv, d, page_size)
        assert dec._layout.snap_width == 64 // page_size, "a tile's page ids after the tables (longer: from kv_indices)"
        return q2, k2, v2, (indptr, idx, last)
    load(first, 21)
    assert pd.plan_for(pd.DecodeProblem(64, hq, hkv, d, "bfloat16", batch), 0, None, None, page_size, uneven=True,
                       balanced=None)[0].one_tile
    s = torch.cuda.Stream()   # torch's documented capture: a warm-up on a side stream, then torch.cuda.graph(g)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dec.run(q, k, v, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = dec.run(q, k, v, out=out, return_lse=True)
    q2, k2, v2, tables = load(later, 22)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check(out, lse, expected(q2, k2, v2, tables, "NHD"), later, "bfloat16")


@pytest.mark.parametrize("page_size", [1, 8, 16, 128])
def test_plan_copies_the_first_page_ids_after_its_tables(page_size):
    """page_snapshot: after plan(), the tables hold the rows, the first page entries, then each
    request's page ids of decode_tiny's 64 rows (-1 past its pages), read from kv_indices; a
    second plan of the same batch rewrites them in place."""
    dec = pykda.BatchDecodeWithPagedKVCache("NHD")
    for seed, lens in enumerate(([17, 0, 1, 64, 200, page_size + 1], [3, 64, 0, 65, 1, 9000])):
        indptr, indices, last, _ = page_table(lens, page_size, seed)
        if seed:
            buffer = dec._tables
            buffer.fill_(-7)   # the first plan's, poisoned: the second writes it again
        dec.plan(torch.from_numpy(indptr), torch.from_numpy(indices).cuda(), torch.from_numpy(last), 32, 8, 128,
                 page_size)
        assert not seed or dec._tables is buffer
        width = dec._layout.snap_width
        assert width == -(-64 // page_size)
        ids = [[int(indices[indptr[b] + j]) if j < indptr[b + 1] - indptr[b] else -1 for j in range(width)]
               for b in range(len(lens))]
        got = dec._tables.cpu().numpy()
        assert got[:len(lens)].tolist() == lens and got[len(lens):2 * len(lens)].tolist() == indptr[:-1].tolist()
        assert got[2 * len(lens):2 * len(lens) + len(lens) * width].tolist() == sum(ids, [])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("d", [128, 256])
def test_pages_of_16_in_box_major_tiles(layout, d):
    """Pages of 16 rows come in one 5-D TMA copy a page for all of a tile's 64-column sub-tiles
    (decode.box_major, decode.cu.j2's BOX_MAJOR): every row of every sub-tile lands where the
    consumers read it, at both head dims of more than one sub-tile, in both layouts, with requests
    ending mid-page and mid-tile, one of them empty."""
    from pykda.ops import decode as dec_op
    lens = [1000, 0, 17, 64, 2500, 129]
    q, k, v, tables = make(lens, 16, 32, 4, d, "bfloat16", layout, seed=d + 3)
    problem = dec_op.DecodeProblem(kv_len=max(lens), q_heads=32, kv_heads=4, head_dim=d, dtype="bfloat16",
                                   batch=len(lens))
    plan, spec = dec_op.plan_for(problem, q.device.index, None, None, 16, uneven=True, balanced=None)
    assert spec.param_dict.get("BOX_MAJOR") and not plan.tiny, "the box-major tiles are what this test reads"
    o, lse = decode(q, k, v, tables, 16, layout, 4)
    check(o, lse, expected(q, k, v, tables, layout), lens, "bfloat16")


# 192 rows = 3 tiles (not a power of two): with 128-row pages every other chunk starts mid-page
@pytest.mark.parametrize("page_size, chunk_size", [(1, 64), (16, 64), (64, 64), (1, 192), (16, 192), (128, 192)])
def test_split_requests_merge_with_scale(page_size, chunk_size):
    """A forced small chunk: requests of 0..5000 rows take ceil(rows / chunk) chunks, 1..79 each (1..27 of
    192), the last the remainder (at 64, 65, 129 and 4097 rows end in a chunk of one row), merged by
    decode_merge."""
    lens = [5000, 64, 65, 0, 4097, 129]
    q, k, v, tables = make(lens, page_size, 32, 4, 128, "bfloat16", "NHD", seed=7 + page_size)
    o, lse = decode(q, k, v, tables, page_size, "NHD", 4, scale=0.3, chunk_size=chunk_size)
    check(o, lse, expected(q, k, v, tables, "NHD", scale=0.3), lens, "bfloat16")


@pytest.mark.parametrize("page_size, chunk_size, cluster", [(1, 128, 8), (16, 128, 8), (16, 384, 4), (64, 512, 2)])
def test_split_requests_merge_in_clusters(page_size, chunk_size, cluster):
    """40 requests of 0..1000 rows in chunks of 128, 384 or 512 rows (at most 8, 3 or 2 each): more
    CTAs than one round of the GPU, so each request's chunks merge in a cluster of 8, 4 or 2 CTAs
    (those past its chunks leave at once), no decode_merge."""
    from pykda.ops import decode as dec_op
    lens = [1000, 0, 1, 64, 65, 999, 129, 383, 385, 512, 513] + \
        np.random.default_rng(page_size).integers(0, 1001, 29).tolist()
    q, k, v, tables = make(lens, page_size, 32, 4, 128, "bfloat16", "NHD", seed=11 + page_size)
    dev = runtime.device_info(0)
    plan = dec_op.plan_decode(dec_op.DecodeProblem(1000, 32, 4, 128, "bfloat16", len(lens)), dev.sm_count,
                              dev.smem_per_sm, chunk_size, uneven=True)
    assert plan.cluster == cluster, plan
    o, lse = decode(q, k, v, tables, page_size, "NHD", 4, scale=0.3, chunk_size=chunk_size, max_kv_len=1000)
    check(o, lse, expected(q, k, v, tables, "NHD", scale=0.3), lens, "bfloat16")


@pytest.mark.parametrize("page_size", [1, 16, 128])   # gathered, a TMA box a page, pages longer than a tile
def test_few_long_requests_take_the_balanced_split(page_size):
    """Few long requests (the planner's balanced split: CTAs share every request's and KV head's
    tiles, crossing requests): lengths 0, 1, 4097, 9000 and random, a request without pages among
    them, shared prefix pages; against float64."""
    lens = [9000, 0, 1, 4097] + np.random.default_rng(page_size).integers(0, 9001, 4).tolist()
    hq, hkv, d = 32, 4, 128
    dev = runtime.device_info(0)
    from pykda.ops import decode as dec_op
    plan = dec_op.plan_decode(dec_op.DecodeProblem(max(lens), hq, hkv, d, "bfloat16", len(lens)), dev.sm_count,
                              dev.smem_per_sm, uneven=True, balanced=None)
    assert plan.balanced, plan
    q, k, v, tables = make(lens, page_size, hq, hkv, d, "bfloat16", "NHD", seed=40 + page_size)
    o, lse = decode(q, k, v, tables, page_size, "NHD", hkv)
    check(o, lse, expected(q, k, v, tables, "NHD"), lens, "bfloat16")


@pytest.mark.parametrize("page_size", [1, 16])
def test_max_kv_len_plans_for_longer_requests(page_size):
    """plan(max_kv_len=) far above the longest request: the split's spare chunks find no rows
    and the merge ignores them; the results are the reference's."""
    lens = [1000, 0, 1, 300, page_size + 1]
    q, k, v, tables = make(lens, page_size, 32, 8, 128, "bfloat16", "NHD", seed=31 + page_size)
    o, lse = decode(q, k, v, tables, page_size, "NHD", 8, max_kv_len=131072)
    check(o, lse, expected(q, k, v, tables, "NHD"), lens, "bfloat16")


@pytest.mark.parametrize("page_size", [1, 16])
def test_k_and_v_as_views_of_one_buffer(page_size):
    """FlashInfer's [num_pages, 2, ...] cache: K and V strided views with equal strides."""
    lens = [700, 33, 0]
    q, k, v, tables = make(lens, page_size, 32, 8, 128, "bfloat16", "HND", seed=11)
    kv = torch.stack([k, v], dim=1)
    o, lse = decode(q, kv[:, 0], kv[:, 1], tables, page_size, "HND", 8)
    check(o, lse, expected(q, k, v, tables, "HND"), lens, "bfloat16")


@pytest.mark.parametrize("page_size, first", [(1, [3000, 1, 200]), (16, [3000, 1, 200]), (1, [17, 5, 30]),
                                               (16, [17, 5, 30])])
def test_cuda_graph_replays_new_page_tables(page_size, first):
    """A graph captured around run() reads the tables of the latest plan() (same batch size and
    kv_indices buffer), requests longer than at capture included (a capture of short requests is
    decode_tiny's, which then takes the rows block by block), and after a plan with max_kv_len
    (which still copies the first page ids that decode_tiny reads)."""
    hq, hkv, d, capacity = 32, 8, 128, 13000 // page_size + 16   # pages enough for every table here
    nan = float("nan")
    q = torch.empty(3, hq, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.empty(capacity, page_size, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    indices = torch.zeros(capacity, dtype=torch.int32, device="cuda")   # the capture's kv_indices buffer
    out = torch.empty_like(q)
    dec = pykda.BatchDecodeWithPagedKVCache()

    def load(lens, seed, **plan_kw):
        """New data and page table in the captured buffers, planned."""
        q2, k2, v2, (indptr, idx, last) = make(lens, page_size, hq, hkv, d, "bfloat16", "NHD", seed)
        k.fill_(nan), v.fill_(nan)
        k[: k2.shape[0]], v[: k2.shape[0]] = k2, v2
        q.copy_(q2)
        indices[: len(idx)] = torch.from_numpy(idx).cuda()
        dec.plan(indptr, indices, last, hq, hkv, d, page_size, **plan_kw)
        return q2, k2, v2, (indptr, idx, last)
    load(first, 13)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up on the capture stream: compile, grow its workspace
        dec.run(q, k, v, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        _, lse = dec.run(q, k, v, out=out, return_lse=True)
    for seed, lens, plan_kw in ((14, [9000, 0, 5], {}), (15, [1, 2999, 64], {}),
                                (16, [40, 3, 60], dict(max_kv_len=12000))):
        q2, k2, v2, tables = load(lens, seed, **plan_kw)
        out.fill_(nan)
        graph.replay()
        torch.cuda.synchronize()
        check(out, lse, expected(q2, k2, v2, tables, "NHD"), lens, "bfloat16")


@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_page_ids_outside_the_pool_read_zeros(page_size):
    """Memory safety: a page id past the pool or negative reads zero rows (scores 0, values 0)."""
    lens = [3 * page_size, 2 * page_size]
    q, k, v, (indptr, indices, last) = make(lens, page_size, 8, 8, 64, "bfloat16", "NHD", seed=17)
    pool = k.shape[0]
    indices = indices.copy()
    indices[1], indices[indptr[1]] = pool + 1000, -1
    o, lse = decode(q, k, v, (indptr, indices, last), page_size, "NHD", 8)
    zero = torch.zeros(1, *k.shape[1:], dtype=k.dtype, device="cuda")
    k0, v0 = torch.cat([k, zero]), torch.cat([v, zero])   # the bad ids read page `pool` of zeros
    ref_indices = np.where((indices < 0) | (indices >= pool), pool, indices)
    check(o, lse, expected(q, k0, v0, (indptr, ref_indices, last), "NHD"), lens, "bfloat16")


@pytest.mark.parametrize("page_size, lens", [(1, [1000, 0, 1, 300, 2500]), (16, [1000, 0, 1, 300, 2500]),
                                              (1, [17, 0, 1, 30, 5]), (16, [17, 0, 1, 56, 5])])
def test_block_tables_equal_the_page_table(page_size, lens):
    """vLLM's form (a [batch, max_blocks] view of a wider table, seq_lens) gives the page table's
    output bit for bit on the same pages, on the pipeline and on decode_tiny (short requests)."""
    q, k, v, tables = make(lens, page_size, 32, 8, 128, "bfloat16", "NHD", seed=11)
    o, lse = decode(q, k, v, tables, page_size, "NHD", 8)
    indptr, indices, _ = tables
    max_blocks = int(np.diff(indptr).max())
    wide = torch.full((len(lens), max_blocks + 3), -7, dtype=torch.int32)
    for b in range(len(lens)):
        wide[b, : indptr[b + 1] - indptr[b]] = torch.from_numpy(indices[indptr[b]:indptr[b + 1]])
    wide = wide.cuda()
    dec = pykda.BatchDecodeWithPagedKVCache("NHD")
    dec.plan_block_tables(wide[:, :max_blocks], torch.tensor(lens, dtype=torch.int32), 32, 8, 128, page_size)
    o2, lse2 = dec.run(q, k, v, return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
