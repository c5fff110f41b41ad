"""`python -m pykda demo`: the job pykda is for, end to end, on a small hybrid stack.

The model: one block of Kimi Linear's layer pattern, three KDA layers to one softmax-attention
layer, with Kimi Linear (48B-A3B)'s head counts: KDA 32 heads with K = V = 128 and its gate
(`-exp(A_log) * softplus(g + dt_bias)`, L2-normalised q and k, sigmoid(beta), all in the
kernels); attention 32 query heads of 128 over 8 KV heads (GQA, standing in for Kimi Linear's
MLA layers: flash decoding serves GQA). Weights (A_log, dt_bias) are random with the layer's
init; there are no projections or MLPs: every layer gets random q/k/v/g/beta per token (seeded),
and the data flow is real: each KDA layer keeps its states in a pool (fp32, V-first), each
attention layer a padded KV cache that grows by every step's k/v.

The job, continuous batching over SLOTS decode slots:
1. compile: the kernels the calls below plan (NVRTC, cached on disk), with a progress bar;
2. capture: the decode step of the whole stack in a CUDA graph, at startup as serving engines
   do (torch's idiom: warm-up on a side stream with every slot empty, `with torch.cuda.graph(g)`);
3. serve: before each step the sequences that are done leave; waiting ones are prefilled with
   `chunk_kda` (packed, `cu_seqlens`), their final states written into free pool rows
   (`initial_state=pool, state_indices=rows`, `has_initial_state` False: a reused row's old state
   is not read), their prompt K/V into the freed cache slots; then the step's inputs are copied
   into the graph's static buffers and the graph is replayed: per KDA layer `fused_recurrent_kda`
   on the pool (`state_indices`, -1 for an empty slot), per attention layer the new k/v appended to
   the cache and `batch_decode_with_padded_kv_cache` with `kv_lens` on the device;
4. check: for two sequences still decoding at the end (one of the first batch, one that joined
   in a reused slot and pool row), the final KDA states in the pool and the last step's outputs
   against the float64 references of `reference.py` over their whole token history;
5. measure: µs per op (CUDA events, warm L2) and tokens/s of the prefill and of the replayed step.

The attention layer's prefill attention (a FlashAttention job, not pykda's) is skipped: its
prompt K/V go into the cache, which is what decode reads. Without a GPU the demo shows the
offline compile of the kernels it would run on an H200 (sm_90a).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import reference, runtime
from .progress import progress

# the model: one block of Kimi Linear's 3:1 pattern, with its head counts
LAYERS = ("kda", "kda", "kda", "attn")
KDA_HEADS, KDA_DIM = 32, 128                          # Kimi Linear: 32 KDA heads, K = V = 128
ATTN_HEADS, ATTN_KV_HEADS, ATTN_DIM = 32, 8, 128      # GQA 32/8 in place of Kimi Linear's MLA (32 heads)
# the workload
SLOTS = 8                     # decode batch: the CUDA graph's batch size, and the KV cache's
POOL_ROWS = SLOTS + 2         # rows of each KDA layer's state pool: freed rows get reused
REQUESTS = 14                 # the first SLOTS fill the slots, the others wait for a free one
PROMPT_LENS = (100, 2000)
STEPS = 16
CACHE_LEN = 2048              # rows per slot of the padded KV cache (>= the longest prompt + STEPS)
SEED = 0
DEVICE = "cuda"
TOL = 1e-2                    # rel-L2 error vs float64 that the check accepts
KIMI = dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            state_v_first=True)


# --------------------------------------------------------------------------------------------
# The workload, planned on the host (no GPU needed)
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Request:
    id: int
    prompt: int                   # prompt tokens
    new: int                      # tokens to decode (the demo stops after STEPS steps)
    slot: int = -1                # decode slot: batch row of the graph's buffers and of the KV cache
    row: int = -1                 # pool row of its KDA states (the same row in every KDA layer)
    join: int = -1                # its first decode step (0: the first batch)
    slot_after: int | None = None  # the request that held the slot before (None: first use)
    row_after: int | None = None   # ... and the pool row

    def live(self, step: int) -> bool:
        return 0 <= self.join <= step < self.join + self.new

    def position(self, step: int) -> int:
        """KV row (= tokens before it) of the token the request decodes at `step`."""
        return self.prompt + step - self.join


@dataclass(eq=False)
class Step:
    slots: tuple                  # per slot: the Request decoding in it, or None (empty: padding)
    joins: tuple                  # requests prefilled just before this step


def make_requests(seed: int = SEED) -> list[Request]:
    """Prompt lengths in PROMPT_LENS; the first batch leaves after 3..STEPS-1 tokens except its
    shortest prompt, and the requests that join stay to the end (both are checked there)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(PROMPT_LENS[0], PROMPT_LENS[1] + 1, REQUESTS)
    new = rng.integers(3, STEPS, REQUESTS)
    new[SLOTS:] = STEPS
    new[int(np.argmin(prompts[:SLOTS]))] = STEPS
    return [Request(i, int(p), int(n)) for i, (p, n) in enumerate(zip(prompts, new))]


