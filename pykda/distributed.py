"""Context parallelism for KDA prefill over torch.distributed: `chunk_kda_cp`.

Each rank of a process group holds a contiguous slice of the tokens of the same B sequences, the
ranks' slices in rank order (the usual CP layout). A slice's chunk recurrence is an affine map of
its start state (DESIGN.md, "Segments and ranks"): it ends in S·M + B. So

1. every rank computes its slice's map [B; M] (`chunk_kda_slice`: pass 1 and the scan of the
   segment machinery, fp32), not knowing its start state;
2. the ranks all-gather their maps: B·H·(V + K)·K fp32 each (1 MiB at H = 8, K = V = 128);
3. rank r composes the maps of ranks 0 .. r − 1 in float64 (rank 0's from the initial state):
   its start;
4. the slice runs from its start (the scan of its segments' starts, then pass 2): outputs, and
   the state at its end, which on the last rank is the sequences' final state.

Every rank does steps 1 and 4 over its own tokens only, so R ranks take about 1/R of the time
of one GPU plus the exchange (one all-gather of a few MiB).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .ops.kda import chunk_kda_slice
from .ops.kda_variant import resolve_state_v_first


def compose_start(maps: torch.Tensor, initial_state: torch.Tensor | None = None) -> torch.Tensor:
    """The state after the maps in order, from `initial_state` (zeros when None): S <- S·M_i + B_i.
    maps [R, B, H, 2V, K] (rows [0, V): B_i, rows [V, 2V): M_i; R may be 0); initial_state
    [B, H, V, K] (V-first). Returns [B, H, V, K] float64 on maps' device."""
    R, B, H, two_v, K = maps.shape
    V = two_v // 2
    s = torch.zeros((B, H, V, K), dtype=torch.float64, device=maps.device)
    if initial_state is not None:
        s.copy_(initial_state)
    for i in range(R):
        m = maps[i].to(torch.float64)
        s = s @ m[:, :, V:] + m[:, :, :V]
    return s


def gather_maps(total: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's slice map, in rank order: [world, *total.shape] (an all-gather)."""
    parts = [torch.empty_like(total) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, total.contiguous(), group=group)
    return torch.stack(parts)


def rank_start(total: torch.Tensor, group=None, initial_state: torch.Tensor | None = None,
               state_v_first: bool = False) -> torch.Tensor:
    """This rank's start state from its slice map `total` [B, H, 2V, K] (fp32): the maps of the
    ranks before it composed in order. `initial_state` ([B, H, K, V], or [B, H, V, K] with
    state_v_first) is read on rank 0 only: rank 0 sends its slice's end state from it in place of
    its B rows, so the others compose from zeros. Returns [B, H, V, K] fp32, contiguous."""
    rank = dist.get_rank(group)
    s0 = None
    if rank == 0 and initial_state is not None:
        s0 = initial_state if state_v_first else initial_state.transpose(-1, -2)
        V = total.shape[2] // 2
        total = torch.cat([compose_start(total[None], s0).to(total.dtype), total[:, :, V:]], dim=2)
    maps = gather_maps(total, group)
    return (s0.to(torch.float32) if s0 is not None else compose_start(maps[:rank]).to(torch.float32)).contiguous()


def check_initial_state(initial_state, q: torch.Tensor, state_v_first: bool) -> None:
    """initial_state [B, H, K, V] (or [B, H, V, K] with state_v_first), fp32 or bf16, on q's device."""
    if initial_state is None:
        return
    if not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"initial_state must be a torch tensor; got {type(initial_state).__name__}")
    B, _, H, K = q.shape
    layout = "[B, H, V, K]" if state_v_first else "[B, H, K, V]"
    if tuple(initial_state.shape) != (B, H, K, K):
        raise ValueError(f"initial_state must have shape {layout} = {(B, H, K, K)}; got {tuple(initial_state.shape)}")
    if initial_state.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"initial_state must have dtype float32 or bfloat16; got {initial_state.dtype}")
    if initial_state.device != q.device:
        raise ValueError(f"initial_state must be on q's device ({q.device}); got {initial_state.device}")


_WHOLE = "each rank holds a slice of B whole sequences"
_NO_CHECKPOINTS = "a rank's slice writes no checkpoints"
# chunk_kda's keywords a rank's slice cannot honour, and why; fla's keywords that change nothing there either
REFUSED = {"cu_seqlens": _WHOLE, "cu_seqlens_cpu": _WHOLE, "state_indices": _WHOLE, "has_initial_state": _WHOLE,
           "return_intermediate_states": _NO_CHECKPOINTS, "intermediate_states": _NO_CHECKPOINTS,
           "checkpoint_every": _NO_CHECKPOINTS,
           "cp_context": "fla's context parallelism; chunk_kda_cp is pykda's, over torch.distributed"}
FLA_NO_OPS = ("disable_recompute", "use_graph", "max_num_seqs")


def chunk_kda_cp(q, k, v, g, beta, *, group=None, initial_state=None, output_final_state: bool = False,
                 state_v_first: bool = False, **kwargs):
    """Chunked KDA forward of sequences split across the ranks of `group` (torch.distributed,
    NCCL for CUDA tensors; default: the world), with chunk_kda's arguments.

    q, k, v, g, beta: this rank's slice [B, T_r, H, .] of B sequences (torch tensors; the slices
    in rank order make up the sequences; T_r may differ between ranks). `initial_state` (the
    sequences' start, [B, H, K, V] or [B, H, V, K] with `state_v_first`) is read on rank 0 only.
    Every other keyword is chunk_kda_slice's (gate and β forms, scale, chunk_size, out,
    final_state, segment_chunks, ...; fla's disable_recompute, use_graph and max_num_seqs are
    accepted and change nothing, transpose_state_layout is state_v_first); no cu_seqlens, state
    pool or checkpoints (ValueError by name).
    Returns (o [B, T_r, H, V], state or None): with `output_final_state` (or `final_state`), the
    state at the end of this rank's slice, which on the last rank is the sequences' final state.
    Every rank must call it (it holds one all-gather).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("chunk_kda_cp needs an initialized torch.distributed process group "
                           "(torch.distributed.init_process_group)")
    for name, why in REFUSED.items():
        value = kwargs.pop(name, None)
        if value is not None and not (value is False and why is _NO_CHECKPOINTS):   # (the flag's default: False)
            raise ValueError(f"chunk_kda_cp does not take {name}: {why}")
    for name in FLA_NO_OPS:
        kwargs.pop(name, None)
    state_v_first = resolve_state_v_first(state_v_first, kwargs.pop("transpose_state_layout", None))
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"chunk_kda_cp takes torch tensors; q is {type(q).__name__}")
    check_initial_state(initial_state, q, state_v_first)
    return chunk_kda_slice(q, k, v, g, beta, lambda total: rank_start(total, group, initial_state, state_v_first),
                           output_final_state=output_final_state, state_v_first=state_v_first, **kwargs)
