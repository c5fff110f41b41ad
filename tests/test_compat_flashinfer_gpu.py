"""pykda.compat.flashinfer on the device: beside FlashInfer (with the peers staged; skipped
without FlashInfer) the same calls, with the same arguments, to both libraries give the same
outputs within bf16 rounding and the same base-2 LSE; the wrapper's CUDA-graph mode replays a run
captured after one plan with the page table of a later plan, whether planned by plan() or by
SGLang's fast_decode_plan."""
import pytest

from pykda import reference
from pykda.compat import flashinfer as shim

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
H, HKV, D, PAGE = 32, 8, 128, 16
TOL = 5e-3   # both outputs are bf16 roundings of the same attention


@pytest.fixture
def flashinfer():
    return pytest.importorskip("flashinfer", reason="FlashInfer (a peer) is not importable")


def rel(a, b):
    return reference.relative_error(a.double().cpu().numpy(), b.double().cpu().numpy())


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_single_decode_matches_flashinfers(flashinfer, kv_layout):
    g = torch.Generator(device="cuda").manual_seed(0)
    kv_len = 1000
    shape = (kv_len, HKV, D) if kv_layout == "NHD" else (HKV, kv_len, D)
    q = torch.randn(H, D, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16) for _ in "kv")
    call = dict(kv_layout=kv_layout, sm_scale=0.07, v_scale=0.5, return_lse=True)
    o, lse = shim.single_decode_with_kv_cache(q, k, v, **call)
    o_fi, lse_fi = flashinfer.single_decode_with_kv_cache(q, k, v, **call)
    assert rel(o, o_fi) <= TOL, rel(o, o_fi)
    assert torch.allclose(lse, lse_fi, atol=1e-3, rtol=1e-4), (lse - lse_fi).abs().max()   # both base 2


