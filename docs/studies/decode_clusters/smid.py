"""Where a small grid's CTAs land: %smid per CTA, SMs grouped into GPCs by clusters' co-placement."""
import collections
import cupy as cp

SRC = r'''
__device__ void body(int* out) {
  if (threadIdx.x == 0) {
    unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    out[blockIdx.x] = s;
    long long t0 = clock64(); while (clock64() - t0 < 40000) {}
  }
}
extern "C" __global__ void p1(int* o) { body(o); }
extern "C" __global__ void __cluster_dims__(2,1,1) p2(int* o) { body(o); }
extern "C" __global__ void __cluster_dims__(4,1,1) p4(int* o) { body(o); }
extern "C" __global__ void __cluster_dims__(8,1,1) p8(int* o) { body(o); }
'''
mod = cp.RawModule(code=SRC, options=("-std=c++17",))
K = {c: mod.get_function(f"p{c}") for c in (1, 2, 4, 8)}
nsm = cp.cuda.Device().attributes["MultiProcessorCount"]

def land(cl, n, smem):
    f = K[cl]
    f.max_dynamic_shared_size_bytes = smem
    o = cp.full(n, -1, cp.int32)
    f((n,), (128,), (o,), shared_mem=smem)
    cp.cuda.Device().synchronize()
    return o.get().tolist()

# GPCs: union the SMs of each cluster (one CTA an SM: 200 KB)
parent = list(range(nsm))
def find(a):
    while parent[a] != a:
        parent[a] = parent[parent[a]]; a = parent[a]
    return a
for rep in range(6):
    for cl in (2, 4, 8):
        for n in (cl * (nsm // cl), cl * 8, cl * 16):
            s = land(cl, n, 200 * 1024)
            for i in range(0, n, cl):
                for j in s[i + 1:i + cl]:
                    if j >= 0: parent[find(j)] = find(s[i])
groups = collections.defaultdict(list)
for sm in range(nsm): groups[find(sm)].append(sm)
gpcs = sorted(groups.values(), key=lambda g: g[0])
gpc_of = {sm: i for i, g in enumerate(gpcs) for sm in g}
print(f"{nsm} SMs in {len(gpcs)} groups, sizes {[len(g) for g in gpcs]}")
for g in gpcs: print("  ", g)
print("\n| CTAs | smem KB | cluster | SMs used | GPCs used | CTAs per GPC (sorted) |")
for smem in (99, 197):
    for cl in (1, 2, 4, 8):
        for n in (8, 16, 32, 64, 128):
            if n < cl: continue
            s = land(cl, n, smem * 1024)
            per = collections.Counter(gpc_of[x] for x in s)
            print(f"| {n} | {smem} | {cl} | {len(set(s))} | {len(per)} | {sorted(per.values(), reverse=True)} |")
    s = land(1, 16, smem * 1024)
    print("first 16 CTAs' SMs (no cluster):", s)
