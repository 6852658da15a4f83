"""Run in a fresh process by tests/test_side_effects.py: the process-wide state a traced step could
change (warnings filters, the logging configuration, `sys` hooks, torch's global hook check), read
before and after traced steps of one kind of model, printed as one JSON line on stdout.

    python tests/state_worker.py eager|compiled|direct
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import sys
import threading
import warnings
from typing import Any

import torch
import torch.nn as nn

import gradscape


def _name(x: Any) -> str:
    return f"{getattr(x, '__module__', '?')}.{getattr(x, '__qualname__', type(x).__name__)}@{id(x):x}"


def _logging_state() -> dict[str, Any]:
    """The root logger, and every logger whose configuration is not the default (a logger that only
    came to exist has the default: any level, handler or flag set on it would show)."""
    out: dict[str, Any] = {"disable": logging.root.manager.disable, "last_resort": _name(logging.lastResort),
                           "raise": logging.raiseExceptions, "class": _name(logging.getLoggerClass())}
    loggers: dict[str, Any] = {"<root>": logging.root}
    loggers.update({k: v for k, v in logging.root.manager.loggerDict.items() if isinstance(v, logging.Logger)})
    for name, lg in sorted(loggers.items()):
        state = [lg.level, [_name(h) for h in lg.handlers], lg.propagate, lg.disabled, [_name(f) for f in lg.filters]]
        if name == "<root>" or state != [logging.NOTSET, [], True, False, []]:
            out[name] = state
    return out


def state() -> dict[str, Any]:
    mm = torch.nn.modules.module
    return {
        "warnings.filters": [repr(f) for f in warnings.filters],
        "warnings.showwarning": _name(warnings.showwarning),
        "warnings.formatwarning": _name(warnings.formatwarning),
        "logging": _logging_state(),
        "sys": {"trace": repr(sys.gettrace()), "profile": repr(sys.getprofile()),
                "excepthook": _name(sys.excepthook), "displayhook": _name(sys.displayhook),
                "unraisablehook": _name(sys.unraisablehook), "breakpointhook": _name(sys.breakpointhook),
                "meta_path": [_name(m) for m in sys.meta_path], "path_hooks": [_name(h) for h in sys.path_hooks],
                "switchinterval": sys.getswitchinterval(), "recursionlimit": sys.getrecursionlimit()},
        "threading": {"excepthook": _name(threading.excepthook),
                      "trace": repr(getattr(threading, "gettrace", lambda: None)()),
                      "profile": repr(getattr(threading, "getprofile", lambda: None)())},
        "gc": {"enabled": gc.isenabled(), "threshold": gc.get_threshold(),
               "callbacks": [_name(c) for c in gc.callbacks]},
        "atexit": atexit._ncallbacks(),
        "torch": {"has_any_global_hook": _name(mm._has_any_global_hook), "grad": torch.is_grad_enabled(),
                  "modes": torch._C._len_torch_function_stack(),
                  "hooks": [len(getattr(mm, n)) for n in ("_global_forward_pre_hooks", "_global_forward_hooks",
                                                           "_global_backward_hooks", "_global_backward_pre_hooks")]},
    }


class _Layer(nn.Linear):
    """A layer trained on its own, through `forward` (the forward-forward example's shape)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.weight.T + self.bias)


def main(kind: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    model = nn.Module()
    model.head = nn.Linear(4, 2)
    if kind == "compiled":
        model.block = torch.compile(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), backend="aot_eager")
    elif kind == "direct":
        model.block = _Layer(4, 4)
    else:
        model.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def loss() -> torch.Tensor:
        h = model.block.forward(x) if kind == "direct" else model.block(x)
        return model.head(h).pow(2).mean()

    loss().backward()  # once untraced (the compiled module compiles here)
    before = state()
    tr = gradscape.Tracer(model)
    for i in range(2):
        with tr.step(i):
            loss().backward()
    tr.close()
    after = state()
    print(json.dumps({"before": before, "after": after}), flush=True)
    if kind == "compiled":  # a user's own global hook still gets torch's warning about it (on stderr)
        handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
        model.block(x)
        handle.remove()


if __name__ == "__main__":
    main(sys.argv[1])
