"""pykda's ops as torch custom ops (pykda.torch_ops, issues 14 and 13): torch.compile and CUDA graphs.

CPU tests (no GPU; skipped without torch): importing pykda never imports torch and
pykda.torch_ops touches no CUDA; the schemas declare the in-place arguments; the fake
implementations give the results' shapes and dtypes on fake CUDA tensors; and, with CPU
stand-ins in place of the eager functions (same contract: fresh results, buffers written in
place), `torch.library.opcheck` passes and a step calling all four wrappers compiles with no
graph break (aot_eager, static and dynamic shapes) and equals the uncompiled step. Paged decode
(torch_ops.BatchDecodeWithPagedKVCache, op paged_decode_run) the same way, with a plan set up
on the host as plan() leaves it: a step calling run() compiles with no graph break, reads a new
plan's tables without recompiling, and refuses a run before plan(); the op's plan arrays are
checked (planned_pointers) before any launch.

GPU tests: a serving step calling all four ops (flash decoding of one sequence and of a padded
batch, Kimi Linear's prefill into a state pool, then decode on that pool) under
torch.compile(fullgraph=True) equals pykda's eager calls bit for bit; under
mode="reduce-overhead" (CUDA graphs recorded, none skipped) three calls with new data copied
into the inputs do too; opcheck with the real kernels. Paged decode (random page table, page size
16, GQA 32/8, D 128, NHD): the compiled step's run() equals eager run() bit for bit, after a new
plan too, and under reduce-overhead with new data and new page ids at each call.
"""
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import pykda   # noqa: E402
from pykda import torch_ops as ops   # noqa: E402
import numpy as np   # noqa: E402
from pykda.ops import decode as _decode, kda as _kda, kda_decode as _kda_decode   # noqa: E402
from pykda.ops import paged_decode as _paged   # noqa: E402

OPS = {"single_decode_with_kv_cache": ("out",),
       "batch_decode_with_padded_kv_cache": ("out",),
       "paged_decode_run": ("out",),
       "chunk_kda": ("initial_state", "out", "final_state", "intermediate_states"),
       "fused_recurrent_kda": ("initial_state", "out", "intermediate_states_buffer")}
KIMI = dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
bf16, f32 = torch.bfloat16, torch.float32


