"""GPU tests of CUDA-graph capture of every op, the way serving engines use it (issue 14).

For each op: torch's idiom as its documentation writes it (warm-up on a side stream, then
`with torch.cuda.graph(g):` without `stream=`, so the capture runs on torch's own capture
stream); eight graphs of different batch sizes captured back to back sharing one memory pool,
replayed in shuffled order with new data (new kv lengths, new cu_seqlens) and eager calls between
the replays; a capture on a stream never used before. Every replay and eager call is checked
against the float64 references, and torch's RNG must work afterwards (a capture broken by an
allocation inside it leaves the RNG unusable for the rest of the process).

Each op is a case (paged decode's run() among them, planned again before each replay):
`inputs(size)` makes the static inputs of one graph, `refill(x, seed)` copies new data into them
(returning what the check needs), `call(x)` runs the op, `check` compares.
"""
import numpy as np
import pytest

import pykda
from pykda import reference, runtime
from pykda.ops.decode import DecodeProblem, plan_decode

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
import test_paged_decode_gpu as paged  # noqa: E402  (its page tables, float64 reference and check)
SIZES = (1, 2, 3, 4, 5, 6, 7, 8)   # one graph each
TOL = 1e-2
LSE_TOL = 2e-3


def f64(t):
    return t.double().cpu().numpy()


def rel(out, expected):
    return reference.relative_error(f64(out), expected)


