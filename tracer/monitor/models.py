"""Several models for one Tracer: a list, tuple or dict of modules becomes one container whose
qualified names keep them apart ("0.fc.weight" / "1.fc.weight", or "G.main.0.weight" / "D.main.0.weight"
for a dict). The container is ours: nothing is written on the user's modules."""

from __future__ import annotations

from typing import Any

import torch


def as_module(model: Any) -> torch.nn.Module | None:
    """`model` as one module: itself, or a ModuleList / ModuleDict holding the given modules."""
    if model is None or isinstance(model, torch.nn.Module):
        return model
    if isinstance(model, dict):
        for k, m in model.items():
            if not isinstance(k, str) or not k or "." in k:
                raise ValueError(f"model: the keys of a dict of models name them in parameter names, so they must "
                                 f"be non-empty strings without '.', got {k!r}")
            _check(m, f"model[{k!r}]")
        return torch.nn.ModuleDict(model)
    if isinstance(model, (list, tuple)):
        for k, m in enumerate(model):
            _check(m, f"model[{k}]")
        return torch.nn.ModuleList(model)
    raise TypeError(f"model must be a torch.nn.Module, a list, tuple or dict of them, or None, "
                    f"got {type(model).__name__}")


def _check(m: Any, where: str) -> None:
    if not isinstance(m, torch.nn.Module):
        raise TypeError(f"{where} must be a torch.nn.Module, got {type(m).__name__}")