def _python(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


# ------------------------------------------------------------------------------------------
# CPU: import, schemas, fake implementations
# ------------------------------------------------------------------------------------------

def test_pykda_imports_without_torch_and_torch_ops_touches_no_cuda():
    out = _python("import sys; import pykda; assert 'torch' not in sys.modules, 'import pykda imported torch'\n"
                  "import torch; import pykda.torch_ops\n"
                  "assert not torch.cuda.is_initialized()\n"
                  "print(sorted(n for n in ('single_decode_with_kv_cache', 'batch_decode_with_padded_kv_cache', "
                  "'paged_decode_run', 'chunk_kda', 'fused_recurrent_kda') if hasattr(torch.ops.pykda, n)))")
    assert out.strip() == str(sorted(OPS))
    # torch absent: pykda is unchanged, pykda.torch_ops says what it needs
    out = _python("import sys; sys.modules['torch'] = None\n"
                  "import pykda; assert callable(pykda.chunk_kda)\n"
                  "try:\n    pykda.torch_ops\nexcept ImportError as e:\n    print('ImportError', e)\n")
    assert out.startswith("ImportError") and "needs torch" in out


def test_lazy_attribute():
    assert pykda.torch_ops is ops
    with pytest.raises(AttributeError):
        pykda.no_such_thing


@pytest.mark.parametrize("name", sorted(OPS))
def test_schema_declares_the_buffers_written_in_place(name):
    schema = getattr(torch.ops.pykda, name).default._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == OPS[name]
    assert all(r.alias_info is None for r in schema.returns), "results never alias inputs"


def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode()


def meta(t):
    return None if t is None else (tuple(t.shape), t.dtype, t.device.type)


def test_fake_decode_results():
    with fake_mode():
        q, k = torch.empty(8, 128, dtype=bf16, device="cuda"), torch.empty(1000, 2, 128, dtype=bf16, device="cuda")
        o, lse = torch.ops.pykda.single_decode_with_kv_cache(q, k, k, return_lse=True)
        assert meta(o) == ((8, 128), bf16, "cuda") and meta(lse) == ((8,), f32, "cuda")
        o, lse = torch.ops.pykda.single_decode_with_kv_cache(q, k, k, out=torch.empty_like(q))
        assert o.numel() == 0 and lse.numel() == 0, "placeholders for out= and no LSE"
        qb = torch.empty(4, 8, 128, dtype=torch.float16, device="cuda")
        kb = torch.empty(4, 2, 512, 128, dtype=torch.float16, device="cuda")
        lens = torch.empty(4, dtype=torch.int32, device="cuda")
        o, lse = torch.ops.pykda.batch_decode_with_padded_kv_cache(qb, kb, kb, lens, kv_layout="HND", return_lse=True)
        assert meta(o) == ((4, 8, 128), torch.float16, "cuda") and meta(lse) == ((4, 8), f32, "cuda")
        # the wrappers return what the eager functions return
        out = torch.empty_like(qb)
        o, lse = ops.batch_decode_with_padded_kv_cache(qb, kb, kb, kv_layout="HND", kv_lens=lens, out=out,
                                                       return_lse=True)
        assert o is out and meta(lse) == ((4, 8), f32, "cuda")
        assert meta(ops.single_decode_with_kv_cache(q, k, k)) == ((8, 128), bf16, "cuda")


def kda_inputs(B, T, H, K, device="cuda"):
    e = lambda *s, dtype=bf16: torch.empty(*s, dtype=dtype, device=device)
    return dict(q=e(B, T, H, K), k=e(B, T, H, K), v=e(B, T, H, K), g=e(B, T, H, K), beta=e(B, T, H),
                A_log=e(H, dtype=f32), dt_bias=e(H, K, dtype=f32))


def test_fake_chunk_kda_results():
    with fake_mode():
        x = kda_inputs(1, 100, 2, 128)
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        # a new final state: [N, H, K, K], N from cu_seqlens, initial_state's dtype (fp32 without one)
        o, fs, ckpt = torch.ops.pykda.chunk_kda(**x, **KIMI, output_final_state=True, cu_seqlens=cu)
        assert ckpt.numel() == 0
        assert meta(o) == ((1, 100, 2, 128), bf16, "cuda") and meta(fs) == ((3, 2, 128, 128), f32, "cuda")
        s0 = torch.empty(3, 2, 128, 128, dtype=bf16, device="cuda")
        o, fs = ops.chunk_kda(**x, **KIMI, initial_state=s0, output_final_state=True, cu_seqlens=cu)
        assert meta(fs) == ((3, 2, 128, 128), bf16, "cuda")
        y = kda_inputs(4, 16, 2, 64)
        o, fs = ops.chunk_kda(**y, **KIMI, output_final_state=True)
        assert meta(o) == ((4, 16, 2, 64), bf16, "cuda") and meta(fs) == ((4, 2, 64, 64), f32, "cuda")
        o, fs = ops.chunk_kda(**y, **KIMI)
        assert fs is None
        # buffers written in place: placeholders from the op, the buffers from the wrapper
        fin, out = torch.empty(4, 2, 64, 64, device="cuda"), torch.empty(4, 16, 2, 64, dtype=bf16, device="cuda")
        o, fs, _ = torch.ops.pykda.chunk_kda(**y, **KIMI, final_state=fin, out=out)
        assert o.numel() == 0 and fs.numel() == 0
        o, fs = ops.chunk_kda(**y, **KIMI, final_state=fin, out=out)
        assert o is out and fs is fin
        pool, rows = torch.empty(9, 2, 128, 128, device="cuda"), torch.empty(3, dtype=torch.int64, device="cuda")
        o, fs, _ = torch.ops.pykda.chunk_kda(**x, **KIMI, initial_state=pool, output_final_state=True,
                                             cu_seqlens=cu, state_indices=rows, state_v_first=True)
        assert fs.numel() == 0
        assert ops.chunk_kda(**x, **KIMI, initial_state=pool, output_final_state=True, cu_seqlens=cu,
                             state_indices=rows, state_v_first=True)[1] is pool
        assert ops.chunk_kda(**x, **KIMI, initial_state=pool, cu_seqlens=cu, state_indices=rows,
                             state_v_first=True)[1] is None


def test_fake_chunk_kda_checkpoints():
    """return_intermediate_states: new checkpoints [B, ceil(T / E), H, K, K] in bf16, fla's
    (E: checkpoint_every, else fla's chunk: 32 with chunk_size=32, else 64), a placeholder where a
    buffer is given (the wrapper returns the buffer); with cu_seqlens their number depends on the
    lengths, so the op asks for the buffer."""
    with fake_mode():
        y = kda_inputs(2, 200, 2, 64)
        s0 = torch.empty(2, 2, 64, 64, dtype=bf16, device="cuda")
        for kw, rows in ((dict(), 4), (dict(chunk_size=32), 7), (dict(checkpoint_every=16), 13),
                         (dict(initial_state=s0, chunk_size=64), 4)):
            o, fs, ckpt = torch.ops.pykda.chunk_kda(**y, **KIMI, return_intermediate_states=True, **kw)
            assert meta(ckpt) == ((2, rows, 2, 64, 64), bf16, "cuda") and fs.numel() == 0
            o, fs, ckpt = ops.chunk_kda(**y, **KIMI, return_intermediate_states=True, **kw)
            assert meta(ckpt) == ((2, rows, 2, 64, 64), bf16, "cuda") and fs is None
        assert len(ops.chunk_kda(**y, **KIMI)) == 2
        x = kda_inputs(1, 100, 2, 128)
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match="needs an intermediate_states buffer"):
            torch.ops.pykda.chunk_kda(**x, **KIMI, cu_seqlens=cu, return_intermediate_states=True)
        buf = torch.empty(1, 5, 2, 128, 128, device="cuda")
        o, fs, ckpt = torch.ops.pykda.chunk_kda(**x, **KIMI, cu_seqlens=cu, return_intermediate_states=True,
                                                intermediate_states=buf)
        assert ckpt.numel() == 0
        assert ops.chunk_kda(**x, **KIMI, cu_seqlens=cu, return_intermediate_states=True,
                             intermediate_states=buf)[2] is buf


def test_fake_chunk_kda_checkpoints_are_bf16_whatever_the_states():
    """New checkpoints are bf16 (fla's) with fp32 states too, as the eager call makes them, and a
    new final state keeps the states' dtype: fp32 initial_state, then a bf16 final_state= buffer."""
    with fake_mode():
        y = kda_inputs(2, 200, 2, 64)
        s0 = torch.empty(2, 2, 64, 64, device="cuda")
        o, fs, ckpt = torch.ops.pykda.chunk_kda(**y, **KIMI, initial_state=s0, output_final_state=True,
                                                return_intermediate_states=True)
        assert meta(ckpt) == ((2, 4, 2, 64, 64), bf16, "cuda") and meta(fs) == ((2, 2, 64, 64), f32, "cuda")
        fin = torch.empty(2, 2, 64, 64, dtype=bf16, device="cuda")
        o, fs, ckpt = ops.chunk_kda(**y, **KIMI, final_state=fin, return_intermediate_states=True)
        assert meta(ckpt) == ((2, 4, 2, 64, 64), bf16, "cuda") and fs is fin


