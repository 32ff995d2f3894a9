#!/usr/bin/env bash
# Runs one step of `make test` beside another: the first command in the
# background, its output kept in LOG and printed once both have ended (so the
# two never interleave), the second in the foreground. Fails if either failed.
# For a step that mostly waits (the Rust tests: servers, backoff and rate
# limits, about 20 s of CPU in 90 s) beside one that does not fill two cores.
#
#   tests/ci/beside.sh LOG BACKGROUND... -- FOREGROUND...
set -uo pipefail
log=$1; shift
background=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do background+=("$1"); shift; done
[ $# -gt 1 ] || { echo "usage: beside.sh LOG BACKGROUND... -- FOREGROUND..." >&2; exit 2; }
shift
mkdir -p "$(dirname "$log")"
"${background[@]}" > "$log" 2>&1 &
pid=$!
"$@"; foreground=$?
wait "$pid"; behind=$?
echo "--- ${background[*]} (ran beside the step above; its output, $log):"
cat "$log"
[ "$foreground" -eq 0 ] && [ "$behind" -eq 0 ]
