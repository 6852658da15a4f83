"""The page's address: what a selection writes into it, `?run=&rank=&step=&node=`, and the rank a deep link
names. The browser parses the address (`deepLink` in assets/links.js).

`rank=` is written only for a rank other than 0: a run outside torch.distributed (rank 0 only) keeps the
address it always had, and a link without `rank=` opens rank 0.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode


def address(selected: dict[str, Any]) -> str:
    """`?run=R&step=S&node=N` for a selection on rank 0, `?run=R&rank=K&step=S&node=N` on rank K."""
    rank = int(selected.get("rank") or 0)
    pairs: list[tuple[str, Any]] = [("run", selected["run"])]
    if rank:
        pairs.append(("rank", rank))
    pairs += [("step", selected["step"]), ("node", selected["node"])]
    return "?" + urlencode(pairs)


def link_rank(link: dict[str, Any] | None) -> int:
    """The rank a deep link names (0 when it names none)."""
    rank = (link or {}).get("rank")
    return int(rank) if isinstance(rank, int) else 0
