# The lab, the contention simulation and the benchmarks (included by the top-level
# Makefile). `lab` prints the tables and writes the plots into docs/; `lab-check`
# compares the tables (seeded, so exact) with tests/lab/expected.txt; `bench`
# runs every benchmark and writes target/bench/report.json and a table.

LAB_BIN   := target/release/agent-retry-lab
LAB_BENCH := target/release/agent-retry-bench

.PHONY: lab lab-build lab-check lab-expected bench bench-proxy

# RUST_BINS (top-level Makefile): the test build's feature set, nothing rebuilt.
lab-build: wasm
	$(RUST_BINS)

lab: lab-build
	$(LAB_BIN) --svg docs

# Fast and deterministic (about 10 s once built): CI runs it.
lab-check: lab-build
	@mkdir -p target/lab
	$(LAB_BIN) > target/lab/lab.txt
	@diff -u tests/lab/expected.txt target/lab/lab.txt && echo "lab-check: the lab and simulation tables are those of tests/lab/expected.txt"

# After a deliberate change of the policy, the mix or the simulation: rewrite the expected tables.
lab-expected: lab-build
	$(LAB_BIN) > tests/lab/expected.txt

# Every benchmark, each against a baseline measured in the same run; the outputs
# go to target/bench/*.txt and are gathered with the lab's own figures into
# target/bench/report.json. Needs redis-server (`make redis`) for the accounts bench.
bench: lab-build redis noop
	@mkdir -p target/bench
	cargo bench -p agent-retry-harness --bench decision > target/bench/decision.txt; s=$$?; cat target/bench/decision.txt; exit $$s
	cargo bench -p agent-retry-harness --bench accounts > target/bench/accounts.txt; s=$$?; cat target/bench/accounts.txt; exit $$s
	cargo bench -p agent-retry-harness --bench update > target/bench/update.txt; s=$$?; cat target/bench/update.txt; exit $$s
	$(MAKE) --no-print-directory bench-hosts > target/bench/hosts.txt 2>&1; s=$$?; cat target/bench/hosts.txt; exit $$s
	$(MAKE) --no-print-directory bench-proxy > target/bench/proxy.txt 2>&1; s=$$?; cat target/bench/proxy.txt; exit $$s
	$(LAB_BENCH) --out target/bench/report.json --outputs target/bench

# What `agent-retry proxy` adds per tool call against a direct connection, over
# stdio and HTTP; throughput at 1, 16 and 256 clients; memory (docs/proxy.md).
# Writes docs/proxy-benchmark.md. BENCH_PROXY_ARGS=--quick for a short run.
bench-proxy: lab-build
	cargo bench -p agent-retry-harness --bench proxy -- --out $(CURDIR)/docs/proxy-benchmark.md $(BENCH_PROXY_ARGS)
