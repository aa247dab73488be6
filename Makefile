# The two commands of the README are `make demo` and `make test`; both set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
HP := $(VENV)/bin/hydraplan
STAMP := $(VENV)/.installed
DEMO := plans/demo

.PHONY: setup demo example test bench docs lint clean

# megatron-core's wheel (no dependencies), read by tests/test_megatron_*.py and bench/bench_megatron.py: its hybrid CP
# scheduler is the reference the Megatron integration (hydraplan.integrations.megatron) is checked against.
MEGATRON_DIR := .cache/megatron
MEGATRON_WHEEL := $(MEGATRON_DIR)/megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl

setup: $(STAMP) $(MEGATRON_WHEEL)

$(MEGATRON_WHEEL): | $(STAMP)
	@mkdir -p $(MEGATRON_DIR) && $(PY) -m pip download --disable-pip-version-check --no-deps --only-binary :all: --python-version 3.12 \
		megatron-core==0.19.2 -d $(MEGATRON_DIR) >$(MEGATRON_DIR).log 2>&1 \
		|| { echo "setup: downloading megatron-core 0.19.2 failed (pip's output: $(MEGATRON_DIR).log)"; exit 1; }

# Re-installs only when pyproject.toml changes, so a second `make setup` takes seconds.
# torch==2.13.0 resolves to the CPU wheel on this machine's disk (never a multi-GB CUDA build).
$(STAMP): pyproject.toml
	@echo "setup: $(VENV) with hydraplan (editable) and numpy, numba, pandas, pyarrow, pydantic, typer, rich, ortools, highspy,"
	@echo "setup: matplotlib, torch (runtime), pytest, ruff (test), binpacking (bench); pip lists each step below"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --progress-bar off -e '.[test,runtime,bench]'
	touch $(STAMP)

RUN := --profile h100-llama2-7b --dataset builtin:wikipedia --gpus 64 --context-len 32768 --tokens-per-iter 200000

# The main job on the bundled Wikipedia lengths: look at the data, propose candidate strategies, plan 20
# iterations, check every plan, then compare against the baselines (report in plans/demo/compare).
demo: setup
	$(HP) dataset stats builtin:wikipedia --context-len 32768
	$(HP) profiles list
	$(HP) propose $(RUN) --out $(DEMO)/strategies.json
	$(HP) pack $(RUN) --iterations 20 --strategies $(DEMO)/strategies.json --out $(DEMO)/run
	$(HP) validate $(DEMO)/run --profile h100-llama2-7b
	$(HP) compare $(RUN) --iterations 20 --out $(DEMO)/compare
	@echo "report: $(DEMO)/compare/report.html"

# The committed 4-GPU example run (plans/example; tests/test_example_run.py keeps it equal to what this code plans).
EXAMPLE_ARGS := --profile cpu-tiny --dataset builtin:wikipedia --gpus 4 --tokens-per-iter 1536 --context-len 768 --iterations 4 --seed 1

example: setup
	$(HP) pack $(EXAMPLE_ARGS) --out plans/example

# tests/test_bench.py runs every bench's smoke configuration (what `python -m bench --smoke` runs) and checks the
# docs' tables and figures against bench/results.
# --maxschedchunk 4: xdist hands out 4 tests at a time, so the slow tests conftest.py puts first are shared by both
# workers (by default one worker's first chunk, an eighth of the suite, took every one of them).
test: setup
	$(PY) -m pytest -q -n 2 --maxschedchunk 4 --durations=10

# Every benchmark with today's code (bench/results/*.json; what each took: the timings table of
# docs/architecture.md, `bound` the longest), then the docs' tables and figures rewritten from them.
bench: setup
	$(PY) -m bench
	$(PY) -m bench.docs

# The docs' tables and figures rewritten from bench/results (after running some benches alone:
# `$(PY) -m bench NAME`); `$(PY) -m bench.docs --check` lists what differs, `--status` how each file was made.
docs: setup
	$(PY) -m bench.docs

# ruff, then mypy over planner/ as the installed `hydraplan` (pyproject's [tool.mypy]; tests/test_typecheck.py runs it too)
lint: setup
	$(PY) -m ruff check planner runtime bench tests examples
	$(PY) tests/typecheck.py

clean:
	rm -rf $(VENV) plans/demo build *.egg-info
