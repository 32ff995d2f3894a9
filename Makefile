# agent-retry: the two commands are `make demo` and `make test`; both set up what
# they need on a fresh machine (the wasm32-wasip2 target, the component; for the
# tests also redis-server, the Python venv and the npm packages).

WASM_BUILD := target/wasm32-wasip2/wasm-release/agent_retry_policy.wasm
WASM := target/component/agent_retry_policy.wasm
# Contract 0.5.0 decides sessions, revisions, TLS and deadlines in the guest;
# 0.6.0 adds tasks, polls, continuations and expired handles, two exports and
# their texts; 0.8.0 the circuit breakers, their shared state and their words;
# 0.9.0 the snapshot and resume of an escalated run (a JSON document with a
# digest, read and written in the guest), the ratio retry budget and presets
# (`make targets`: the size against issue 23's 115,000).
WASM_LIMIT_BYTES := 200000
JCO := hosts/typescript/node_modules/@bytecodealliance/jco/src/jco.js
# Each step of `make test` prints and records its time (target/step-times.txt).
TIMED := tests/ci/timed.sh
# How many processes the Python and Node suites run their tests in: their tests
# mostly wait (on servers, backoff and timeouts), so one more than the cores
# (on 2 cores: Node 166 s -> 80 s, Python 170 s -> 79 s).
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
# What `make test` runs after the Rust tests and the Python suite (which run
# side by side), in this order.
TEST_STEPS := test-python-langchain test-ts events-agree judges test-hosts-agree docs-links lab-check dist-test fuzz-replay

.PHONY: setup wasm demo test vectors targets judge-setup judges judge-rust judge-proxy redis hostile noop events-agree

# The Python and Node hosts' targets (and the npm packages `wasm` needs for jco).
include hosts/hosts.mk

# The Python and Node hosts' targets (and the npm packages `wasm` needs for jco).

setup:
	rustup target add wasm32-wasip2

# The component. `--profile wasm-release` optimises it for size without slowing
# the host crates' release builds; then `jco opt` runs Binaryen's wasm-opt
# (size, no names section) over its core module: $(WASM) is what every host loads.
wasm: setup $(HOSTS_TS_MODULES)
	cargo build -p agent-retry-policy --target wasm32-wasip2 --profile wasm-release
	@mkdir -p $(dir $(WASM))
	node $(JCO) opt $(WASM_BUILD) -o $(WASM) --quiet
	python3 guest/strip_custom_sections.py $(WASM)
	@size=$$(stat -c %s $(WASM)); echo "$(WASM): $$size bytes (limit $(WASM_LIMIT_BYTES))"; \
	  test $$size -le $(WASM_LIMIT_BYTES) || { echo "the component is over its size budget"; exit 1; }

# The no-op component: the same world, no work; the benchmarks' boundary floor
# (docs/benchmark.md).
noop: setup
	cargo build -p agent-retry-noop --target wasm32-wasip2 --profile wasm-release
	@mkdir -p target/noop
	cp target/wasm32-wasip2/wasm-release/agent_retry_noop.wasm target/noop/agent_retry_noop.wasm

# The hostile components every host's sandbox tests load (target/hostile/), and
# the lying policy of the wrappers' guard tests (the guest's `liar` feature).
hostile: wasm
	cargo build -p agent-retry-policy --target wasm32-wasip2 --profile liar --features liar
	node tests/hostile/build.mjs

# The refund desk end to end: the demo MCP server, scripted agent runs, the table.
demo: wasm
	cargo run --release -p agent-retry-cli --bin agent-retry -- demo

# The thin-hosts targets (host source lines, the component's size), printed
# and written to docs/targets.md.
targets: wasm
	python3 tests/contract/measure_targets.py

# Rewrites tests/vectors/*.json from make_vectors.py.
vectors:
	python3 tests/vectors/make_vectors.py
	python3 tests/vectors/fleet/make_manifests.py

# redis-server for the account-budget tests and redis-cli for their fault
# injection (pause, FLUSHALL, wrong-typed keys), from Debian's packages if missing.
redis:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools; }

