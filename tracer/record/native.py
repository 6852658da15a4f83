"""The native recorder: the graph walk, the node hooks and their summaries in C++ (`csrc/`).

NOTE [Native recorder]
    A Python node hook costs a few microseconds a node before it does anything (torch wraps every
    gradient for it, calls it, and the hook's own bookkeeping allocates), and on a graph of small ops,
    an LSTMCell unrolled over time, that is most of the step. So where it can, a traced step is
    recorded in C++: the walk reads the graph (names, kinds, creation numbers, edges, the metadata of
    each node's outputs) into flat arrays, and one C++ hook per node (a pre-hook on AccumulateGrad, a
    post-hook elsewhere, NOTE [One hook per node]) summarises what arrives and what is sent with the
    summary kernel (`_fastsum.c`) into an arena of doubles, and appends a run record. Everything the
    Python recorder does per node in a hook is done there, with the same rules: NOTE [Dedupe] (a
    gradient handed from a single sender to its child is summarised once), NOTE [Views share a buffer],
    the module sums (tracer/record/module_sums.py), what arrived at each parameter (for `st.params`).
    What an optimizer stepped with in a traced step is summarised there too, all of it in one call
    (`NativeStep.summarise`, from the monitor's optimizer post-hook).
    After the backward, Python reads the records once (`records`, and `tables`: the runs ordered by node
    and each summary's raw statistics, sorted and gathered in C++, where numpy's set-up on a small step's
    arrays cost more than the work) and the step's `NodeTrace`s are made from them only when someone
    reads one (tracer/record/tables.py). The graph's structure hash (`structure`) is read from the extension
    too, and a backward call's start (the walk, the hooks, the new nodes' parameters, the call's structure for its
    key) and end (what arrived at each parameter, and whether `.grad` is still it) are one extension call each
    (NOTE [A backward call's ends in one call] in csrc/backward_call.h).

    What the kernel cannot summarise (another device, a sparse or strided layout other than a matrix's
    transpose, a dtype other than float32/bfloat16/float16/float64, a float32 sum that overflowed) is
    handed to the Python summariser from the hook, which takes the GIL for it, as a Python hook would.

    The Python recorder (tracer/record/node_hooks.py) is used instead when the extension is not built
    for the torch that is imported (`gradscape build-recorder` builds it: tracer/record/native_build.py;
    `gradscape doctor` says whether it is in use, and why not), with `tensors="full"`, when a breakpoint
    is set (the debugger pauses inside a Python hook), with GRADSCAPE_NATIVE=0, and when asked for
    (`Tracer(recorder="python")`); `st.meta["recorder"]` says which recorded a step, and why not the
    native one ("python (why)").

NOTE [Cold steps]
    Inside a traced step, small Python and numpy work costs 3-5 times what it costs timed alone: the
    user's forward and backward, and the step's own recording, evict the interpreter's and numpy's code
    and data from the caches (measured on a 2-core machine: `TensorTable(...)` 3 µs alone, 18 µs at a
    step's end; a numpy call on a few elements 0.5-1 µs alone, 2-3 µs there; the first forward after a
    traced step 63 µs against 30 µs for a second one; the monitor's same code 0.15 ms a step after an
    MLP's step, about 0.5 ms after a LeNet's). A numpy reduction is the worst of it: one `max` over the
    step's name codes cost the MLP's traced step about 25 µs (4.17x to 3.97x when the extension's count
    of names replaced it); an `any` over the summaries' NaN/Inf counts and a per-plan sum of thumbnail
    cells, about as much together (4.40x to 4.17x when `tables()` and the arena's size answered them).
    What makes a small step's fixed cost is how much code and memory it touches, so a step's bookkeeping
    belongs in the extension (one call that does a dozen numpy calls' work) or in plain bytes
    operations, and a microbenchmark of a piece is not its cost.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
from collections import deque
from functools import lru_cache
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gradscape.tracer.record import native_build
from gradscape.tracer.record.labels import RELU_LIKE, VIEW_NODES
from gradscape.tracer.record.model_index import ModelIndex
from gradscape.tracer.summary.budget import past_budget_raw
from gradscape.tracer.summary.fastpath import kernel_plan
from gradscape.tracer.summary.kernel import native
from gradscape.tracer.summary.stats import dtype_name
from gradscape.tracer.summary.summariser import Summariser

if TYPE_CHECKING:
    from gradscape.tracer.record.structure import StructureCache

KINDS = ("op", "acc", "compiled", "checkpoint", "hook", "custom")  # the extension's kind codes
_KIND_BYTE = {k: bytes((i,)) for i, k in enumerate(KINDS)}  # each code as one int8 byte (`has_kinds`)
_KIND_ACC = 1


@lru_cache(maxsize=1)
def _loaded() -> tuple[Any, str]:
    """(the extension, set up, or None; why not)."""
    if os.environ.get("GRADSCAPE_NATIVE", "1") == "0":
        return None, "GRADSCAPE_NATIVE=0"
    path = native_build.target()
    if not path.exists():
        note = native_build.failed(path)
        if note.exists():
            return None, (f"the build failed ({note.read_text().strip()}); `gradscape build-recorder --force` "
                          f"tries again and prints the compiler's words")
        return None, (f"not built for torch {torch.__version__} and these sources (`gradscape build-recorder` "
                      f"builds it, into {path.parent})")
    try:
        ext = _import(path)
    except ImportError as exc:
        return None, f"{path} does not load ({exc}); `gradscape build-recorder --force` builds it again"
    if torch.__version__ != ext.TORCH_VERSION:
        return None, (f"the native recorder was built for torch {ext.TORCH_VERSION}, and torch "
                      f"{torch.__version__} is imported (`gradscape build-recorder --force` builds it again)")
    lib = native()
    if lib is None:
        return None, "the summary kernel is not available"
    names = ("gs_summarise_f32", "gs_summarise_bf16", "gs_summarise_f16", "gs_summarise_f64", "gs_summarise_strided")
    # (a kernel built before gs_summarise_strided has none: the extension then copies strided tensors)
    addresses = tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value if hasattr(lib, n) else 0 for n in names)
    ext.setup(kernel_plan, addresses, sorted(VIEW_NODES))
    return ext, ""


def _import(path: Any) -> Any:
    spec = importlib.util.spec_from_file_location("gradscape.tracer.record._recorder", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not an extension module: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def path() -> Any:
    """The built extension's file, when it is in use."""
    return native_build.target() if _loaded()[0] is not None else None