def test_fake_fused_recurrent_kda_results():
    with fake_mode():
        x = kda_inputs(4, 2, 2, 128)
        pool, rows = torch.empty(8, 2, 128, 128, device="cuda"), torch.empty(4, dtype=torch.int32, device="cuda")
        o = torch.ops.pykda.fused_recurrent_kda(**x, **KIMI, initial_state=pool, state_indices=rows,
                                                state_v_first=True)
        assert meta(o) == ((4, 2, 2, 128), bf16, "cuda") and o.is_contiguous()
        o, s = ops.fused_recurrent_kda(**x, **KIMI, initial_state=pool, state_indices=rows, state_v_first=True,
                                       output_final_state=True)
        assert meta(o) == ((4, 2, 2, 128), bf16, "cuda") and s is pool
        out = torch.empty(4, 2, 2, 128, dtype=bf16, device="cuda")
        assert torch.ops.pykda.fused_recurrent_kda(**x, initial_state=pool, out=out, **KIMI).numel() == 0
        assert ops.fused_recurrent_kda(**x, initial_state=pool, out=out, **KIMI) == (out, None)
        # speculative decode: fla's 2-D ssm_state_indices and num_accepted_tokens
        table, acc = (torch.empty(4, 2, dtype=torch.int32, device="cuda"),
                      torch.empty(4, dtype=torch.int32, device="cuda"))
        o, s = ops.fused_recurrent_kda(**x, **KIMI, initial_state=pool, ssm_state_indices=table, num_accepted_tokens=acc,
                                       inplace_final_state=True, state_v_first=True, output_final_state=True)
        assert meta(o) == ((4, 2, 2, 128), bf16, "cuda") and s is pool


def test_speculative_keywords_reach_the_eager_function(monkeypatch):
    """The wrapper and the op hand ssm_state_indices, num_accepted_tokens and inplace_final_state
    to pykda.fused_recurrent_kda, which resolves them (one place)."""
    seen = {}

    def recording(*args, **kw):
        seen.update(kw)
        return stand_in_fused_recurrent_kda(*args, **kw)
    monkeypatch.setattr(_kda_decode, "fused_recurrent_kda", recording)
    x = kda_inputs_random(torch.Generator().manual_seed(0), 2, 2, 2, 128)
    pool = torch.zeros(6, 2, 128, 128)
    table, acc = torch.tensor([[1, 2], [3, -1]], dtype=torch.int32), torch.tensor([2, 1], dtype=torch.int32)
    ops.fused_recurrent_kda(**x, **KIMI, initial_state=pool, ssm_state_indices=table, num_accepted_tokens=acc,
                            state_v_first=True)
    assert seen["ssm_state_indices"] is table and seen["num_accepted_tokens"] is acc
    assert seen["inplace_final_state"] is True and seen["state_indices"] is None and seen["first_row"] == 0
    ops.fused_recurrent_kda(**x, **KIMI, initial_state=pool, ssm_state_indices=table, state_v_first=True,
                            first_row=1)   # vLLM's null block 0
    assert seen["first_row"] == 1


def test_balanced_reaches_the_eager_batch_decode(monkeypatch):
    """The wrapper and the op hand `balanced` (None, True, False) to
    pykda.batch_decode_with_padded_kv_cache."""
    seen = []

    def recording(q, k, v, **kw):
        seen.append(kw["balanced"])
        return q.new_empty(q.shape)
    monkeypatch.setattr(_decode, "batch_decode_with_padded_kv_cache", recording)
    q, k = torch.zeros(2, 4, 64, dtype=bf16), torch.zeros(2, 16, 1, 64, dtype=bf16)
    for flag in (None, True, False):
        ops.batch_decode_with_padded_kv_cache(q, k, k, balanced=flag)
    assert seen == [None, True, False]


def test_cp_context_is_refused():
    with fake_mode(), pytest.raises(ValueError, match="cp_context"):
        ops.chunk_kda(**kda_inputs(1, 16, 1, 64), cp_context=object())


# ------------------------------------------------------------------------------------------
# CPU: the ops' plumbing with stand-ins for the eager functions
# ------------------------------------------------------------------------------------------
# Each stand-in keeps its eager function's contract: new results, `out`/final_state/pool rows
# written in place, the same return values. Their arithmetic is arbitrary but reads the inputs.

