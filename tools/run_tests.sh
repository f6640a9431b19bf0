#!/usr/bin/env bash
# make test's and make test-fast's runner: pytest processes side by side on the 2 cores.
#   make test (TEST_SET=all), four processes by default (TEST_PROCESSES=4):
#     [dist] tests/distributed (its modules share one launch per world size, a session fixture,
#       so they stay in one process) and tests/unit;
#     [e2e] tests/e2e, tests/gpu and the gfx90a kernel build; [intg] the other integration
#       tests;
#     [wait] the tests that mostly wait ($waiting below: Slurm jobs, hang limits, a held
#       port's deadline, save bounds, signals; 1000-1090 s of wall time for 190-220 CPU s),
#       so their waits overlap the others' compute instead of lengthening [e2e] and [intg];
#       with them the 1 GB preprocessing runs, which made [intg] the last to end, and the HIP
#       kernel simulator, which with the gfx90a build (now in [e2e]) made [dist] the last.
#     Measured from a fresh clone on the 2-core development machine (Xeon with AVX-512): the
#     suite took 2240-2370 CPU seconds in mid-2026, so 2 cores needed about 20 minutes; in five
#     runs the four took 19-22, 20-23, 19-21 and 17-18 minutes, the whole .ci/run 21:10-23:30;
#     three processes (the same without [wait]) 21:51, 24:20 and 24:20, the .ci/run 25:29. By
#     December 2026 it had grown to 2760-3200 CPU seconds and the .ci/run to 26:19-29:48.
#   TEST_PROCESSES=3: [dist] (with the 1 GB preprocessing runs), [e2e] and [intg], each with
#     its own waiting tests.
#   TEST_PROCESSES=2: [dist] and [rest], every other test (37-39 min on an older machine).
#   make test-fast (TEST_SET=fast): tests/unit ([unit]) and the integration tests not marked
#     slow ([intg]).
# Each line is prefixed with its process, and each ends with its own summary (the slowest tests,
# the shared launches' costs). The exit status is the first failing process's; a process that
# selects no test (pytest's 5) counts as passed. TEST_PROCESSES=1: one pytest for everything.
# Arguments go to pytest.
set -uo pipefail
PY=${PY:-.venv/bin/python}
processes=${TEST_PROCESSES:-4}
case $processes in
    1|2|3|4) ;;
    *) echo "run_tests.sh: TEST_PROCESSES=$processes: expected 1, 2, 3 or 4 (the default)" >&2
       exit 2 ;;
esac
ARGS=(-q -ra --durations=20 "$@")
if [ "${TEST_SET:-all}" = "fast" ]; then
    ARGS+=(-m "not slow")
    names=(unit intg)
    parts=("tests/unit" "tests/integration")
    everything=(tests/unit tests/integration)
else
    kernels="tests/integration/test_kernels_simulated.py tests/integration/test_kernels_aot_build.py"
    # [wait]'s tests (above)
    waiting="tests/e2e/test_launch_slurm.py tests/e2e/test_launch_slurm_hang.py"
    waiting+=" tests/e2e/test_training_slurm_chain.py tests/e2e/test_launch_torchrun_signals.py"
    waiting+=" tests/integration/test_launch_rendezvous_port.py"
    waiting+=" tests/integration/test_training_save_limits.py"
    waiting+=" tests/integration/test_training_watchdog_hang.py"
    waiting+=" tests/integration/test_training_hang_resume.py"
    waiting+=" tests/integration/test_launch_exit_teardown.py"
    waiting+=" tests/integration/test_training_deadline_save.py"
    if [ "$processes" = "4" ]; then
        # and the two 1 GB preprocessing runs (120 CPU s, 320 s of wall time under the suite's
        # load): [intg] ended last, 6-7 minutes after [wait] (at 655836e: 24:52 and 18:08)
        waiting+=" tests/integration/test_data_preprocess_memory.py"
        not_waiting=${waiting//tests\//--ignore=tests/}
        # the compiler-bound kernel tests out of [dist], which ended last, alone for its final
        # minute (December 2026: 25:29, [wait] 21:56): the simulator with [wait], the gfx90a
        # build with [e2e] (with both, [wait] ended last at 25:46, [e2e] at 23:00)
        names=(dist e2e intg wait)
        parts=("tests/distributed tests/unit"
               "tests/e2e tests/gpu tests/integration/test_kernels_aot_build.py $not_waiting"
               "tests/integration ${kernels//tests\//--ignore=tests/} $not_waiting"
               "$waiting tests/integration/test_kernels_simulated.py")
    elif [ "$processes" = "3" ]; then
        kernels+=" tests/integration/test_data_preprocess_memory.py"  # 245 s: [intg] was longest
        names=(dist e2e intg)
        parts=("tests/distributed tests/unit $kernels" "tests/e2e tests/gpu"
               "tests/integration ${kernels//tests\//--ignore=tests/}")
    else
        names=(dist rest)
        parts=("tests/distributed tests/unit $kernels"
               "tests/e2e tests/gpu tests/integration ${kernels//tests\//--ignore=tests/}")
    fi
    everything=(tests/distributed tests/e2e tests/gpu tests/integration tests/unit)
fi
if [ "$processes" = "1" ]; then
    exec "$PY" -m pytest "${ARGS[@]}" "${everything[@]}"
fi
export PYTHONUNBUFFERED=1
# Each process's lines are kept too, so the last lines printed name every failure: a CI log's
# tail then says which test failed however far up its process printed it.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
part() {  # name, paths...: one pytest, its lines prefixed
    local name=$1; shift
    "$PY" -m pytest "${ARGS[@]}" "$@" 2>&1 | sed -u "s/^/[$name] /" | tee "$logs/$name"
    return "${PIPESTATUS[0]}"
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
echo "run_tests.sh: each process's failures and counts:"
for name in "${names[@]}"; do
    grep -E "^\[$name\] (FAILED|ERROR) " "$logs/$name"
    counts="([0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran).* in [0-9.]+s"
    grep -E "^\[$name\] .*$counts" "$logs/$name" \
        | tail -n 1 | grep . || echo "[$name] no pytest summary line (killed or crashed?)"
done
exit $status