def page_table(lengths, pool: int, seed: int, page: int = PAGE):
    """indptr, indices, last_page_len of requests holding `lengths` rows on shuffled pages of
    `page` rows drawn from a pool of `pool` pages (int32, on the device)."""
    pages = [-(-n // page) for n in lengths]
    order = torch.randperm(pool, generator=torch.Generator().manual_seed(seed))[:sum(pages)].to(torch.int32)
    indptr = torch.tensor([0] + [sum(pages[:i + 1]) for i in range(len(pages))], dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page if p else 1 for n, p in zip(lengths, pages)], dtype=torch.int32)
    return indptr.cuda(), order.cuda(), last.cuda()


def randn(*shape, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)


def test_paged_wrapper_matches_flashinfers(flashinfer):
    lengths, pool = [1, 17, 300, 1024, 4097], 400
    table = page_table(lengths, pool, 1)
    q, cache = randn(len(lengths), H, D, seed=1), randn(pool, 2, HKV, PAGE, D, seed=2)   # one [pages, 2, ...] buffer
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    results = []
    for module in (shim, flashinfer):
        w = module.BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
        w.plan(*table, H, HKV, D, PAGE, q_data_type=torch.bfloat16, sm_scale=0.09)
        results.append(w.run(q, cache, return_lse=True))
    (o, lse), (o_fi, lse_fi) = results
    assert rel(o, o_fi) <= TOL, rel(o, o_fi)
    assert torch.allclose(lse, lse_fi, atol=1e-3, rtol=1e-4), (lse - lse_fi).abs().max()


def test_cuda_graph_mode_replays_the_latest_plan():
    """A run captured after one plan, replayed after each of two plans of the batch size (other
    lengths and pages, a longer longest request: its graph gives the rest to the last chunk):
    each replay matches an eager run of its plan (equal for the captured plan; within bf16
    rounding for the other, split in other chunks)."""
    B, pool = 4, 600
    bufs = (torch.empty(B + 1, dtype=torch.int32, device="cuda"), torch.empty(4096, dtype=torch.int32, device="cuda"),
            torch.empty(B, dtype=torch.int32, device="cuda"))
    w = shim.BatchDecodeWithPagedKVCacheWrapper(None, "HND", True, False, *bufs)
    tables = [page_table([100, 2000, 33, 700], pool, 2), page_table([3000, 5, 640, 1200], pool, 3)]
    cache, q = randn(pool, 2, HKV, PAGE, D, seed=4), randn(B, H, D, seed=5)
    out = torch.empty_like(q)
    w.plan(*tables[0], H, HKV, D, PAGE, q_data_type=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.run(q, cache, out=out)   # warm-up on a side stream, then capture (torch's idiom)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out)
    for i, table in enumerate(tables):
        w.plan(*table, H, HKV, D, PAGE, q_data_type=torch.bfloat16)
        q.copy_(randn(B, H, D, seed=10 + i))
        out.fill_(float("nan"))
        graph.replay()
        eager = shim.BatchDecodeWithPagedKVCacheWrapper(None, "HND")
        eager.plan(*table, H, HKV, D, PAGE, q_data_type=torch.bfloat16)
        o = eager.run(q, cache)
        assert torch.equal(out, o) if i == 0 else rel(out, o) <= TOL, rel(out, o)


@pytest.mark.parametrize("tensor_cores, flashinfers", [(False, False), (True, False), (True, True)])
def test_sglang_graph_replays_after_fast_decode_plan(tensor_cores, flashinfers):
    """SGLang's decode under CUDA graphs on its token pool (pages of 1, NHD): plan() once, the run
    captured (through forward(), as SGLang calls it), then before each replay the next table
    written into the wrapper's buffers and fast_decode_plan (SGLang's, or FlashInfer's own) in
    place of plan(): each replay equals an eager plan and run of its table (the plan's chunks may
    differ: within bf16 rounding then). A table has a request with no rows, as SGLang's padded
    batches do."""
    from sglang_fast_plan import fast_decode_plan
    B, pool, scale = 4, 12000, D ** -0.5
    bufs = (torch.empty(B + 1, dtype=torch.int32, device="cuda"), torch.empty(pool, dtype=torch.int32, device="cuda"),
            torch.empty(B, dtype=torch.int32, device="cuda"))
    w = shim.BatchDecodeWithPagedKVCacheWrapper(torch.empty(8, dtype=torch.uint8, device="cuda"), "NHD", True,
                                                tensor_cores, *bufs)
    tables = [page_table(lengths, pool, seed, page=1)
              for seed, lengths in ((6, [100, 2000, 33, 700]), (7, [3000, 0, 640, 1200]), (8, [5, 17, 1, 4097]))]
    cache = (randn(pool, HKV, D, seed=4), randn(pool, HKV, D, seed=3))   # SGLang's (k_buffer, v_buffer)
    q = randn(B, H, D, seed=5)
    w.begin_forward(*tables[0], H, HKV, D, 1, data_type=torch.bfloat16, q_data_type=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        w.forward(q, cache, sm_scale=scale)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w.forward(q, cache, sm_scale=scale)
    for i, (indptr, indices, last) in enumerate(tables[1:] + tables[:1]):
        bufs[0].copy_(indptr)
        bufs[1][:indices.shape[0]].copy_(indices)
        bufs[2].copy_(last)
        fast_decode_plan(w, bufs[0], bufs[1], bufs[2], H, HKV, D, 1, sm_scale=scale, flashinfers=flashinfers)
        q.copy_(randn(B, H, D, seed=20 + i))
        out.fill_(float("nan"))
        graph.replay()
        eager = shim.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
        eager.plan(indptr, indices, last, H, HKV, D, 1, q_data_type=torch.bfloat16)
        o = eager.run(q, cache)
        assert not out.isnan().any() and rel(out, o) <= TOL, rel(out, o)
        if i == 2:   # the captured plan's own table
            assert torch.equal(out, o)
