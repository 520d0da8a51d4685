# The two commands a newcomer needs: `make run` and `make test`. Both set up .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install run test lint data queue reproduce clean

# The install byte-compiles the libraries on every core (pip compiles them on one; as pip
# does, a file of another Python's syntax in a library's test data is skipped; the libraries'
# own test suites, 3,750 files no command imports, are not compiled) and dpfair as a regular
# (non-editable) install would: where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) Python never writes byte-code itself, and every process would compile what it
# imports (the suite took 1,615 CPU-s instead of 1,006 without this step),
# and puts bin/_dpfair_dvc_on_path.py in the venv's site-packages with a .pth importing it: the
# venv's `dvc queue start` has the venv's bin first on PATH (its workers start `dvc` by name).
# It also makes MLflow's empty SQLite store (dpfair/tracking/empty_store.py) and Prefect's
# empty database (flows/server.py) in the user's cache, while the byte-code compiles (on a new
# machine 16 s, mostly a Prefect server starting): a new tracking store or Prefect home then
# starts as their copy instead of running the migrations (MLflow's 1.5-3 s, Prefect's 4 s).
$(STAMP): pyproject.toml constraints.txt bin/_dpfair_dvc_on_path.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -c constraints.txt -e ".[dev]"
	site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  cp bin/_dpfair_dvc_on_path.py "$$site/" && \
	  echo "import _dpfair_dvc_on_path" > "$$site/_dpfair_dvc_on_path.pth" && \
	  { $(BIN)/python -c "from dpfair.tracking.empty_store import empty_store; empty_store(); \
	    from flows.server import empty_database; empty_database()" & databases=$$!; } && \
	  { $(BIN)/python -m compileall -q -j 0 -x '/tests/' "$$site" >/dev/null || true; } && \
	  $(BIN)/python -m compileall -q -j 0 dpfair tasks flows; \
	  compiled=$$?; wait $$databases && exit $$compiled
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/dpfair run

# One pytest worker per core (pytest-xdist); a test file runs whole on one worker, so its
# module fixtures (one release of every command, one trained model) run once. Files are handed
# out in collection order, the longest first (tests/conftest.py: LONGEST_FIRST).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

data: $(STAMP)  ## every DVC prepare stage (`dvc repro` runs the whole pipeline)
	$(BIN)/dvc repro prepare

queue: $(STAMP)  ## DVC's queue worker: the queued experiments of `dvc exp run --queue`
	$(BIN)/dvc queue start

lint: $(STAMP)
	$(BIN)/ruff check dpfair tasks flows tests benchmarks

reproduce: $(STAMP)
	$(BIN)/python benchmarks/reproduce.py

clean:
	rm -rf $(VENV) .pytest_cache mlruns mlflow.db
