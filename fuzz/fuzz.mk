# Fuzzing and properties (issue 11). Included from the top-level Makefile
# (`-include fuzz/fuzz.mk`) or run as `make -f fuzz/fuzz.mk <target>`, from the
# repository root either way (every path here is relative to it).
#
#   fuzz-short      CI, stable Rust: fuzz-replay + fuzz-component (about 25 s of
#                   CPU once built; the component test needs `make wasm`'s component)
#   fuzz-replay     every corpus file and FUZZ_MUTATIONS seeded mutations per
#                   target through the targets' bodies (fuzz/tests/replay.rs)
#   fuzz-component  the corpus and seeded mutations through the component in
#                   wasmtime, compared with the native core (fuzz/tests/component.rs)
#   fuzz-setup      installs nightly Rust and cargo-fuzz (cargo install --locked)
#   fuzz-long       nightly + cargo-fuzz: each target for FUZZ_RUNS_<target>
#                   libFuzzer executions (10 million in total by default), niced,
#                   then fuzz-report; `make -j2` runs two targets at a time
#   fuzz-report     writes docs/fuzzing.md from the logs in fuzz/work/ (what ran)
#   fuzz-regressions the minimized reproducers of known bugs (fail until fixed)

FUZZ_DIR := fuzz
FUZZ_TARGETS := headers config json tool_error run flat snapshot
FUZZ_MUTATIONS ?= 50000
FUZZ_COMPONENT_MUTATIONS ?= 300
FUZZ_RUNS_headers ?= 700000
FUZZ_RUNS_config ?= 2000000
FUZZ_RUNS_json ?= 5500000
FUZZ_RUNS_tool_error ?= 300000
FUZZ_RUNS_run ?= 500000
# The flat path takes its share from json's (the total stays 10 million).
FUZZ_RUNS_flat ?= 500000
# The snapshot reader (contract 0.9.0) takes its share from config's.
FUZZ_RUNS_snapshot ?= 500000
FUZZ_MAX_LEN ?= 8192
# Safe Rust: AddressSanitizer finds nothing the checks do not, at a third of the speed.
FUZZ_SANITIZER ?= none
# Its own target directory: a stable build of fuzz/ (fuzz-short) does not block it.
FUZZ_TARGET_DIR ?= $(FUZZ_DIR)/target/libfuzzer
FUZZ_LIBFUZZER_ARGS ?= -max_len=$(FUZZ_MAX_LEN) -timeout=5 -print_final_stats=1
# Long runs share the machine with builds: they yield to them.
FUZZ_NICE ?= 19
FUZZ_REPORT ?= docs/fuzzing.md

.PHONY: fuzz-short fuzz-replay fuzz-component fuzz-regressions fuzz-setup fuzz-long fuzz-report fuzz-corpus

fuzz-short: fuzz-replay fuzz-component

fuzz-replay:
	cd $(FUZZ_DIR) && FUZZ_REPLAY_MUTATIONS=$(FUZZ_MUTATIONS) cargo test --release -p agent-retry-fuzz --test replay -- --nocapture

fuzz-component:
	@test -f target/component/agent_retry_policy.wasm || $(MAKE) --no-print-directory -f Makefile wasm
	cd $(FUZZ_DIR) && FUZZ_COMPONENT_MUTATIONS=$(FUZZ_COMPONENT_MUTATIONS) cargo test --release -p agent-retry-fuzz-component --test component -- --nocapture

fuzz-regressions:
	cd $(FUZZ_DIR) && cargo test --release -p agent-retry-fuzz --test replay -- --ignored --nocapture; \
	  cargo test --release -p agent-retry-fuzz-component --test component -- --ignored --nocapture

fuzz-setup:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

# Rewrites the text targets' seed corpus (fuzz/corpus/{headers,tool_error,config,json}).
fuzz-corpus:
	python3 $(FUZZ_DIR)/make_corpus.py

# One target's long run: libFuzzer's working corpus is fuzz/work/<target>/ (not
# committed), seeded from fuzz/corpus/<target>/; the log is fuzz/work/<target>.log
# and fuzz/work/<target>.meta says when, on which commit and under what load it
# ran (fuzz-report reads both). The build comes first, so that the seconds are
# the fuzzing's. A run stopped with SIGINT to the fuzzer (libFuzzer prints its
# final stats, exit 72) counts as interrupted, not failed.
fuzz-long-%: fuzz-setup
	@mkdir -p $(FUZZ_DIR)/work/$*
	@echo "fuzz-long $*: $(FUZZ_RUNS_$*) runs"
	@nice -n $(FUZZ_NICE) cargo +nightly fuzz build --fuzz-dir $(FUZZ_DIR) --target-dir $(FUZZ_TARGET_DIR) --features libfuzzer --sanitizer $(FUZZ_SANITIZER) $* \
	  > $(FUZZ_DIR)/work/$*.build.log 2>&1 || { tail -40 $(FUZZ_DIR)/work/$*.build.log; exit 1; }
	@meta=$(FUZZ_DIR)/work/$*.meta; start=$$(date +%s); \
	{ echo "target $*"; echo "runs-asked $(FUZZ_RUNS_$*)"; echo "started $$(date -u +%Y-%m-%dT%H:%M:%SZ)"; \
	  echo "commit $$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; \
	  echo "uncommitted $$(git status --porcelain -- guest fuzz 2>/dev/null | wc -l)"; \
	  echo "cores $$(nproc)"; echo "nice $(FUZZ_NICE)"; echo "load-start $$(cut -d' ' -f1-3 /proc/loadavg)"; } > $$meta; \
	nice -n $(FUZZ_NICE) cargo +nightly fuzz run --fuzz-dir $(FUZZ_DIR) --target-dir $(FUZZ_TARGET_DIR) --features libfuzzer --sanitizer $(FUZZ_SANITIZER) $* \
	  $(FUZZ_DIR)/work/$* $(FUZZ_DIR)/corpus/$* -- -runs=$(FUZZ_RUNS_$*) $(FUZZ_LIBFUZZER_ARGS) > $(FUZZ_DIR)/work/$*.log 2>&1; rc=$$?; \
	{ echo "seconds $$(( $$(date +%s) - start ))"; echo "load-end $$(cut -d' ' -f1-3 /proc/loadavg)"; echo "exit $$rc"; } >> $$meta; \
	if grep -q 'libFuzzer: run interrupted' $(FUZZ_DIR)/work/$*.log; then echo "fuzz-long $*: interrupted"; \
	elif [ $$rc -ne 0 ]; then tail -40 $(FUZZ_DIR)/work/$*.log; exit 1; fi; \
	echo "fuzz-long $*: $$(grep -E '^stat::number_of_executed_units' $(FUZZ_DIR)/work/$*.log | awk '{print $$2}') executions, $$(( $$(date +%s) - start )) s"

fuzz-long: $(addprefix fuzz-long-,$(FUZZ_TARGETS))
	@$(MAKE) --no-print-directory -f $(FUZZ_DIR)/fuzz.mk fuzz-report

# docs/fuzzing.md from whatever fuzz/work/ holds (also after a stopped run).
fuzz-report:
	python3 $(FUZZ_DIR)/fuzz_report.py --work $(FUZZ_DIR)/work --out $(FUZZ_REPORT) $(FUZZ_TARGETS)