def stand_in_decode(q, k, v, *, kv_layout="NHD", kv_lens=None, scale=None, out=None, return_lse=False, stream=None,
                    chunk_size=None, stages=None, balanced=None):
    shift = v.float().mean() + (0.0 if kv_lens is None else kv_lens.float().mean())
    o = (q.float() * (scale or 1.0) + shift).to(q.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    lse = q.float().sum(-1) + k.float().mean()
    return (o, lse) if return_lse else o


def stand_in_chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                       allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                       return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                       *, A_log=None, dt_bias=None, state_indices=None, has_initial_state=None, out=None,
                       final_state=None, chunk_size=16, checkpoint_every=None, intermediate_states=None, **ignored):
    B, T, H, K = q.shape
    o = (q.float() * beta.float()[..., None] + v.float() + g.float()).to(bf16)
    if out is not None:
        out.copy_(o)
        o = out
    n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
    step = k.float().mean() + torch.arange(n, dtype=f32).view(n, 1, 1, 1)
    ckpt = intermediate_states
    if return_intermediate_states or intermediate_states is not None:
        every = checkpoint_every or 64
        if ckpt is None:
            ckpt = torch.empty(B, -(-T // every), H, K, K, dtype=bf16)   # fla's
        ckpt.copy_(q.float().mean() + torch.arange(ckpt.shape[1], dtype=f32).view(1, -1, 1, 1, 1))
    if state_indices is not None:
        for i, r in enumerate(state_indices.tolist()):
            if 0 <= r < initial_state.shape[0]:
                initial_state[r] += step[i].to(initial_state.dtype)
        fs = initial_state if output_final_state else None
    else:
        s0 = initial_state.float() if initial_state is not None else torch.zeros(n, H, K, K)
        new = (s0 + step).to(initial_state.dtype if initial_state is not None else f32)
        if final_state is not None:
            final_state.copy_(new)
            fs = final_state
        else:
            fs = new if output_final_state else None
    return (o, fs, ckpt) if return_intermediate_states else (o, fs)


def stand_in_fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                                 output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                                 use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                                 state_v_first=False, cu_seqlens=None, *, safe_gate=False, state_indices=None,
                                 out=None, **ignored):
    o = torch.empty_like(v, memory_format=torch.contiguous_format)
    o.copy_(q.float() + v.float() * 2)
    rows = state_indices.tolist() if state_indices is not None else range(q.shape[0])
    for i, r in enumerate(rows):
        if r >= 0:
            initial_state[r].mul_(0.5).add_(k[i].float().mean().to(initial_state.dtype))
    if out is not None:
        out.copy_(o)
        o = out
    return o, (initial_state if output_final_state else None)


@pytest.fixture
def stand_ins(monkeypatch):
    monkeypatch.setattr(_decode, "single_decode_with_kv_cache", stand_in_decode)
    monkeypatch.setattr(_decode, "batch_decode_with_padded_kv_cache", stand_in_decode)
    monkeypatch.setattr(_kda, "chunk_kda", stand_in_chunk_kda)
    monkeypatch.setattr(_kda_decode, "fused_recurrent_kda", stand_in_fused_recurrent_kda)


def cpu_step_inputs(seed=0, T=100):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, dtype=bf16: torch.randn(*s, generator=g).to(dtype)
    return dict(
        q1=r(8, 128), k1=r(1000, 2, 128), v1=r(1000, 2, 128),
        q2=r(4, 8, 128), k2=r(4, 512, 2, 128), v2=r(4, 512, 2, 128),
        lens=torch.tensor([512, 100, 0, 301], dtype=torch.int32), out2=torch.empty(4, 8, 128, dtype=bf16),
        **{n + "3": t for n, t in kda_inputs_random(g, 1, T, 2, 128).items()},
        cu=torch.tensor([0, 40, 41, T], dtype=torch.int32), rows3=torch.tensor([5, 0, 2], dtype=torch.int32),
        has=torch.tensor([True, False, True]),
        **{n + "4": t for n, t in kda_inputs_random(g, 4, 1, 2, 128).items()},
        rows4=torch.tensor([2, 5, -1, 7], dtype=torch.int32),
        pool=r(8, 2, 128, 128, dtype=f32) * 0.1)


def kda_inputs_random(gen, B, T, H, K, device="cpu"):
    r = lambda *s, dtype=bf16: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)
    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, K), g=r(B, T, H, K), beta=r(B, T, H),
                A_log=torch.log(1 + 15 * torch.rand(H, generator=gen)).to(device), dt_bias=r(H, K, dtype=f32) * 0.5)


class Eager:
    """pykda's eager functions (pykda.chunk_kda, ...), looked up in their modules at each call,
    where the CPU tests put their stand-ins."""
    MODULES = {"single_decode_with_kv_cache": _decode, "batch_decode_with_padded_kv_cache": _decode,
               "chunk_kda": _kda, "fused_recurrent_kda": _kda_decode}

    def __getattr__(self, name):
        return getattr(self.MODULES[name], name)


EAGER = Eager()


def step_with(mod):
    """The serving step of the tests through `mod` (EAGER, or pykda.torch_ops)."""
    def step(x):
        o1, lse1 = mod.single_decode_with_kv_cache(x["q1"], x["k1"], x["v1"], return_lse=True)
        o2, lse2 = mod.batch_decode_with_padded_kv_cache(x["q2"], x["k2"], x["v2"], kv_lens=x["lens"], out=x["out2"],
                                                         return_lse=True)
        o3, _ = mod.chunk_kda(x["q3"], x["k3"], x["v3"], x["g3"], x["beta3"], **KIMI, A_log=x["A_log3"],
                              dt_bias=x["dt_bias3"], initial_state=x["pool"], state_indices=x["rows3"],
                              has_initial_state=x["has"], cu_seqlens=x["cu"], state_v_first=True)
        o4, pool = mod.fused_recurrent_kda(x["q4"], x["k4"], x["v4"], x["g4"], x["beta4"], A_log=x["A_log4"],
                                           dt_bias=x["dt_bias4"], **KIMI, initial_state=x["pool"],
                                           state_indices=x["rows4"], state_v_first=True, output_final_state=True)
        return o1, lse1, o2, lse2, o3, o4, pool
    return step


def snapshot(results):
    return [r.clone() for r in results]


def fresh(x):
    """x with its buffers written in place (the pool, out2) cloned: for the reference run."""
    return {**x, "pool": x["pool"].clone(), "out2": x["out2"].clone()}


def assert_same(got, expected):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape and a.dtype == b.dtype, i
        assert torch.equal(a, b), f"result {i} differs"


