"""GPU tests of a rank's slice (context parallelism, `chunk_kda_slice` and pykda.distributed's
composition), one process: the ranks' slices run one after another, each start state composed from
the maps the slices before it reported, and the joined outputs and final state are checked against
the float64 reference and the single-call `chunk_kda`. The exchange across processes is
tests/test_distributed.py's (gloo, CPU) and examples/cp_launch.py's (NCCL, torchrun)."""
import pytest

from pykda.ops.kda import chunk_kda_slice

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from pykda.distributed import compose_start  # noqa: E402
from test_kda_gpu import SAFE, SOFTPLUS, f64, long_memory, make, ref, rel, run  # noqa: E402


def run_slices(x, flags, bounds, s0=None, state_v_first=True, zero_starts=False, **kw):
    """Rank r runs tokens [bounds[r], bounds[r + 1]): (outputs joined, the last slice's end state,
    the slices' maps). zero_starts: every slice from zeros (a wrong composition, for contrast)."""
    gate_args = {n: x[n] for n in ("A_log", "dt_bias") if flags.get("use_gate_in_kernel")}
    maps, outs, fs = [], [], None
    for r in range(len(bounds) - 1):
        part = {n: x[n][:, bounds[r]:bounds[r + 1]] for n in ("q", "k", "v", "g", "beta")}

        def start_of(total):
            maps.append(total.clone())
            start = s0 if state_v_first or s0 is None else s0.transpose(-1, -2)
            if zero_starts:
                return torch.zeros_like(total[:, :, :K])
            return compose_start(torch.stack(maps)[:-1], start).float().contiguous()
        B, T, H, K = part["q"].shape
        out = torch.full((B, T, H, K), float("nan"), dtype=torch.bfloat16, device="cuda")
        o, fs = chunk_kda_slice(*part.values(), start_of, **flags, **gate_args, state_v_first=state_v_first,
                                output_final_state=True, out=out, **kw)
        outs.append(o)
    return torch.cat(outs, dim=1), fs, maps


@pytest.mark.parametrize("K, C, seg", [(64, 16, None), (128, 16, 3), (128, 32, 1), (64, 32, 2)])
@pytest.mark.parametrize("flags", ["softplus", "safe"])
def test_slices_join_into_the_whole_sequence(K, C, seg, flags):
    """Three or four ranks of uneven slices (1, 15, 17 tokens, partial last chunks), segments of
    1–3 chunks within a slice or a whole slice as one, B = 2, fp32 initial state on rank 0."""
    flags = SOFTPLUS if flags == "softplus" else dict(SAFE, lower_bound=-5.0 if C == 16 else -2.5)
    T = 700
    x, s0 = make(2, T, 2, K, seed=500 + K + C, state_dtype="float32")
    x = long_memory(x)
    bounds = [0, 1, 16, 33, T] if seg is None else [0, 17, 300, T]
    o, fs, _ = run_slices(x, flags, bounds, s0, chunk_size=C, segment_chunks=seg)
    o_ref, s_ref = ref(x, flags.get("lower_bound"), s0, flags=flags)
    assert torch.isfinite(o).all(), "every output row written"
    o0, fs0, _ = run_slices(x, flags, bounds, s0, chunk_size=C, segment_chunks=seg, zero_starts=True)
    assert rel(o0, o_ref) > 0.1 and rel(fs0, s_ref) > 0.1, "the test sees a wrong start"
    o1, fs1 = run(x, flags, initial_state=s0, output_final_state=True, chunk_size=C)
    print(f"\nslices vs float64: out {rel(o, o_ref):.2e} state {rel(fs, s_ref):.2e}; one call: "
          f"{rel(o1, o_ref):.2e} / {rel(fs1, s_ref):.2e}; slices vs one call {rel(o, f64(o1)):.2e} / "
          f"{rel(fs, f64(fs1)):.2e}")
    # as accurate as one call (both round differently: bf16 operands of the state, bf16 outputs)
    assert rel(o, o_ref) <= 1.2 * rel(o1, o_ref) + 5e-4 and rel(fs, s_ref) <= 1.2 * rel(fs1, s_ref) + 5e-4


