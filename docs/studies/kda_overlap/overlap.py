"""Would prepare and the recurrence overlap? chunk_kda's two launches timed alone, in one stream,
and on two streams at once (the recurrence reading records a previous prepare wrote), cold L2."""
import torch

import pykda
from pykda import runtime
from pykda.bench.kda import FLAGS, _inputs
from pykda.bench.timing import Timer
from pykda.ops.kda import record_bytes

captured = {}
orig = runtime.CallValues.launch


def spy(self, values, launches, stream):   # a call's packed values and bound launches
    captured["x"] = (self, values, launches)
    return orig(self, values, launches, stream)


runtime.CallValues.launch = spy

timer = Timer("read")
s_lo = torch.cuda.Stream(priority=0)
s_hi = torch.cuda.Stream(priority=-1)
main = torch.cuda.current_stream()

def rows(H, T, warps=None):
    x, params, cu, h0 = _inputs(H, [T], False)
    seq = [x[n] for n in ("q", "k", "v", "g", "beta")]
    f = lambda: pykda.chunk_kda(*seq, **params, **FLAGS["softplus"], state_v_first=True, warps=warps)
    f()
    cv, values, launches = captured["x"]
    assert len(launches) == 2, len(launches)
    nbytes = -(-T // 16) * H * record_bytes(128, 16) + 4096
    recb = torch.empty(2, nbytes, dtype=torch.uint8, device="cuda")
    W = [recb[0].data_ptr(), recb[1].data_ptr()]
    print(f"H={H} T={T} warps={warps or 'auto'}", flush=True)   # values[15]: the records workspace (CALL_VALUES)
    def pack(ws):
        v = list(values); v[15] = ws
        cv.layout.pack_into(cv.buffer, 0, *v)
    prep, rec = launches
    # fill W0 with records
    pack(W[0]); prep(main.cuda_stream); torch.cuda.synchronize()
    def alone_prep():
        pack(W[1]); prep(main.cuda_stream)
    def alone_rec():
        pack(W[0]); rec(main.cuda_stream)
    def seq1():
        pack(W[0]); prep(main.cuda_stream); rec(main.cuda_stream)
    def conc(first):
        ev = torch.cuda.Event(); ev.record(main)
        s_lo.wait_event(ev); s_hi.wait_event(ev)
        # prepare writes W1 on the low-priority stream; recurrence reads W0 on the high one
        # (CallValues is one buffer: the driver copies params at launch, so pack then launch)
        if first == "prep":
            pack(W[1]); prep(s_lo.cuda_stream); pack(W[0]); rec(s_hi.cuda_stream)
        else:
            pack(W[0]); rec(s_hi.cuda_stream); pack(W[1]); prep(s_lo.cuda_stream)
        e1 = torch.cuda.Event(); e1.record(s_lo); e2 = torch.cuda.Event(); e2.record(s_hi)
        main.wait_event(e1); main.wait_event(e2)
    res = {}
    for name, fn in [("prepare", alone_prep), ("recurrence", alone_rec), ("both, one stream", seq1),
                     ("both, two streams, prepare first", lambda: conc("prep")),
                     ("both, two streams, recurrence first", lambda: conc("rec")),
                     ("chunk_kda", f)]:
        res[name] = [timer.median_us(fn, warmup=3, repeats=20) for _ in range(2)]
        print(f"  {name:40s} " + " ".join(f"{u:8.1f}" for u in res[name]), flush=True)
    return res

table = {}
# (fewer heads: segments, four launches); warps None: the planner's (8 on wgmma at H=96 since session 22)
for H, T, warps in [(96, 8192, None), (96, 8192, 2), (64, 8192, None), (64, 8192, 8), (32, 8192, None)]:
    table[(H, T, warps)] = rows(H, T, warps)
print("\n| H | T | warps | prepare | recurrence | one stream | two streams (prep first) | (rec first) | chunk_kda |")
for (H, T, warps), r in table.items():
    m = {k: min(v) for k, v in r.items()}
    print(f"| {H} | {T} | {warps or 'auto'} | " + " | ".join(f"{m[k]:.1f}" for k in r) + " |")
