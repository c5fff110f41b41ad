"""CPU tests of pykda.distributed's exchange and composition: 2–4 ranks on gloo (processes on this
machine), each holding the float64 map of its slice of a random sequence (the reference's
kda_affine_map), must find the state the whole sequence has reached at its slice's start."""
import os
import socket

import numpy as np
import pytest

from pykda import reference

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)
from pykda.distributed import chunk_kda_cp, compose_start, rank_start  # noqa: E402

H, K, B = 2, 8, 2
OPTIONS = reference.kda_options(dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                     use_beta_sigmoid_in_kernel=True))


def inputs(T, seed):
    rng = np.random.default_rng(seed)
    x = {n: rng.standard_normal((B, T, H, K)) for n in ("q", "k", "v", "g")}
    x["beta"] = rng.standard_normal((B, T, H))
    gate = dict(A_log=np.log(1 + 4 * rng.random(H)), dt_bias=0.5 * rng.standard_normal((H, K)))
    s0 = 0.1 * rng.standard_normal((B, H, K, K))   # [B, H, V, K]
    return x, gate, s0


def state_at(x, gate, s0, t):
    """The float64 recurrence's state after tokens [0, t)."""
    if t == 0:
        return s0
    part = {n: a[:, :t] for n, a in x.items()}
    return reference.kda_recurrent(*part.values(), **gate, initial_state=s0, **OPTIONS)[1]


def slice_map(x, gate, lo, hi):
    """[B, H, 2V, K]: the B rows, then the M rows, of tokens [lo, hi)."""
    part = {n: a[:, lo:hi] for n, a in x.items()}
    M, Bm = reference.kda_affine_map(*part.values(), **gate, **OPTIONS)
    return np.concatenate([Bm, M], axis=2)


def test_compose_start_follows_the_recurrence():
    x, gate, s0 = inputs(30, seed=1)
    bounds = [0, 7, 8, 30]
    maps = torch.tensor(np.stack([slice_map(x, gate, lo, hi) for lo, hi in zip(bounds, bounds[1:])]))
    for r, t in enumerate(bounds):
        got = compose_start(maps[:r], torch.tensor(s0)).numpy()
        assert reference.relative_error(got, state_at(x, gate, s0, t)) <= 1e-12
    assert torch.count_nonzero(compose_start(maps[:0])) == 0   # no map, no initial state: zeros


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, bounds, with_s0, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x, gate, s0 = inputs(bounds[-1], seed=world)
        total = torch.tensor(slice_map(x, gate, bounds[rank], bounds[rank + 1]), dtype=torch.float32)
        s0_given = torch.tensor(s0.swapaxes(-1, -2)) if with_s0 else None   # fla's [B, H, K, V]
        start = rank_start(total, initial_state=s0_given if rank == 0 else None)
        expected = state_at(x, gate, s0 if with_s0 else np.zeros_like(s0), bounds[rank])
        results.put((rank, start.dtype == torch.float32 and start.is_contiguous(),
                     reference.relative_error(start.double().numpy(), expected)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, bounds, with_s0", [(2, [0, 9, 20], True), (3, [0, 5, 6, 20], False),
                                                    (4, [0, 3, 10, 11, 24], True)])
def test_ranks_exchange_their_maps_into_their_start_states(world, bounds, with_s0):
    """Each rank's start: the maps of the ranks before it, rank 0's from the initial state (which
    only rank 0 passes), to fp32 accuracy."""
    mp = torch.multiprocessing.get_context("spawn")
    results, port = mp.Queue(), _free_port()
    procs = [mp.Process(target=_rank_main, args=(r, world, port, bounds, with_s0,
                                                  results)) for r in range(world)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=120) for _ in range(world))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [r for r, _, _ in got] == list(range(world))
    for rank, layout_ok, err in got:
        assert layout_ok, f"rank {rank}: the start is fp32, contiguous"
        assert err <= 1e-6, f"rank {rank}: start state relative error {err:.2e}"


def test_chunk_kda_cp_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        chunk_kda_cp(None, None, None, None, None)