def schedule(requests: list[Request]) -> list[Step]:
    """Continuous batching: before each step the requests that have decoded all their tokens leave
    (their slot and pool row are freed), and waiting requests, in order, take the free slots and
    the longest-free pool rows. Fills in each request's slot, row and join step."""
    queue, free_rows = list(requests), list(range(POOL_ROWS))
    slots: list[Request | None] = [None] * SLOTS
    last_in_slot: dict[int, int] = {}
    last_in_row: dict[int, int] = {}
    steps = []
    for step in range(STEPS):
        for i, r in enumerate(slots):
            if r is not None and not r.live(step):
                free_rows.append(r.row)
                last_in_slot[i], last_in_row[r.row], slots[i] = r.id, r.id, None
        joins = []
        for i in range(SLOTS):
            if slots[i] is None and queue:
                r = queue.pop(0)
                r.slot, r.row, r.join = i, free_rows.pop(0), step
                r.slot_after, r.row_after = last_in_slot.get(i), last_in_row.get(r.row)
                slots[i] = r
                joins.append(r)
        steps.append(Step(tuple(slots), tuple(joins)))
    return steps


def checked_requests(steps: list[Step]) -> list[Request]:
    """Two requests decoding at the last step: the shortest prompt of the first batch, and the
    shortest of those that joined later (in a reused pool row where there is one)."""
    last = [r for r in steps[-1].slots if r is not None]
    first = [r for r in last if r.join == 0]
    joined = [r for r in last if r.join > 0]
    joined = [r for r in joined if r.row_after is not None] or joined
    return [min(group, key=lambda r: r.prompt) for group in (first, joined) if group]


def slot_meta(index: int, step: Step) -> np.ndarray:
    """int32 [3, SLOTS] for the step's static buffers: pool rows (-1: empty slot), KV position of
    the new token (0 for an empty slot: its row 0 is scratch), KV lengths with it (0: empty)."""
    meta = np.zeros((3, SLOTS), dtype=np.int32)
    meta[0] = -1
    for i, r in enumerate(step.slots):
        if r is not None:
            meta[:, i] = r.row, r.position(index), r.position(index) + 1
    return meta


def describe(requests: list[Request], steps: list[Step]) -> None:
    kinds = " ".join(k.upper() for k in LAYERS)
    print("pykda demo: a hybrid stack in Kimi Linear's proportions serving a batch, random weights "
          f"(seed {SEED})")
    print(f"  layers   {kinds}: KDA {KDA_HEADS} heads K=V={KDA_DIM} (Kimi Linear's), Kimi Linear's gate, "
          f"fp32 states in a pool of {POOL_ROWS} rows per layer;")
    print(f"           attention {ATTN_HEADS} query / {ATTN_KV_HEADS} KV heads of {ATTN_DIM} (GQA in place of "
          f"Kimi Linear's MLA), bf16 KV cache {SLOTS} x {CACHE_LEN} rows")
    first = steps[0].joins
    print(f"  serving  {len(requests)} requests, prompts {PROMPT_LENS[0]}-{PROMPT_LENS[1]} tokens, {SLOTS} slots, "
          f"{STEPS} decode steps: first batch {len(first)} sequences / {sum(r.prompt for r in first)} tokens, "
          f"{sum(len(s.joins) for s in steps[1:])} joining later")