def fill(dst, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dst.copy_(scale * torch.randn(dst.shape, generator=g, device="cuda"))


def decode_ref(q, k, v):
    """Float64 output and LSE of one sequence: q [Hq, D], k, v [n, Hkv, D]."""
    o, lse = reference.decode_attention(*(cp.from_dlpack(x.double().contiguous()) for x in (q, k, v)))
    return cp.asnumpy(o), cp.asnumpy(lse)


def check_decode(o, lse, q, k, v, n):
    if n == 0:
        assert (o == 0).all() and (lse == -float("inf")).all(), "an empty sequence gives zeros, LSE -inf"
        return
    o_ref, lse_ref = decode_ref(q, k[:n], v[:n])
    assert rel(o, o_ref) < TOL
    assert np.abs(lse.cpu().numpy() - lse_ref).max() < LSE_TOL


def assert_splits(problems):
    """Each problem splits its sequences, so its calls take a workspace (the chunks' partial outputs
    and LSE) and launch decode_merge after decode_partial."""
    dev = runtime.device_info(0)
    assert all(plan_decode(p, dev.sm_count, dev.smem_per_sm).split for p in problems)


class SingleDecode:
    """single_decode_with_kv_cache; the size is the kv length (8 heads over 2 KV heads, D = 128)."""
    sizes = tuple(300 + 500 * i for i in range(len(SIZES)))

    def inputs(self, S):
        return dict(q=torch.empty(8, 128, device="cuda", dtype=torch.bfloat16),
                    k=torch.empty(S, 2, 128, device="cuda", dtype=torch.bfloat16),
                    v=torch.empty(S, 2, 128, device="cuda", dtype=torch.bfloat16),
                    out=torch.empty(8, 128, device="cuda", dtype=torch.bfloat16))

    def refill(self, x, seed):
        for i, n in enumerate("qkv"):
            fill(x[n], seed * 3 + i, 2.0 if n == "q" else 1.0)
        x["out"].fill_(float("nan"))

    def call(self, x):
        return pykda.single_decode_with_kv_cache(x["q"], x["k"], x["v"], out=x["out"], return_lse=True)

    def check(self, x, outs, _):
        o, lse = outs
        assert o is x["out"]
        check_decode(o, lse, x["q"], x["k"], x["v"], x["k"].shape[0])


class BatchDecode:
    """batch_decode_with_padded_kv_cache of B sequences padded to 1024 rows, lengths on the device;
    rows past a length hold NaN. The outputs are made by the call (inside a capture: from the
    graph's pool)."""
    S, HQ, HKV = 1024, 8, 2
    sizes = SIZES

    @classmethod
    def problem(cls, B):
        return DecodeProblem(cls.S, cls.HQ, cls.HKV, 128, "bfloat16", B)

    def inputs(self, B):
        return dict(q=torch.empty(B, self.HQ, 128, device="cuda", dtype=torch.bfloat16),
                    k=torch.empty(B, self.S, self.HKV, 128, device="cuda", dtype=torch.bfloat16),
                    v=torch.empty(B, self.S, self.HKV, 128, device="cuda", dtype=torch.bfloat16),
                    kv_lens=torch.empty(B, device="cuda", dtype=torch.int32))

    def refill(self, x, seed):
        B = x["q"].shape[0]
        rng = np.random.default_rng(seed)
        lens = [int(n) for n in rng.integers(0, self.S + 1, B)]
        lens[rng.integers(B)] = int(rng.choice([0, 1, self.S]))
        for i, n in enumerate("qkv"):
            fill(x[n], seed * 3 + i, 2.0 if n == "q" else 1.0)
        for b, n in enumerate(lens):
            x["k"][b, n:], x["v"][b, n:] = float("nan"), float("nan")
        x["kv_lens"].copy_(torch.tensor(lens, dtype=torch.int32))
        return lens

    def call(self, x):
        return pykda.batch_decode_with_padded_kv_cache(x["q"], x["k"], x["v"], kv_lens=x["kv_lens"], return_lse=True)

    def check(self, x, outs, lens):
        o, lse = outs
        for b, n in enumerate(lens):
            check_decode(o[b], lse[b], x["q"][b], x["k"][b], x["v"][b], n)


class TinyBatchDecode(BatchDecode):
    """batch_decode_with_padded_kv_cache of B sequences padded to 32 rows (32 query heads over 8 KV
    heads): a short call that decode_tiny runs in one launch without a workspace."""
    S, HQ, HKV = 32, 32, 8


def assert_tiny(problems):
    """decode_tiny runs each problem's calls (one kernel, no pipeline, no split)."""
    dev = runtime.device_info(0)
    assert all(plan_decode(p, dev.sm_count, dev.smem_per_sm, tiny=True).tiny for p in problems)


def kda_inputs(B, T, H, K):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return dict(q=torch.empty(B, T, H, K, **bf), k=torch.empty(B, T, H, K, **bf), v=torch.empty(B, T, H, K, **bf),
                g=torch.empty(B, T, H, K, **bf), beta=torch.empty(B, T, H, **bf),
                A_log=torch.empty(H, device="cuda"), dt_bias=torch.empty(H, K, device="cuda"))


def kda_refill(x, seed):
    for i, n in enumerate(("q", "k", "v", "g", "beta")):
        fill(x[n], seed * 7 + i)
    fill(x["dt_bias"], seed * 7 + 5, 0.5)
    x["A_log"].copy_(torch.log(1 + 15 * torch.rand(x["A_log"].shape, device="cuda",
                                                   generator=torch.Generator(device="cuda").manual_seed(seed))))


# Kimi Linear's gate, -exp(A_log) * softplus(g + dt_bias), L2 norm and sigmoid(beta) in the kernels
KIMI = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            state_v_first=True)


def kda_ref(x, initial_state, cu_seqlens=None):
    return reference.kda_recurrent(*(f64(x[n]) for n in ("q", "k", "v", "g", "beta")), A_log=f64(x["A_log"]),
                                   dt_bias=f64(x["dt_bias"]), initial_state=initial_state, cu_seqlens=cu_seqlens,
                                   gate="softplus")


def run_chunk_kda(x):
    """chunk_kda with fla's keywords and Kimi Linear's gate, varlen with a final state."""
    return pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
                           initial_state=x["s0"], output_final_state=True, cu_seqlens=x["cu_seqlens"], **KIMI)


