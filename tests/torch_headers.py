"""Unpack the C++ headers of torch releases from their wheels, without installing them, for
tests/test_torch_shims.py (`make torch-headers`, which `make test` runs):

    python tests/torch_headers.py --into .cache/torch-headers 2.9.1 2.14.1

Each release's `torch/include/` goes to INTO/<release>/include. A release already unpacked is kept.
The wheel comes from pip (its cache, this machine's files, or the package index)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PREFIX = "torch/include/"
MARKER = "torch/csrc/autograd/function.h"  # present once a release's headers are all there


def unpack(release: str, into: Path) -> Path:
    """INTO/<release>/include, unpacked from the wheel of torch==release if it is not there yet."""
    target = into / release / "include"
    if (target / MARKER).exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                        f"torch=={release}", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("torch-*.whl"))
        partial = into / release / "partial"
        shutil.rmtree(partial, ignore_errors=True)  # what an interrupted run left
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith(PREFIX) and not name.endswith("/"):
                    out = partial / name[len(PREFIX):]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(name))
        partial.rename(target)
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", type=Path, required=True)
    ap.add_argument("releases", nargs="+")
    args = ap.parse_args()
    for release in args.releases:
        print(f"torch {release} headers: {unpack(release, args.into)}")


if __name__ == "__main__":
    main()