# --------------------------------------------------------------------------------------------
# Progress and the kernels
# --------------------------------------------------------------------------------------------


def kernel_specs(steps: list[Step], arch: str, sm_count: int, smem_per_sm: int) -> list[runtime.KernelSpec]:
    """The kernels the demo's calls run, as their own validation and planners pick them for a
    device of `sm_count` SMs (the arguments are stand-ins with the calls' shapes: no GPU needed)."""
    from .ops.decode import plan_decode, decode_spec, validate_decode
    from .ops.kda import kda_specs, plan_kda, validate_kda
    from .ops.kda_decode import kda_decode_spec, plan_kda_decode, validate_kda_decode
    from .ops.kda_variant import KdaFlags
    from .runtime.arrays import DeviceArray, contiguous_strides

    def arr(shape, dtype="bfloat16"):
        return DeviceArray(1 << 30, tuple(shape), contiguous_strides(tuple(shape)), dtype, 0, "demo", None)

    H, K = KDA_HEADS, KDA_DIM
    flags = KdaFlags(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    weights = (arr((H,), "float32"), arr((H, K), "float32"))
    pool = arr((POOL_ROWS, H, K, K), "float32")
    specs: list[runtime.KernelSpec] = []
    for step in steps:   # one packed chunk_kda call per KDA layer and prefill
        if not step.joins:
            continue
        N, T = len(step.joins), sum(r.prompt for r in step.joins)
        x = [arr((1, T, H, K))] * 4
        p = validate_kda(*x, arr((1, T, H)), *weights, pool, arr((N,), "int32"), arr((N,), "bool"),
                         arr((N + 1,), "int32"), None, None, flags, True, 16)
        specs += kda_specs(p, plan_kda(p, sm_count), arch)
    x = [arr((SLOTS, 1, H, K))] * 4
    p = validate_kda_decode(*x, arr((SLOTS, 1, H)), *weights, pool, arr((SLOTS,), "int32"), None,
                            arr((SLOTS, 1, H, K)), flags, True)
    plan = plan_kda_decode(p, sm_count, smem_per_sm)
    specs.append(kda_decode_spec(p, plan.rpt, plan.stages, arch))
    q, kv = arr((SLOTS, ATTN_HEADS, ATTN_DIM)), arr((SLOTS, CACHE_LEN, ATTN_KV_HEADS, ATTN_DIM))
    p = validate_decode(q, kv, kv, q, arr((SLOTS,), "int32"), batched=True, kv_layout="NHD")
    specs.append(decode_spec(p, plan_decode(p, sm_count, smem_per_sm), arch))
    return list(dict.fromkeys(specs))


def compile_kernels(specs: list[runtime.KernelSpec]) -> list[tuple[runtime.KernelSpec, int, float, bool]]:
    """NVRTC (or the disk cache) for every spec, several at once: (spec, cubin bytes, seconds, from disk)."""
    compiled = runtime.compile_specs(specs)
    return [(spec, len(cubin), seconds, from_disk) for spec, cubin, seconds, from_disk in
            progress(compiled, "  compile", lambda row: row[0].template, plain_lines=True, total=len(specs))]


def offline(steps: list[Step], why: str) -> int:
    """No run: the offline compile of every kernel the demo runs (three families), for an H200."""
    from .registry import H200_SMEM_PER_SM, H200_SMS
    print(f"{why}; showing the offline compile of the kernels this demo runs, for an H200 (sm_90a)")
    t0 = time.perf_counter()
    rows = compile_kernels(kernel_specs(steps, "sm_90a", H200_SMS, H200_SMEM_PER_SM))
    for spec, nbytes, seconds, from_disk in rows:
        print(f"  {spec.template:<15} {spec.describe():<96} {seconds:6.2f} s {nbytes:7d} B "
              f"({'disk cache' if from_disk else 'NVRTC'})")
    families = sorted({s.template for s, *_ in rows})
    print(f"compiled {len(rows)} kernels ({', '.join(families)}) in {time.perf_counter() - t0:.1f} s; "
          "`python -m pykda compile` compiles every registered specialization")
    return 0


# --------------------------------------------------------------------------------------------
# The stack on the GPU (torch)
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class KdaLayer:
    A_log: Any                    # fp32 [H]: Kimi Linear's gate weights,
    dt_bias: Any                  # fp32 [H, K]
    pool: Any                     # fp32 [P, H, V, K]: one state per pool row (state_v_first)
    x: dict                       # static decode inputs q, k, v, g [SLOTS, 1, H, K], beta [SLOTS, 1, H], bf16
    o: Any                        # static decode output [SLOTS, 1, H, V]
    kind: str = "kda"


@dataclass(eq=False)
class AttnLayer:
    k_cache: Any                  # bf16 [SLOTS, CACHE_LEN, Hkv, D]: padded cache, one slot per batch row
    v_cache: Any
    x: dict                       # static decode inputs q [SLOTS, Hq, D], k, v [SLOTS, Hkv, D], bf16
    o: Any                        # static decode output [SLOTS, Hq, D]
    kind: str = "attn"


@dataclass(eq=False)
class Engine:
    layers: list
    meta: Any                     # int32 [3, SLOTS]: slot_meta's rows, positions, lengths (static)
    slot_base: Any                # int64 [SLOTS]: each slot's first row in a flattened cache
    gen: Any                      # CUDA generator of the random activations
    graph: Any = None             # the captured decode step

    @property
    def rows(self):
        return self.meta[0]

    @property
    def kv_lens(self):
        return self.meta[2]


@dataclass(eq=False)
class Prompts:
    """One prefill: the joining requests' prompts, packed along T (B = 1)."""
    requests: tuple
    spans: list                   # (start, end) of each prompt in the packed tokens
    cu: Any                       # int32 [N + 1] cu_seqlens on the device
    rows: Any                     # int32 [N] their pool rows
    fresh: Any                    # bool [N], all False: each starts from a zero state
    x: list                       # per layer, the random activations of the prompt tokens
    tokens: int = field(init=False)

    def __post_init__(self):
        self.tokens = self.spans[-1][1]


def build(torch) -> Engine:
    """Weights with Kimi Linear's init (A = U(1, 16), dt log-uniform in [1e-3, 1e-1] as
    softplus⁻¹), state pools, KV caches and the decode step's static buffers."""
    dev, bf = DEVICE, dict(device=DEVICE, dtype=torch.bfloat16)
    rng = np.random.default_rng(SEED)
    H, K = KDA_HEADS, KDA_DIM
    layers = []
    for kind in LAYERS:
        if kind == "kda":
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), (H, K)))
            layers.append(KdaLayer(
                A_log=torch.tensor(np.log(rng.uniform(1, 16, H)), dtype=torch.float32, device=dev),
                dt_bias=torch.tensor(dt + np.log(-np.expm1(-dt)), dtype=torch.float32, device=dev),
                pool=torch.zeros(POOL_ROWS, H, K, K, device=dev),
                x=dict(q=torch.empty(SLOTS, 1, H, K, **bf), k=torch.empty(SLOTS, 1, H, K, **bf),
                       v=torch.empty(SLOTS, 1, H, K, **bf), g=torch.empty(SLOTS, 1, H, K, **bf),
                       beta=torch.empty(SLOTS, 1, H, **bf)),
                o=torch.empty(SLOTS, 1, H, K, **bf)))
        else:
            cache = (SLOTS, CACHE_LEN, ATTN_KV_HEADS, ATTN_DIM)
            layers.append(AttnLayer(
                k_cache=torch.zeros(cache, **bf), v_cache=torch.zeros(cache, **bf),
                x=dict(q=torch.empty(SLOTS, ATTN_HEADS, ATTN_DIM, **bf),
                       k=torch.empty(SLOTS, ATTN_KV_HEADS, ATTN_DIM, **bf),
                       v=torch.empty(SLOTS, ATTN_KV_HEADS, ATTN_DIM, **bf)),
                o=torch.empty(SLOTS, ATTN_HEADS, ATTN_DIM, **bf)))
    meta = torch.from_numpy(slot_meta(0, Step((None,) * SLOTS, ()))).to(dev)   # every slot empty
    slot_base = torch.arange(SLOTS, device=dev, dtype=torch.int64) * CACHE_LEN
    gen = torch.Generator(device=dev)
    gen.manual_seed(SEED)
    return Engine(layers, meta, slot_base, gen)