def test_ops_run_with_the_buffers_they_write_left_out(stand_ins):
    """torch <= 2.11's @custom_op raised IndexError when an optional argument it writes was left
    at its default (its Python ADInplaceOrView kernel indexed the args the dispatcher had
    trimmed): the ops are defined without that kernel, and calls that leave out= and the
    states out run eagerly on every torch."""
    for name in OPS:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"pykda::{name}", "ADInplaceOrView")
    x = cpu_step_inputs()
    o, lse = torch.ops.pykda.single_decode_with_kv_cache(x["q1"], x["k1"], x["v1"])
    assert o.shape == (8, 128) and lse.numel() == 0
    o, lse = torch.ops.pykda.batch_decode_with_padded_kv_cache(x["q2"], x["k2"], x["v2"], return_lse=True)
    assert o.shape == (4, 8, 128) and lse.shape == (4, 8)
    kda3 = [x[n + "3"] for n in ("q", "k", "v", "g", "beta")]
    o, fs, ckpt = torch.ops.pykda.chunk_kda(*kda3, output_final_state=True)
    assert o.shape == (1, 100, 2, 128) and fs.shape == (1, 2, 128, 128) and ckpt.numel() == 0
    pool = x["pool"].clone()
    o = torch.ops.pykda.fused_recurrent_kda(*[x[n + "4"] for n in ("q", "k", "v", "g", "beta")], initial_state=pool)
    assert o.shape == (4, 1, 2, 128) and not torch.equal(pool, x["pool"])


