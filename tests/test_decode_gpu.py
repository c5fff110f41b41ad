"""GPU tests of flash decoding against the float64 reference (run on the H200)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pykda
from pykda import reference

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
TOL = {"bfloat16": 1e-2, "float16": 2e-3}
ROOT = Path(__file__).resolve().parent.parent


def make(S, hq, hkv, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = (2 * torch.randn(hq, d, generator=g, device="cuda")).to(dt)
    k = torch.randn(S, hkv, d, generator=g, device="cuda").to(dt)
    v = torch.randn(S, hkv, d, generator=g, device="cuda").to(dt)
    return q, k, v


def ref(q, k, v, scale=None):
    f64 = [cp.from_dlpack(x.double().contiguous()) for x in (q, k, v)]
    o, lse = reference.decode_attention(*f64, scale=scale)
    return cp.asnumpy(o), cp.asnumpy(lse)


def rel(out, expected):
    return reference.relative_error(np.asarray(out, dtype=np.float64), expected)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hq, hkv", [(32, 32), (32, 8), (32, 4), (8, 1), (64, 4)])   # groups 1-8 transposed, 16 not
@pytest.mark.parametrize("S", [1, 15, 64, 65, 1000, 8192, 131073])
def test_matches_reference(S, hq, hkv, d, dtype):
    q, k, v = make(S, hq, hkv, d, dtype, seed=S * 7 + hq + d)
    out = torch.full((hq, d), float("nan"), dtype=q.dtype, device="cuda")
    o, lse = pykda.single_decode_with_kv_cache(q, k, v, out=out, return_lse=True)
    assert o is out
    o_ref, lse_ref = ref(q, k, v)
    assert torch.isfinite(o).all(), "every output element written"
    err = rel(o.float().cpu().numpy(), o_ref)
    assert err < TOL[dtype], f"relative L2 error {err:.2e}"
    assert np.abs(lse.cpu().numpy() - lse_ref).max() < 2e-3


@pytest.mark.parametrize("S, hq, hkv, d, dtype", [(1, 32, 8, 128, "bfloat16"), (1000, 8, 1, 64, "float16"),
                                                   (8192, 32, 32, 128, "bfloat16"), (131073, 32, 8, 256, "bfloat16")])
def test_hnd_layout_matches_reference(S, hq, hkv, d, dtype):
    q, k, v = make(S, hq, hkv, d, dtype, seed=S + d)
    out = torch.full((hq, d), float("nan"), dtype=q.dtype, device="cuda")
    k_hnd, v_hnd = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()   # [num_kv_heads, kv_len, head_dim]
    o, lse = pykda.single_decode_with_kv_cache(q, k_hnd, v_hnd, kv_layout="HND", out=out, return_lse=True)
    o_ref, lse_ref = ref(q, k, v)
    assert rel(o.float().cpu().numpy(), o_ref) < TOL[dtype]
    assert np.abs(lse.cpu().numpy() - lse_ref).max() < 2e-3


def test_scale_and_lse_shape():
    q, k, v = make(777, 16, 4, 128, "bfloat16", seed=1)
    o, lse = pykda.single_decode_with_kv_cache(q, k, v, scale=0.3, return_lse=True)
    o_ref, lse_ref = ref(q, k, v, scale=0.3)
    assert lse.shape == (16,) and lse.dtype == torch.float32
    assert rel(o.float().cpu().numpy(), o_ref) < 1e-2
    assert np.abs(lse.cpu().numpy() - lse_ref).max() < 2e-3


# chunks of any tile count (the chunk is a kernel argument): 192 = 3 tiles, 1664 = 26, 960 = 15
@pytest.mark.parametrize("chunk_size, stages", [(64, 2), (128, 4), (1024, 3), (4096, 2), (1 << 20, 3), (192, 3),
                                                (1664, 3), (960, 4)])
def test_planner_overrides_give_the_same_answer(chunk_size, stages):
    q, k, v = make(5000, 32, 8, 128, "bfloat16", seed=2)
    o, lse = pykda.single_decode_with_kv_cache(q, k, v, chunk_size=chunk_size, stages=stages, return_lse=True)
    o_ref, lse_ref = ref(q, k, v)
    assert rel(o.float().cpu().numpy(), o_ref) < 1e-2
    assert np.abs(lse.cpu().numpy() - lse_ref).max() < 2e-3


def test_strided_views_of_a_larger_cache():
    S, hkv, d = 3000, 8, 128
    q = torch.randn(32, d, device="cuda").to(torch.bfloat16)
    cache = torch.randn(S + 10, 2, hkv, 2 * d, device="cuda").to(torch.bfloat16)   # [S, K|V, H, 2D]
    k, v = cache[5:5 + S, 0, :, :d], cache[5:5 + S, 1, :, d:]
    o = pykda.single_decode_with_kv_cache(q, k, v)
    assert rel(o.float().cpu().numpy(), ref(q, k, v)[0]) < 1e-2


def test_frameworks_agree():
    q, k, v = make(4099, 32, 8, 128, "float16", seed=3)
    o_torch = pykda.single_decode_with_kv_cache(q, k, v)
    assert isinstance(o_torch, torch.Tensor)
    qc, kc, vc = (cp.from_dlpack(x) for x in (q, k, v))
    o_cupy = pykda.single_decode_with_kv_cache(qc, kc, vc)
    assert isinstance(o_cupy, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(o_cupy), o_torch.cpu().numpy())


def test_bf16_from_cupy_and_jax():
    q, k, v = make(2049, 32, 8, 128, "bfloat16", seed=4)
    expected = pykda.single_decode_with_kv_cache(q, k, v).float().cpu().numpy()
    qc, kc, vc = (cp.from_dlpack(x) for x in (q, k, v))
    assert qc.dtype.name == "bfloat16"
    o_cupy = pykda.single_decode_with_kv_cache(qc, kc, vc)
    np.testing.assert_array_equal(cp.asnumpy(o_cupy).astype(np.float32), expected)
    jax = pytest.importorskip("jax")
    torch.cuda.synchronize()
    qj, kj, vj = (jax.dlpack.from_dlpack(x) for x in (q, k, v))
    o_jax = pykda.single_decode_with_kv_cache(qj, kj, vj)
    assert isinstance(o_jax, jax.Array)
    np.testing.assert_array_equal(np.asarray(o_jax.astype(jax.numpy.float32)), expected)


def test_cuda_graph_capture_and_replay_with_new_data():
    q, k, v = make(8192, 32, 8, 128, "bfloat16", seed=5)
    out = torch.empty_like(q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):   # warm-up on the capture stream: compile, grow its workspace
        pykda.single_decode_with_kv_cache(q, k, v, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        pykda.single_decode_with_kv_cache(q, k, v, out=out)
    for seed in (6, 7):
        q2, k2, v2 = make(8192, 32, 8, 128, "bfloat16", seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel(out.float().cpu().numpy(), ref(q2, k2, v2)[0]) < 1e-2


def test_disk_cache_hit_in_a_second_process(tmp_path):
    code = ("import torch, pykda; from pykda.runtime import cache;"
            "q = torch.randn(8, 64, device='cuda', dtype=torch.float16);"
            "k = torch.randn(300, 1, 64, device='cuda', dtype=torch.float16);"
            "pykda.single_decode_with_kv_cache(q, k, k); torch.cuda.synchronize();"
            "print(cache.stats['nvrtc_compiles'], cache.stats['disk_hits'])")
    env = {**os.environ, "PYKDA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    first, second = (tuple(map(int, r.stdout.split())) for r in runs)
    assert first[0] >= 1 and second == (0, first[0])


def test_bad_inputs_raise_before_launch():
    q, k, v = make(100, 32, 8, 128, "bfloat16", seed=8)
    with pytest.raises(TypeError, match="k must have the dtype of q"):
        pykda.single_decode_with_kv_cache(q, k.half(), v)
    with pytest.raises(ValueError, match="num_qo_heads"):
        pykda.single_decode_with_kv_cache(q[:30], k, v)
    with pytest.raises(ValueError, match="k must be contiguous in its last dimension"):
        pykda.single_decode_with_kv_cache(q, k.transpose(1, 2).contiguous().transpose(1, 2), v)
    with pytest.raises(TypeError, match="q must be a CUDA tensor"):
        pykda.single_decode_with_kv_cache(q.cpu(), k, v)