def extension() -> Any:
    """The extension, set up, or None where it is not in use (`status` says why)."""
    return _loaded()[0]


def status() -> tuple[bool, str]:
    """(the native recorder can be used, why not). A Tracer uses it when it can, unless told
    `Tracer(recorder="python")` (tests compare the two recorders; bench/pernode.py measures both)."""
    mod, why = _loaded()
    return mod is not None, why


@lru_cache(maxsize=1)
def relu_codes() -> tuple[int, ...]:
    """The extension's name codes of the ReLU-like nodes (`labels.RELU_LIKE`): a name has one code for the process."""
    mod = _loaded()[0]
    return tuple(sorted(int(mod.code(name)) for name in RELU_LIKE))


@lru_cache(maxsize=1)
def dtype_names() -> dict[int, str]:
    """The extension's dtype codes (torch's scalar types) → gradscape's dtype names."""
    mod = _loaded()[0]
    out: dict[int, str] = {}
    for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
              torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool):
        out[mod.scalar_code(torch.empty(0, dtype=d))] = dtype_name(d)
    return out


_EMPTY: dict[Any, np.ndarray] = {t: np.zeros(0, t) for t in (np.int8, np.int32, np.int64, np.uint64)}
_NO_OFFSETS = np.zeros(1, np.int64)
for _a in (*_EMPTY.values(), _NO_OFFSETS):
    _a.flags.writeable = False


# the walk's arrays, read from the extension when asked for (NOTE [Graph read when asked]), in the order `graph`
# gives their buffers: each one's dtype in the buffer, and whether it is widened to int64
_ARRAYS: dict[str, tuple[Any, bool]] = {
    "name": (np.int32, False), "kind": (np.int8, False), "seq": (np.uint64, False), "child_off": (np.int32, True),
    "child_id": (np.int32, False), "child_nr": (np.int32, False), "out_off": (np.int32, True),
    "out_ndim": (np.int32, False), "out_dtype": (np.int8, False), "out_dims": (np.int64, False)}
_ORDER = tuple(_ARRAYS)
_STRUCTURE = ("name", "kind", "child_off", "child_id", "child_nr")  # what `NativeGraph.digest` hashes


def arrays_of(which: tuple[str, ...], bufs: tuple[bytes, ...]) -> tuple[np.ndarray, ...]:
    """The walk's arrays `which` made of their buffers (`NativeGraph.buffers`)."""
    return tuple(map(_array, which, bufs))


def _array(name: str, buf: bytes) -> np.ndarray:
    dtype, wide = _ARRAYS[name]
    value = np.frombuffer(buf, dtype)
    return value.astype(np.int64) if wide else value


