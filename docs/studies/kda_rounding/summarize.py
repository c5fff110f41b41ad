import json, numpy as np
d = {**json.load(open("abl_a.json")), **json.load(open("abl_b.json"))}
names = ["stress3", "stress0.1", "safe_s5", "bench_sp", "bench_safe"]
steps = ["qd", "so", "kd", "sw", "ab", "u", "x", "mqk", "kr", "prep", "gate", "norm", "acc", "out"]
print("on alone (rest float64): out rel-L2 x1e-4 [state]")
print("step  " + " ".join(f"{n:>16s}" for n in names))
for s in steps:
    print(f"{s:5s} " + " ".join(f"{d[n]['on:'+s][0]*1e4:8.2f} [{d[n]['on:'+s][1]*1e4:5.2f}]" for n in names))
print("off alone (rest as kernel): out x1e-4")
for s in steps:
    print(f"{s:5s} " + " ".join(f"{d[n]['off:'+s][0]*1e4:16.2f}" for n in names))
print("all   " + " ".join(f"{d[n]['all'][0]*1e4:8.2f} [{d[n]['all'][1]*1e4:5.2f}]" for n in names))
print("share of excess variance (all^2 - out^2), from on-alone^2:")
for n in names:
    ex = d[n]["all"][0] ** 2 - d[n]["on:out"][0] ** 2
    tot = sum(d[n]["on:" + s][0] ** 2 for s in steps if s != "out")
    sh = {s: d[n]["on:" + s][0] ** 2 / ex for s in steps if s != "out"}
    print(f"{n:10s} excess(quadrature) {np.sqrt(ex)*1e4:.2f}e-4, sum of on-alone^2 / excess^2 = {tot/ex:.3f}; " +
          ", ".join(f"{s} {100*v:.0f}%" for s, v in sorted(sh.items(), key=lambda t: -t[1])[:6]))
