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
#   fuzz-long       nightly + cargo-fuzz: each target for FUZZ_RUNS_<target>
#                   libFuzzer executions (10 million in total by default)
#   fuzz-regressions the minimized reproducers of known bugs (fail until fixed)

FUZZ_DIR := fuzz
FUZZ_TARGETS := headers config json tool_error run
FUZZ_MUTATIONS ?= 50000
FUZZ_COMPONENT_MUTATIONS ?= 300
FUZZ_RUNS_headers ?= 700000
FUZZ_RUNS_config ?= 2500000
FUZZ_RUNS_json ?= 6000000
FUZZ_RUNS_tool_error ?= 300000
FUZZ_RUNS_run ?= 500000
FUZZ_MAX_LEN ?= 8192
# Safe Rust: AddressSanitizer finds nothing the checks do not, at a third of the speed.
FUZZ_SANITIZER ?= none
# Its own target directory: a stable build of fuzz/ (fuzz-short) does not block it.
FUZZ_TARGET_DIR ?= $(FUZZ_DIR)/target/libfuzzer
FUZZ_LIBFUZZER_ARGS ?= -max_len=$(FUZZ_MAX_LEN) -timeout=5 -print_final_stats=1

.PHONY: fuzz-short fuzz-replay fuzz-component fuzz-regressions fuzz-setup fuzz-long fuzz-corpus

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
# committed), seeded from fuzz/corpus/<target>/; the log is fuzz/work/<target>.log.
fuzz-long-%: fuzz-setup
	@mkdir -p $(FUZZ_DIR)/work/$*
	@echo "fuzz-long $*: $(FUZZ_RUNS_$*) runs"
	@start=$$(date +%s); \
	cargo +nightly fuzz run --fuzz-dir $(FUZZ_DIR) --target-dir $(FUZZ_TARGET_DIR) --features libfuzzer --sanitizer $(FUZZ_SANITIZER) $* \
	  $(FUZZ_DIR)/work/$* $(FUZZ_DIR)/corpus/$* -- -runs=$(FUZZ_RUNS_$*) $(FUZZ_LIBFUZZER_ARGS) > $(FUZZ_DIR)/work/$*.log 2>&1 \
	  || { tail -40 $(FUZZ_DIR)/work/$*.log; exit 1; }; \
	echo "fuzz-long $*: $$(grep -E '^stat::number_of_executed_units' $(FUZZ_DIR)/work/$*.log | awk '{print $$2}') executions, 0 crashes, $$(( $$(date +%s) - start )) s"

fuzz-long: $(addprefix fuzz-long-,$(FUZZ_TARGETS))
