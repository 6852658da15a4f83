# gradscape: `make run` sets everything up and runs `gradscape demo` (the server plus a bundled training
# loop streaming into it); `make test` sets up and runs lint and every test (the package test included, and the docs
# site built with --strict: tests/docs/test_site.py). `make docs` builds the site into site/, `make docs-serve` serves it.
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
	tracer/summary/_fastsum_v4.c tracer/summary/_fastsum_wide.h tracer/summary/_fastsum_thumb.h \
	tracer/summary/_fastsum_simd.h

.PHONY: venv run test lint bench chromium compiler recorder clean test-torch torch-headers docs docs-serve \
	docs-figures

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

# `make test-torch TORCH=2.9.1`: the core suite (tests/torch_range.txt) on another torch release, in a virtual
# environment of its own (.venv-torch-X; .venv stays on TORCH_SPEC). Releases from the package index are CUDA
# builds: they import and run on a CPU once their nvidia-* packages are installed (~3 GB a release). It builds
# the native recorder for that release, runs the suite, then checks that installing the wheel with no
# constraint leaves that torch in place (tests/install_keeps_torch.sh).
TORCH ?= 2.9.1
TVENV := .venv-torch-$(TORCH)
test-torch: compiler
	test -x $(TVENV)/bin/python || $(PYTHON) -m venv $(TVENV)
	$(TVENV)/bin/python -c "import torch" 2>/dev/null || \
	  $(TVENV)/bin/python -m pip install -q --no-compile --disable-pip-version-check torch==$(TORCH)
	echo "torch==$(TORCH)" > $(TVENV)/torch-constraint.txt
	$(TVENV)/bin/python -m pip install -q --no-compile --disable-pip-version-check -c $(TVENV)/torch-constraint.txt \
	  "setuptools>=70.1" -e . "pytest>=8" "pytest-timeout>=2.2" "psutil>=5.9"
	$(TVENV)/bin/python -m gradscape build-recorder
	$(TVENV)/bin/python -m pytest -q -p no:cacheprovider $$(grep -v '^#' tests/torch_range.txt)
	bash tests/install_keeps_torch.sh $(TVENV)

# The headers of the supported range's two ends, unpacked from their wheels (no install), for the test that
# compiles the recorder's version shims against each (tests/test_torch_shims.py)
SHIM_TORCHES ?= 2.9.1 2.14.1
HEADERS := .cache/torch-headers
torch-headers: venv
	$(PY) tests/torch_headers.py --into $(HEADERS) $(SHIM_TORCHES)

chromium:
	@command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

lint: venv
	$(VENV)/bin/ruff check gradscape tracer app tests bench examples tools setup.py
	$(PY) tools/typecheck.py

test: venv chromium recorder torch-headers lint
	$(VENV)/bin/python -m pytest -q

run: $(RUN_STAMP)
	-$(PY) -m gradscape build-recorder
	$(VENV)/bin/gradscape demo

bench: venv chromium recorder
	$(PY) bench/overhead.py
	$(PY) bench/stream.py
	$(PY) bench/ui.py
	$(PY) bench/first_step.py

# The docs site (mkdocs.yml; MkDocs, Material, mkdocstrings: the `dev` extra). --strict: a broken link, page,
# included example or API reference fails the build.
docs: venv
	$(VENV)/bin/mkdocs build --strict

docs-serve: venv
	$(VENV)/bin/mkdocs serve

# The docs' pictures of the page, taken again by the browser tests from real traced steps
docs-figures: venv chromium recorder
	GRADSCAPE_SCREENSHOT=docs/screenshot.png $(PY) -m pytest -q tests/e2e/test_ui.py -k screenshot_for_the_readme
	GRADSCAPE_DOCS_FIGURES=docs/images $(PY) -m pytest -q tests/e2e/test_docs_figures.py

clean:
	-test -x $(PY) && $(PY) -c "import shutil; from gradscape.tracer.record import native_build as b; \
	  shutil.rmtree(b.cache_dir(), True)"
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info build dist site tracer/summary/_fastsum*.so
