#!/usr/bin/env bash
# `make test-torch`'s last check: installing gradscape's wheel into an environment that holds a supported
# torch, with no constraint file and no pip configuration, leaves that torch in place (`pip list` before
# and after). The environment's editable install is put back afterwards.
#     bash tests/install_keeps_torch.sh VENV
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$1
PY="$VENV/bin/python"
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1  # no constraint, no cap: what a user's pip does
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip wheel -q . --no-deps --no-build-isolation -w "$work"
"$PY" -m pip list --format=freeze | grep -iE '^(torch|nvidia-)' | sort > "$work/before.txt"
"$PY" -m pip uninstall -q -y gradscape
"$PY" -m pip install -q --no-compile "$work"/gradscape-*.whl
"$PY" -m pip list --format=freeze | grep -iE '^(torch|nvidia-)' | sort > "$work/after.txt"
"$PY" -m pip install -q --no-compile --no-deps --no-build-isolation -e .
if ! diff -u "$work/before.txt" "$work/after.txt"; then
    echo "FAIL: installing the gradscape wheel changed torch (above: pip list before and after)" >&2
    exit 1
fi
echo "ok: the gradscape wheel installed beside $(grep -i '^torch==' "$work/before.txt") and left it in place"
