#!/usr/bin/env bash
# make test's and make test-fast's runner: pytest processes side by side on the 2 cores.
#   make test (TEST_SET=all), three processes:
#     [dist] tests/distributed (its modules share one launch per world size, a session fixture,
#       so they stay in one process), tests/unit, the compiler-bound kernel tests of
#       tests/integration (the HIP simulator, the gfx90a build) and its 1 GB preprocessing runs;
#     [e2e] tests/e2e and tests/gpu; [intg] the rest of tests/integration.
#     Measured (fresh clone, 2 cores): with two processes ([dist], and e2e with integration)
#     1326 CPU seconds in 20 min and 1509 in 39 min, the second wait-bound (deadlines, hang
#     limits, Slurm jobs, the CUDA wheel's pip); split in three, 25, 30 and 34 min, and with
#     the preprocessing runs moved to [dist] 27, 30 and 29 (the whole suite uses about 2900 CPU
#     seconds, so 2 cores need at least 24 min).
#   make test-fast (TEST_SET=fast): tests/unit ([unit]) and the integration tests not marked
#     slow ([intg]).
# Each line is prefixed with its process, and each ends with its own summary (the slowest tests,
# the shared launches' costs). The exit status is the first failing process's; a process that
# selects no test (pytest's 5) counts as passed. TEST_PROCESSES=1: one pytest for everything.
# Arguments go to pytest.
set -uo pipefail
PY=${PY:-.venv/bin/python}
ARGS=(-q -ra --durations=20 "$@")
if [ "${TEST_SET:-all}" = "fast" ]; then
    ARGS+=(-m "not slow")
    names=(unit intg)
    parts=("tests/unit" "tests/integration")
    everything=(tests/unit tests/integration)
else
    kernels="tests/integration/test_kernels_simulated.py tests/integration/test_kernels_aot_build.py"
    kernels+=" tests/integration/test_data_preprocess_memory.py"  # 245 s: [intg] was the longest
    names=(dist e2e intg)
    parts=("tests/distributed tests/unit $kernels" "tests/e2e tests/gpu"
           "tests/integration ${kernels//tests\//--ignore=tests/}")
    everything=(tests/distributed tests/e2e tests/gpu tests/integration tests/unit)
fi
if [ "${TEST_PROCESSES:-${#names[@]}}" = "1" ]; then
    exec "$PY" -m pytest "${ARGS[@]}" "${everything[@]}"
fi
export PYTHONUNBUFFERED=1
part() {  # name, paths...: one pytest, its lines prefixed
    local name=$1; shift
    "$PY" -m pytest "${ARGS[@]}" "$@" 2>&1 | sed -u "s/^/[$name] /"
}
pids=()
for i in "${!names[@]}"; do
    # shellcheck disable=SC2086  # a part is a list of paths and options without spaces
    part "${names[$i]}" ${parts[$i]} & pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid"; code=$?
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ] && [ "$status" -eq 0 ]; then
        status=$code
    fi
done
summary=""
for i in "${!names[@]}"; do summary+=" [${names[$i]}] ${parts[$i]};"; done
echo "run_tests.sh:${summary} side by side; exit status $status"
exit $status
