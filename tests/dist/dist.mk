# The packages and the component as release artifacts (`make dist`), and the
# fresh-environment tests that install them (`make dist-test`). Included by the
# top-level Makefile, which defines WASM, WASM_LIMIT_BYTES, JCO and `wasm`;
# hosts/hosts.mk defines HOSTS_PY and hosts-ts-setup. tests/dist/README.md says
# what is written where and how to push the component with `wkg`.

DIST            := target/dist
DIST_STAGE      := target/dist-stage
# One version for the packages: the Rust workspace's, checked against
# pyproject.toml and package.json by dist-check-versions. The contract (the WIT
# package) has its own: a patch of the packages (0.4.1) implements the same
# contract (0.4.0), so only their major.minor must agree.
DIST_VERSION    := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n 1)
DIST_CONTRACT   := $(shell sed -n 's/^package agent-retry:policy@\(.*\);$$/\1/p' wit/world.wit)
DIST_WASM       := $(DIST)/component/agent_retry_policy.wasm
# The component's registry metadata (tests/dist/add-metadata.mjs). The source URL
# is written only when given (`make dist DIST_SOURCE_URL=https://...`, where the
# repository is published): no placeholder is shipped.
DIST_SOURCE_URL ?=
# The packages' READMEs (tests/dist/readme/, by tests/dist/package_readme.py):
# links that leave the package point at DIST_SOURCE_URL's files at
# DIST_SOURCE_REF (default: this commit; `DIST_SOURCE_REF=v0.9.0` for a tag),
# or, with no URL, name the file in the repository as text.
DIST_SOURCE_REF ?= $(shell git rev-parse HEAD 2>/dev/null)
DIST_README     := python3 tests/dist/package_readme.py --version $(DIST_VERSION) --contract $(DIST_CONTRACT) \
                   $(if $(DIST_SOURCE_URL),--source-url $(DIST_SOURCE_URL) --source-ref $(DIST_SOURCE_REF))
DIST_METADATA   := --name agent-retry:policy --version $(DIST_CONTRACT) --licenses Apache-2.0 \
                   $(if $(DIST_SOURCE_URL),--source $(DIST_SOURCE_URL)) --description "Retry, failure classification and budgets for AI agents calling MCP tools"

.PHONY: dist dist-check-versions wasm-metadata dist-component dist-python dist-npm dist-crate dist-test

