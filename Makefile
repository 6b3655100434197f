# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= config.toml

.PHONY: run test test-agents test-engines check lint bench clean test-prometheus test-browser test-docker

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

run: $(VENV)/.installed  ## start the demo: simulated pools + the gateway on 127.0.0.1:8000
	$(BIN)/latgate demo --config $(CONFIG)

# The fast suite: simulators and real servers on loopback only. It downloads nothing
# beyond the first run's `pip install -e '.[dev]'` into .venv (~700 MB installed).
test: $(VENV)/.installed  ## install and run the fast test suite
	@echo "make test: the fast suite (loopback only, no downloads); the real agent CLIs (~1.4 GB from npm) run in make test-agents"
	$(BIN)/python -m pytest -q -p no:cacheprovider

# The real coding-agent CLIs (Codex, Cline, Qwen Code, Claude Code) each complete a turn
# through latgate (tests/agents). The first run installs them from the npm registry
# (~1.4 GB) into AGENTS_CACHE; later runs reuse it (about a minute).
AGENTS_CACHE ?= $(HOME)/.cache/latgate-agents
test-agents: $(VENV)/.installed  ## real agent CLIs through latgate (first run downloads ~1.4 GB from npm)
	@echo "make test-agents: agent CLIs cached in $(AGENTS_CACHE) (a cold cache downloads ~1.4 GB from npm)"
	LATGATE_TIER=agents LATGATE_AGENTS_CACHE=$(AGENTS_CACHE) $(BIN)/python -m pytest -q -p no:cacheprovider tests/agents

# The engine tier: two real vLLM (CPU) replicas behind latgate (tests/engines/). The vLLM
# venv and the model are built once per machine under ENGINES_CACHE (keyed by versions).
ENGINES_CACHE ?= $(HOME)/.cache/latgate-engines
test-engines: $(VENV)/.installed  ## real vLLM behind latgate (first run installs ~3.5 GB)
	env $$(bash tests/engines/setup.sh $(ENGINES_CACHE)) $(BIN)/python -m pytest -q -p no:cacheprovider tests/engines

check: $(VENV)/.installed
	$(BIN)/latgate check --config $(CONFIG)

# ruff and mypy come with the dev extra, pinned (their checks change between versions); .ci/run runs this.
# No `ruff format --check`: ~48 files predate the formatter and the tree is not reformatted wholesale.
lint: $(VENV)/.installed  ## ruff over src, tests, benchmarks, tools (pyproject.toml [tool.ruff]); mypy over src/latgate ([tool.mypy]); the import contract (tools/layers.py); module and function sizes (tools/sizes.py)
	$(BIN)/python -m ruff check src tests benchmarks tools
	$(BIN)/python -m mypy
	$(BIN)/python tools/layers.py
	$(BIN)/python tools/sizes.py

# Real Prometheus (Debian's prometheus package, installed when missing) scraping a gateway
# in front of simulators: every dashboard query and alert rule evaluated (tests/prometheus).
test-prometheus: $(VENV)/.installed
	.ci/apt-need promtool=prometheus
	LATGATE_TIER=prometheus $(BIN)/python -m pytest -q -p no:cacheprovider tests/prometheus

# /ui in Debian's headless Chromium (installed when missing) against a demo stack; the
# screenshot lands in build/artifacts/ui.png (tests/browser).
test-browser: $(VENV)/.installed
	.ci/apt-need chromium=chromium
	LATGATE_TIER=browser $(BIN)/python -m pytest -q -p no:cacheprovider tests/browser

# The image built and run on a real Docker engine (docker.io; dockerd started with host
# networking only) on a debootstrap-made base image cached in the engine (tests/dockerimage).
test-docker: $(VENV)/.installed
	.ci/apt-need dockerd=docker.io debootstrap=debootstrap
	.ci/docker-engine start
	.ci/docker-engine base
	LATGATE_TIER=docker $(BIN)/python -m pytest -q -p no:cacheprovider tests/dockerimage; status=$$?; .ci/docker-engine stop; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build dist
