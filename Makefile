# One entry point per job. `make demo` and `make test` set everything up on a fresh machine
# that has only python3 and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint format bench clean fuzz-smoke load-smoke load-soak dist

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The wheel users install (`pip install dist/schedguard-*.whl`, extras as `'...whl[load]'`),
# built by pip in a venv of its own under build/ (nothing of .venv needed).
DIST_VENV := build/dist-venv
dist:
	test -x $(DIST_VENV)/bin/pip || $(PYTHON) -m venv $(DIST_VENV)
	rm -f dist/schedguard-*.whl
	$(DIST_VENV)/bin/pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/schedguard-*.whl

demo: $(STAMP)
	$(BIN)/schedguard demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# ruff, mypy (strict), and the import contracts of pyproject.toml's [tool.importlinter].
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo --no-cache

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Every fuzz target briefly (FUZZ_SMOKE_S seconds each, all engines available here sharing it);
# fails when a hardened or guard target has a finding. Reports and any payload files go to
# FUZZ_SMOKE_OUT, not into payloads/.
FUZZ_SMOKE_S ?= 20
FUZZ_SMOKE_ENGINE ?= all
FUZZ_SMOKE_OUT ?= build/fuzz-smoke
FUZZ_TARGETS := placeholder-vulnerable placeholder-hardened chat-template-vulnerable \
	chat-template-hardened guard-pipeline guard-app scheduler-state

fuzz-smoke: $(STAMP)
	@status=0; for t in $(FUZZ_TARGETS); do \
	  $(BIN)/schedguard fuzz run --target $$t --engine $(FUZZ_SMOKE_ENGINE) \
	    --duration $(FUZZ_SMOKE_S) --minimise-s 5 --seed 1 --out $(FUZZ_SMOKE_OUT)/$$t \
	    --found-root $(FUZZ_SMOKE_OUT)/corpus || status=1; \
	done; exit $$status

bench: $(STAMP)
	$(BIN)/python bench/seed.py

# ~30 s of benign and attack traffic through the guard in front of the vulnerable reference
# scheduler; fails when an SLO does (loadtests/README.md). Reports in out/load-smoke/.
load-smoke: $(STAMP)
	$(BIN)/schedguard load --duration 30 --users 6 --attack-share 0.3 --out out/load-smoke

# The 10-minute soak: the RSS slope of guard and upstream is gated (MB per minute).
load-soak: $(STAMP)
	$(BIN)/schedguard load --duration 600 --users 20 --attack-share 0.3 --max-rss-slope 1.0 \
		--out out/load-soak

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Real LLM servers (vLLM, llama-cpp-python) with tiny local models, set up once into
# ${SCHEDGUARD_UPSTREAMS_DIR:-~/.cache/schedguard/upstreams} (~10 min the first time, then a
# no-op), then the end-to-end tests against them (scripts/upstreams/README.md).
.PHONY: e2e
e2e: $(STAMP)
	$(PYTHON) scripts/upstreams/upstreams.py setup all
	SCHEDGUARD_E2E=1 $(BIN)/python -m pytest -q tests/e2e
