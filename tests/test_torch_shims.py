"""The native recorder's sources compile against the headers of both ends of the supported torch range
(csrc/torch_shims.h picks what differs by torch's version macros), whichever torch is installed: `make test`
unpacks those headers first (`make torch-headers`, tests/torch_headers.py). The full builds and suites on
each end run in `make test-torch TORCH=X`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gradscape.tracer import _compat
from gradscape.tracer.record import native_build

pytestmark = pytest.mark.slow

HEADERS = Path(__file__).resolve().parent.parent / ".cache" / "torch-headers"
ENDS = ("2.9.1", "2.14.1")  # std::shared_ptr and c10::intrusive_ptr nodes (NOTE [Node ownership across releases])


def _include(release: str) -> Path:
    include = HEADERS / release / "include"
    assert (include / "torch" / "csrc" / "autograd" / "function.h").exists(), (
        f"no headers of torch {release} in {HEADERS}: `make torch-headers` unpacks them")
    return include


def test_the_ends_are_the_supported_range() -> None:
    ends = sorted(_compat.torch_version(r) for r in ENDS)
    assert ends == [_compat.MIN_TORCH, _compat.MAX_TESTED]


@pytest.mark.parametrize("release", sorted(ENDS))
def test_the_recorder_compiles_against_the_headers_of(release: str) -> None:
    """Also a check that the version macros chose the release's own node ownership: torch_shims.h asserts
    that its NodePtr is what the release's `Node::getptr()` returns."""
    done = subprocess.run(native_build.syntax_command(_include(release)), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
