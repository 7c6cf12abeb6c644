# The two Quickstart commands (`make up`, `make test`) create .venv and install the project on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up test lint format schemas bench clean install docs docs-serve

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# `make up PORT=8081 NATS_PORT=4223` when the default ports (8080, 4222) are taken (from the command
# line only: a PORT in the environment is often meant for something else)
cli_var = $(if $(filter command line,$(origin $(1))),$(2) $($(1)))
up: $(STAMP)
	$(BIN)/chamber up $(call cli_var,PORT,--port) $(call cli_var,NATS_PORT,--nats-port)

# Test files run in parallel, one file per worker (module fixtures stay shared), one worker per core up to
# 4; `make test TEST_WORKERS=0` runs them in one process.
TEST_WORKERS ?= auto
test: $(STAMP)
	sh scripts/ensure-chromium.sh
	$(BIN)/python -m pytest --numprocesses=$(TEST_WORKERS) --maxprocesses=4 --dist=loadfile

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy  # files and strictness per module: [tool.mypy] in pyproject.toml
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .cache/site-lint  # a broken link or a page left out of the nav fails

# The documentation site (mkdocs.yml; pages under docs/, some generated: docs/hooks/generated_pages.py)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

schemas: $(STAMP)
	$(BIN)/chamber schemas --out schemas

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b" >&2; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .chamber .pytest_cache .ruff_cache .mypy_cache site .cache/site-lint
