#!/bin/sh
# Compares jco versions' generated glue on this component (the reason package.json
# pins @bytecodealliance/jco 1.12.0). Installs both into a scratch directory
# (~250 MB, ~30 s), transpiles the component with each, and measures each twice.
#   sh hosts/typescript/bench/jco-versions.sh [path/to/agent_retry_policy.wasm]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
wasm=${1:-$here/../../../target/component/agent_retry_policy.wasm}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
npm init -y >/dev/null && npm pkg set type=module
npm install --silent --no-audit --no-fund jco112@npm:@bytecodealliance/jco@1.12.0 jco135@npm:@bytecodealliance/jco@1.35.0
node node_modules/jco112/src/jco.js transpile "$wasm" -o out-1.12.0 --instantiation async --name agent_retry_policy --quiet
node node_modules/jco135/dist/jco.js transpile "$wasm" -o out-1.35.0 --instantiation async --name agent_retry_policy --quiet
for round in 1 2; do
  for version in 1.12.0 1.35.0; do node "$here/jco-measure.mjs" "out-$version"; done
done