def decode_layer(eng: Engine, layer) -> None:
    """One layer's decode for every slot, from and into the static buffers."""
    import pykda
    x = layer.x
    if layer.kind == "kda":
        pykda.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=layer.A_log,
                                  dt_bias=layer.dt_bias, initial_state=layer.pool, state_indices=eng.rows,
                                  out=layer.o, **KIMI)
    else:
        at = eng.slot_base + eng.meta[1]   # the new token's row in each flattened slot
        layer.k_cache.view(-1, ATTN_KV_HEADS, ATTN_DIM).index_copy_(0, at, x["k"])
        layer.v_cache.view(-1, ATTN_KV_HEADS, ATTN_DIM).index_copy_(0, at, x["v"])
        pykda.batch_decode_with_padded_kv_cache(x["q"], layer.k_cache, layer.v_cache, kv_lens=eng.kv_lens,
                                                out=layer.o)


def decode_step(eng: Engine) -> None:
    """The stack's decode step (the body of the CUDA graph)."""
    for layer in eng.layers:
        decode_layer(eng, layer)


def capture(torch, eng: Engine) -> None:
    """torch's idiom: warm-up on a side stream (loads the kernels, prepares the calls), then the
    capture on torch's capture stream. Every slot is empty meanwhile: no state is touched."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            decode_step(eng)
    torch.cuda.current_stream().wait_stream(s)
    eng.graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(eng.graph):
        decode_step(eng)


def make_prompts(torch, eng: Engine, joins: tuple) -> Prompts:
    """The joining requests' prompts: random activations per layer, packed, and where they go."""
    T, spans = 0, []
    for r in joins:
        spans.append((T, T + r.prompt))
        T += r.prompt
    kw = dict(device=DEVICE, dtype=torch.bfloat16, generator=eng.gen)
    xs = []
    for layer in eng.layers:
        if layer.kind == "kda":
            xs.append({n: torch.randn(1, T, KDA_HEADS, KDA_DIM, **kw) for n in ("q", "k", "v", "g")})
            xs[-1]["beta"] = torch.randn(1, T, KDA_HEADS, **kw)
        else:   # only K/V: the prompt's attention itself is not pykda's job
            xs.append({n: torch.randn(T, ATTN_KV_HEADS, ATTN_DIM, **kw) for n in ("k", "v")})
    cu = torch.tensor([0] + [e for _, e in spans], dtype=torch.int32, device=DEVICE)
    rows = torch.tensor([r.row for r in joins], dtype=torch.int32, device=DEVICE)
    fresh = torch.zeros(len(joins), dtype=torch.bool, device=DEVICE)
    return Prompts(tuple(joins), spans, cu, rows, fresh, xs)


