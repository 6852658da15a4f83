"""The names of a model's modules and parameters, as one traced step sees them.

NOTE [Index kept]
    Naming a model's modules and parameters walks every module's parameter and child dicts in Python: 50–150
    µs a traced step for a small Llama, ViT or T5 (bench/loops.py). A Tracer keeps its last index
    (`IndexCache`) with the dicts it was built from and what each held, and hands it out again while every one
    of those dicts is still the module's own and holds the very same objects, in the same order (one pass of
    identity checks, no names made); a module or parameter added, removed or replaced anywhere builds it
    anew. The steps share its dicts: read them, do not change them (`release` rebinds, `name_unsharded`
    writes the step's own `unsharded_names`).
"""

from __future__ import annotations

from itertools import chain
from operator import is_
from typing import Any

from gradscape.tracer import _compat


class ModelIndex:
    """Qualified names of the model's modules (`module_names`, by module; `module_types`, `module_params`,
    by name) and parameters (`params`, each with its name in the model's order; `name_of`, by tensor;
    `param_by_name`), and of the unsharded copies FSDP2 makes of its parameters for a forward
    (`unsharded_names`, NOTE [Unsharded parameters])."""

    def __init__(self, model: Any = None, sources: _Sources | None = None) -> None:
        self.module_names: dict[Any, str] = {}
        self.module_types: dict[str, str] = {}
        self.module_params: dict[str, list[str]] = {}
        self.params: list[tuple[Any, str]] = []  # every parameter once, with its first name
        # id → name of the parameters in `params` (which keep them alive): a tensor's own hash is a Python call
        self._names: dict[int, str] = {}
        self.param_by_name: dict[str, Any] = {}
        self.unsharded_names: dict[Any, str] = {}  # FSDP2's per-forward copies → their parameter's name
        if model is not None:
            self._index(model, sources)

    def shared(self) -> ModelIndex:
        """Another index over the same names (NOTE [Index kept]), with a step's own `unsharded_names`."""
        out = ModelIndex()
        out.module_names, out.module_types, out.module_params = self.module_names, self.module_types, self.module_params
        out.params, out._names, out.param_by_name = self.params, self._names, self.param_by_name
        return out

    def _index(self, model: Any, sources: _Sources | None = None) -> None:
        """One pre-order pass over the modules' children (what `named_modules(remove_duplicate=False)`
        walks, without its generators): a shared module or parameter keeps its first name, as
        `named_modules()` / `named_parameters()` give it.

        NOTE [Compiled wrappers]: `torch.compile(module)` returns a wrapper module (`OptimizedModule`) that
        holds the module as its child `_orig_mod`. Both get the name the wrapper has (its child's names
        carry no `_orig_mod.`), so the modules and parameters of a compiled model are named as those of
        the model itself: a region traced as one node is attributed to the wrapper's call, and an op of
        a region run eagerly to the module that made it (NOTE [Compiled regions on a traced step] in
        tracer/record/compiled.py). The module's type is the compiled module's."""
        names, types, params, pnames = self.module_names, self.module_types, self.module_params, self._names
        stack: list[tuple[str, Any]] = [("", model)]
        while stack:
            name, mod = stack.pop()
            first = mod not in names
            prefix = name + "." if name else ""
            plist: list[str] = []
            if first:
                qual = name or "<root>"
                names[mod] = qual
                types[qual] = type(mod).__name__
                params[qual] = plist
            pdict, cdict = _compat.module_parameters(mod), _compat.module_children(mod)
            if sources is not None:  # what this index was built from (NOTE [Index kept])
                sources.add(mod, pdict, cdict)
            for pname, p in pdict.items():
                if p is None:
                    continue
                full = prefix + pname
                if id(p) not in pnames:
                    pnames[id(p)] = full
                    self.params.append((p, full))
                    self.param_by_name.setdefault(full, p)
                if first:
                    plist.append(full)
            inner = _compat.compiled_wrapper_inner(mod)
            if inner is not None:  # NOTE [Compiled wrappers]: the wrapper and what it compiles share a name
                stack.append((name, inner))
                continue
            children = [(prefix + cname, child) for cname, child in cdict.items() if child is not None]
            stack.extend(reversed(children))

    @property
    def by_id(self) -> dict[int, str]:
        """id → name of every parameter (read it, do not mutate it): what the native recorder looks its
        AccumulateGrad nodes' variables up in."""
        return self._names

    def name_of(self, t: Any) -> str | None:
        """The name of the parameter `t` is; None for any other tensor."""
        return self._names.get(id(t))

    def param_of(self, var: Any) -> str | None:
        """The name of the parameter a leaf tensor is, or stands for (an FSDP2 unsharded copy); None
        for any other leaf."""
        param = self._names.get(id(var))
        if param is None and self.unsharded_names:
            param = self.unsharded_names.get(var)
        return param

    def name_unsharded(self, mod: Any, name: str) -> None:
        """NOTE [Unsharded parameters]: FSDP2 (`fully_shard`) swaps each parameter for an unsharded
        copy in the module's parameters for the forward, and the graph's AccumulateGrad nodes hold
        those copies, which the index's parameter names (built from the sharded parameters) do not know. The
        global forward hook that calls this runs before the module's own hooks, so before FSDP2 puts
        the shards back: what the module holds now is the copy, named after the parameter it stands for."""
        prefix = "" if name == "<root>" else name + "."
        for pname, p in _compat.module_parameters(mod).items():
            if p is not None and id(p) not in self._names:
                self.unsharded_names[p] = prefix + pname

    def release(self) -> None:
        """Let go of the model's modules and parameters (the names by name stay)."""
        self.module_names = {}
        self.params = []
        self._names = {}
        self.param_by_name = {}


