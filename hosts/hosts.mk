# The Python and Node hosts. The top-level Makefile includes this file and defines
# `wasm` (the component at $(WASM)). Each target sets up what it needs on a fresh
# machine with python3/pip and node/npm: a venv at .venv, node_modules, jco's
# transpilation of the component, the TypeScript build.

HOSTS_VENV        := .venv
HOSTS_PY          := $(HOSTS_VENV)/bin/python
HOSTS_PY_STAMP    := $(HOSTS_VENV)/.agent-retry-installed
HOSTS_TS          := hosts/typescript
HOSTS_TS_MODULES  := $(HOSTS_TS)/node_modules/.package-lock.json
HOSTS_WASM        := $(WASM)

.PHONY: fault-proxy-setup
.PHONY: test-python test-ts test-hosts bench-hosts test-hosts-agree hosts-python-setup hosts-ts-setup judge-python judge-ts

$(HOSTS_PY):
	python3 -m venv $(HOSTS_VENV)

# Reinstalled when the package's dependencies change.
$(HOSTS_PY_STAMP): hosts/python/pyproject.toml | $(HOSTS_PY)
	$(HOSTS_PY) -m pip install --quiet --upgrade pip
	$(HOSTS_PY) -m pip install --quiet -e 'hosts/python[test,bench]'
	touch $@

hosts-python-setup: $(HOSTS_PY_STAMP)

# The LangChain adapter's venv: langchain-mcp-adapters 0.3.2 needs mcp<2, the MCP
# wrapper mcp>=2.3, so it has a venv of its own with the package WITHOUT the `mcp`
# extra (docs/cookbook/langchain.md). httpx2, pytest and redis are for the tests' conftest.
HOSTS_LC_VENV     := .venv-langchain
HOSTS_LC_STAMP    := $(HOSTS_LC_VENV)/.agent-retry-installed

$(HOSTS_LC_STAMP): hosts/python/pyproject.toml
	python3 -m venv $(HOSTS_LC_VENV)
	$(HOSTS_LC_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(HOSTS_LC_VENV)/bin/python -m pip install --quiet -e 'hosts/python[langchain]' 'httpx2>=2.10' 'pytest>=8' 'redis>=5'
	$(HOSTS_LC_VENV)/bin/python -c 'import langchain_mcp_adapters.interceptors, langgraph.prebuilt, mcp, agent_retry_policy.adapters.langchain'
	touch $@

.PHONY: hosts-langchain-setup test-python-langchain
hosts-langchain-setup: $(HOSTS_LC_STAMP)

test-python-langchain: wasm hosts-langchain-setup judge-setup
	cd hosts/python && ../../$(HOSTS_LC_VENV)/bin/python -m pytest -q tests/test_adapter_langchain.py

# The cross-host account test runs Node and Rust workers beside Python's (and
# Node's test runs Python's): each host's tests set the other two up.
# The tests run in TEST_JOBS processes (pytest-xdist hands out single tests; Makefile).
test-python: wasm hostile noop hosts-python-setup hosts-ts-setup fault-proxy-setup judge-setup
	cd hosts/python && ../../$(HOSTS_VENV)/bin/ruff check . && ../../$(HOSTS_VENV)/bin/ruff format --check .
	cd hosts/python && ../../$(HOSTS_PY) -m pytest -q -n $(TEST_JOBS)

$(HOSTS_TS_MODULES): $(HOSTS_TS)/package.json $(HOSTS_TS)/package-lock.json
	cd $(HOSTS_TS) && npm ci --no-audit --no-fund

# jco's transpilation of the component (into generated/), then the TypeScript build.
hosts-ts-setup: $(HOSTS_TS_MODULES)
	cd $(HOSTS_TS) && npm run --silent transpile && npm run --silent build

# `npm test` with TEST_JOBS test files at a time (Makefile), where the node has
# --test-concurrency (20.10 and later; Debian 12's own nodejs is 18: one at a time).
TS_TEST_CONCURRENCY = $(shell node --test-concurrency=1 -e 0 >/dev/null 2>&1 && echo --test-concurrency=$(TEST_JOBS))
test-ts: wasm hostile hosts-ts-setup hosts-python-setup fault-proxy-setup judge-setup
	cd $(HOSTS_TS) && node ../../tests/hostile/build.mjs && node --test $(TS_TEST_CONCURRENCY) --test-reporter=spec dist/test/

test-hosts: test-python test-ts

# Python and Node run every vector and must give byte-identical outputs to the
# Rust core's (target/vector-outputs-rust.jsonl, written by the Rust vector runner).
test-hosts-agree: wasm hosts-python-setup hosts-ts-setup
	$(HOSTS_PY) -m agent_retry_policy.conformance --dump target/vector-outputs-python.jsonl
	node $(HOSTS_TS)/dist/src/conformance.js --dump target/vector-outputs-node.jsonl
	@test -f target/vector-outputs-rust.jsonl || cargo test --release -p conformance --test vectors
	@passed=0; failed=0; for host in python node; do \
	  if cmp -s target/vector-outputs-rust.jsonl target/vector-outputs-$$host.jsonl; then \
	    echo "$$host: outputs identical to the Rust core for every vector"; passed=$$((passed+1)); \
	  else echo "$$host: outputs DIFFER from the Rust core"; failed=$$((failed+1)); fi; done; \
	  echo "agreement: $$passed passed, $$failed failed"; test $$failed -eq 0

# Per-decision cost against tenacity (Python) and p-retry (Node); figures in hosts/README.md.
bench-hosts: wasm noop hosts-python-setup hosts-ts-setup
	$(HOSTS_PY) hosts/python/bench/bench.py
	$(HOSTS_PY) hosts/python/bench/live.py
	cd $(HOSTS_TS) && npm run --silent bench && npm run --silent bench:live

# The host-conformance judge (tests/judge/exam.json) against each host's exam
# client: the judge serves the exam's faults, runs the client, and checks from
# the server's side what the host did. `judge-setup` (top-level Makefile) builds
# target/release/agent-retry.
HOSTS_JUDGE := target/release/agent-retry judge --exam tests/judge/exam.json --

judge-python: wasm hosts-python-setup judge-setup
	$(HOSTS_JUDGE) $(JUDGE_EXAM_python)

judge-ts: wasm hosts-ts-setup judge-setup
	$(HOSTS_JUDGE) $(JUDGE_EXAM_ts)

# The fault proxy's third-party server (@modelcontextprotocol/server-everything,
# tests/fault-proxy/README.md), for the wrapper tests of every host.
FAULT_PROXY_MODULES := tests/fault-proxy/node_modules/.package-lock.json
$(FAULT_PROXY_MODULES): tests/fault-proxy/package.json tests/fault-proxy/package-lock.json
	cd tests/fault-proxy && npm ci --no-audit --no-fund
fault-proxy-setup: $(FAULT_PROXY_MODULES)
