# Every target works on a fresh clone: run and test install what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DB     ?= var/keysvc.db
HOST   ?= 127.0.0.1
PORT   ?= 8080

.PHONY: install run test lint fmt clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Bootstraps an organization on first use (credentials are printed once), then serves.
run: install
	mkdir -p $(dir $(DB))
	$(BIN)/keysvc bootstrap --if-empty --db $(DB)
	exec $(BIN)/keysvc serve --db $(DB) --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check keysvc tests
	$(BIN)/ruff format --check keysvc tests
	$(BIN)/mypy keysvc

fmt: install
	$(BIN)/ruff format keysvc tests
	$(BIN)/ruff check --fix keysvc tests

test: install lint
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
