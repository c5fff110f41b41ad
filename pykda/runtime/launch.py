"""Loading cubins through CuPy and launching their kernels with the CUDA driver API.

Kernel parameters are packed into one buffer laid out as the CUDA ABI does (each parameter
at its natural alignment, tensor maps at 64 bytes); cuLaunchKernelEx gets a pointer to each.
Python values map to parameter types by their type: `int` -> 64-bit (pointers), np.int32 -> int, np.int64 -> long long, np.float32 and `float` -> float (rounded to nearest),
`bytes` -> a struct passed by value (128 bytes: a tensor map, 64-byte aligned; others 8-byte
aligned).

A `Launcher` packs all of a launch's arguments at every launch. A prepared call (one op call's
validated plan, made once per argument key) binds its launches once instead (`Launcher.bind`):
their constant arguments are packed then, each into a buffer of its own launch, and the
arguments that change from call to call (pointers, tensor maps: `PerCall`) are read from one
`CallValues` buffer that the call packs once for all its launches.

From a prepared call's ninth call on a stream, a call of two or more launches goes to the
driver as one CUDA graph executable of its launches for that stream (`LaunchGraph`): the kernel
nodes' parameters are set from the same buffers, then one cuGraphLaunch (on the H200's host:
6.4 µs for chunk_kda's two kernels against 12.6 µs for two cuLaunchKernelEx; whole calls 2–3 µs
faster). A stream being captured into the caller's own graph, a driver without graphs, or
PYKDA_GRAPH_LAUNCH=0 take the launches one by one.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import operator
import os
import struct
import threading
from typing import NamedTuple

import numpy as np

_MAX_DYNAMIC_SMEM_ATTR = 8   # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_NUM_REGS_ATTR = 4           # CU_FUNC_ATTRIBUTE_NUM_REGS
_ERROR_INVALID_CONTEXT = 201
_SCALARS = {int: ("Q", 8), np.int64: ("q", 8), np.uint64: ("Q", 8), np.int32: ("i", 4), np.float32: ("f", 4),
            float: ("f", 4)}


@functools.lru_cache(maxsize=None)
def _driver():
    """cuLaunchKernelEx without a prototype (its four arguments are ctypes objects made once,
    so nothing is converted per call) and cuGetErrorName."""
    lib = ctypes.CDLL("libcuda.so.1")
    launch = lib.cuLaunchKernelEx
    launch.restype = ctypes.c_int
    name = lib.cuGetErrorName
    name.restype = ctypes.c_int
    name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return launch, name


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig: grid, block, dynamic shared memory and stream of a launch (no attributes)."""
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("num_attrs", ctypes.c_uint)]

    @functools.cached_property
    def ref(self):
        """The config by reference, as cuLaunchKernelEx takes it (made once)."""
        return ctypes.byref(self)


def _error_name(code: int) -> str:
    s = ctypes.c_char_p()
    _driver()[1](code, ctypes.byref(s))
    return s.value.decode() if s.value else str(code)


def signature(args: tuple) -> tuple:
    """What a parameter buffer's layout depends on: each argument's type, and for a struct
    (`bytes`) its byte length."""
    return tuple(len(a) if type(a) is bytes else type(a) for a in args)


def layout_of(sig: tuple) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packed parameter buffer for a signature (types; byte lengths for structs) and each
    parameter's offset in it."""
    fmt, offset, offsets = "<", 0, []
    for t in sig:
        if type(t) is int:   # a struct of t bytes
            code, size = f"{t}s", t
            align = 64 if size == 128 else 8
        elif t in _SCALARS:
            code, size = _SCALARS[t]
            align = size
        else:
            raise TypeError(f"unsupported kernel argument type {t.__name__}")
        pad = -offset % align
        fmt += "x" * pad + code
        offsets.append(offset + pad)
        offset += pad + size
    return struct.Struct(fmt), tuple(offsets)


def param_layout(args: tuple) -> tuple[struct.Struct, tuple[int, ...]]:
    """The packed parameter buffer for `args` (laid out by their types and, for structs,
    byte lengths) and each parameter's offset in it."""
    return layout_of(signature(args))


