"""Where a small chunk_kda call's host time goes on a GPU machine (issue 14: <= 20 µs asked).

`bench kda`'s host row (H 32, 4 packed sequences, T 512, the pool, Kimi Linear's gate), and each
piece of the call timed alone with the objects the call makes: the arguments' key, the memo, the
two allocations, v's tensor map, the launches (as the call's graph and one by one). Host µs,
medians. Run from the repository root on the device: `PYTHONPATH=. python docs/studies/kda_host/breakdown.py`.
"""
import statistics
import time

import torch

from pykda import runtime
from pykda.bench import kda as bench, timing
from pykda.ops import kda
from pykda.runtime import launch
from pykda.runtime.arrays import CallArrays


def loop_us(fn, n=2000, reps=7):
    """Median over `reps` of the mean host µs of `n` back-to-back calls (no GPU work in fn)."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def main():
    call, seq, params, flags, cu, cu_cpu, pool, idx = bench.host_call()
    rows = [("chunk_kda call (launches as the call's graph)", timing.host_us(call)) for _ in range(3)]
    rows += [("chunk_kda call back to back behind GPU work (busy_host_us)", timing.busy_host_us(call))
             for _ in range(3)]
    objs = (*seq, params["A_log"], params["dt_bias"], pool, idx, None, cu, None, None, None)
    arrays = CallArrays(objs, kda.ARGUMENTS, kda.REQUIRED)
    rows.append(("CallArrays (11 arguments, 4 None)", loop_us(lambda: CallArrays(objs, kda.ARGUMENTS, kda.REQUIRED))))
    settings = (None, (True, True, True, False, False, None), True, 16, None, None, None,
                kda.longest_chunks(cu_cpu, 16), False, False, None)
    numbers = (16, None, None, None, None)
    key = kda.prepared_key(arrays.key, settings, numbers)
    rows.append(("prepared_key + PREPARED.get", loop_us(lambda: kda.PREPARED.get(
        kda.prepared_key(arrays.key, settings, numbers), arrays, settings))))
    prepared = kda.PREPARED.get(key, arrays, settings)
    strm = arrays.stream(None)
    rows.append(("arrays.stream", loop_us(lambda: arrays.stream(None))))
    rows.append(("out: arrays.new_empty", loop_us(lambda: arrays.new_empty(0, tuple(seq[0].shape)))))
    rows.append(("out: arrays.new_contiguous_like", loop_us(lambda: arrays.new_contiguous_like(0))))
    rows.append(("q.new_empty(*shape) (reference)", loop_us(lambda: seq[0].new_empty(*seq[0].shape))))
    contiguous = torch.contiguous_format
    rows.append(("torch.empty_like(q, contiguous) (reference)",
                 loop_us(lambda: torch.empty_like(seq[0], memory_format=contiguous))))
    nbytes = prepared.workspace[0]
    rows.append((f"workspace ({nbytes} B) taken and given back", loop_us(lambda: runtime.workspace(seq[0], strm, nbytes))))
    v_p = arrays.ptrs[2]
    rows.append(("v tensor map (memo hit)", loop_us(lambda: prepared.v_maps(v_p))))
    t0 = time.perf_counter()
    for off in range(1, 201):
        prepared.v_maps(v_p + 16 * off)
    rows.append(("v tensor map (new address: driver encode)", (time.perf_counter() - t0) / 200 * 1e6))
    ws, records = runtime.workspace(seq[0], strm, nbytes)
    out, o_p = arrays.new_contiguous_like(0)
    q_p, k_p, _, g_p, b_p, a_p, dt_p, s0_p, idx_p, hi_p, cu_p, *_ = arrays.ptrs
    values = (prepared.v_maps(v_p), q_p, k_p, g_p, b_p, a_p, dt_p, s0_p, idx_p, hi_p, cu_p, o_p, s0_p, 0,
              prepared.checkpoints[1], records, 0, bytes(128), bytes(128), 0, 0)   # kda.CALL_VALUES, as _run
    n = len(prepared.launches)
    rows.append((f"launches ({n}) as the call's graph",
                 timing.host_us(lambda: prepared.values.launch(values, prepared.launches, strm))))
    for k in prepared.values.graphs:   # from here on: one by one
        prepared.values.graphs[k] = launch.NO_GRAPH
    rows.append((f"launches ({n}) one by one", timing.host_us(lambda: prepared.values.launch(
        values, prepared.launches, strm))))
    rows.append(("chunk_kda call (launches one by one)", timing.host_us(call)))
    rows.append(("_run alone (launches one by one)", timing.host_us(
        lambda: kda._run(prepared, arrays, seq[0], None, None, pool, None, checkpoints=(None, cu_cpu)))))

    def same_signature(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                       allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                       return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                       cp_context=None, use_graph=False, max_num_seqs=None, *, A_log=None, dt_bias=None,
                       state_indices=None, has_initial_state=None, out=None, final_state=None, chunk_size=16,
                       stream=None, warps=None, stages=None, segment_chunks=None, checkpoint_every=None,
                       intermediate_states=None, transpose_state_layout=None):
        return None
    rows.append(("a Python call of chunk_kda's signature, as the bench calls it", loop_us(
        lambda: same_signature(*seq, **params, **flags, state_v_first=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
                               initial_state=pool, state_indices=idx))))
    torch.cuda.synchronize()
    del ws, out
    rows.append(("torch.empty_like(q) (reference)", loop_us(lambda: torch.empty_like(seq[0]))))
    rows.append(("torch.cuda.current_stream() (reference)", loop_us(torch.cuda.current_stream)))
    prepared.values.graphs.clear()   # the call's launches go as a graph again after a few calls
    try:   # the previous tree, copied beside as pykda_base (git archive HEAD pykda), alternated with this one
        import pykda_base.ops.kda as base
        base_call = lambda: base.chunk_kda(*seq, **params, **flags, state_v_first=True, cu_seqlens=cu,  # noqa: E731
                                           cu_seqlens_cpu=cu_cpu, initial_state=pool, state_indices=idx)
        for _ in range(3):
            rows.append(("A/B: pykda_base chunk_kda call", timing.host_us(base_call)))
            rows.append(("A/B: this tree's chunk_kda call", timing.host_us(call)))
    except ImportError:
        pass
    print(f"{'piece':62s} {'host us':>8s}")
    for name, us in rows:
        print(f"{name:62s} {us:8.2f}")


if __name__ == "__main__":
    main()