def prefill_layer(layer, x: dict, p: Prompts) -> None:
    """One layer's prefill: KDA's final states into the pool rows, or the prompt K/V into the slots."""
    import pykda
    if layer.kind == "kda":
        pykda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], A_log=layer.A_log, dt_bias=layer.dt_bias,
                        initial_state=layer.pool, state_indices=p.rows, has_initial_state=p.fresh,
                        cu_seqlens=p.cu, **KIMI)
    else:
        for r, (s, e) in zip(p.requests, p.spans):
            layer.k_cache[r.slot, : e - s] = x["k"][s:e]
            layer.v_cache[r.slot, : e - s] = x["v"][s:e]


def prefill(eng: Engine, p: Prompts) -> None:
    for layer, x in zip(eng.layers, p.x):
        prefill_layer(layer, x, p)


def load_step(torch, eng: Engine, index: int, step: Step) -> None:
    """The step's inputs into the static buffers: new random activations, slots' rows and lengths."""
    for layer in eng.layers:
        for t in layer.x.values():
            t.normal_(generator=eng.gen)
    eng.meta.copy_(torch.from_numpy(slot_meta(index, step)))   # from pageable memory: synchronous


def record_prompts(trace: dict, eng: Engine, p: Prompts) -> None:
    """The checked requests' prompt activations (views of the packed prompts, never written)."""
    for r, (s, e) in zip(p.requests, p.spans):
        if r.id in trace:
            for hist, x, layer in zip(trace[r.id], p.x, eng.layers):
                for n, t in x.items():   # KDA's [1, T, ...] -> [t, ...]; attention's [T, Hkv, D]
                    hist.setdefault(n, []).append(t[0, s:e] if layer.kind == "kda" else t[s:e])