def test_a_slice_map_is_the_affine_map_of_its_tokens():
    """The map each slice reports: its B rows the state reached from zero, its M rows the
    transition (the reference's kda_affine_map), both fp32-accurate."""
    from pykda import reference
    x = long_memory(make(1, 400, 2, 64, seed=77)[0])
    _, _, maps = run_slices(x, SOFTPLUS, [0, 150, 400], segment_chunks=2)
    for (lo, hi), total in zip(((0, 150), (150, 400)), maps):
        part = {n: f64(x[n][:, lo:hi]) for n in ("q", "k", "v", "g", "beta")}
        M, B = reference.kda_affine_map(*part.values(), A_log=f64(x["A_log"]), dt_bias=f64(x["dt_bias"]),
                                        **reference.kda_options(SOFTPLUS))
        assert reference.relative_error(f64(total[:, :, :64]), B) <= 2e-3
        assert reference.relative_error(f64(total[:, :, 64:]), M) <= 2e-3


def test_slices_in_fla_layout_with_bf16_final_state():
    x, s0 = make(1, 520, 2, 128, seed=91, state_dtype="float32")
    x = long_memory(x)
    s0k = s0.transpose(-1, -2).contiguous()   # [N, H, K, V]
    gate_args = {n: x[n] for n in ("A_log", "dt_bias")}
    fs = torch.empty_like(s0k, dtype=torch.bfloat16)
    outs = []
    maps = []
    for lo, hi in ((0, 260), (260, 520)):
        part = {n: x[n][:, lo:hi] for n in ("q", "k", "v", "g", "beta")}

        def start_of(total):
            maps.append(total.clone())
            return compose_start(torch.stack(maps)[:-1], s0).float().contiguous()
        o, got = chunk_kda_slice(*part.values(), start_of, **SOFTPLUS, **gate_args, final_state=fs)
        assert got is fs or got.data_ptr() == fs.data_ptr()
        outs.append(o)
    o_ref, s_ref = ref(x, None, s0, flags=SOFTPLUS)
    assert rel(torch.cat(outs, 1), o_ref) <= 1e-2
    assert rel(fs.transpose(-1, -2), s_ref) <= 1e-2


def test_long_slices_match_the_single_gpu_call():
    """Two slices of 65536 tokens at H = 4 with the planner's segments, against one chunk_kda call
    over 131072 tokens (segmented) and the serial chain (segment_chunks=0): the slices differ
    from either no more than those two differ from each other."""
    x, s0 = make(1, 131072, 4, 128, seed=3, state_dtype="float32")
    x = long_memory(x)
    o, fs, _ = run_slices(x, SOFTPLUS, [0, 65536, 131072], s0)
    o1, fs1 = run(x, SOFTPLUS, initial_state=s0, output_final_state=True)
    o2, fs2 = run(x, SOFTPLUS, initial_state=s0, output_final_state=True, segment_chunks=0)
    print(f"\n2 slices of 65536: vs one call out {rel(o, f64(o1)):.2e} state {rel(fs, f64(fs1)):.2e}; vs serial "
          f"{rel(o, f64(o2)):.2e} / {rel(fs, f64(fs2)):.2e}; one call vs serial {rel(o1, f64(o2)):.2e} / "
          f"{rel(fs1, f64(fs2)):.2e}")
    assert rel(o, f64(o2)) <= 1.2 * rel(o1, f64(o2)) + 5e-4 and rel(fs, f64(fs2)) <= 1.2 * rel(fs1, f64(fs2)) + 5e-4


def test_torchrun_on_two_gpus():
    """examples/cp_launch.py under torchrun on 2 GPUs over NCCL: every slice within 1e-3 of one
    chunk_kda call (it exits 1 otherwise)."""
    import os
    import subprocess
    import sys
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (the device's two-GPU kind)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        os.path.join(root, "examples", "cp_launch.py"), "--seq-len", "65536", "--heads", "4",
                        "--repeats", "3"], capture_output=True, text=True, timeout=600, env=env)
    print(r.stdout[-2000:])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PASS" in r.stdout
