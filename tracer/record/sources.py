"""Where user code is: the source line a node is attributed to (NOTE [Source lines] in
tracer/record/forward.py) is that of the first frame outside torch and gradscape, and a library leaf
module (NOTE [Library leaves]) is one whose forward is torch's own code."""

from __future__ import annotations

import os
from typing import Any

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the tracer package, every room
_SKIP_PREFIXES = (_TORCH_DIR, _OUR_DIR)

# file name → its basename if it is the user's code, else None. Keyed by the file name, not the code
# object: code objects compare equal across files when their contents do.
_is_user_code: dict[str, str | None] = {}
_MAX_CACHED = 4096  # entries per cache here; past that it starts over (files and classes made on the fly)


def user_frame(start: Any) -> str | None:
    """`file.py:LINE` of the first frame outside torch and gradscape, walking outwards."""
    f = start
    while f is not None:
        fn = f.f_code.co_filename
        base = _is_user_code.get(fn, False)
        if base is False:
            user = not fn.startswith(_SKIP_PREFIXES) and not fn.startswith("<frozen")
            if len(_is_user_code) >= _MAX_CACHED:
                _is_user_code.clear()
            base = _is_user_code[fn] = os.path.basename(fn) if user else None
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
