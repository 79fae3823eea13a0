# sandfleet: every target installs what it needs first (hack/bootstrap is idempotent and fast when warm).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: test demo bootstrap build lint unit cluster-up cluster-down

# The README's test command: bootstrap; build the binaries, images and harbor's Python 3.12
# environment (hack/build-all) and lint at the same time (lint needs nothing built); then every test.
test: bootstrap
	$(MAKE) --no-print-directory -j2 build lint
	$(PY) -m pytest tests --durations=25

build:
	hack/build-all

# The README's main job: the embedded default (local gVisor sandboxes behind the gateway).
demo: bootstrap
	hack/demo

bootstrap:
	hack/bootstrap

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: bootstrap
	$(PY) -m pytest tests/unit

cluster-up: bootstrap
	hack/cluster up

cluster-down:
	hack/cluster down
