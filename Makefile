# gradscape: `make run` sets everything up and starts the demo; `make test` sets up and runs every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Users with a GPU: make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: venv run test lint bench chromium clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

lint: venv
	$(VENV)/bin/ruff check tracer app tests bench examples
	$(VENV)/bin/mypy tracer

test: venv chromium lint
	$(VENV)/bin/python -m pytest -q

run: venv
	$(VENV)/bin/gradscape demo

bench: venv chromium
	$(PY) bench/overhead.py
	$(PY) bench/stream.py
	$(PY) bench/ui.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
