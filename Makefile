# cairn: make install | test | lint | bench | demo
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements-ml.txt 2>/dev/null | cksum | cut -d' ' -f1)

.PHONY: install test test-fast lint bench demo up down clean

install: $(STAMP)

$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-ml.txt
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

test: install
	$(PY) -m pytest -q -p no:cacheprovider

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy events services

bench: install
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-bench.txt
	$(PY) -m bench

demo: install
	$(VENV)/bin/cairn demo

up: install
	$(VENV)/bin/cairn up

down: install
	$(VENV)/bin/cairn down

clean:
	rm -rf $(VENV) .cairn .pytest_cache .mypy_cache .ruff_cache
