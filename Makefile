# Fresh machine: `make demo` (embedded pipeline on an example) and `make test` (every test).
SHELL := /bin/bash
EXAMPLE ?= examples/resnet50.yaml
# Tests run in a random order (pytest-randomly): each must set up what it reads. The seed is
# printed; SEED=<n> repeats an order.
SEED ?= $(shell date +%s)
# Test files run on WORKERS pytest-xdist workers, each pinned to its share of the cores
# (tests/conftest.py); a file's tests stay on one worker (their module fixtures compile once).
# WORKERS=0 runs them in this process, one after another.
WORKERS ?= 2

# Backends' own environments (requirements/env-*.txt; cached under ~/.cache/kompile by the hash of
# each file): litert's and xla's first builds take 2-5 minutes and 6.5 GB each (a second torch);
# tvm's and iree's about 30 seconds and 450-600 MB (no torch).
ENVS ?= litert iree tvm xla

.PHONY: demo test setup lint unit envs control-plane dev-cluster crds mlflow-ui

demo:
	@v=$$(scripts/setup-venv.sh | tail -n 1) && $$v/bin/kompile run $(EXAMPLE)

# The setup scripts again, on their fast paths: each prints the path this recipe needs.
test: setup
	@v=$$(scripts/setup-venv.sh | tail -n 1) && \
	  export KOMPILE_K8S_BIN=$$(scripts/build-control-plane.sh | tail -n 1) && \
	  export KOMPILE_S3_BIN=$$(scripts/build-s3-server.sh | tail -n 1) && \
	  $$v/bin/ruff check kompile tests benchmarks examples devtools && \
	  $$v/bin/mypy && \
	  $$v/bin/lint-imports && \
	  echo "test order: pytest-randomly seed $(SEED) (again: make test SEED=$(SEED))" && \
	  $$v/bin/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --randomly-seed=$(SEED) $(PYTEST_ARGS)

# Everything `make test` needs (venv, backend environments, control plane, S3 server, test tools),
# built in three concurrent lanes (scripts/setup-all.sh); cached, so a warm run returns at once.
setup:
	@scripts/setup-all.sh $(ENVS)

envs:
	@for e in $(ENVS); do scripts/setup-backend-env.sh $$e >/dev/null || exit 1; done

unit:
	@v=$$(scripts/setup-venv.sh | tail -n 1) && $$v/bin/python -m pytest -q tests/unit $(PYTEST_ARGS)

lint:
	@v=$$(scripts/setup-venv.sh | tail -n 1) && $$v/bin/ruff check kompile tests benchmarks examples devtools && $$v/bin/mypy && $$v/bin/lint-imports

crds:
	@v=$$(scripts/setup-venv.sh | tail -n 1) && $$v/bin/kompile crd --out crds/ && $$v/bin/kompile reference --out docs/reference.md

control-plane:
	@scripts/build-control-plane.sh

dev-cluster:
	@v=$$(scripts/setup-venv.sh | tail -n 1) && \
	  export KOMPILE_K8S_BIN=$$(scripts/build-control-plane.sh | tail -n 1) && \
	  $$v/bin/python -m devtools.devcluster

mlflow-ui:
	@v=$$(scripts/setup-venv.sh | tail -n 1) && \
	  $$v/bin/mlflow ui --backend-store-uri sqlite:///.kompile/mlflow.db --port 5000