def record_step(trace: dict, eng: Engine, index: int, checked: list[Request]) -> None:
    """The checked requests' activations of this step (copies: the static buffers are reused)."""
    for r in checked:
        if r.live(index):
            for hist, layer in zip(trace[r.id], eng.layers):
                for n, t in layer.x.items():   # KDA's [SLOTS, 1, H, .] -> [1, H, .]; attention's -> [1, H, D]
                    row = t[r.slot] if layer.kind == "kda" else t[r.slot : r.slot + 1]
                    hist.setdefault(n, []).append(row.clone())


def serve(torch, eng: Engine, steps: list[Step], checked: list[Request]) -> tuple[dict, Prompts, float]:
    """Continuous batching: before each step prefill the joining requests, then load the step's
    inputs and replay the graph. Returns the checked requests' whole history (per layer, per
    input), the first batch's prompts and the first prefill's wall time (with the kernels' loads)."""
    trace = {r.id: [dict() for _ in eng.layers] for r in checked}
    first, first_s = None, 0.0
    for index, step in enumerate(steps):
        if step.joins:
            t0 = time.perf_counter()
            p = make_prompts(torch, eng, step.joins)
            prefill(eng, p)
            if first is None:
                torch.cuda.synchronize()
                first, first_s = p, time.perf_counter() - t0
            log_joins(index, p)
            record_prompts(trace, eng, p)
        load_step(torch, eng, index, step)
        record_step(trace, eng, index, checked)
        eng.graph.replay()
    torch.cuda.synchronize()
    tokens = sum(r is not None for s in steps for r in s.slots)
    print(f"decode: {STEPS} graph replays, {tokens} tokens; "
          f"{sum(r is not None for r in steps[-1].slots)} of {SLOTS} slots decoding at the end")
    return trace, first, first_s


def log_joins(index: int, p: Prompts) -> None:
    if index == 0:
        print(f"step  0: prefill {len(p.requests)} sequences / {p.tokens} tokens (chunk_kda, packed) into "
              f"slots and pool rows {p.requests[0].row}-{p.requests[-1].row}")
        return

    def where(r):
        slot = f"slot {r.slot}" + (f" after r{r.slot_after}" if r.slot_after is not None else "")
        row = f"pool row {r.row}" + (f" after r{r.row_after}" if r.row_after is not None else " (unused so far)")
        return f"r{r.id} ({r.prompt} tokens) -> {slot}, {row}"
    print(f"step {index:2d}: prefill " + "; ".join(map(where, p.requests)))


