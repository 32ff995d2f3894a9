#!/usr/bin/env bash
# Fresh-environment tests of the `make dist` outputs: a new venv installs the
# wheel, a new npm project the tarball, a new Cargo project the packaged crate,
# each in a temporary directory, and each runs the refund-desk example
# (tests/dist/examples) against its own demo server. Nothing of the repository's
# build tree is used at run time but target/dist and the demo server binary
# (the Cargo project shares target/ as its CARGO_TARGET_DIR only so that wasmtime
# is not compiled a second time). Ends with "fresh-env: N passed, N failed".
#
#   bash tests/dist/fresh-env.sh [python] [node] [rust]      (default: all three)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dist=$repo/target/dist
server_bin=$repo/target/release/agent-retry
examples=$repo/tests/dist/examples
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
hosts=("$@"); [ ${#hosts[@]} -eq 0 ] && hosts=(python node rust)
work=$(mktemp -d /tmp/agent-retry-fresh.XXXXXX)
server_pid=
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
unset AGENT_RETRY_WASM PYTHONPATH NODE_PATH VIRTUAL_ENV

for f in "$server_bin" "$dist/python/agent_retry_policy-$version-py3-none-any.whl" \
         "$dist/npm/agent-retry-policy-$version.tgz" "$dist/crate/agent-retry-host-$version.crate"; do
  [ -f "$f" ] || { echo "missing $f: run make dist (and cargo build --release -p agent-retry-cli)"; exit 1; }
done

# A demo server with the example's faults on a free loopback port; sets $url.
start_server() {
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$server_bin" serve --http "127.0.0.1:$port" --faults "$examples/faults.json" 2>"$work/server-$1.log" &
  server_pid=$!
  url="http://127.0.0.1:$port/mcp"
  for _ in $(seq 1 100); do
    grep -q "demo MCP server at" "$work/server-$1.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "the demo server did not start:"; cat "$work/server-$1.log"; return 1
}
stop_server() { kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=; }

# The example's JSON line: the lookup and the refund got through their 503s (two
# retries), the refund above the limit, a task that asks a person (MCP
# 2026-07-28's Tasks extension) with no handler to answer, escalated
# input-required.
check() {
  python3 - "$1" "$2" <<'PY'
import json, sys
host, out = sys.argv[1], sys.argv[2]
lines = [l for l in out.splitlines() if l.startswith("{")]
got = json.loads(lines[-1]) if lines else {}
want = {"host": host, "order": "delivered", "refunded": True, "escalated": "input-required", "retries": 2}
bad = {k: got.get(k) for k, v in want.items() if got.get(k) != v}
print(f"{host}: {json.dumps(got)}")
sys.exit(1 if bad else 0)
PY
}

passed=0; failed=0
result() {  # name, status
  if [ "$2" -eq 0 ]; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}

run_python() {
  local dir=$work/python; mkdir -p "$dir" && cd "$dir" || return 1
  python3 -m venv venv && venv/bin/pip install --quiet --disable-pip-version-check \
    "$dist/python/agent_retry_policy-$version-py3-none-any.whl[mcp]" || return 1
  venv/bin/python -c "import agent_retry_policy as p, sys; b = p.component.bundled_component(); \
    print('installed at', p.__file__, '; bundled component:', b); sys.exit(0 if b and '$repo' not in str(b) else 1)" || return 1
  cp "$examples/python/agent.py" . && start_server python || return 1
  local out; out=$(timeout 60 venv/bin/python agent.py "$url" 2>"$dir/stderr.log"); local rc=$?
  stop_server
  [ $rc -eq 0 ] || { cat "$dir/stderr.log"; return 1; }
  check python "$out"
}

run_node() {
  local dir=$work/node; mkdir -p "$dir" && cd "$dir" || return 1
  npm init -y >/dev/null && npm pkg set type=module >/dev/null || return 1
  npm install --silent --no-audit --no-fund "$dist/npm/agent-retry-policy-$version.tgz" '@modelcontextprotocol/client@^2.4.0' || return 1
  [ ! -e node_modules/agent-retry-policy/dist/generated/agent_retry_policy.core.wasm ] && { echo "no transpiled component in the tarball"; return 1; }
  cp "$examples/node/agent.mjs" . && start_server node || return 1
  local out; out=$(timeout 60 node agent.mjs "$url" 2>"$dir/stderr.log"); local rc=$?
  stop_server
  [ $rc -eq 0 ] || { cat "$dir/stderr.log"; return 1; }
  check node "$out"
}

run_rust() {
  local dir=$work/rust; mkdir -p "$dir/src" && cd "$dir" || return 1
  tar xzf "$dist/crate/agent-retry-host-$version.crate" -C "$work" || return 1
  local crate=$work/agent-retry-host-$version
  sed "s|@CRATE_DIR@|$crate|" "$examples/rust/Cargo.toml.in" > Cargo.toml
  cp "$examples/rust/src/main.rs" src/main.rs
  # The packaged crate's lock file: the same dependency versions as the workspace,
  # so the shared target/ already holds them compiled.
  cp "$crate/Cargo.lock" Cargo.lock
  CARGO_TARGET_DIR=$repo/target cargo build --release --quiet 2>"$dir/build.log" || { tail -30 "$dir/build.log"; return 1; }
  local bin=$repo/target/release/agent-retry-fresh-example
  start_server rust || return 1
  local out; out=$(cd "$dir" && timeout 60 "$bin" "$url" 2>"$dir/stderr.log"); local rc=$?
  stop_server
  [ $rc -eq 0 ] || { cat "$dir/stderr.log"; return 1; }
  check rust "$out"
}

for host in "${hosts[@]}"; do
  start=$(date +%s)
  "run_$host"; status=$?
  result "$host: installed from $dist and ran the example ($(( $(date +%s) - start )) s)" $status
done
echo "fresh-env: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