class ChunkKda:
    """chunk_kda over N packed sequences (B = 1, T = 40·N tokens, H = 2, K = 64), new sequence
    boundaries (empty sequences among them) on every refill; out and the final state are made by
    the call."""
    sizes = SIZES

    def inputs(self, N):
        x = kda_inputs(1, 40 * N, 2, 64)
        x["s0"] = torch.empty(N, 2, 64, 64, device="cuda")
        x["cu_seqlens"] = torch.empty(N + 1, device="cuda", dtype=torch.int32)
        return x

    def refill(self, x, seed):
        kda_refill(x, seed)
        fill(x["s0"], seed * 7 + 6, 0.05)
        N, T = x["s0"].shape[0], x["q"].shape[1]
        cuts = np.sort(np.random.default_rng(seed).integers(0, T + 1, N - 1))
        cu = np.concatenate([[0], cuts, [T]]).astype(np.int32)
        x["cu_seqlens"].copy_(torch.from_numpy(cu))
        return cu

    def call(self, x):
        return run_chunk_kda(x)

    def check(self, x, outs, cu):
        o, fs = outs
        o_ref, s_ref = kda_ref(x, f64(x["s0"]), cu)
        assert rel(o, o_ref) < TOL and rel(fs, s_ref) < TOL


class FusedRecurrentKda:
    """fused_recurrent_kda of B sequences, one token each (H = 2, K = 64), on one state pool of 24
    rows shared by every graph and eager call; new rows (a padding slot among them) on every refill."""
    sizes = SIZES
    P = 24

    def __init__(self):
        self.pool = torch.empty(self.P, 2, 64, 64, device="cuda")
        fill(self.pool, 1, 0.1)

    def inputs(self, B):
        x = kda_inputs(B, 1, 2, 64)
        x["state_indices"] = torch.empty(B, device="cuda", dtype=torch.int32)
        return x

    def refill(self, x, seed):
        kda_refill(x, seed)
        B = x["q"].shape[0]
        rng = np.random.default_rng(seed)
        rows = rng.permutation(self.P)[:B]
        if B > 1:
            rows[rng.integers(B)] = -1
        x["state_indices"].copy_(torch.from_numpy(rows.astype(np.int32)))
        return rows.tolist(), self.pool.clone()

    def call(self, x):
        o, _ = pykda.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=x["A_log"],
                                         dt_bias=x["dt_bias"], initial_state=self.pool,
                                         state_indices=x["state_indices"], **KIMI)
        return (o,)

    def check(self, x, outs, info):
        (o,), (rows, before) = outs, info
        for i, r in enumerate(rows):
            if r < 0:
                assert (o[i] == 0).all(), "a padding slot gives zeros"
                continue
            xi = {n: t[i:i + 1] if t.dim() >= 3 else t for n, t in x.items()}
            o_ref, s_ref = kda_ref(xi, f64(before[r])[None])
            assert rel(o[i:i + 1], o_ref) < TOL and rel(self.pool[r], s_ref[0]) < TOL
        untouched = [r for r in range(self.P) if r not in rows]
        assert torch.equal(self.pool[untouched], before[untouched]), "rows of no sequence stay as they were"


class PagedDecode:
    """BatchDecodeWithPagedKVCache.run of B requests of 0..640 rows on shuffled NHD pages of 16 rows
    (8 query heads over 2 KV heads; test_paged_decode_gpu's tables: shared prefix pages, NaN in every
    row no request reads), one pool and kv_indices buffer per graph; each refill writes new data and
    a new page table into them and plans it again, as a serving step plans before its replay (same
    batch, same kv_indices buffer: the captured run stays valid)."""
    PAGE, MAX_PAGES, HQ, HKV = 16, 40, 8, 2
    sizes = SIZES

    def inputs(self, B):
        bf = dict(device="cuda", dtype=torch.bfloat16)
        pool = B * self.MAX_PAGES + 5   # (page_table's spare pages)
        return dict(q=torch.empty(B, self.HQ, 128, **bf), k=torch.empty(pool, self.PAGE, self.HKV, 128, **bf),
                    v=torch.empty(pool, self.PAGE, self.HKV, 128, **bf),
                    kv_indices=torch.zeros(pool, device="cuda", dtype=torch.int32),
                    dec=pykda.BatchDecodeWithPagedKVCache("NHD"))

    def refill(self, x, seed):
        B, longest = x["q"].shape[0], self.PAGE * self.MAX_PAGES
        rng = np.random.default_rng(seed)
        lens = [int(n) for n in rng.integers(0, longest + 1, B)]
        lens[rng.integers(B)] = int(rng.choice([0, 1, longest]))
        q, k, v, tables = paged.make(lens, self.PAGE, self.HQ, self.HKV, 128, "bfloat16", "NHD", seed)
        indptr, ids, last = tables
        x["q"].copy_(q)
        for name, pages in (("k", k), ("v", v)):
            x[name].fill_(float("nan"))
            x[name][: pages.shape[0]] = pages
        x["kv_indices"][: ids.size].copy_(torch.from_numpy(ids))
        x["dec"].plan(indptr, x["kv_indices"], last, self.HQ, self.HKV, 128, self.PAGE)
        return lens, tables

    def call(self, x):
        return x["dec"].run(x["q"], x["k"], x["v"], return_lse=True)

    def check(self, x, outs, info):
        (o, lse), (lens, tables) = outs, info
        paged.check(o, lse, paged.expected(x["q"], x["k"], x["v"], tables, "NHD"), lens, "bfloat16")