# --------------------------------------------------------------------------------------------
# Check and measure
# --------------------------------------------------------------------------------------------


def f64(t) -> np.ndarray:
    return t.double().cpu().numpy()


def check(torch, eng: Engine, trace: dict, checked: list[Request]) -> list[tuple[Request, str, str, float]]:
    """Final KDA states of the pool rows and the last step's outputs vs float64, over each
    checked request's whole history (prompt and decoded tokens, from a zero state)."""
    results = []
    pairs = [(r, i) for r in checked for i in range(len(eng.layers))]
    for r, i in progress(pairs, "  check vs float64", lambda ri: f"r{ri[0].id} layer {ri[1]}", plain_lines=True):
        layer = eng.layers[i]
        t = {n: f64(torch.cat(v)) for n, v in trace[r.id][i].items()}
        name = f"{i} {layer.kind.upper()}"
        if layer.kind == "kda":
            o_ref, s_ref = reference.kda_recurrent(
                t["q"][None], t["k"][None], t["v"][None], t["g"][None], t["beta"][None], A_log=f64(layer.A_log),
                dt_bias=f64(layer.dt_bias), gate="softplus", qk_norm=True, beta_form="logit")
            results.append((r, name, "state", reference.relative_error(f64(layer.pool[r.row]), s_ref[0])))
            results.append((r, name, "out", reference.relative_error(f64(layer.o[r.slot, 0]), o_ref[0, -1])))
        else:
            o_ref, _ = reference.batch_decode_attention(t["q"][-1:], t["k"][None], t["v"][None])
            n = t["k"].shape[0]
            cache = np.stack([f64(layer.k_cache[r.slot, :n]), f64(layer.v_cache[r.slot, :n])])
            results.append((r, name, "kv cache", reference.relative_error(cache, np.stack([t["k"], t["v"]]))))
            results.append((r, name, "out", reference.relative_error(f64(layer.o[r.slot]), o_ref[0])))
    return results


def gpu_us(torch, fn: Callable[[], None], reps: int = 20) -> float:
    """Median GPU time of fn (µs, CUDA events); a sleep kernel before each call keeps the GPU busy
    while the host enqueues it, so the events time the GPU, not the host."""
    sleep = getattr(torch.cuda, "_sleep", None)
    fn()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in pairs:
        if sleep is not None:
            sleep(2_000_000)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in pairs])) * 1e3


