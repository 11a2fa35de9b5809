# Two commands on a fresh machine: `make demo` and `make test`. Each makes the virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint docs e2e-build helm-build promtool-build node-build cluster cluster-down cluster-status bench bench-e2e bench-placement loadtest loadtest-saturation mutation clean

# `make loadtest` settings: cluster size, target pods/s, seconds of load, node names per filter call
# (a number, or `adaptive` for kube-scheduler's default percentageOfNodesToScore), initial GPU fill.
NODES ?= 1000
RATE ?= 300
DURATION ?= 30
NAMES ?= adaptive
FILL ?= 0.3
LOADTEST_ARGS ?=

# `make bench-e2e` settings: Node objects (8 GPUs x 40 GiB each), pending GPU pods, rounds (each runs
# kube-scheduler alone, then each wiring asked: --wiring full, filter-bind, floor-full, floor-filter-bind), and any
# other flag of python -m bench.e2e.
E2E_NODES ?= 1000
E2E_PODS ?= 3000
E2E_RUNS ?= 1
E2E_ARGS ?=

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Runtime only, for the demo.
$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Runtime plus Locust (it brings gevent, so it stays out of the runtime), for the load test.
$(VENV)/.loadtest: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[loadtest]'
	touch $@ $(VENV)/.runtime

# Runtime plus the test and lint tools, Locust (the load test's smoke run is part of the suite) and MkDocs (the suite
# builds the docs site strictly).
$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,loadtest,docs]'
	touch $@ $(VENV)/.runtime $(VENV)/.loadtest $(VENV)/.docs

# Runtime plus MkDocs, for the docs site.
$(VENV)/.docs: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[docs]'
	touch $@ $(VENV)/.runtime

demo: $(VENV)/.runtime
	$(BIN)/extender demo

lint: $(VENV)/.test
	$(BIN)/ruff check extender devtools tests bench loadtest
	$(BIN)/ruff format --check extender devtools tests bench loadtest
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m devtools.module_size

# The e2e tier's control plane (kube-apiserver and kube-scheduler built from source, Debian's etcd), cached in
# ~/.cache/gpu-extender: about 6 minutes the first time, seconds after. Without Go it says the tier is skipped.
e2e-build:
	bash tests/e2e/build.sh

# The helm that tests/test_chart.py lints and renders charts/gpu-extender/ with, cached the same way (about 2
# minutes the first time, instant after). Without Go it says the chart tests are skipped.
helm-build:
	bash tests/helm/build.sh

# promtool, which tests/test_alert_rules.py runs `promtool test rules` with, built from Prometheus' source
# (v3.15.1, module v0.315.1) and cached the same way (several minutes the first time, instant after).
# Without Go it says the rule tests are skipped.
promtool-build:
	bash tests/promtool/build.sh

# What the node tier (tests/node) and `make cluster` need besides the e2e tier's binaries: Debian's containerd,
# runc, CNI plugins, iptables, buildah (devtools/cluster/packages.sh, as root), and the images the manifests name,
# built from their sources and cached (image/node-images.sh, image/cert-manager.sh: about ten minutes the first
# time, seconds after), and gpushare-scheduler-extender's for the migration tests (image/peer-images.sh: its source
# cloned from GitHub once, about four minutes the first time).
# Not root: it says the node tier is skipped.
node-build: e2e-build helm-build
	bash devtools/cluster/packages.sh
	bash image/node-images.sh
	bash image/cert-manager.sh
	bash image/peer-images.sh

test: lint e2e-build helm-build promtool-build node-build
	$(BIN)/pytest -q

# A one-node Kubernetes cluster on this machine (root): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, containerd, CoreDNS and a device-plugin double of $(PROTOCOL) (gpushare,
# hami or none), in a network namespace with no way out. It prints the kubeconfig to use. `make cluster-down`
# removes it whole. docs/install/one-machine.md: what it is and what to try on it.
PROTOCOL ?= gpushare
cluster: $(VENV)/.test node-build
	$(BIN)/python -m devtools.cluster up --protocol $(PROTOCOL)

cluster-down: $(VENV)/.test
	$(BIN)/python -m devtools.cluster down

