# Set-up and entry points. `make demo` and `make test` each build .venv from scratch if needed.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch lies on this machine's disk; a bare `torch` would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: env demo test clean

$(BIN)/poise: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install -q --disable-pip-version-check -e ".[test]"
	touch $(BIN)/poise

env: $(BIN)/poise

demo: env
	$(BIN)/poise train configs/demo.yaml

test: env
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) runs
