"""Session 60's sweep found the two rows cuDNN leads among the grid's batches (256 x 32/8 KV 1024 and
64 x 32/8 KV 4096, D 128, every sequence the whole KV length) 3.5 % faster at 4 stages (one CTA an
SM) than at the planner's 3 (two), while uneven batches of many units lose at 4 (DEFAULT_STAGES'
comment). Is "no kv_lens: 4 stages" a rule? Batches of many units, D 128 and 64, each at stages 3, 4
and 5 where they fit, even (no kv_lens) and uneven (kv_lens of `uneven_lengths`), cuDNN beside the even
ones. HND, cold L2, median of 50, µs; a summary of 4 / 3 per row last.
Run from the repository root: `PYTHONPATH=. python docs/studies/decode_led_rows/even_batches.py`."""
import torch

from pykda.bench import timing
from pykda.bench.decode import _pykda, _sdpa_peer, grid_inputs

ROWS = [(256, 32, 8, 128, 1024), (64, 32, 8, 128, 4096), (128, 32, 8, 128, 2048), (32, 32, 8, 128, 8192),
        (16, 32, 32, 128, 8192), (256, 8, 1, 128, 4096), (512, 32, 8, 128, 512), (256, 64, 8, 128, 512),
        (128, 16, 16, 128, 3000), (64, 128, 8, 128, 2048), (256, 32, 8, 64, 2048), (32, 32, 8, 64, 8192),
        (64, 16, 16, 64, 4096)]


def main() -> None:
    timer, _ = timing.start("read")
    summary = []
    for B, hq, hkv, D, S in ROWS:
        for uneven in (False, True):
            q, k, v, lens = grid_inputs(B, hq, hkv, D, S, uneven)
            tag = f"{B}x{hq}/{hkv} D{D} S{S}{'~' if uneven else ''}"
            peer = float("nan")
            if not uneven:
                run, _ = _sdpa_peer("CUDNN_ATTENTION", q, k, v)
                peer = timer.median_us(run) if run else peer
            kv_lens = torch.as_tensor(lens, dtype=torch.int32, device="cuda") if uneven else None
            us = {}
            for stages in (3, 4, 5):
                fn = _pykda(q, k, v, True, "HND", None, stages, kv_lens)
                try:
                    fn()
                except ValueError:
                    continue
                us[stages] = timer.median_us(fn)
            print(f"{tag:>26} cudnn {peer:7.1f}  " + "  ".join(f"s{s} {t:7.1f}" for s, t in us.items()), flush=True)
            summary.append((tag, peer, us))
            del q, k, v
            torch.cuda.empty_cache()
    print(f"\n{'row':>26} {'cudnn':>7} {'s3':>7} {'s4':>7}  s4/s3  cudnn/s4")
    for tag, peer, us in summary:
        print(f"{tag:>26} {peer:7.1f} {us[3]:7.1f} {us[4]:7.1f}  {us[4] / us[3]:.3f}  {peer / us[4]:.3f}")


if __name__ == "__main__":
    main()
