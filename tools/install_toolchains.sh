#!/usr/bin/env bash
# Installs what the tests need from Debian when it is missing and we are root; otherwise says
# which tests will skip. Idempotent and quick when everything is present.
set -u
need=()
command -v hipcc >/dev/null 2>&1 || need+=(hipcc libamdhip64-dev)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
# Headless Chromium renders megatron-report's page in tests/integration/test_cli_report.py.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# The shellcheck tool lints the shell scripts (tests/integration/test_launch_frontier_recipes_run.py).
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_toolchains: not root or no apt-get; tests needing ${need[*]} will skip" >&2
  exit 0
fi
echo "install_toolchains: apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
(apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}") >/tmp/install_toolchains.log 2>&1 \
  || { echo "install_toolchains: apt-get failed (see /tmp/install_toolchains.log); dependent tests will skip" >&2; exit 0; }