class Launcher:
    """Launches of one kernel with arguments of one signature: the parameter buffer and the
    pointer array into it are made once and reused (the driver copies the parameters during
    the launch), as are the launch configurations of each geometry. Arguments of another
    signature would be packed wrongly: a caller keeps one Launcher per call site, whose argument
    types never change."""
    __slots__ = ("kernel", "sig", "structs", "layout", "offsets", "buffer", "pointers", "_configs")

    def __init__(self, kernel: "Kernel", sig: tuple):
        self.kernel, self.sig = kernel, sig
        self.structs = tuple((i, n) for i, n in enumerate(sig) if type(n) is int)   # (position, bytes)
        self.layout, self.offsets = layout_of(sig)
        self.buffer = ctypes.create_string_buffer(self.layout.size)
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * len(sig))(*[base + o for o in self.offsets])
        self._configs: dict[tuple, LaunchConfig] = {}

    def config(self, grid: tuple, block: tuple, smem: int) -> LaunchConfig:
        """The launch configuration of a geometry (tuples of three ints; bytes of dynamic shared
        memory), checked and made once. The kernel's shared-memory limit is raised to `smem`."""
        key = (grid, block, smem)
        found = self._configs.get(key)
        if found is None:
            dims = tuple(map(operator.index, tuple(grid) + tuple(block)))
            if len(dims) != 6 or not all(0 < d < 2 ** 31 for d in dims) or not 0 <= smem < 2 ** 31:
                raise ValueError(f"{self.kernel.name}: grid and block must be three ints in 1..2^31-1 and the "
                                 f"shared memory a byte count; got grid {grid}, block {block}, smem {smem}")
            self.kernel.reserve_smem(smem)
            found = LaunchConfig(*dims, smem, None, None, 0)
            if len(self._configs) >= 256:
                self._configs.clear()
            self._configs[key] = found
        return found

    def __call__(self, config: LaunchConfig, args: tuple, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream` (no host synchronisation)."""
        with self.kernel._lock:   # the buffer and the config's stream are shared
            self.layout.pack_into(self.buffer, 0, *args)
            config.stream = stream
            status = _driver()[0](config.ref, self.kernel._handle, self.pointers, None)
            if status:
                _retry_or_raise(status, self.kernel, config, self.pointers)

    def bind(self, config: LaunchConfig, args: tuple, values: "CallValues") -> "BoundLaunch":
        """A launch of this kernel in `config` (its own copy) whose arguments are `args`: the
        constants among them packed here once, each `PerCall(i)` read from `values` at launch."""
        return BoundLaunch(self, config, args, values)


class PerCall(NamedTuple):
    """A kernel argument that a prepared call gives anew on every call: its value `index` of the
    call's `CallValues`."""
    index: int


class CallValues:
    """The arguments a prepared call's launches take anew on every call (pointers, tensor maps),
    in one buffer packed by one `struct` call, which each `BoundLaunch` of the call reads in place.
    `launch` holds the lock from the packing to the last launch: the buffer and the launches'
    stream are the call's, whichever thread makes it."""
    __slots__ = ("sig", "layout", "buffer", "address", "lock", "graphs")

    def __init__(self, sig: tuple):
        self.sig = sig
        self.layout, offsets = layout_of(sig)
        self.buffer = ctypes.create_string_buffer(max(self.layout.size, 1))
        base = ctypes.addressof(self.buffer)
        self.address = tuple(base + o for o in offsets)   # of each value
        self.lock = threading.Lock()
        self.graphs: dict[tuple, object] = {}   # (stream, launches) -> calls so far (int), then their LaunchGraph

    def launch(self, values: tuple, launches: tuple, stream: int) -> None:
        """Pack `values` (of this signature), then make `launches` (BoundLaunches reading them) in
        order, asynchronously on the stream handle `stream`: two or more, after GRAPH_AFTER_CALLS
        calls on this stream, as their LaunchGraph; else (and wherever the graph declines) one by one.
        (One launch gains nothing as a graph: 17.5 µs per fused_recurrent_kda call either way.)"""
        with self.lock:
            self.layout.pack_into(self.buffer, 0, *values)
            if len(launches) > 1:
                key = (stream, launches)
                graph = self.graphs.get(key, 0)
                if type(graph) is not LaunchGraph and graph != NO_GRAPH and (graph or len(self.graphs) < GRAPH_STREAMS):
                    graph = self.graphs[key] = (graph + 1 if graph < GRAPH_AFTER_CALLS
                                                else LaunchGraph.make(launches, stream))
                if type(graph) is LaunchGraph and graph(stream):
                    return
            for bound in launches:
                bound(stream)


class BoundLaunch:
    """A kernel, a launch configuration of its own and its arguments: the constants packed once
    into a buffer of the launch's, each `PerCall` one pointing into the call's CallValues (made
    by `Launcher.bind`; launched by `CallValues.launch`)."""
    __slots__ = ("kernel", "config", "buffer", "pointers", "values")

    def __init__(self, launcher: Launcher, config: LaunchConfig, args: tuple, values: CallValues):
        self.kernel, self.values = launcher.kernel, values
        self.config = LaunchConfig.from_buffer_copy(config)
        sig = launcher.sig
        if len(args) != len(sig):
            raise TypeError(f"{self.kernel.name}: {len(args)} arguments for a kernel of {len(sig)}")
        for i, (a, want) in enumerate(zip(args, sig)):
            got = values.sig[a.index] if type(a) is PerCall else signature((a,))[0]
            if got != want:
                raise TypeError(f"{self.kernel.name}: argument {i} is {got}, the kernel takes {want}")
        self.buffer = ctypes.create_string_buffer(launcher.layout.size)   # per-call slots left zero
        launcher.layout.pack_into(self.buffer, 0, *((bytes(n) if type(n) is int else 0) if type(a) is PerCall else a
                                                    for a, n in zip(args, sig)))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * len(sig))(*[values.address[a.index] if type(a) is PerCall else base + o
                                                       for a, o in zip(args, launcher.offsets)])

    def __call__(self, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream`, the call's values packed (the
        caller holds their lock: `CallValues.launch`)."""
        config = self.config
        config.stream = stream
        status = _driver()[0](config.ref, self.kernel._handle, self.pointers, None)
        if status:
            _retry_or_raise(status, self.kernel, config, self.pointers)


GRAPH_AFTER_CALLS = 8   # plain launches before a (stream, launches) gets its graph: making one (~tens of
                        # µs) pays off only over many calls (2-4 µs each), and shapes seen a few times make none
NO_GRAPH = -1           # a (stream, launches) whose graph the driver would not make: one by one for good
GRAPH_STREAMS = 8       # graphs of one call's CallValues at most (more streams launch one by one)


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS (the unversioned driver entry points' layout)."""
    _fields_ = [("func", ctypes.c_void_p), ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint),
                ("grid_z", ctypes.c_uint), ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint),
                ("block_z", ctypes.c_uint), ("smem", ctypes.c_uint), ("params", ctypes.c_void_p),
                ("extra", ctypes.c_void_p)]


