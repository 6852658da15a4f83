#!/usr/bin/env bash
# The CUDA checks, on a machine with a GPU (CI has none, so `make test` skips every CUDA case):
#
#     bash bench/cuda.sh [OUT_DIR]          # PYTHON=... to pick the interpreter (default python3)
#
# Install gradscape into that interpreter first, with its own pip (`python3 -m pip install -e .`): a machine's
# `pip` on the PATH may belong to another Python, and then `gradscape.tracer` is not found.
#
# 1. what runs where (torch, CUDA, the GPU, `gradscape doctor`), and the native recorder built for this torch;
# 2. every test with a CUDA case: tests/test_cuda.py and the device-parametrised tests (`pytest -k cuda`);
# 3. bench/overhead.py on CUDA (ratio to a plain step, the monitor's cost, peak GPU memory per mode);
# 4. bench/pernode.py on CUDA (the LSTMCell loop's cost per node, 1k to 100k nodes).
# Each part has a time limit, so one that hangs does not take the others with it (LIMIT_RECORDER, LIMIT_TESTS,
# LIMIT_OVERHEAD, LIMIT_PERNODE: seconds; 0 skips the part, for a lease of a few minutes). Output: OUT_DIR/*.txt.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-bench-cuda-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

part() {  # part NAME SECONDS COMMAND...: run COMMAND with a time limit, its output also in OUT_DIR/NAME.txt
    local name=$1 limit=$2
    shift 2
    [ "$limit" = 0 ] && { echo "== $name: skipped"; return; }
    echo "== $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
}

part env 60 "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
part doctor 60 "$PY" -m gradscape doctor
part recorder "${LIMIT_RECORDER:-240}" "$PY" -m gradscape build-recorder
part tests "${LIMIT_TESTS:-300}" "$PY" -m pytest -q -p no:cacheprovider -k cuda tests/test_cuda.py tests/test_reference.py \
    tests/test_summary.py tests/test_optimizer_steps.py tests/test_triggers.py tests/test_native_recorder.py \
    tests/test_breakpoints.py
part overhead "${LIMIT_OVERHEAD:-300}" "$PY" bench/overhead.py --device cuda --workloads "${WORKLOADS:-W1,W2,W3,W4,W6,W7,W8,W9,W10}" \
    --rounds "${ROUNDS:-7}"
part pernode "${LIMIT_PERNODE:-240}" "$PY" bench/pernode.py --device cuda --nodes "${NODES:-1000,10000,100000}" --rounds 3
