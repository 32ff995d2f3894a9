#!/usr/bin/env bash
# Runs one step of `make test` or `.ci/run` and records how long it took, so a
# slow CI run says which step grew (issue 23's target: a fresh `.ci/run` in at
# most 20 minutes). Appends "<seconds> <name>" to target/step-times.txt.
#
#   tests/ci/timed.sh NAME COMMAND [ARGS...]
set -uo pipefail
name=$1; shift
started=$(date +%s)
"$@"; status=$?
took=$(( $(date +%s) - started ))
mkdir -p target && echo "$took $name" >> target/step-times.txt
echo "[step] $name: $took s (exit $status)" >&2
exit "$status"
