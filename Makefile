# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each target installs what it needs (idempotently) before it runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export DCGM_BRIDGE_CACHE ?= $(HOME)/.cache/dcgm-bridge
# make demo DEMO_DURATION=3 DEMO_OUT=/tmp/d: a short demo elsewhere (tests/test_readme.py runs it so).
DEMO_OUT ?= artifacts/demo

.PHONY: demo test lint unit servers bench bench-peers mutate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.runtime: pyproject.toml bridge/_kernel.c $(wildcard bridge/vendor/ryu/*) | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml bridge/_kernel.c $(wildcard bridge/vendor/ryu/*) | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(VENV)/.runtime

demo: $(VENV)/.runtime
	$(BIN)/dcgm-bridge demo --out $(DEMO_OUT)

# Real servers the tests use (VictoriaMetrics, Prometheus, etcd + apiextensions-apiserver; AIPerf 0.13.0 from
# PyPI in its own venv, scripts/install-aiperf.sh, for the `aiperf`-marked tests), installed
# from the package registries into $(DCGM_BRIDGE_CACHE), keyed by version; fast when already there.
servers:
	@for s in scripts/install-*.sh; do echo "== $$s"; bash "$$s" || exit 1; done

lint: $(VENV)/.test
	$(BIN)/ruff check bridge tests bench
	$(BIN)/mypy

# mypy (~15 CPU-s on a fresh clone) runs beside the tests at the lowest priority, in the CPU they leave idle while
# they wait on real seconds; the target fails where the tests or the lint fail.
test: $(VENV)/.test servers
	$(BIN)/ruff check bridge tests bench
	nice -n 19 $(BIN)/mypy > $(VENV)/mypy.log 2>&1 & mypy=$$!; \
	$(BIN)/pytest -q --durations=25; tests=$$?; \
	wait $$mypy; typed=$$?; cat $(VENV)/mypy.log; [ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# Everything not slow, root-only or needing the real servers: the quick loop while editing.
unit: $(VENV)/.test
	$(BIN)/pytest -q -m "not slow and not root and not realstack and not kubeapi and not aiperf"

bench: $(VENV)/.test
	$(BIN)/python bench/run.py

# The sidecar beside Prometheus (agent mode) and vmagent on the same pages, 10 minutes a load (20 in all): not in
# `make bench`. A quick look: `make bench-peers MINUTES=2`.
bench-peers: $(VENV)/.test servers
	$(BIN)/python bench/bench_peers.py $(if $(MINUTES),--minutes $(MINUTES))

# Deliberate faults in the report, the parser, the verdict and the dashboards, each run against only the tests that
# must catch it (scripts/mutate.py; the dashboard faults use the real servers). Not part of `make test` or CI.
mutate: $(VENV)/.test
	$(BIN)/python scripts/mutate.py

clean:
	rm -rf $(VENV) artifacts .pytest_cache .mypy_cache .ruff_cache