def wall_us(torch, fn: Callable[[], None], reps: int = 100) -> float:
    """Wall time per call of back-to-back calls (host and GPU together), µs."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def measure(torch, eng: Engine, first: Prompts, steps: list[Step]) -> list[tuple[str, str, float, str]]:
    """µs per op and tokens/s (after the check: these calls change the states). Rows of
    (op, shape, µs, rate)."""
    import pykda
    i_kda = next(i for i, layer in enumerate(eng.layers) if layer.kind == "kda")
    kda, x0 = eng.layers[i_kda], first.x[i_kda]
    attn = next(layer for layer in eng.layers if layer.kind == "attn")
    live = sum(r is not None for r in steps[-1].slots)
    n_kda = sum(layer.kind == "kda" for layer in eng.layers)
    N, T = len(first.requests), first.tokens
    chunk = gpu_us(torch, lambda: prefill_layer(kda, x0, first))
    stack = gpu_us(torch, lambda: prefill(eng, first))
    recur = gpu_us(torch, lambda: decode_layer(eng, kda))
    x = attn.x
    flash = gpu_us(torch, lambda: pykda.batch_decode_with_padded_kv_cache(
        x["q"], attn.k_cache, attn.v_cache, kv_lens=eng.kv_lens, out=attn.o))
    graph = gpu_us(torch, eng.graph.replay)
    eager_wall, graph_wall = wall_us(torch, lambda: decode_step(eng)), wall_us(torch, eng.graph.replay)
    lens = eng.kv_lens.cpu().numpy()
    return [
        ("chunk_kda", f"{N} seqs packed, {T} tokens, 1 layer", chunk, f"{T / chunk:.1f} M tokens/s"),
        ("prefill, whole stack", f"{n_kda} x chunk_kda + KV cache writes", stack, f"{T / stack:.1f} M tokens/s"),
        ("fused_recurrent_kda", f"{live} of {SLOTS} slots, 1 layer", recur, ""),
        ("batch_decode_with_padded_kv_cache", f"{live} of {SLOTS} slots, KV {lens[lens > 0].min()}-{lens.max()}",
         flash, ""),
        ("decode step, graph replay", f"{len(eng.layers)} layers, {live} sequences", graph,
         f"{live / graph * 1e6:,.0f} tokens/s"),
        ("decode step, eager (wall)", "back to back, host and GPU", eager_wall,
         f"{live / eager_wall * 1e6:,.0f} tokens/s"),
        ("decode step, graph replay (wall)", "back to back, host and GPU", graph_wall,
         f"{live / graph_wall * 1e6:,.0f} tokens/s"),
    ]


def report(checks, timings, first_s: float, total_s: float) -> bool:
    ok = all(err < TOL for *_, err in checks)
    print(f"check vs float64 (reference.py), rel-L2 errors, pass < {TOL:g}:")
    for r in {c[0].id: c[0] for c in checks}.values():
        print(f"  r{r.id}: prompt {r.prompt} + {STEPS - r.join} decoded, "
              + ("first batch" if r.join == 0 else f"joined at step {r.join}")
              + f", slot {r.slot}, pool row {r.row}" + (f" (after r{r.row_after})" if r.row_after is not None else ""))
        for name in dict.fromkeys(c[1] for c in checks if c[0] is r):
            errs = "  ".join(f"{what} {err:.1e}" for rr, nn, what, err in checks if rr is r and nn == name)
            print(f"    layer {name:<7} {errs}")
    print("timing (median, warm L2; CUDA events unless marked wall):")
    for op, shape, us, rate in timings:
        print(f"  {op:<34} {shape:<40} {us:9.1f} us  {rate}")
    print(f"first prefill with the kernels' loads {first_s:.2f} s; whole demo {total_s:.1f} s: "
          + ("all checks pass" if ok else "CHECK FAILED"))
    return ok


def run(torch, steps: list[Step], t_start: float) -> int:
    dev = runtime.device_info(torch.cuda.current_device())
    print(f"on {dev.name} ({dev.sm_count} SMs, {dev.arch})")
    checked = checked_requests(steps)
    t0 = time.perf_counter()
    rows = compile_kernels(kernel_specs(steps, dev.arch, dev.sm_count, dev.smem_per_sm))
    fresh = sum(not disk for *_, disk in rows)
    print(f"compile: {len(rows)} kernels ({', '.join(sorted({s.template for s, *_ in rows}))}) in "
          f"{time.perf_counter() - t0:.1f} s, {fresh} by NVRTC, {len(rows) - fresh} from the disk cache")
    eng = build(torch)
    capture(torch, eng)
    print(f"capture: the decode step of {len(eng.layers)} layers in a CUDA graph, every slot empty")
    trace, first, first_s = serve(torch, eng, steps, checked)
    checks = check(torch, eng, trace, checked)
    timings = measure(torch, eng, first, steps)
    return 0 if report(checks, timings, first_s, time.perf_counter() - t_start) else 1


def main() -> int:
    t_start = time.perf_counter()
    requests = make_requests()
    steps = schedule(requests)
    describe(requests, steps)
    if not runtime.gpu_available():
        return offline(steps, "no CUDA GPU here")
    try:
        import torch
    except ImportError:
        return offline(steps, "the demo's GPU run needs PyTorch (its CUDA graphs), which is not installed")
    if not torch.cuda.is_available():
        return offline(steps, "PyTorch sees no CUDA GPU")
    why = runtime.device_info(torch.cuda.current_device()).unsupported
    if why is not None:
        return offline(steps, why)
    return run(torch, steps, t_start)