def test_opcheck_with_stand_ins(stand_ins):
    x = cpu_step_inputs()
    kimi = {**KIMI, "state_v_first": True}
    cases = [
        (torch.ops.pykda.single_decode_with_kv_cache, (x["q1"], x["k1"], x["v1"]), dict(return_lse=True)),
        (torch.ops.pykda.single_decode_with_kv_cache, (x["q1"], x["k1"], x["v1"], torch.empty(8, 128, dtype=bf16)),
         dict(scale=0.5)),
        (torch.ops.pykda.batch_decode_with_padded_kv_cache, (x["q2"], x["k2"], x["v2"], x["lens"], x["out2"]),
         dict(return_lse=True)),
        (torch.ops.pykda.chunk_kda, tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], initial_state=x["pool"], state_indices=x["rows3"],
              has_initial_state=x["has"], cu_seqlens=x["cu"], output_final_state=True, **kimi)),
        (torch.ops.pykda.chunk_kda, tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], cu_seqlens=x["cu"], output_final_state=True, **kimi)),
        (torch.ops.pykda.chunk_kda, tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], cu_seqlens=x["cu"], initial_state=x["pool"][:3].clone(),
              final_state=torch.empty(3, 2, 128, 128), out=torch.empty(1, 100, 2, 128, dtype=bf16), **kimi)),
        (torch.ops.pykda.chunk_kda, tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], return_intermediate_states=True, checkpoint_every=32,
              **kimi)),
        (torch.ops.pykda.chunk_kda, tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], cu_seqlens=x["cu"], return_intermediate_states=True,
              intermediate_states=torch.empty(1, 3, 2, 128, 128), **kimi)),
        (torch.ops.pykda.fused_recurrent_kda, tuple(x[n + "4"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log4"], dt_bias=x["dt_bias4"], initial_state=x["pool"], state_indices=x["rows4"], **kimi)),
    ]
    for op, args, kwargs in cases:
        torch.library.opcheck(op.default, args, kwargs)


def test_checkpoints_through_the_wrapper_equal_eager(stand_ins):
    """torch_ops.chunk_kda returns the eager function's three results, a buffer's contents included."""
    x = cpu_step_inputs()
    args = tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta"))
    kw = dict(**KIMI, A_log=x["A_log3"], dt_bias=x["dt_bias3"], return_intermediate_states=True, checkpoint_every=32)
    assert_same(ops.chunk_kda(*args, **kw, output_final_state=True)[::2],
                EAGER.chunk_kda(*args, **kw, output_final_state=True)[::2])
    buf, ref = torch.empty(1, 4, 2, 128, 128), torch.empty(1, 4, 2, 128, 128)
    o, fs, ckpt = ops.chunk_kda(*args, **kw, intermediate_states=buf)
    EAGER.chunk_kda(*args, **kw, intermediate_states=ref)
    assert ckpt is buf and fs is None and torch.equal(buf, ref)


@pytest.mark.parametrize("dynamic", [False, True])
def test_step_compiles_without_graph_breaks_and_equals_eager(stand_ins, dynamic):
    torch._dynamo.reset()
    step, wrapped = step_with(EAGER), step_with(ops)
    compiled = torch.compile(wrapped, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    for T in (100, 64):   # a second shape: recompiled (static) or the same graph (dynamic)
        x = cpu_step_inputs(seed=T, T=T)
        x["A_log3"] = torch.nn.Parameter(x["A_log3"])   # as a model holds it
        expected = snapshot(step(fresh(x)))
        assert_same(snapshot(wrapped(fresh(x))), expected)
        got = compiled(x)
        assert got[2] is x["out2"] and got[6] is x["pool"], "buffers written in place come back as themselves"
        assert not any(t.requires_grad for t in got)
        assert_same(snapshot(got), expected)
    assert torch._dynamo.explain(wrapped)(cpu_step_inputs()).graph_break_count == 0


# ------------------------------------------------------------------------------------------
# CPU: paged decode (torch_ops.BatchDecodeWithPagedKVCache, op paged_decode_run)
# ------------------------------------------------------------------------------------------

PAGED = dict(hq=32, hkv=8, d=128, page_size=16)


def page_table(lens, page_size, num_pages, gen):
    """FlashInfer's kv_indptr, kv_indices (distinct random pages) and kv_last_page_len of
    requests of `lens` rows (numpy int32)."""
    pages = [-(-n // page_size) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], np.int32)
    indices = torch.randperm(num_pages, generator=gen)[:max(int(indptr[-1]), 1)].to(torch.int32)
    return indptr, indices, last


def set_cpu_plan(dec, lens, num_pages=64, seed=0, **kw):
    """What plan() leaves on `dec` (BatchDecodeWithPagedKVCache._set_tables), on the CPU: the
    layout, the int32 tables (rows per request, then first page entries; rewritten in place while
    they fit) and the page ids. Returns the page ids."""
    hq, hkv, d, page_size = (kw.get(n, PAGED[n]) for n in ("hq", "hkv", "d", "page_size"))
    indptr, indices, last = page_table(lens, page_size, num_pages, torch.Generator().manual_seed(seed))
    rows = _paged.request_rows(indptr, last, indices.shape[0], page_size)
    tables = torch.from_numpy(np.concatenate([rows, indptr[:-1]]).astype(np.int32))
    if dec._tables is None or dec._tables.numel() < tables.numel():
        dec._tables = torch.empty(tables.numel(), dtype=torch.int32)
    dec._tables[:tables.numel()].copy_(tables)
    dec._indices = indices
    dec._layout = _paged.PagedLayout(len(lens), hq, hkv, d, page_size, dec.kv_layout, int(rows.max()), 0,
                                     d ** -0.5, None, None, 0)
    return indices


def stand_in_planned_pointers(layout, tables, indices):
    return tables, indices   # the stand-in launch reads the tensors themselves


def stand_in_run_planned(layout, tables, indices, q, k_cache, v_cache, out=None, return_lse=False, stream=None):
    """run_planned's contract (new o and lse, `out` written in place) with arithmetic that reads
    the plan's tables (each request's rows and first page entry) and page ids."""
    B = layout.batch
    rows, starts = tables[:B].float(), tables[B:2 * B].long()
    first = indices.reshape(-1)[starts.clamp(max=indices.numel() - 1)].float()
    shift = (rows * 1e-3 + first * 1e-2).view(B, 1, 1) + v_cache.float().mean()
    o = (q.float() * layout.scale + shift).to(q.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    lse = q.float().sum(-1) + k_cache.float().mean() + rows.view(B, 1) + layout.max_rows
    return (o, lse) if return_lse else o


@pytest.fixture
def paged_stand_ins(monkeypatch):
    monkeypatch.setattr(_paged, "planned_pointers", stand_in_planned_pointers)
    monkeypatch.setattr(_paged, "run_planned", stand_in_run_planned)


def paged_inputs(seed=0, batch=3, num_pages=64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=bf16)
    hq, hkv, d, page = (PAGED[n] for n in ("hq", "hkv", "d", "page_size"))
    return dict(q=r(batch, hq, d), k=r(num_pages, page, hkv, d), v=r(num_pages, page, hkv, d),
                out=torch.empty(batch, hq, d, dtype=bf16, device=device))


def paged_step(dec):
    """A step calling the wrapper's run() twice (new o and LSE; `out=` with the caches as a pair)."""
    def step(x):
        o, lse = dec.run(x["q"], x["k"], x["v"], return_lse=True)
        o2 = dec.run(x["q"] * 2, (x["k"], x["v"]), out=x["out"])
        return o, lse, o2
    return step


def paged_reference(dec, x):
    """The step's results from run_planned with the plan's layout, tables and page ids."""
    args = (dec._layout, dec._tables, dec._indices)
    o, lse = _paged.run_planned(*args, x["q"], x["k"], x["v"], return_lse=True)
    o2 = _paged.run_planned(*args, x["q"] * 2, x["k"], x["v"], x["out"].clone())
    return [o, lse, o2]


def test_fake_paged_decode_results():
    with fake_mode():
        e = lambda *s, dtype=bf16: torch.empty(*s, dtype=dtype, device="cuda")
        q, k = e(4, 32, 128), e(50, 16, 8, 128)
        tables, indices = e(8, dtype=torch.int32), e(40, dtype=torch.int32)
        layout = _paged.PagedLayout(4, 32, 8, 128, 16, "NHD", 300, 0, 128 ** -0.5, None, None, 0)
        o, lse = torch.ops.pykda.paged_decode_run(q, k, k, tables, indices, *layout, return_lse=True)
        assert meta(o) == ((4, 32, 128), bf16, "cuda") and meta(lse) == ((4, 32), f32, "cuda")
        o, lse = torch.ops.pykda.paged_decode_run(q, k, k, tables, indices, *layout, torch.empty_like(q))
        assert o.numel() == 0 and lse.numel() == 0, "placeholders for out= and no LSE"
        # the wrapper returns what eager run() returns
        dec = ops.BatchDecodeWithPagedKVCache("NHD")
        dec._layout, dec._tables, dec._indices = layout, tables, indices
        assert meta(dec.run(q, k, k)) == ((4, 32, 128), bf16, "cuda")
        out = torch.empty_like(q)
        o, lse = dec.run(q, (k, k), out=out, return_lse=True)
        assert o is out and meta(lse) == ((4, 32), f32, "cuda")


def test_paged_run_before_plan_is_refused():
    dec = ops.BatchDecodeWithPagedKVCache("NHD")
    assert isinstance(dec, pykda.BatchDecodeWithPagedKVCache)
    x = paged_inputs()
    with pytest.raises(RuntimeError, match=r"call plan\(\) before run\(\)"):
        dec.run(x["q"], x["k"], x["v"])
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"call plan\(\) before run\(\)"):
        torch.compile(paged_step(dec), backend="aot_eager", fullgraph=True)(x)


@pytest.mark.parametrize("case, exc, message", [
    ("tables_dtype", TypeError, r"tables must have dtype int32; got int64"),
    ("tables_short", ValueError, r"tables must be a 1-D int32 array of at least \(2 \+ snap_width\) · batch = 18 entries"),
    ("tables_strided", ValueError, r"tables must be contiguous in its last dimension; got strides \(2,\)"),
    ("indices_aligned", ValueError, r"indices must start at a 4-byte aligned address"),
    ("indices_dtype", TypeError, r"indices must have dtype int32; got float32"),
    ("device", ValueError, r"indices must be on the plan's device \(0\); got device 1"),
    ("host", TypeError, r"tables must be a CUDA tensor"),
])
def test_paged_op_checks_the_plan_arrays(case, exc, message):
    """The raw op takes the plan's arrays from its caller: planned_pointers names a bad one before
    any launch."""
    from fakes import device_array as arr
    layout = _paged.PagedLayout(3, 32, 8, 128, 16, "NHD", 100, 0, 128 ** -0.5, None, None, 4)   # 4 page ids copied
    tables, indices = arr((18,), "int32"), arr((10,), "int32")
    if case == "tables_dtype":
        tables = arr((18,), "int64")
    elif case == "tables_short":
        tables = arr((17,), "int32")
    elif case == "tables_strided":
        tables = arr((18,), "int32", strides=(2,))
    elif case == "indices_dtype":
        indices = arr((10,), "float32")
    elif case == "indices_aligned":
        indices = arr((10,), "int32", ptr=(1 << 30) + 2)
    elif case == "device":
        indices = arr((10,), "int32", device=1)
    elif case == "host":
        tables = torch.zeros(18, dtype=torch.int32)
    with pytest.raises(exc, match=message):
        _paged.planned_pointers(layout, tables, indices)
    if case not in ("host",):
        assert _paged.planned_pointers(layout, arr((18,), "int32", ptr=64), arr((4, 3), "int32", ptr=128)) == (64, 128)


def test_paged_opcheck_with_stand_ins(paged_stand_ins):
    dec = ops.BatchDecodeWithPagedKVCache("NHD")
    set_cpu_plan(dec, [100, 0, 33])
    x = paged_inputs()
    plan = (dec._tables, dec._indices, *dec._layout)
    for args, kwargs in [((x["q"], x["k"], x["v"], *plan), dict(return_lse=True)),
                         ((x["q"], x["k"], x["v"], *plan, x["out"]), {}),
                         ((x["q"], x["k"], x["v"], *plan, x["out"]), dict(return_lse=True))]:
        torch.library.opcheck(torch.ops.pykda.paged_decode_run.default, args, kwargs)


def test_paged_step_compiles_without_graph_breaks_and_reads_new_plans(paged_stand_ins):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    dec = ops.BatchDecodeWithPagedKVCache("NHD")
    set_cpu_plan(dec, [100, 0, 33])
    step = paged_step(dec)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    x = paged_inputs()
    assert_same(snapshot(step(x)), paged_reference(dec, x))   # the wrapper, uncompiled
    tables = dec._tables
    for seed, lens in enumerate(([100, 0, 33], [0, 100, 40], [40, 100, 0])):   # new page ids and lengths
        set_cpu_plan(dec, lens, seed=seed)
        x = paged_inputs(seed)
        got = compiled(x)
        assert got[2] is x["out"], "out= comes back as itself"
        assert_same(snapshot(got), paged_reference(dec, x))
    assert dec._tables is tables and counters["stats"]["unique_graphs"] == 1, "new plans read without recompiling"
    set_cpu_plan(dec, [7, 0, 500], seed=3)   # another longest request: the layout (constants of the graph) changed
    x = paged_inputs(3)
    assert_same(snapshot(compiled(x)), paged_reference(dec, x))
    assert counters["stats"]["unique_graphs"] == 2
    assert torch._dynamo.explain(step)(x).graph_break_count == 0


def test_paged_run_takes_the_eager_path_where_the_op_cannot(monkeypatch):
    """stream= given, or arrays other than torch tensors: pykda's eager run()."""
    seen = []
    monkeypatch.setattr(_paged, "run_planned", lambda layout, t, i, *args: seen.append((t, i, args)) or "eager")
    dec = ops.BatchDecodeWithPagedKVCache("NHD")
    set_cpu_plan(dec, [100, 0, 33])
    dec._tables_ptr, dec._indices_ptr = 1 << 30, 2 << 30
    x = paged_inputs()
    assert dec.run(x["q"], x["k"], x["v"], stream=7) == "eager"
    assert seen[-1] == (1 << 30, 2 << 30, (x["q"], x["k"], x["v"], None, False, 7))
    cupy_like = object()
    assert dec.run(cupy_like, x["k"], x["v"], return_lse=True) == "eager"
    assert seen[-1][2][0] is cupy_like and seen[-1][2][4] is True


# ------------------------------------------------------------------------------------------
# GPU: the real kernels under torch.compile and CUDA graphs
# ------------------------------------------------------------------------------------------

def gpu_step_inputs(seed=0):
    return {n: t.cuda() for n, t in cpu_step_inputs(seed).items()}


def refill(x, seed):
    """New data copied into the step's inputs (not the pool, which the steps carry on)."""
    y = gpu_step_inputs(seed)
    for n, t in x.items():
        if n != "pool":
            t.copy_(y[n])


@pytest.mark.gpu
def test_compiled_step_equals_eager_bit_for_bit():
    torch._dynamo.reset()
    step, wrapped = step_with(EAGER), step_with(ops)
    x = gpu_step_inputs()
    expected = snapshot(step(fresh(x)))          # also compiles the kernels
    assert_same(snapshot(wrapped(fresh(x))), expected)   # the ops, uncompiled
    explain = torch._dynamo.explain(wrapped)(fresh(x))
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(wrapped, fullgraph=True)
    for seed in (0, 1):
        if seed:
            refill(x, seed)
            expected = snapshot(step(fresh(x)))
        got = compiled(x)
        assert got[2] is x["out2"] and got[6] is x["pool"]
        assert_same(snapshot(got), expected)


@pytest.mark.gpu
def test_reduce_overhead_records_cuda_graphs_and_replays_new_data():
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    step, wrapped = step_with(EAGER), step_with(ops)
    x = gpu_step_inputs(10)
    for n in ("pool", "out2"):   # written in place: static addresses, as serving engines mark their caches
        torch._dynamo.mark_static_address(x[n])
    step(fresh(x))   # kernels compiled before the capture
    compiled = torch.compile(wrapped, mode="reduce-overhead", fullgraph=True)
    for seed in (11, 12, 13):    # warm-up, recording, replay
        refill(x, seed)
        expected = snapshot(step(fresh(x)))
        got = snapshot(compiled(x))
        assert_same(got, expected)
    torch.cuda.synchronize()
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


@pytest.mark.gpu
def test_opcheck_with_the_kernels():
    x = gpu_step_inputs(20)
    kimi = {**KIMI, "state_v_first": True}
    kda3 = tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta"))
    cases = [
        (torch.ops.pykda.single_decode_with_kv_cache, (x["q1"], x["k1"], x["v1"]), dict(return_lse=True)),
        (torch.ops.pykda.batch_decode_with_padded_kv_cache, (x["q2"], x["k2"], x["v2"], x["lens"], x["out2"]),
         dict(return_lse=True)),
        (torch.ops.pykda.chunk_kda, kda3, dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], initial_state=x["pool"],
                                               state_indices=x["rows3"], has_initial_state=x["has"],
                                               cu_seqlens=x["cu"], **kimi)),
        (torch.ops.pykda.chunk_kda, kda3, dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], cu_seqlens=x["cu"],
                                               output_final_state=True, **kimi)),
        (torch.ops.pykda.chunk_kda, tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], return_intermediate_states=True, checkpoint_every=32,
              **kimi)),
        (torch.ops.pykda.chunk_kda, tuple(x[n + "3"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log3"], dt_bias=x["dt_bias3"], cu_seqlens=x["cu"], return_intermediate_states=True,
              intermediate_states=torch.empty(1, 3, 2, 128, 128, device="cuda"), **kimi)),
        (torch.ops.pykda.fused_recurrent_kda, tuple(x[n + "4"] for n in ("q", "k", "v", "g", "beta")),
         dict(A_log=x["A_log4"], dt_bias=x["dt_bias4"], initial_state=x["pool"], state_indices=x["rows4"], **kimi)),
    ]
    for op, args, kwargs in cases:
        torch.library.opcheck(op.default, args, kwargs)