class IndexCache:
    """A Tracer's last `ModelIndex`, handed out again while the model's modules and parameters are the very
    objects it was built from (NOTE [Index kept])."""

    def __init__(self) -> None:
        self.model: Any = None
        self.built: ModelIndex | None = None
        self.sources = _Sources()

    def index(self, model: Any) -> ModelIndex:
        built = self.built
        if built is None or model is not self.model or not self.sources.unchanged():
            sources = _Sources()
            built = ModelIndex(model, sources)
            self.model, self.built, self.sources = model, built, sources
        return built.shared()


class _Sources:
    """The modules an index was built from, their parameter and child dicts and what those held then, flat:
    checked again by a few C-level passes (`map`, `all`), not a Python loop over the modules."""

    def __init__(self) -> None:
        self.mods: list[Any] = []
        self.pdicts: list[dict[str, Any]] = []
        self.cdicts: list[dict[str, Any]] = []
        self.plens: list[int] = []
        self.clens: list[int] = []
        self.pvalues: list[Any] = []
        self.cvalues: list[Any] = []

    def add(self, mod: Any, pdict: dict[str, Any], cdict: dict[str, Any]) -> None:
        self.mods.append(mod)
        self.pdicts.append(pdict)
        self.cdicts.append(cdict)
        self.plens.append(len(pdict))
        self.clens.append(len(cdict))
        self.pvalues.extend(pdict.values())
        self.cvalues.extend(cdict.values())

    def unchanged(self) -> bool:
        pdicts, cdicts = self.pdicts, self.cdicts
        return (all(map(is_, map(_compat.module_parameters, self.mods), pdicts))
                and all(map(is_, map(_compat.module_children, self.mods), cdicts))
                and list(map(len, pdicts)) == self.plens and list(map(len, cdicts)) == self.clens
                and all(map(is_, chain.from_iterable(map(dict.values, pdicts)), self.pvalues))
                and all(map(is_, chain.from_iterable(map(dict.values, cdicts)), self.cvalues)))