def replay_and_check(case, graph, x, outs, seed):
    info = case.refill(x, seed)
    graph.replay()
    torch.cuda.synchronize()
    case.check(x, outs, info)


def eager_and_check(case, size, seed):
    x = case.inputs(size)
    info = case.refill(x, seed)
    outs = case.call(x)
    torch.cuda.synchronize()
    case.check(x, outs, info)


def check_rng_works():
    assert not torch.cuda.is_current_stream_capturing()
    r = torch.randn(1 << 16, device="cuda")
    torch.cuda.synchronize()
    assert torch.isfinite(r).all() and 0.9 < float(r.std()) < 1.1


def torch_idiom(case):
    """torch's documented capture: side-stream warm-up, `with torch.cuda.graph(g):`, replays."""
    x = case.inputs(case.sizes[-1])
    case.refill(x, 0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            case.call(x)
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = case.call(x)

    for seed in (1, 2):
        replay_and_check(case, g, x, outs, seed)
    check_rng_works()


def shared_pool_and_fresh_stream(case):
    """A graph per size captured back to back in one pool, replayed in shuffled order with new data
    and an eager call between replays; then a capture on a stream never used before."""
    xs = [case.inputs(n) for n in case.sizes]
    for i, x in enumerate(xs):
        case.refill(x, 10 + i)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up of every size: compiles each kernel
        for x in xs:
            case.call(x)
    torch.cuda.current_stream().wait_stream(s)

    graphs, outs = [torch.cuda.CUDAGraph() for _ in xs], []
    with torch.cuda.graph(graphs[0]):
        outs.append(case.call(xs[0]))
    for g, x in zip(graphs[1:], xs[1:]):
        with torch.cuda.graph(g, pool=graphs[0].pool()):
            outs.append(case.call(x))

    rng = np.random.default_rng(0)
    seed = 100
    for _ in range(2):
        for i in rng.permutation(len(graphs)):
            replay_and_check(case, graphs[i], xs[i], outs[i], seed)
            eager_and_check(case, case.sizes[rng.integers(len(case.sizes))], seed + 1)
            seed += 2

    raw = cp.cuda.Stream(non_blocking=True)   # a CUDA stream made now: no call has ever used it
    fresh = torch.cuda.ExternalStream(raw.ptr)
    g = torch.cuda.CUDAGraph()
    fresh.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=fresh):
        fresh_outs = case.call(xs[3])
    for seed in (200, 201):
        replay_and_check(case, g, xs[3], fresh_outs, seed)
    check_rng_works()


def test_single_decode_torch_idiom():
    assert_splits([DecodeProblem(SingleDecode.sizes[-1], 8, 2, 128, "bfloat16")])
    torch_idiom(SingleDecode())


def test_single_decode_shared_pool_and_fresh_stream():
    assert_splits([DecodeProblem(S, 8, 2, 128, "bfloat16") for S in SingleDecode.sizes])
    shared_pool_and_fresh_stream(SingleDecode())


