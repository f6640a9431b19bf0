#!/usr/bin/env bash
# make test's and make test-fast's runner: two pytest processes side by side on the 2 cores.
#   make test (TEST_SET=all): [dist] tests/distributed (its modules share one launch per world
#     size, a session fixture, so they stay in one process), tests/unit and the compiler-bound
#     kernel tests of tests/integration (the HIP simulator, the gfx90a build); [rest] every other
#     test. Measured (MEGATRON_TEST_TIMES, fresh clone, 2 cores): 1326 CPU seconds in 20 min and
#     1509 in 39 min. The second is wait-bound (deadlines, hang limits, Slurm jobs, the CUDA
#     wheel's pip), so balancing CPU seconds does not balance wall time: it is the long pole.
#   make test-fast (TEST_SET=fast): tests/unit ([unit]) and the integration tests not marked
#     slow ([intg]).
# Each line is prefixed with its process, and each ends with its own summary (the slowest tests,
# the shared launches' costs). The exit status is the first failing process's; a half that
# selects no test (pytest's 5) counts as passed. TEST_PROCESSES=1: one pytest, as before.
# Arguments go to pytest.
set -uo pipefail
PY=${PY:-.venv/bin/python}
ARGS=(-q -ra --durations=20 "$@")
if [ "${TEST_SET:-all}" = "fast" ]; then
    ARGS+=(-m "not slow")
    names=(unit intg); first=(tests/unit); second=(tests/integration)
    everything=("${first[@]}" "${second[@]}")
else
    kernels=(tests/integration/test_kernels_simulated.py tests/integration/test_kernels_aot_build.py)
    names=(dist rest); first=(tests/distributed tests/unit "${kernels[@]}")
    second=(tests/e2e tests/gpu tests/integration "${kernels[@]/#/--ignore=}")
    everything=(tests/distributed tests/e2e tests/gpu tests/integration tests/unit)
fi
if [ "${TEST_PROCESSES:-2}" = "1" ]; then
    exec "$PY" -m pytest "${ARGS[@]}" "${everything[@]}"
fi
export PYTHONUNBUFFERED=1
half() {  # name, paths...: one pytest, its lines prefixed
    local name=$1; shift
    "$PY" -m pytest "${ARGS[@]}" "$@" 2>&1 | sed -u "s/^/[$name] /"
}
half "${names[0]}" "${first[@]}" & one=$!
half "${names[1]}" "${second[@]}" & two=$!
status=0
for pid in $one $two; do
    wait "$pid"; code=$?
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ] && [ "$status" -eq 0 ]; then
        status=$code
    fi
done
echo "run_tests.sh: [${names[0]}] ${first[*]} and [${names[1]}] ${second[*]} side by side; exit status $status"
exit $status