# Everything: Rust (unit, sandbox, MCP end to end, account budgets with Redis,
# the vectors natively and in wasmtime), then the Python and TypeScript hosts,
# the judge for all three, and the check that all three give the same outputs
# for every vector. The Python venv comes first: Rust's session tests run the
# `mcp` SDK's own server with it (tests/mcp-sdk-server/).
test: wasm hostile noop redis fault-proxy-setup hosts-python-setup
	python3 tests/vectors/make_vectors.py --check
	python3 tests/vectors/fleet/make_manifests.py --check
	python3 tests/contract/make_mirrors.py --check
	$(TIMED) cargo-test-build cargo test --release --workspace --no-run
	$(RUST_BINS)
	@# The Rust tests mostly wait (about 20 s of CPU in 90 s): they run beside the
	@# Python suite, their output shown after it (tests/ci/beside.sh).
	tests/ci/beside.sh target/cargo-test.log $(TIMED) cargo-test cargo test --release --workspace \
	  -- $(TIMED) test-python $(MAKE) --no-print-directory test-python
	@for step in $(TEST_STEPS); do $(TIMED) $$step $(MAKE) --no-print-directory $$step || exit 1; done

# The events scenario's dumps (target/events/<host>.json, written by each host's
# tests above) against tests/events/expected.json (docs/events.md).
events-agree:
	python3 tests/events/agree.py

# The workspace's release binaries: agent-retry (the judge, also the Rust host's
# exam client), agent-retry-lab and agent-retry-bench. `--examples` has Cargo
# resolve features with the dev-dependencies, as `cargo test --workspace` does,
# so after the tests this compiles nothing; a `-p` build unifies fewer features
# and compiled rmcp, tokio, serde and wasmtime again.
RUST_BINS := cargo build --release --workspace --bins --examples

judge-setup:
	$(RUST_BINS)

# The host-conformance judge against the Rust host (tests/judge/exam.json).
judge-rust: wasm judge-setup
	$(HOSTS_JUDGE) $(JUDGE_EXAM_rust)

# The judge against every host at once (each exam mostly waits on its faults;
# on 2 cores 25 s against 59 s one after another), each host's lines together.
# What they need is built first, once: the judge-run-* targets have no
# prerequisites, so nothing rewrites the component while another reads it.
judges: wasm judge-setup hosts-python-setup hosts-ts-setup
	$(MAKE) --no-print-directory -j4 --output-sync=target judge-run-rust judge-run-python judge-run-ts judge-run-proxy

# Each host's exam client. (judge-run-% is a pattern rule, so not .PHONY: make
# skips pattern rules for phony targets.)
JUDGE_EXAM_rust   = target/release/agent-retry exam
JUDGE_EXAM_proxy  = target/release/agent-retry exam --through-proxy
JUDGE_EXAM_python = $(CURDIR)/$(HOSTS_PY) -m agent_retry_policy.exam
JUDGE_EXAM_ts     = node $(CURDIR)/$(HOSTS_TS)/dist/src/exam.js
judge-run-%:
	$(HOSTS_JUDGE) $(JUDGE_EXAM_$*)

# The same exam, taken by a plain MCP client (no retries of its own) through
# `agent-retry proxy`: the policy's fourth host (docs/proxy.md).
judge-proxy: wasm judge-setup
	$(HOSTS_JUDGE) $(JUDGE_EXAM_proxy)

# The lab, the contention simulation and the benchmarks (tests/lab/lab.mk), and
# the packages (tests/dist/dist.mk).
-include tests/lab/lab.mk
-include tests/dist/dist.mk
# The API reference (`make docs`), docs/timeline.svg (`make timeline-doc`) and the
# Markdown link check (`make docs-links`): tests/dist/docs.mk.
-include tests/dist/docs.mk
# Fuzzing: fuzz-replay (in `test`), fuzz-component, fuzz-setup (nightly + cargo-fuzz), fuzz-long
# (writes docs/fuzzing.md; `make -j2 fuzz-long`), fuzz-report, fuzz-regressions (fuzz/README.md).
-include fuzz/fuzz.mk
