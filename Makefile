# gradscape: `make run` sets everything up and runs `gradscape demo` (the server plus a bundled training
# loop streaming into it); `make test` sets up and runs lint and every test (the package test included).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Users with a GPU: make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
# --no-compile: pip would byte-compile every file of torch at install time (~25 s here); Python
# compiles what it imports on first use instead. `make run` installs only what the demo needs.
PIP := $(PY) -m pip install -q --no-compile --disable-pip-version-check
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
# what the install builds from: a change to any of them re-runs the install (the summary kernel is
# compiled by it, into tracer/summary/ for this editable install)
BUILD_INPUTS := pyproject.toml setup.py tracer/summary/_fastsum.c tracer/summary/_fastsum_v3.c \
	tracer/summary/_fastsum_v4.c tracer/summary/_fastsum_wide.h tracer/summary/_fastsum_thumb.h

.PHONY: venv run test lint bench chromium compiler recorder clean

venv: $(DEV_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): $(BUILD_INPUTS) | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) $(TORCH_SPEC)
	$(PIP) -e .
	touch $@

# `make test` also installs the framework extras (Lightning, transformers, Accelerate: their tests are part of
# the suite). They depend on torch; the constraint pins the torch installed above, so pip never replaces it.
TORCH_PIN := $(VENV)/torch-constraint.txt

$(DEV_STAMP): $(BUILD_INPUTS) | $(PY) compiler
	$(PY) -c "import torch" 2>/dev/null || $(PIP) $(TORCH_SPEC)
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(TORCH_PIN)
	$(PIP) -c $(TORCH_PIN) -e ".[dev,lightning,huggingface]"
	touch $@ $(RUN_STAMP)

# The summary kernel and the native recorder are optional for `make run` (without a compiler the install
# still succeeds, summaries use torch and steps are recorded in Python), but the tests check both, so
# `make test` installs a C and a C++ compiler when none is there.
compiler:
	@{ command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; } && \
	  { command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1; } || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc g++ libc6-dev; }

# The native step recorder (C++, tracer/record/csrc/) is built against the installed torch, after the install
# (tracer/record/native_build.py says why not by pip); a build that is there already is kept (~2 s to check).
recorder: venv
	$(PY) -m gradscape build-recorder

chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

lint: venv
	$(VENV)/bin/ruff check gradscape tracer app tests bench examples tools setup.py
	$(PY) tools/typecheck.py

test: venv chromium recorder lint
	$(VENV)/bin/python -m pytest -q

run: $(RUN_STAMP)
	-$(PY) -m gradscape build-recorder
	$(VENV)/bin/gradscape demo

bench: venv chromium recorder
	$(PY) bench/overhead.py
	$(PY) bench/stream.py
	$(PY) bench/ui.py
	$(PY) bench/first_step.py

clean:
	-test -x $(PY) && $(PY) -c "import shutil; from gradscape.tracer.record import native_build as b; \
	  shutil.rmtree(b.cache_dir(), True)"
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info build dist tracer/summary/_fastsum*.so