cluster-status: $(VENV)/.test
	$(BIN)/python -m devtools.cluster status

# The docs site, from docs/ and mkdocs.yml, into site/ (open site/index.html). Strict: a broken link or anchor, or
# a page missing from the nav, fails the build; tests/test_docs.py builds it the same way in `make test`.
# (NO_MKDOCS_2_WARNING: Material's notice of its end of life, printed on every build; pyproject.toml's `docs` extra
# says what it means for us.)
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Runtime plus uvicorn, the server the hand-written transport is measured against (bench/transport.py).
$(VENV)/.bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[bench]'
	touch $@ $(VENV)/.runtime

# RECORD=DIR: each bench below also writes a run record there (bench/record.py); the docs' tables are built from
# the records in bench/records/ (make bench RECORD=bench/records, then commit them).
RECORD ?=
RECORD_ARG = $(if $(RECORD),--record $(RECORD))

bench: $(VENV)/.bench
	$(BIN)/python -m bench.bench $(RECORD_ARG)
	$(BIN)/python -m bench.cache_build $(RECORD_ARG)
	$(BIN)/python -m bench.transport $(RECORD_ARG)
	$(BIN)/python -m bench.scale $(RECORD_ARG)

# The real kube-scheduler on the e2e tier's control plane, alone and with the extender wired in as it ships:
# pods/s, CPU per pod per process, and the end check. Needs the tier's binaries and its helpers (tests/e2e).
bench-e2e: $(VENV)/.test e2e-build
	$(BIN)/python -m bench.e2e --nodes $(E2E_NODES) --pods $(E2E_PODS) --runs $(E2E_RUNS) $(RECORD_ARG) $(E2E_ARGS)

# `make bench-placement` settings: the trace's csv directory (Alibaba's cluster-trace-gpu-v2023/csv, never
# committed: docs/benchmarks/placement.md says how to get it), its workload, the seeds of the arrival sequence,
# the modes (real: the real kube-scheduler, the figure of record; burst; fast: in process), and any other flag of
# python -m bench.placement (--nodes N for a sample of the cluster, --flag=--placement=fill, --churn for pods that
# come and go, --policies shipped,fill, --peer gpushare=DIR for a peer built from its source, --protocol hami for
# HAMi's nodes and pods, --plot FILE.svg for the curves, ...).
TRACE ?=
WORKLOAD ?= default
SEEDS ?= 42
MODE ?= real
PLACEMENT_ARGS ?=

# How well the extender places: GPU allocation on a production trace through the real kube-scheduler.
bench-placement: $(VENV)/.test e2e-build
	$(BIN)/python -m bench.placement --trace "$(TRACE)" --workload $(WORKLOAD) --seeds $(SEEDS) --mode $(MODE) \
		$(RECORD_ARG) $(PLACEMENT_ARGS)

loadtest: $(VENV)/.loadtest
	$(BIN)/python -m loadtest.run --nodes $(NODES) --pods-per-second $(RATE) --duration $(DURATION) \
		--names $(NAMES) --fill $(FILL) $(RECORD_ARG) $(LOADTEST_ARGS)

# The pace where the p99 of some verb passes 50 ms: steps from 100 to 1,200 pods/s, a fresh server per step.
loadtest-saturation: $(VENV)/.loadtest
	$(BIN)/python -m loadtest.run --nodes $(NODES) --duration 15 --names $(NAMES) --fill $(FILL) \
		--find-saturation $(RECORD_ARG) $(LOADTEST_ARGS)

# Runtime plus the test tools and mutmut, for `make mutation`.
$(VENV)/.mutation: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,mutation]'
	touch $@ $(VENV)/.runtime

# The share of mutmut's small changes to the core (ledger, mig, placement, protocols) that each area's tests notice,
# per module (devtools/mutation.py; equivalents with why in devtools/mutation_equivalents.toml). Not in `make test`:
# tens of minutes. MUTATION_ARGS: areas, --recheck [--only PATTERN], --committed, --with-properties, --max-children N.
MUTATION_ARGS ?=
mutation: $(VENV)/.mutation
	nice -n 10 $(BIN)/python -m devtools.mutation $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache site
