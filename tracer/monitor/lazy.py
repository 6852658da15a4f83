"""Numbers the monitor keeps as tensors until they can be read without waiting on the device.

NOTE [No sync on CUDA]
    An untraced step must not make the host wait for the device. The monitor's norms and losses are
    tensors on the gradients' device; at the end of the step each device's numbers are gathered into
    one tensor and copied to the host with `non_blocking=True`, and an event is recorded after the
    copy. The row is read when the event says the copy is done (checked at the next step's start,
    never waited for), or at `Tracer.close()`. On the CPU the numbers are read at once. (No GPU was
    available where this was written: the CUDA path is untested.)
"""

from __future__ import annotations

from typing import Any

import torch


class LazyNumbers:
    """Scalars (0-d tensors or floats) and vectors (1-d tensors), read together once ready."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._copies: list[tuple[list[int], list[int], Any, Any]] = []
        self._values: list[Any] | None = None

    def add(self, x: Any) -> int:
        """Slot of `x` (a tensor, a float or None)."""
        self.items.append(x)
        return len(self.items) - 1

    def extend(self, xs: list[Any]) -> range:
        """The slots of each of `xs`, in order (`add` of each, in one call)."""
        at = len(self.items)
        self.items.extend(xs)
        return range(at, at + len(xs))

    def launch(self) -> None:
        """Start reading: on the CPU now; on another device a non-blocking copy (NOTE [No sync on CUDA])."""
        remote: dict[Any, list[int]] = {}
        values: list[Any] = list(self.items)
        for k, x in enumerate(self.items):
            if isinstance(x, torch.Tensor):
                if x.is_cpu:
                    values[k] = x.tolist()
                else:
                    remote.setdefault(x.device, []).append(k)
        for dev, ks in remote.items():
            parts = [self.items[k].detach().reshape(-1).double() for k in ks]
            sizes = [p.numel() for p in parts]
            host = torch.cat(parts).to("cpu", non_blocking=True)
            event = torch.cuda.Event() if dev.type == "cuda" else None
            if event is not None:
                event.record()
            self._copies.append((ks, sizes, host, event))
        self.items = []  # the device tensors are no longer needed here (the copies hold what they read)
        self._values = values

    def ready(self) -> bool:
        return all(ev is None or ev.query() for _, _, _, ev in self._copies)

    def values(self) -> list[Any]:
        """Every slot as a float, a list of floats, or None (waits for the copies if they are not done)."""
        assert self._values is not None, "launch() first"
        for ks, sizes, host, event in self._copies:
            if event is not None:
                event.synchronize()
            flat = host.tolist()
            off = 0
            for k, n in zip(ks, sizes):
                v = flat[off:off + n]
                off += n
                was = self._values[k]
                self._values[k] = v if isinstance(was, torch.Tensor) and was.dim() == 1 else v[0]
        self._copies = []
        return self._values
