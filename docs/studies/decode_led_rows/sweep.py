"""The rows of `bench decode --grid` a peer led in session 59 (H100, by 1-3 %), each with the
planner's plan and its neighbours: stages 2-5 (where they fit), half and twice the planner's chunk,
and for batches the balanced split; cuDNN SDPA beside. HND, cold L2, median of 50, µs; the best
setting per row and its ratio to cuDNN printed last. A setting a row cannot take prints "-".
Run from the repository root: `PYTHONPATH=. python docs/studies/decode_led_rows/sweep.py`."""
import torch

from pykda.bench import timing
from pykda.bench.decode import _pykda, _sdpa_peer, grid_inputs
from pykda.ops import decode

ROWS = [(256, 32, 8, 128, 1024), (64, 32, 8, 128, 4096), (1, 16, 16, 64, 100003), (1, 32, 32, 64, 262144),
        (1, 64, 8, 64, 1048575), (1, 32, 32, 128, 65536), (1, 64, 4, 128, 500000), (1, 32, 32, 256, 12345)]


def settings(p: decode.DecodeProblem, sms: int, smem: int) -> dict:
    """label -> (chunk_size, stages, balanced) around the planner's plan."""
    plan = decode.plan_decode(p, sms, smem)
    out = {f"plan ({plan.n_chunks} x {plan.chunk}, s{plan.stages})": (None, None, None)}
    for s in (2, 3, 4, 5):
        if s != plan.stages:
            out[f"stages {s}"] = (None, s, None)
    for chunk in (plan.chunk // 2, plan.chunk * 2):
        if chunk % plan.block_n == 0 and 0 < chunk < p.kv_len:
            out[f"chunk {chunk}"] = (chunk, None, None)
    if p.batch > 1:
        out["balanced"] = (None, None, True)
    return out


def main() -> None:
    timer, _ = timing.start("read")
    props = torch.cuda.get_device_properties(0)
    sms, smem = props.multi_processor_count, props.shared_memory_per_multiprocessor
    summary = []
    for B, hq, hkv, D, S in ROWS:
        q, k, v, _ = grid_inputs(B, hq, hkv, D, S, False)
        tag = f"{B}x{hq}/{hkv} D{D} S{S}"
        run, _ = _sdpa_peer("CUDNN_ATTENTION", q, k, v)
        cudnn = timer.median_us(run) if run else float("nan")
        print(f"{tag}: cudnn {cudnn:.1f} us", flush=True)
        best = None
        for label, (chunk, stages, balanced) in settings(decode.DecodeProblem(S, hq, hkv, D, "bfloat16", B), sms, smem).items():
            try:
                if balanced:
                    fn = lambda: decode.flash_decode(q, k, v, batched=True, kv_layout="HND", balanced=True)  # noqa: E731
                else:
                    fn = _pykda(q, k, v, B > 1, "HND", chunk, stages)
                fn()
            except (ValueError, RuntimeError) as exc:
                print(f"  {label:28s} -  ({type(exc).__name__}: {str(exc)[:60]})", flush=True)
                continue
            us = timer.median_us(fn)
            print(f"  {label:28s} {us:8.1f} us  cudnn / this {cudnn / us:.3f}", flush=True)
            best = min(best or (us, label), (us, label))
        summary.append((tag, cudnn, best))
        del q, k, v
        torch.cuda.empty_cache()
    print(f"\n{'row':>24} {'cudnn':>8} {'best pykda':>10}  setting, cudnn / best")
    for tag, cudnn, (us, label) in summary:
        print(f"{tag:>24} {cudnn:8.1f} {us:10.1f}  {label}, {cudnn / us:.3f}")


if __name__ == "__main__":
    main()