@pytest.mark.parametrize("state, v_first, exc, message", [
    (lambda: [[0.0]], False, TypeError, "initial_state must be a torch tensor; got list"),
    (lambda: torch.zeros(2, 3, 8, 8), False, ValueError, r"initial_state must have shape \[B, H, K, V\] = \(2, 2, 8, 8\)"),
    (lambda: torch.zeros(2, 2, 8, 4), True, ValueError, r"initial_state must have shape \[B, H, V, K\]"),
    (lambda: torch.zeros(2, 2, 8, 8, dtype=torch.float16), False, TypeError, "float32 or bfloat16; got torch.float16"),
])
def test_a_bad_initial_state_is_named(state, v_first, exc, message):
    from pykda.distributed import check_initial_state
    q = torch.zeros(2, 5, 2, 8)
    with pytest.raises(exc, match=message):
        check_initial_state(state(), q, v_first)
    check_initial_state(torch.zeros(2, 2, 8, 8), q, v_first)   # a good one passes


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(cu_seqlens=torch.tensor([0, 4])), ValueError, "chunk_kda_cp does not take cu_seqlens"),
    (dict(state_indices=torch.tensor([0])), ValueError, "chunk_kda_cp does not take state_indices"),
    (dict(has_initial_state=torch.tensor([True])), ValueError, "chunk_kda_cp does not take has_initial_state"),
    (dict(q=[[0.0]]), TypeError, "chunk_kda_cp takes torch tensors; q is list"),
    (dict(initial_state=torch.zeros(1, 2, 8, 4)), ValueError, "initial_state must have shape"),
])
def test_chunk_kda_cp_names_what_it_cannot_take(kwargs, exc, message):
    """Refused with the argument named, inside an initialized group (one gloo rank), before any
    exchange or launch."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        x = {n: torch.zeros(1, 4, 2, 8) for n in ("q", "k", "v", "g")}
        x["beta"] = torch.zeros(1, 4, 2)
        q = kwargs.pop("q", x.pop("q"))   # a bad q replaces the good one
        with pytest.raises(exc, match=message):
            chunk_kda_cp(q, *x.values(), **kwargs)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kwargs, message", [
    (dict(return_intermediate_states=True), "chunk_kda_cp does not take return_intermediate_states"),
    (dict(intermediate_states=torch.zeros(1, 1, 2, 8, 8)), "chunk_kda_cp does not take intermediate_states"),
    (dict(checkpoint_every=64), "chunk_kda_cp does not take checkpoint_every"),
    (dict(cu_seqlens_cpu=torch.tensor([0, 4])), "chunk_kda_cp does not take cu_seqlens_cpu"),
    (dict(cp_context=object()), "chunk_kda_cp does not take cp_context"),
])
def test_chunk_kda_cp_names_the_checkpoint_and_varlen_keywords_of_chunk_kda(monkeypatch, kwargs, message):
    """chunk_kda's keywords that a rank's slice cannot honour (checkpoints, fla's context, the
    host copy of cu_seqlens) are refused by name with ValueError, not chunk_kda_slice's TypeError."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    import pykda.distributed as pd
    monkeypatch.setattr(pd, "chunk_kda_slice", lambda *a, **kw: pytest.fail("reached chunk_kda_slice"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        x = [torch.zeros(1, 4, 2, 8) for _ in range(4)] + [torch.zeros(1, 4, 2)]
        with pytest.raises(ValueError, match=message):
            chunk_kda_cp(*x, **kwargs)
    finally:
        dist.destroy_process_group()


def test_chunk_kda_cp_takes_fla_s_no_op_keywords_and_the_old_layout_name(monkeypatch):
    """As chunk_kda: fla's disable_recompute, use_graph and max_num_seqs are accepted and change
    nothing, transpose_state_layout is state_v_first (README: every keyword of chunk_kda but
    cu_seqlens, the state pool and checkpoints)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    import pykda.distributed as pd
    seen = {}
    monkeypatch.setattr(pd, "chunk_kda_slice", lambda *a, **kw: seen.update(kw) or ("o", None))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        x = [torch.zeros(1, 4, 2, 8) for _ in range(4)] + [torch.zeros(1, 4, 2)]
        s0 = torch.zeros(1, 2, 8, 8)
        assert chunk_kda_cp(*x, disable_recompute=True, use_graph=True, max_num_seqs=8, chunk_size=32) == ("o", None)
        assert seen["state_v_first"] is False and seen["chunk_size"] == 32
        assert not {"disable_recompute", "use_graph", "max_num_seqs"} & set(seen)
        with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
            chunk_kda_cp(*x, initial_state=s0, transpose_state_layout=True)
        assert seen["state_v_first"] is True and "transpose_state_layout" not in seen
    finally:
        dist.destroy_process_group()