class _GraphDriver(NamedTuple):
    """The driver's graph entry points, prototyped (64-bit handles)."""
    create: object
    add_kernel_node: object
    instantiate: object
    set_params: object
    launch: object
    is_capturing: object
    exchange_capture_mode: object
    destroy_exec: object
    destroy: object


@functools.lru_cache(maxsize=None)
def _graph_driver() -> _GraphDriver | None:
    """The graph entry points of libcuda, or None (no driver, one without them, or
    PYKDA_GRAPH_LAUNCH=0): launches then go one by one."""
    if os.environ.get("PYKDA_GRAPH_LAUNCH", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        names = ("cuGraphCreate", "cuGraphAddKernelNode", "cuGraphInstantiateWithFlags",
                 "cuGraphExecKernelNodeSetParams", "cuGraphLaunch", "cuStreamIsCapturing",
                 "cuThreadExchangeStreamCaptureMode", "cuGraphExecDestroy", "cuGraphDestroy")
        fns = [getattr(lib, n) for n in names]
    except (OSError, AttributeError):
        return None
    p, u, ull, ptr = ctypes.c_void_p, ctypes.c_uint, ctypes.c_ulonglong, ctypes.POINTER
    protos = ([ptr(p), u], [ptr(p), p, p, ctypes.c_size_t, p], [ptr(p), p, ull], [p, p, p], [p, p],
              [p, ptr(ctypes.c_int)], [ptr(ctypes.c_int)], [p], [p])
    for f, args in zip(fns, protos):
        f.argtypes, f.restype = args, ctypes.c_int
    return _GraphDriver(*fns)


_CAPTURE_MODE_RELAXED = 2   # CU_STREAM_CAPTURE_MODE_RELAXED


@contextlib.contextmanager
def _relaxed_capture_mode(driver: _GraphDriver):
    """This thread in relaxed capture mode for the block (yields whether the driver switched it),
    then as it was: graph calls made there do not break a capture in global mode elsewhere
    (torch's default)."""
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    relaxed = driver.exchange_capture_mode(ctypes.byref(mode)) == 0
    try:
        yield relaxed
    finally:
        if relaxed:
            driver.exchange_capture_mode(ctypes.byref(mode))


def _capturing(driver: _GraphDriver, stream: int, status: ctypes.c_int | None = None) -> bool:
    """The stream handle `stream` is being captured into a graph (or its state is unknown);
    `status`: a c_int of the caller's to read it into (one call at a time)."""
    status = ctypes.c_int() if status is None else status
    return bool(driver.is_capturing(stream, ctypes.byref(status)) or status.value)


class LaunchGraph:
    """A call's launches (BoundLaunches, in order) as one CUDA graph executable, for one stream:
    a chain of kernel nodes whose parameters are set from the launches' own pointer arrays (the
    call's values just packed) at every call whose values differ from those the nodes hold, then
    one launch of the whole. Changing the parameters leaves launches already enqueued as they
    were (the driver's contract)."""
    __slots__ = ("driver", "graph", "exec", "_steps", "_status", "_values", "_held")

    @classmethod
    def make(cls, launches: tuple, stream: int) -> "LaunchGraph | int":
        """The graph of `launches` for the stream handle `stream`; NO_GRAPH where the driver has
        no graphs or makes none; GRAPH_AFTER_CALLS (ask again next call) while `stream` is being
        captured. It is made in this thread's relaxed capture mode."""
        driver = _graph_driver()
        if driver is None:
            return NO_GRAPH
        if _capturing(driver, stream):
            return GRAPH_AFTER_CALLS
        with _relaxed_capture_mode(driver) as relaxed:
            if not relaxed:
                return NO_GRAPH
            try:
                return cls(driver, launches)
            except (RuntimeError, ctypes.ArgumentError):
                return NO_GRAPH

    def __init__(self, driver: _GraphDriver, launches: tuple):
        import cupy
        self.driver, self.graph, self.exec, self._status = driver, ctypes.c_void_p(), None, ctypes.c_int()
        self._values, self._held = launches[0].values.buffer, None   # the call's values; those the nodes hold
        nodes, params_of = [], []
        with cupy.cuda.Device(launches[0].kernel.device):
            self._check(driver.create(ctypes.byref(self.graph), 0), "cuGraphCreate")
            for bound in launches:
                c = bound.config
                params = _KernelNodeParams(bound.kernel.handle, c.grid_x, c.grid_y, c.grid_z, c.block_x, c.block_y,
                                           c.block_z, c.smem, ctypes.cast(bound.pointers, ctypes.c_void_p), None)
                node = ctypes.c_void_p()
                deps = ctypes.byref(nodes[-1]) if nodes else None
                self._check(driver.add_kernel_node(ctypes.byref(node), self.graph, deps, min(len(nodes), 1),
                                                   ctypes.byref(params)), "cuGraphAddKernelNode")
                nodes.append(node)
                params_of.append(params)
            exe = ctypes.c_void_p()
            self._check(driver.instantiate(ctypes.byref(exe), self.graph, 0), "cuGraphInstantiateWithFlags")
            self.exec = exe
        self._steps = tuple(zip(nodes, map(ctypes.byref, params_of)))   # (node, its parameters), in order

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"{what} failed: {_error_name(status)}")

    def __call__(self, stream: int) -> bool:
        """Launch on the stream handle `stream`, the call's values packed (the caller holds their
        lock). False, with nothing launched, where the stream is being captured (the caller's
        capture records plain kernel launches) or the driver refuses."""
        d, exe = self.driver, self.exec
        if _capturing(d, stream, self._status):   # (the caller's lock makes the status buffer this call's)
            return False
        values = self._values.raw
        if values != self._held:   # (a call on the same arrays as the last skips the driver's copies)
            self._held = None
            for node, params in self._steps:
                if d.set_params(exe, node, params):
                    return False
            self._held = values
        return d.launch(exe, stream) == 0

    def __del__(self):
        with _relaxed_capture_mode(self.driver):   # as when made
            if self.exec is not None:
                self.driver.destroy_exec(self.exec)
            if self.graph:
                self.driver.destroy(self.graph)


