# cairn: make install | test | lint | bench | chaos | failover | demo | test-lab | test-hosts | test-slurm
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock 2>/dev/null | cksum | cut -d' ' -f1)

.PHONY: install lock test test-fast test-dist horovod deepspeed test-deepspeed lint bench chaos failover property demo up down clean \
        browser web-assets screenshot test-search test-lab test-hosts test-slurm

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

# Every package of the development environment comes from requirements.lock (exact versions and
# their hashes), then cairn itself without its dependencies, so two installs are the same. A
# package the lock no longer names stays in .venv until `make clean`.
$(STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --require-hashes -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

# Regenerates requirements.lock from pyproject.toml (every extra) and requirements-ml.txt with
# pip-compile (pip-tools, pinned, in its own .venv-lock). Pins the bounds still allow are kept;
# LOCK_FLAGS=--upgrade (or --upgrade-package NAME) moves them. A few minutes: it fetches every
# file of each pinned release to hash it. Then `make install`.
PIP_TOOLS  := pip-tools==7.6.2
LOCK_FLAGS ?=
lock:
	@test -x .venv-lock/bin/pip-compile || ($(PYTHON) -m venv .venv-lock \
	    && .venv-lock/bin/pip install -q --disable-pip-version-check $(PIP_TOOLS))
	CUSTOM_COMPILE_COMMAND="make lock" .venv-lock/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras $(LOCK_FLAGS) \
	    --extra server --extra s3 --extra dev --no-emit-index-url --no-emit-find-links \
	    --output-file requirements.lock pyproject.toml requirements-ml.txt

test: install browser
	$(PY) -m pytest -q -p no:cacheprovider

# DDP on the digits MLP across two agents (2 slots each, gloo on CPU): a rank SIGKILLed mid-run
# and an agent SIGKILLed mid-run each restart the gang from its checkpoint to completion, and
# 4 ranks follow the 1-rank loss curve (about 5 minutes on 2 cores).
test-dist: install
	CAIRN_TEST_DIST=1 $(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_distributed.py

# Horovod (opt-in, for `python3 -m cairn.launch.horovod`): 0.28.1 is the last release and it
# compiles as C++14, which torch 2.13's headers refuse. The source release is built with
# `set(CMAKE_CXX_STANDARD 14)` made 17: in horovod/torch (torch's headers) and at the top level
# (gloo too, or gloo's C++14 out-of-line `Store::kDefaultTimeout` clashes at link time with the
# inline one C++17 code sees). CPU and gloo only: no MPI, no TensorFlow. Minutes of compiling.
HOROVOD_VERSION := 0.28.1
HOROVOD_SRC     := .horovod-build/horovod-$(HOROVOD_VERSION)
horovod: install
	rm -rf .horovod-build && mkdir -p .horovod-build
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
	    horovod==$(HOROVOD_VERSION) -d .horovod-build
	tar -xzf .horovod-build/horovod-$(HOROVOD_VERSION).tar.gz -C .horovod-build
	sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
	    $(HOROVOD_SRC)/CMakeLists.txt $(HOROVOD_SRC)/horovod/torch/CMakeLists.txt
	HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
	HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO \
	    $(PY) -m pip install --disable-pip-version-check --no-build-isolation $(HOROVOD_SRC)

# DeepSpeed (opt-in, for `python3 -m determined.launch.deepspeed` / `cairn.launch.deepspeed`):
# its release is a source package that builds against the installed torch, so it is installed
# without build isolation and without its CUDA-only dependencies (CPU ranks talk over gloo; its
# shared-memory op is compiled on first use, about a minute).
DEEPSPEED_PINS := deepspeed==0.19.8 hjson==3.1.0 ninja==1.13.2 py-cpuinfo==9.0.0 msgpack==1.2.4 \
                  einops==0.8.2
deepspeed: install
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation $(DEEPSPEED_PINS)

# A trial on two CPU slots through `python3 -m determined.launch.deepspeed` (a few minutes).
test-deepspeed: deepspeed
	CAIRN_TEST_DEEPSPEED=1 $(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_deepspeed_trial.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy events services cairn

bench: install browser
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-bench.txt
	$(PY) -m bench

# The property tests with many random examples (make test runs a few): usage billing equals the
# allocation intervals, and batched projection equals applying one event at a time.
PROPERTY_EXAMPLES ?= 100
property: install
	CAIRN_PROPERTY_EXAMPLES=$(PROPERTY_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider \
		tests/integration/test_usage.py tests/integration/test_tracker_batch.py

# The chaos suite: each seed runs a 16-trial ASHA search on a fresh embedded cluster, once without
# faults and once while every component is killed, a leader paused, NATS rolled back and the
# cluster restarted; prints faults, recovery times and invariants; exit 1 if one broke.
# CHAOS_SEEDS=3,7 make chaos runs some seeds; each run is bounded by CHAOS_TIMEOUT seconds.
CHAOS_SEEDS   ?= 1-20
CHAOS_TIMEOUT ?= 300
chaos: install
	$(PY) -m tests.chaos --seeds $(CHAOS_SEEDS) --timeout $(CHAOS_TIMEOUT)

# Failover with standbys: `cairn up --replicas 2`, the leaders SIGKILLed and SIGSTOPped
# (about 30 s; not in `make test`), plus the fenced-writer fault test.
failover: install
	CAIRN_REPLICA_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_replicas.py tests/fault/test_failover.py

# Search methods' slower tests, beyond `make test`'s budget: PBT on a live cluster of processes
# with a searcher SIGKILL, the example custom searcher replayed after restarts, and hostile custom
# searchers beside another user's search on a live cluster (as root: the sandbox switches uid).
test-search: install
	CAIRN_SEARCH_E2E=1 $(PY) -m pytest -q -p no:cacheprovider tests/e2e/test_pbt.py \
		tests/integration/test_custom_searcher.py tests/e2e/test_custom_searcher_isolation.py

# The lab suite (never part of `make test`): a Docker engine (installed and started if need be),
# the images built offline from Debian packages and wheels, the compose cluster, an ASHA
# experiment with its trials in containers, an agent killed mid-trial; tests/lab.
test-lab: install
	deploy/lab/docker-engine.sh
	CAIRN_LAB=1 $(PY) -m pytest -q -p no:cacheprovider --timeout=3600 tests/lab

# The many-hosts test bed (never part of `make test`; needs root): network namespaces on a bridge
# (cairnbr0, 10.77.0.0/24) as a control host and two agent hosts, the cluster across them, DDP
# ranks on both agent hosts, a cut link and packet loss; tests/hosts, docs/hosts.md. Skips with
# the reason when namespaces cannot be made here.
test-hosts: install
	CAIRN_HOSTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/hosts

# The Slurm test bed (never part of `make test`; needs root): Debian's slurmctld, slurmd and
# munged (installed by deploy/slurm/install.sh when missing), started with a slurm.conf and a
# MUNGE key under a scratch directory, one node of 8 CPUs; tests/slurm (tests/slurm/bed.py).
test-slurm: install
	deploy/slurm/install.sh
	CAIRN_SLURM=1 $(PY) -m pytest -q -p no:cacheprovider tests/slurm

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