dist: dist-check-versions dist-component dist-python dist-npm dist-crate
	@cp tests/dist/README.md $(DIST)/README.md
	@cd $(DIST) && find component python npm crate README.md -type f | LC_ALL=C sort | xargs sha256sum > SHA256SUMS
	@echo "$(DIST):"; cd $(DIST) && ls -l component/*.wasm python/*.whl npm/*.tgz crate/*.crate | awk '{print "  " $$9 ": " $$5 " bytes"}'
	@echo "  SHA256SUMS: $$(wc -l < $(DIST)/SHA256SUMS) files"

dist-check-versions:
	@py=$$(sed -n 's/^version = "\(.*\)"$$/\1/p' hosts/python/pyproject.toml); \
	 npm=$$(node -p "require('./hosts/typescript/package.json').version"); \
	 echo "versions: Cargo $(DIST_VERSION), Python $$py, npm $$npm; contract (WIT) $(DIST_CONTRACT)"; \
	 test "$(DIST_VERSION)" = "$$py" && test "$$py" = "$$npm" \
	   || { echo "the versions differ: one version for the crates, the wheel and the npm package"; exit 1; }; \
	 test "$${py%.*}" = "$(basename $(DIST_CONTRACT))" \
	   || { echo "the packages $$py do not implement contract $(DIST_CONTRACT): their major.minor must agree"; exit 1; }

# The registry metadata written into $(WASM) itself (idempotent), for the `wasm`
# target if every build is to carry it.
wasm-metadata:
	node tests/dist/add-metadata.mjs $(WASM) $(WASM) $(DIST_METADATA)

# The component with its metadata, and its WIT package (the text files wkg builds from).
dist-component: wasm
	@mkdir -p $(DIST)/component
	node tests/dist/add-metadata.mjs $(WASM) $(DIST_WASM) $(DIST_METADATA)
	@size=$$(stat -c %s $(DIST_WASM)); test $$size -le $(WASM_LIMIT_BYTES) \
	  || { echo "$(DIST_WASM): $$size bytes, over the limit $(WASM_LIMIT_BYTES)"; exit 1; }
	@rm -rf $(DIST)/component/wit && mkdir -p $(DIST)/component/wit
	@cd wit && find . -name '*.wit' | while read -r f; do mkdir -p ../$(DIST)/component/wit/$$(dirname $$f); cp $$f ../$(DIST)/component/wit/$$f; done
	@# The transpiled component's exports must name the same version (what the hosts check).
	@node $(JCO) wit $(DIST_WASM) | grep -q "export agent-retry:policy/policy@$(DIST_CONTRACT);" \
	  || { echo "$(DIST_WASM) does not export agent-retry:policy/policy@$(DIST_CONTRACT)"; exit 1; }

# The wheel, from a staging copy of hosts/python with the component and LICENSE
# in it (the source tree never holds a .wasm: an editable install keeps loading target/).
dist-python: dist-component hosts-python-setup
	@rm -rf $(DIST_STAGE)/python $(DIST)/python && mkdir -p $(DIST_STAGE) $(DIST)/python
	cp -r hosts/python $(DIST_STAGE)/python
	@rm -rf $(DIST_STAGE)/python/src/*.egg-info $(DIST_STAGE)/python/build $(DIST_STAGE)/python/.pytest_cache
	@find $(DIST_STAGE)/python -name __pycache__ -prune -exec rm -rf {} +
	cp LICENSE $(DIST_STAGE)/python/LICENSE
	cp $(DIST_WASM) $(DIST_STAGE)/python/src/agent_retry_policy/agent_retry_policy.wasm
	cp tests/vectors/gate.json $(DIST_STAGE)/python/src/agent_retry_policy/gate.json
	$(DIST_README) tests/dist/readme/python.md $(DIST_STAGE)/python/README.md
	$(HOSTS_PY) -m pip wheel --quiet --no-deps -w $(DIST)/python $(DIST_STAGE)/python
	@$(HOSTS_PY) -c "import sys, zipfile; names = zipfile.ZipFile(sys.argv[1]).namelist(); \
	  assert 'agent_retry_policy/agent_retry_policy.wasm' in names, names; \
	  assert 'agent_retry_policy/gate.json' in names, names; print(sys.argv[1], 'carries the component and the gate vectors')" $(DIST)/python/*.whl

# The npm tarball, from a staging copy whose dist/generated is jco's transpilation
# of $(DIST_WASM) (so the package runs without Rust and carries the metadata).
dist-npm: dist-component hosts-ts-setup
	@rm -rf $(DIST_STAGE)/npm $(DIST)/npm && mkdir -p $(DIST_STAGE)/npm/dist $(DIST)/npm
	cp hosts/typescript/package.json hosts/typescript/KNOWN_GAPS.md LICENSE $(DIST_STAGE)/npm/
	$(DIST_README) tests/dist/readme/npm.md $(DIST_STAGE)/npm/README.md --ships LICENSE=LICENSE
	cp -r hosts/typescript/scripts $(DIST_STAGE)/npm/scripts
	cp -r hosts/typescript/dist/src $(DIST_STAGE)/npm/dist/src
	node hosts/typescript/scripts/transpile.mjs $(DIST_WASM) $(DIST_STAGE)/npm/dist/generated
	@# The record of where it came from names the file, not this machine's path.
	node -e "const f=process.argv[1], s=JSON.parse(require('fs').readFileSync(f)); s.wasm='agent_retry_policy.wasm'; require('fs').writeFileSync(f, JSON.stringify(s, null, 2) + '\n')" $(DIST_STAGE)/npm/dist/generated/source.json
	cd $(DIST_STAGE)/npm && npm pack --silent --pack-destination $(CURDIR)/$(DIST)/npm >/dev/null
	@ls $(DIST)/npm/agent-retry-policy-$(DIST_VERSION).tgz

# The crate package of agent-retry-host with the component embedded: the .wasm is
# copied into hosts/rust/component/ (ignored by git) only while `cargo package`
# runs. --no-verify: `make dist-test` builds the packaged crate in a new project
# instead (release, sharing target/ so wasmtime is not compiled again). The
# directory's time is put back afterwards: the crate's build script reruns when
# component/ changes, and adding and removing the file made every later build
# compile the host and all that depends on it again (124 s of a fresh CI run).
dist-crate: dist-component
	@rm -rf $(DIST)/crate && mkdir -p $(DIST)/crate $(DIST_STAGE)
	@touch -r hosts/rust/component $(DIST_STAGE)/component-dir-time; \
	  trap 'rm -f hosts/rust/component/agent_retry_policy.wasm; touch -r $(DIST_STAGE)/component-dir-time hosts/rust/component' EXIT; \
	  cp $(DIST_WASM) hosts/rust/component/agent_retry_policy.wasm && \
	  cargo package -p agent-retry-host --allow-dirty --no-verify --quiet
	cp target/package/agent-retry-host-$(DIST_VERSION).crate $(DIST)/crate/
	@# The crate's README is the generated one; hosts/rust/README.md stays the repository's guide.
	@mkdir -p $(DIST_STAGE)
	$(DIST_README) tests/dist/readme/crate.md $(DIST_STAGE)/crate-README.md --ships LICENSE=LICENSE
	python3 tests/dist/replace_in_crate.py $(DIST)/crate/agent-retry-host-$(DIST_VERSION).crate README.md $(DIST_STAGE)/crate-README.md
	@tar tzf $(DIST)/crate/agent-retry-host-$(DIST_VERSION).crate | grep -q component/agent_retry_policy.wasm \
	  && echo "$(DIST)/crate/agent-retry-host-$(DIST_VERSION).crate carries the component"

# Installs each package from $(DIST) in a new environment (venv, npm project,
# Cargo project in temporary directories) and runs the refund-desk example
# against the demo server (target/release/agent-retry serve).
dist-test: dist judge-setup
	bash tests/dist/fresh-env.sh
