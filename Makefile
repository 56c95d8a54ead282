# Set-up and entry points. `make demo` and `make test` each build .venv from scratch if needed.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch lies on this machine's disk; a bare `torch` would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q --disable-pip-version-check

.PHONY: env demo test clean

# The core: what `poise train` needs. pip byte-compiles one file at a time; compileall does the
# same files on every core (it reports the few files that are not Python 3, hence `|| true`),
# leaving out what no Poise process imports: the other model families of transformers, Ray's
# libraries (RLlib, Data, Train, Tune, Serve, LLM, AIR), test directories and a few tools. A
# module left out still imports, compiled in memory.
UNUSED := site-packages/(transformers/models/(?!(auto|llama|qwen2|qwen3|mistral)/|__init__)|ray/(rllib|data|train|tune|llm|serve|air)/|networkx/|pip/|setuptools/|pygments/|fontTools/|sympy/physics/|numpy/(distutils|f2py)/|torch/_inductor/(codegen|fx_passes)/|huggingface_hub/inference/)|/tests/
$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --no-compile "$(TORCH_SPEC)" -e .
	$(BIN)/python -m compileall -q -j 0 -x '$(UNUSED)' $(VENV)/lib src > /dev/null 2>&1 || true
	touch $@

# The tests also read `datasets` directories and write TensorBoard scalars: the optional extras.
$(VENV)/.test: $(VENV)/.core
	$(PIP) -e ".[test]"
	touch $@

env: $(VENV)/.core

demo: env
	$(BIN)/poise train configs/demo.yaml

test: $(VENV)/.test
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) runs
