"""Split decodes of <= 8 chunks: planner's default vs (chunks, stages) with cluster forced on/off.
`compile` as argv[1]: only compile the specs (no GPU)."""
import sys, dataclasses
from pykda.ops import decode
from pykda import runtime
H200 = dict(sm_count=132, smem_per_sm=233472)
SHAPES = [(32, 32, 8192, 128), (16, 16, 8192, 128), (32, 8, 4096, 128), (8, 1, 65537, 256), (128, 8, 4097, 256),
          (64, 8, 50000, 128), (32, 32, 65536, 128), (16, 16, 32768, 64)]
MAXSTAGES = {64: 6, 128: 6, 256: 3}

def points(hq, hkv, S, d):
    p = decode.DecodeProblem(S, hq, hkv, d, "bfloat16", 1)
    block_n = decode.tile_rows(d, S)
    yield None, None, None
    for n in (2, 4, 8):
        chunk = -(-(-(-S // n)) // block_n) * block_n
        for st in sorted({decode.DEFAULT_STAGES[d], MAXSTAGES[d]}):
            for cl in (False, True):
                yield chunk, st, cl

if sys.argv[1:] == ["compile"]:
    for hq, hkv, S, d in SHAPES:
        p = decode.DecodeProblem(S, hq, hkv, d, "bfloat16", 1)
        for chunk, st, cl in points(hq, hkv, S, d):
            plan = decode.plan_decode(p, **H200, chunk_size=chunk, stages=st)
            if cl is not None:
                plan = dataclasses.replace(plan, cluster=decode.merge_cluster(plan.n_chunks) if cl else 0)
            runtime.compile_spec(decode.decode_spec(p, plan, "sm_90a"))
    sys.exit()

import torch
from pykda.bench import timing
timer, copy = timing.start("read")
real = decode.cluster_pays
for hq, hkv, S, d in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(hq, d, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(hkv, S, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(hkv, S, d, device="cuda", generator=g).to(torch.bfloat16)
    ref = None
    line = []
    for chunk, st, cl in points(hq, hkv, S, d):
        decode.cluster_pays = real if cl is None else (lambda *a, cl=cl: cl)
        decode.plan_decode.cache_clear(); decode.PREPARED.clear()
        fn = lambda: decode.single_decode_with_kv_cache(q, k, v, kv_layout="HND", chunk_size=chunk, stages=st)
        o = fn()
        if ref is None: ref = o.float()
        err = (o.float() - ref).norm() / ref.norm()
        us = timer.median_us(fn)
        tag = "auto" if chunk is None else "%d/s%d/%s" % (chunk, st, "C" if cl else "m")
        line.append(f"{tag} {us:.1f}" + (f" ERR{err:.1e}" if err > 1e-2 else ""))
    print(f"{hq}/{hkv} S{S} D{d}: " + ", ".join(line), flush=True)
decode.cluster_pays = real
