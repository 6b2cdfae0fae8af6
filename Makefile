# cairn: make install | test | lint | bench | chaos | demo | test-lab
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements-ml.txt 2>/dev/null | cksum | cut -d' ' -f1)

.PHONY: install test test-fast lint bench chaos demo up down clean browser web-assets screenshot \
        test-lab

# The web UI's chart libraries, pinned in package.json/package-lock.json, copied from
# node_modules into the directory the API serves (services/api/web/vendor, not committed).
WEB_VENDOR := services/api/web/vendor
WEB_STAMP  := $(WEB_VENDOR)/.installed-$(shell cat package-lock.json 2>/dev/null | cksum | cut -d' ' -f1)

install: $(STAMP) $(WEB_STAMP)

web-assets: $(WEB_STAMP)

$(WEB_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@mkdir -p $(WEB_VENDOR)
	@rm -f $(WEB_VENDOR)/.installed-*
	cp node_modules/uplot/dist/uPlot.esm.js node_modules/uplot/dist/uPlot.min.css \
	   node_modules/echarts/dist/echarts.esm.min.js $(WEB_VENDOR)/
	@touch $@

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads a browser).
browser:
	@test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-ml.txt
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

test: install browser
	$(PY) -m pytest -q -p no:cacheprovider

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy events services cairn

bench: install browser
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-bench.txt
	$(PY) -m bench

# The chaos suite: each seed runs a 16-trial ASHA search on a fresh embedded cluster, once without
# faults and once while every component is killed, a leader paused, NATS rolled back and the
# cluster restarted; prints faults, recovery times and invariants; exit 1 if one broke.
# CHAOS_SEEDS=3,7 make chaos runs some seeds; each run is bounded by CHAOS_TIMEOUT seconds.
CHAOS_SEEDS   ?= 1-20
CHAOS_TIMEOUT ?= 300
chaos: install
	$(PY) -m tests.chaos --seeds $(CHAOS_SEEDS) --timeout $(CHAOS_TIMEOUT)

# The lab suite (never part of `make test`): a Docker engine (installed and started if need be),
# the images built offline from Debian packages and wheels, the compose cluster, an ASHA
# experiment with its trials in containers, an agent killed mid-trial; tests/lab.
test-lab: install
	deploy/lab/docker-engine.sh
	CAIRN_LAB=1 $(PY) -m pytest -q -p no:cacheprovider --timeout=3600 tests/lab

# The README's screenshot of the demo's experiment page (docs/webui-experiment.png).
screenshot: install browser
	$(PY) -m tests.browser.screenshot --out docs/webui-experiment.png

demo: install
	$(VENV)/bin/cairn demo

up: install
	$(VENV)/bin/cairn up

down: install
	$(VENV)/bin/cairn down

clean:
	rm -rf $(VENV) .cairn .pytest_cache .mypy_cache .ruff_cache
