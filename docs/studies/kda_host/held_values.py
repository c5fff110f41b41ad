"""Does chunk_kda's graph launch skip its parameter copies in `bench kda`'s host row? (issue 14)

Counts LaunchGraph's `cuGraphExecKernelNodeSetParams` calls over repeated calls timed as
`timing.host_us` times them, and prints which of the call's values changed between calls (a
new out or workspace pointer each call would make every launch copy its parameters). Then the
call's host µs with the graph and one by one, alternated. Run from the repository root on the
device: `PYTHONPATH=. python docs/studies/kda_host/held_values.py`.
"""
from pykda.bench import kda as bench, timing
from pykda.ops import kda
from pykda.runtime import launch


def main():
    call = bench.host_call().call
    for _ in range(launch.GRAPH_AFTER_CALLS + 2):
        call()
    prepared = kda.PREPARED.last[1]
    graphs = [g for g in prepared.values.graphs.values() if type(g) is launch.LaunchGraph]
    print(f"graphs of the call: {len(graphs)}")
    graph = graphs[0]
    sets, seen = [0], []
    real_set = graph.driver.set_params

    def counting_set(*a):
        sets[0] += 1
        return real_set(*a)
    graph.driver = graph.driver._replace(set_params=counting_set)
    fmt = prepared.values.layout

    def traced():
        out = call()
        seen.append(fmt.unpack_from(prepared.values.buffer, 0))
        return out
    timing.host_us(traced, n=100)
    changed = sorted({kda.CALL_VALUES[i] if i < len(kda.CALL_VALUES) else f"value {i}"
                      for a, b in zip(seen, seen[1:]) for i, (u, w) in enumerate(zip(a, b)) if u != w})
    print(f"{len(seen)} calls: {sets[0]} parameter sets ({len(graph._steps)} nodes); values that changed "
          f"between calls: {changed or 'none'}")
    for name in ("out", "records"):
        if name in kda.CALL_VALUES:
            i = kda.CALL_VALUES.index(name)
            print(f"  {name}: {len({s[i] for s in seen})} distinct, first six {[hex(s[i]) for s in seen[:6]]}")
    graph.driver = graph.driver._replace(set_params=real_set)
    key = next(k for k, g in prepared.values.graphs.items() if g is graph)
    for _ in range(3):
        prepared.values.graphs[key] = graph
        with_graph = timing.host_us(call)
        prepared.values.graphs[key] = launch.NO_GRAPH
        one_by_one = timing.host_us(call)
        print(f"chunk_kda call: as the graph {with_graph:.2f} µs, one by one {one_by_one:.2f} µs")
    prepared.values.graphs[key] = graph


if __name__ == "__main__":
    main()
