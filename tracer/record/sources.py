"""Where user code is: the source line a node is attributed to (NOTE [Source lines] in
tracer/record/forward.py) is that of the first frame outside torch and gradscape, a library leaf
module (NOTE [Library leaves]) is one whose forward is torch's own code, and the module whose
`forward` an op ran in is read from the frames too (NOTE [Direct forward calls]).

NOTE [Direct forward calls]
    Module hooks fire only through `Module.__call__`; code that calls `layer.forward(x)` itself
    (layer-local training, wrappers that bypass `__call__`) opens no hook window
    (NOTE [Attribution by sequence window]). The function mode already walks out from each op it
    sees to the user's line; on the way it also looks for the innermost frame that runs the
    `forward` of a module of the model: the frame's code is one of the model's classes' `forward`
    (or what it wraps, `__wrapped__`), and its first argument is a module of the model. The walk
    stops at a `Module._call_impl` frame of a module of the model: inside a call through
    `__call__`, the hooks' window is at least as precise. An op so placed belongs to that module,
    whichever way its forward was called; the others keep their window. The first argument is
    read from the frame's locals once per frame (the last frame is remembered), so an op pays one
    dictionary look-up per frame walked. Ops the mode does not see (inside a library leaf called
    through `__call__`, where the mode steps aside) get the leaf's window, as before.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gradscape.tracer import _compat

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the tracer package, every room
_SKIP_PREFIXES = (_TORCH_DIR, _OUR_DIR)

# file name → its basename if it is the user's code, else None. Keyed by the file name, not the code
# object: code objects compare equal across files when their contents do.
_is_user_code: dict[str, str | None] = {}
_MAX_CACHED = 4096  # entries per cache here; past that it starts over (files and classes made on the fly)


def _user_base(fn: str) -> str | None:
    """The basename of file `fn` if it is the user's code, else None; cached in `_is_user_code`."""
    user = not fn.startswith(_SKIP_PREFIXES) and not fn.startswith("<frozen")
    if len(_is_user_code) >= _MAX_CACHED:
        _is_user_code.clear()
    base = _is_user_code[fn] = os.path.basename(fn) if user else None
    return base


def user_frame(start: Any) -> str | None:
    """`file.py:LINE` of the first frame outside torch and gradscape, walking outwards."""
    f = start
    while f is not None:
        fn = f.f_code.co_filename
        base = _is_user_code.get(fn, False)
        if base is False:
            base = _user_base(fn)
        if base is not None:
            return f"{base}:{f.f_lineno}"
        f = f.f_back
    return None


_library_leaf: dict[type, bool] = {}  # module class → _forward_in_torch(class)


def _forward_in_torch(cls: type) -> bool:
    """True when the class's forward is torch's own code (nn.Linear, nn.ReLU, a subclass that keeps
    torch's forward), which calls no user code: see NOTE [Library leaves]."""
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    return code is not None and code.co_filename.startswith(_TORCH_DIR)


def is_library_leaf(cls: type) -> bool:
    """`_forward_in_torch(cls)`, cached per class."""
    lib = _library_leaf.get(cls)
    if lib is None:
        if len(_library_leaf) >= _MAX_CACHED:
            _library_leaf.clear()
        lib = _library_leaf[cls] = _forward_in_torch(cls)
    return lib


_forward_codes: dict[type, list[Any]] = {}  # module class → the code of its forward and of what that wraps


def _codes_of(cls: type) -> list[Any]:
    codes = _forward_codes.get(cls)
    if codes is None:
        if len(_forward_codes) >= _MAX_CACHED:
            _forward_codes.clear()
        codes, fn, seen = [], getattr(cls, "forward", None), 0
        while fn is not None and seen < 8:  # `functools.wraps` chains (decorated forwards), bounded
            code = getattr(fn, "__code__", None)
            if code is not None and code.co_argcount:
                codes.append(code)
            fn, seen = getattr(fn, "__wrapped__", None), seen + 1
        _forward_codes[cls] = codes
    return codes


_CALL_CODE = _compat.module_call_code


class ForwardFrames:
    """Finds, from an op's frame, the user's line and the module of the model whose `forward` runs
    there (NOTE [Direct forward calls]). `names`: the model's modules → their qualified names."""

    __slots__ = ("names", "codes", "_frame", "_owner")

    def __init__(self, names: dict[Any, str]) -> None:
        self.names = names
        # id(code) → (code, its first argument's name). By id: a code object hashes its whole contents
        # at every look-up; the code is kept, so its id is not reused while this lives
        self.codes: dict[int, tuple[Any, str]] = {id(_CALL_CODE): (_CALL_CODE, _CALL_CODE.co_varnames[0])}
        for mod in names:
            for code in _codes_of(type(mod)):
                self.codes[id(code)] = (code, code.co_varnames[0])
        self._frame: Any = None  # the last frame whose first argument was read, and its module's name
        self._owner: str | None = None

    def owner(self, f: Any, arg: str) -> str | None:
        """The name of the model module that is frame `f`'s first argument `arg`, else None."""
        if f is self._frame:
            return self._owner
        mod = f.f_locals.get(arg)
        try:
            name = self.names.get(mod)
        except TypeError:  # an unhashable first argument: not a module
            name = None
        self._frame, self._owner = f, name
        return name

    def locate(self, start: Any) -> tuple[str | None, str | None]:
        """(`file.py:LINE` of the first frame outside torch and gradscape, the module whose forward runs
        in the innermost frame that runs one) walking outwards from `start`; None where not found, and
        for the module also when a call of a model module through `__call__` comes first."""
        codes = self.codes
        src: str | None = None
        mod: str | None = None
        looking = True
        f = start
        while f is not None:
            code = f.f_code
            if looking:
                known = codes.get(id(code))
                if known is not None and known[0] is code:
                    name = self._owner if f is self._frame else self.owner(f, known[1])
                    if name is not None:
                        looking = False
                        mod = None if code is _CALL_CODE else name
            if src is None:
                fn = code.co_filename
                base = _is_user_code.get(fn, False)
                if base is False:
                    base = _user_base(fn)
                if base is not None:
                    src = f"{base}:{f.f_lineno}"
            if src is not None and not looking:
                break
            f = f.f_back
        return src, mod

    def release(self) -> None:
        self._frame = None
        self.names = {}