def _retry_or_raise(status: int, kernel: "Kernel", config: LaunchConfig, pointers) -> None:
    """After cuLaunchKernelEx of `kernel` in `config` (parameters at `pointers`) returned
    `status` != 0: in a thread without a current context, launch again within the device's; a
    failure raises RuntimeError naming the kernel and its geometry."""
    if status == _ERROR_INVALID_CONTEXT:
        import cupy
        with cupy.cuda.Device(kernel.device):
            status = _driver()[0](config.ref, kernel._handle, pointers, None)
    if status != 0:
        raise RuntimeError(f"cuLaunchKernelEx({kernel.name}) failed: {_error_name(status)} (grid "
                           f"{(config.grid_x, config.grid_y, config.grid_z)}, block "
                           f"{(config.block_x, config.block_y, config.block_z)}, {config.smem} bytes of "
                           f"shared memory)")


class Kernel:
    """One `extern "C"` kernel of a loaded module."""
    __slots__ = ("name", "function", "handle", "device", "_smem_limit", "_lock", "_launchers", "_handle")

    def __init__(self, function, name: str, device: int):
        self.function, self.name, self.device = function, name, device
        self.handle = function.ptr
        self._handle = ctypes.c_void_p(self.handle)   # as the driver call takes it
        self._smem_limit = 48 * 1024
        self._lock = threading.Lock()
        self._launchers: dict[tuple, Launcher] = {}   # by signature, and by the argument types alone

    @property
    def num_regs(self) -> int:
        from cupy.cuda import driver
        return driver.funcGetAttribute(_NUM_REGS_ATTR, self.handle)

    def reserve_smem(self, smem: int) -> None:
        """Let launches use `smem` bytes of dynamic shared memory (raises the kernel's limit)."""
        with self._lock:
            if smem > self._smem_limit:
                from cupy.cuda import driver
                driver.funcSetAttribute(self.handle, _MAX_DYNAMIC_SMEM_ATTR, smem)
                self._smem_limit = smem

    def launcher(self, args: tuple) -> Launcher:
        """The Launcher for arguments like `args` (looked up by their types alone; struct
        lengths are checked against the one found)."""
        types = tuple(map(type, args))
        found = self._launchers.get(types)
        if found is not None:
            for i, n in found.structs:
                if len(args[i]) != n:
                    break
            else:
                return found
        found = self._launchers[types] = self.launcher_for(signature(args))
        return found

    def launcher_for(self, sig: tuple) -> Launcher:
        """The Launcher for arguments of signature `sig` (see `signature`), made on first use."""
        found = self._launchers.get(sig)
        if found is None:
            found = self._launchers[sig] = Launcher(self, sig)
        return found

    def launch(self, grid: tuple, block: tuple, args: tuple, smem: int, stream: int) -> None:
        """Asynchronous launch on the stream handle `stream` (no host synchronisation)."""
        launcher = self.launcher(args)
        launcher(launcher.config(grid, block, smem), args, stream)


class LoadedModule:
    __slots__ = ("module", "device", "_kernels")

    def __init__(self, module, device: int):
        self.module, self.device, self._kernels = module, device, {}

    def kernel(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = Kernel(self.module.get_function(name), name, self.device)
        return k


def load_module(cubin: bytes, device: int) -> LoadedModule:
    import cupy
    from cupy.cuda import function
    with cupy.cuda.Device(device):
        module = function.Module()
        module.load(cubin)
    return LoadedModule(module, device)
