"""The ops' bound launches: a kernel of a prepared call in its launch configuration, its constant
arguments packed once and the others (`runtime.PerCall`) read from the call's `runtime.CallValues`."""
from __future__ import annotations

from .. import runtime


def bound_launch(spec: runtime.KernelSpec, device: int, values: runtime.CallValues, name: str, sig: tuple,
                 args: tuple, grid: tuple, threads: int, smem: int) -> runtime.BoundLaunch:
    """Kernel `name` of `spec` (compiled on first use) in its configuration (`threads` per CTA,
    `smem` bytes of dynamic shared memory), bound to `args` of signature `sig` (PerCall entries
    read from `values`)."""
    launcher = runtime.get_kernel(spec, device, name).launcher_for(sig)
    return launcher.bind(launcher.config(grid, (threads, 1, 1), smem), args, values)