def test_batch_decode_torch_idiom():
    assert_splits([BatchDecode.problem(SIZES[-1])])
    torch_idiom(BatchDecode())


def test_batch_decode_shared_pool_and_fresh_stream():
    assert_splits([BatchDecode.problem(B) for B in SIZES])
    shared_pool_and_fresh_stream(BatchDecode())


def test_tiny_batch_decode_torch_idiom():
    assert_tiny([TinyBatchDecode.problem(SIZES[-1])])
    torch_idiom(TinyBatchDecode())


def test_tiny_batch_decode_shared_pool_and_fresh_stream():
    assert_tiny([TinyBatchDecode.problem(B) for B in SIZES])
    shared_pool_and_fresh_stream(TinyBatchDecode())


def test_paged_decode_torch_idiom():
    torch_idiom(PagedDecode())


def test_paged_decode_shared_pool_and_fresh_stream():
    shared_pool_and_fresh_stream(PagedDecode())


def test_fused_recurrent_kda_torch_idiom():
    torch_idiom(FusedRecurrentKda())


def test_fused_recurrent_kda_shared_pool_and_fresh_stream():
    shared_pool_and_fresh_stream(FusedRecurrentKda())


def test_chunk_kda_torch_idiom():
    torch_idiom(ChunkKda())


def test_chunk_kda_shared_pool_and_fresh_stream():
    shared_pool_and_fresh_stream(ChunkKda())


def test_torch_scratch_is_a_raw_block_of_torch_allocator_for_the_launch_stream():
    """On a CUDA build of torch, the workspace of a torch call is a raw block of torch's caching
    allocator (counted by torch, given back when its owner goes); inside a capture it comes from
    the graph's pool (a new segment of it, where outside the capture t's segment had room)."""
    from pykda.runtime.arrays import TorchBlock
    t = torch.empty(8, device="cuda")
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    owner, ptr = runtime.workspace(t, s.cuda_stream, 3 << 20)
    assert type(owner) is TorchBlock and ptr == owner.ptr and ptr % 256 == 0
    assert torch.cuda.memory_allocated() - before >= 3 << 20
    del owner
    assert torch.cuda.memory_allocated() == before
    reserved = torch.cuda.memory_reserved()   # t's small segment has room for 1 MiB outside any graph
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        graph.capture_begin(pool=torch.cuda.graph_pool_handle())
        owner, ptr = runtime.workspace(t, side.cuda_stream, 1 << 20)
        del owner
        graph.capture_end()
    torch.cuda.synchronize()
    assert ptr != 0 and torch.cuda.memory_reserved() > reserved, "inside the capture: a segment of the graph's pool"


@pytest.mark.parametrize("case, module", [(SingleDecode, "decode"), (BatchDecode, "decode"), (TinyBatchDecode, "decode"),
                                          (ChunkKda, "kda"), (FusedRecurrentKda, "kda_decode")])
def test_repeated_calls_go_as_one_graph_launch_with_each_calls_values(case, module):
    """After GRAPH_AFTER_CALLS calls of a prepared call on a stream, its launches go as one graph
    executable (runtime.LaunchGraph) whose kernel parameters are set anew each call: eager calls
    on the same arrays with new data each time, three of them as the graph, every one checked
    against the float64 reference."""
    import importlib
    from pykda.runtime.launch import GRAPH_AFTER_CALLS, LaunchGraph
    case = case()
    x = case.inputs(case.sizes[2])
    for seed in range(GRAPH_AFTER_CALLS + 3):
        info = case.refill(x, 40 + seed)
        outs = case.call(x)
        torch.cuda.synchronize()
        case.check(x, outs, info)
    call = importlib.import_module(f"pykda.ops.{module}").PREPARED.last[1]
    stream = torch.cuda.current_stream().cuda_stream
    graphs = [g for (s, _), g in call.values.graphs.items() if s == stream]
    if len(call.launches) > 1:
        assert len(graphs) == 1 and type(graphs[0]) is LaunchGraph
    else:   # one launch stays a kernel launch
        assert graphs == [] and module in ("decode", "kda_decode")
    if module == "kda":
        assert len(call.launches) == 2