# ------------------------------------------------------------------------------------------
# GPU: paged decode
# ------------------------------------------------------------------------------------------

PAGED_LENS = [1000, 0, 33, 517, 16, 4000]   # every plan below: these lengths, new page ids (one layout)
PAGED_PAGES = 700


def gpu_plan(dec, seed, lens=PAGED_LENS):
    """Plan `dec` (a torch_ops or a pykda wrapper) on a random page table of `lens` (the wrapper
    keeps kv_indices alive for run())."""
    indptr, indices, last = page_table(lens, PAGED["page_size"], PAGED_PAGES, torch.Generator().manual_seed(seed))
    indices = indices.cuda()
    dec.plan(torch.from_numpy(indptr), indices, torch.from_numpy(last), PAGED["hq"], PAGED["hkv"], PAGED["d"],
             PAGED["page_size"])


def gpu_paged_inputs(seed):
    return {n: t.cuda() for n, t in paged_inputs(seed, len(PAGED_LENS), PAGED_PAGES).items()}


def eager_paged(x, seed):
    """The step's results from pykda's own wrapper, planned on the same table."""
    ref = pykda.BatchDecodeWithPagedKVCache("NHD")
    gpu_plan(ref, seed)
    o, lse = ref.run(x["q"], x["k"], x["v"], return_lse=True)
    o2 = ref.run(x["q"] * 2, (x["k"], x["v"]), out=x["out"].clone())
    return snapshot([o, lse, o2])


