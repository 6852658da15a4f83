# gradscape: `make run` sets everything up and starts the demo; `make test` sets up and runs every test.
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

.PHONY: venv run test lint bench chromium clean

venv: $(DEV_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) $(TORCH_SPEC)
	$(PIP) -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) $(TORCH_SPEC)
	$(PIP) -e ".[dev]"
	touch $@ $(RUN_STAMP)

chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

lint: venv
	$(VENV)/bin/ruff check tracer app tests bench examples
	$(VENV)/bin/mypy tracer

test: venv chromium lint
	$(VENV)/bin/python -m pytest -q

run: $(RUN_STAMP)
	$(VENV)/bin/gradscape demo

bench: venv chromium
	$(PY) bench/overhead.py
	$(PY) bench/stream.py
	$(PY) bench/ui.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
