# The API reference (`make docs`), the run timeline of the docs (`make
# timeline-doc`) and the Markdown link check (`make docs-links`). Included by
# the top-level Makefile, which defines `wasm` and `judge-setup`; hosts/hosts.mk
# defines HOSTS_PY, HOSTS_TS, hosts-python-setup and hosts-ts-setup;
# tests/dist/dist.mk DIST_VERSION and DIST_CONTRACT. docs/api.md says what is
# built where. Nothing here uses the network.

DOCS_OUT      := target/docs
TIMELINE_LOG  := target/timeline/demo.jsonl

.PHONY: docs docs-rust docs-python docs-ts docs-index docs-links timeline-doc

docs: docs-rust docs-python docs-ts docs-index
	@echo "API reference: $(DOCS_OUT)/index.html"

# rustdoc for the host crate; -D warnings makes a broken intra-doc link an error.
# --no-deps documents this crate only (dependencies are checked, not documented).
docs-rust:
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p agent-retry-host --release
	@rm -rf $(DOCS_OUT)/rust && mkdir -p $(DOCS_OUT)
	cp -r target/doc $(DOCS_OUT)/rust

# pdoc for the Python package (imported from the venv's editable install): the
# package and its public modules (tests/dist/pdoc_modules.py lists them, and
# leaves out one whose optional dependency is not in the venv, saying so).
docs-python: hosts-python-setup
	@rm -rf $(DOCS_OUT)/python
	specs=$$($(HOSTS_PY) tests/dist/pdoc_modules.py) && $(HOSTS_VENV)/bin/pdoc $$specs -o $(DOCS_OUT)/python --docformat markdown

# TypeDoc for the Node package's entry points (hosts/typescript/typedoc.json):
# a link TypeDoc cannot resolve is an error. Type errors are tsc's to report
# (`npm run build`), so TypeDoc skips checking them.
docs-ts: $(HOSTS_TS_MODULES)
	@rm -rf $(DOCS_OUT)/typescript
	cd $(HOSTS_TS) && node node_modules/typedoc/bin/typedoc --options typedoc.json --treatWarningsAsErrors --logLevel Warn

docs-index:
	@mkdir -p $(DOCS_OUT)
	sed -e 's/{{version}}/$(DIST_VERSION)/g' -e 's/{{contract}}/$(DIST_CONTRACT)/g' tests/dist/docs-index.html > $(DOCS_OUT)/index.html

# Every relative link of docs/, README.md and the hosts' READMEs, and of the
# package README templates, names a file and, with #anchor, a heading in it.
# The checker's own tests first (a fixture with dead links must fail).
docs-links:
	python3 -m unittest discover -s tests/dist -p 'test_*.py' -q
	python3 tests/dist/check_links.py
	python3 tests/dist/check_links.py tests/dist/readme/*.md

# docs/timeline.svg from a real run: the demo (seeded) writes its JSON lines,
# `agent-retry timeline` draws them, one lane per run.
timeline-doc: wasm judge-setup
	@mkdir -p $(dir $(TIMELINE_LOG))
	target/release/agent-retry demo --seed 3 --runs 12 --workers 4 --log $(TIMELINE_LOG) > /dev/null
	target/release/agent-retry timeline $(TIMELINE_LOG) --out docs/timeline.svg
