"""32/8 KV 17 D 64: cold (L2 flushed, events) and back-to-back (a graph of 200 calls) µs, pykda stages 2/3/4 vs FlashInfer."""
import torch, pykda, flashinfer
from pykda.bench import timing
timer, _ = timing.start("read")
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(32, 64, device="cuda", generator=g).to(torch.bfloat16)
k = torch.randn(8, 17, 64, device="cuda", generator=g).to(torch.bfloat16)
v = torch.randn(8, 17, 64, device="cuda", generator=g).to(torch.bfloat16)
fns = {f"pykda s{s}": (lambda s=s: pykda.single_decode_with_kv_cache(q, k, v, kv_layout="HND", stages=s)) for s in (2, 3, 4)}
fns["fi"] = lambda: flashinfer.single_decode_with_kv_cache(q, k, v, kv_layout="HND", use_tensor_cores=False)
for name, fn in fns.items():
    for _ in range(3): fn()
    torch.cuda.synchronize()
    cold = timer.median_us(fn)
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(200): fn()
    gr.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(5):
        e0.record(); gr.replay(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1) * 1e3 / 200)
    print(f"{name}: cold {cold:.2f} us, back-to-back in a graph {sorted(ts)[2]:.2f} us", flush=True)