class NativeGraph:
    """The graph of one traced step as the extension walked it, in flat arrays (ids are positions), and
    the extension's recorder, which holds the nodes and their hooks for the step."""

    def __init__(self, model: ModelIndex, summariser: Summariser, thumb: int) -> None:
        mod = _loaded()[0]
        self.rec = mod.Recorder()
        self.rec.configure(summariser.fallback, thumb, -1 if summariser.budget is None else summariser.budget,
                           past_budget_raw)  # NOTE [Budget while recording] in csrc/budget.h
        self.model = model
        self.size = 0
        # (read-only until the first walk: shared empty arrays, made once)
        self.name = _EMPTY[np.int32]  # name code per node (`names()`)
        self.kind = _EMPTY[np.int8]  # KINDS code
        self.seq = _EMPTY[np.uint64]  # creation number
        self.child_off = _NO_OFFSETS  # CSR of each node's slots: child id (-1: None), input_nr
        self.child_id = _EMPTY[np.int32]
        self.child_nr = _EMPTY[np.int32]
        self.out_off = _NO_OFFSETS  # CSR of each node's forward outputs: rank (-1: no shape), dtype
        self.out_ndim = _EMPTY[np.int32]
        self.out_dtype = _EMPTY[np.int8]
        self.out_dims = _EMPTY[np.int64]
        self.params: dict[int, str] = {}  # AccumulateGrad node → its parameter's name
        self.last_param = -1  # the greatest node id in `params`
        self._codes = b""  # every node's KINDS code, one byte each, as the last walk left them
        self.structure = b""  # what the last backward call's key is made of (`start_call`)
        self.leaves: dict[int, tuple[int, ...]] = {}  # AccumulateGrad node of another leaf → the leaf's shape
        self.acc_shapes: dict[int, tuple[int, ...]] = {}  # every AccumulateGrad node → its leaf's shape
        self._arrays_read = True  # arrays are in `__dict__` (the empty ones above, or read since the last walk)
        self._bufs: dict[str, bytes] | None = None  # the buffers of the arrays, as `graph` gave them after a walk
        self._senders: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # `senders_of`
        self._digest: bytes | None = None  # `digest`
        self._sum_index: dict[tuple[int, int], int] = {}  # module sum key → the extension's index

    # ---- the walk
    def start_call(self, roots: list[tuple[Any, int]], seq0: int) -> list[int]:
        """A backward call starts from `roots` ((grad_fn, output nr) each): walk the graph from each, hook the
        nodes it adds (they get the next ids) and name their parameters, in one extension call (NOTE [A backward
        call's ends in one call] in csrc/backward_call.h). Returns the roots' ids; `structure` is then what the
        call's key is made of: its nodes' structure, their creation numbers counted from `seq0` (the creation counter
        as the step began), and the parameters and leaves among them."""
        model = self.model
        ids, self._codes, last, self.structure = self.rec.start_call(
            [node for node, _ in roots], seq0, (model.by_id, model.unsharded_names, self.acc_shapes, self.params,
                                                self.leaves))
        self.size = len(self._codes)
        if last >= 0:
            self.last_param = last
        if self._arrays_read:  # read again when next asked for (`__getattr__`): NOTE [Graph read when asked]
            self._arrays_read = False
            deque(map(self.__dict__.pop, _ARRAYS, repeat(None)), maxlen=0)  # (C-level passes)
        self._bufs = None
        self._senders = None
        self._digest = None
        return ids  # type: ignore[no-any-return]

    def __getattr__(self, attr: str) -> Any:
        """NOTE [Graph read when asked]: a walk's array, the first time it is asked for after a walk. The whole
        graph walked so far is read again, each array one buffer the extension made, with no concatenation in
        Python (ten of them cost a later pass ~30 µs; the bytes copied are the same), and only the arrays asked
        for are made of them. Most backward calls of a carried step read none of them before the step's end:
        reading them at each call cost a GPT's call 20-55 µs (more as the graph grows, 40 micro-batches a step)."""
        if attr not in _ARRAYS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        self._arrays_read = True
        value = self.__dict__[attr] = _array(attr, self.buffers((attr,))[0])
        return value

    def buffers(self, which: tuple[str, ...]) -> tuple[bytes, ...]:
        """The extension's buffers of the arrays `which` (as `graph` gave them after the last walk), not made into
        arrays: for columns read later, if at all (`arrays_of`, when they are)."""
        if self._bufs is None:
            self._bufs = dict(zip(_ORDER, self.rec.graph(0)))
        return tuple(map(self._bufs.__getitem__, which))

    def share_structure(self, cache: StructureCache) -> None:
        """The arrays the structure alone makes (names, kinds, edges: what `digest` hashes) taken from an earlier
        step of the same structure (`cache`), read-only and shared, not read from the extension again; kept there
        on a first structure. Call after the step's last walk."""
        key = ("arrays", self.digest())
        arrays = cache.get(key)
        if arrays is None:
            arrays = tuple(getattr(self, a) for a in _STRUCTURE)
            for a in arrays:
                a.flags.writeable = False
            cache.put(key, arrays)
        self.__dict__.update(zip(_STRUCTURE, arrays))
        self._arrays_read = True

    def digest(self) -> bytes:
        """A hash of the graph's structure as walked so far: every node's name, kind and edges."""
        if self._digest is None:
            self._digest = hashlib.blake2b(self.rec.structure(), digest_size=16).digest()
        return self._digest

    # ---- what the rest of the recorder asks of the graph (the Python walk answers the same)
    def id_of(self, node: Any) -> int | None:
        i = int(self.rec.id_of(node))
        return None if i < 0 else i

    def node(self, nid: int) -> Any:
        """The graph node (grad_fn) of id `nid`, while the step runs."""
        return self.rec.node(nid)

    def seq_of(self, nid: int) -> int:
        return int(self.seq[nid])

    def kind_of(self, nid: int) -> str:
        k = int(self.kind[nid])
        if k == _KIND_ACC:
            return "param" if nid in self.params else "leaf"
        return KINDS[k]

    def children(self, nid: int) -> list[tuple[int, int] | None]:
        a, b = int(self.child_off[nid]), int(self.child_off[nid + 1])
        return [None if c < 0 else (int(c), int(nr)) for c, nr in zip(self.child_id[a:b], self.child_nr[a:b])]

    def senders_of(self, child: int, nr: int) -> list[tuple[int, int]]:
        """The (node, slot) pairs that send to input `nr` of node `child`."""
        if self._senders is None:  # every edge, sorted by (child, input_nr), and its sender's (node, slot)
            src = np.repeat(np.arange(self.size, dtype=np.int64), np.diff(self.child_off))
            slot = np.arange(len(self.child_id), dtype=np.int64) - self.child_off[src]
            key = (self.child_id.astype(np.int64) << 32) | self.child_nr.astype(np.int64)
            order = np.argsort(key, kind="stable")
            self._senders = (key[order], src[order], slot[order])
        keys, srcs, slots = self._senders
        want = (child << 32) | nr
        a = int(np.searchsorted(keys, want, "left"))
        b = int(np.searchsorted(keys, want, "right"))
        return list(zip(srcs[a:b].tolist(), slots[a:b].tolist()))

    def set_sum(self, nid: int, slot: int, key: tuple[int, int]) -> None:
        """That slot's gradients are added up, in the hook, into module sum `key` (`sums`)."""
        index = self._sum_index.get(key)
        if index is None:
            index = self._sum_index[key] = len(self._sum_index)
        self.rec.set_sum(nid, slot, index)

    def sums(self) -> dict[tuple[int, int], torch.Tensor]:
        """The module sums the hooks added up, by key."""
        tensors = self.rec.sums()
        return {key: tensors[i] for key, i in self._sum_index.items() if i < len(tensors) and tensors[i] is not None}

    def has_kinds(self, *kinds: str) -> bool:
        # a byte search (memchr) in the int8 codes: a numpy comparison and `any` per kind cost ~15 µs inside a
        # small step (NOTE [Cold steps]), this ~4
        codes = self._codes  # (the arrays are not read for this: NOTE [Graph read when asked])
        return any(map(codes.__contains__, map(_KIND_BYTE.__getitem__, kinds)))  # (C-level passes: no generator)

    def new_since(self, first: int) -> tuple[int, bool]:
        """Of the nodes from `first` on: how many are not AccumulateGrad, and whether a parameter's is among them
        (NOTE [Repeated calls' thumbnails] in call_thumbs.py)."""
        codes = self._codes
        return len(codes) - first - codes.count(_KIND_BYTE["acc"], first), self.last_param >= first

    def release(self) -> None:
        self.rec.release()


_names: list[str] = []  # `names()` as last read


def names(codes: np.ndarray | None = None) -> list[str]:
    """Every node name the extension has seen, by code (`codes`: the codes the caller will look up; None reads
    the list again). The extension only adds names: while it has no name the list last read lacks, that list
    is returned (shared: read it, do not mutate it)."""
    global _names
    mod = _loaded()[0]
    if mod is None:
        _names = []
    elif codes is None or mod.name_count() != len(_names):  # (a count, not `codes.max()`: NOTE [Cold steps])
        _names = list(mod.names())
    return _names