@pytest.mark.gpu
def test_paged_decode_compiled_step_equals_eager_bit_for_bit():
    torch._dynamo.reset()
    dec = ops.BatchDecodeWithPagedKVCache("NHD")
    gpu_plan(dec, 0)
    step = paged_step(dec)
    x = gpu_paged_inputs(0)
    expected = eager_paged(x, 0)   # also compiles the kernels
    assert_same(snapshot(step(x)), expected)   # through the op, uncompiled
    explain = torch._dynamo.explain(step)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    for seed in (0, 1, 2):   # new data and a new plan (new page ids, the same lengths) at each call
        if seed:
            gpu_plan(dec, seed)
            x = gpu_paged_inputs(seed)
            expected = eager_paged(x, seed)
        got = compiled(x)
        assert got[2] is x["out"]
        assert_same(snapshot(got), expected)
    # the op with the kernels
    x = gpu_paged_inputs(3)
    gpu_plan(dec, 3)
    plan = (dec._tables, dec._indices, *dec._layout)
    for args, kwargs in [((x["q"], x["k"], x["v"], *plan), dict(return_lse=True)),
                         ((x["q"], x["k"], x["v"], *plan, x["out"]), {})]:
        torch.library.opcheck(torch.ops.pykda.paged_decode_run.default, args, kwargs)


@pytest.mark.gpu
def test_paged_decode_reduce_overhead_records_cuda_graphs_and_replays_new_plans():
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    dec = ops.BatchDecodeWithPagedKVCache("NHD")
    gpu_plan(dec, 10)
    x = gpu_paged_inputs(10)
    for n in ("k", "v", "out"):   # the caches and out=: static addresses, as serving engines mark them
        torch._dynamo.mark_static_address(x[n])
    eager_paged(x, 10)   # kernels compiled before the capture
    compiled = torch.compile(paged_step(dec), mode="reduce-overhead", fullgraph=True)
    for seed in (11, 12, 13):    # warm-up, recording, replay: new data and a new plan at each call
        gpu_plan(dec, seed)   # rewrites the plan's tables in place (same batch)
        for n, t in gpu_paged_inputs(seed).items():
            x[n].copy_(t)
        expected = eager_paged(x, seed)
        got = snapshot(compiled(x))
        assert_same(got, expected)
    torch.cuda.synchronize()
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
