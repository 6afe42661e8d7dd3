# The two commands of the README's quick start:
#   make tour   -- set everything up (virtual environment, pinned CPU torch, addnorm) and run the main job
#   make test   -- set everything up and run the whole test suite
# Everything else here is what those two need.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch: an unpinned `torch` would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.addnorm-installed

.PHONY: tour test setup bench clean

tour: $(STAMP)
	$(VENV)/bin/addnorm tour

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_add_norm.py

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py src/addnorm/kernels/cpu/addnorm_cpu.c src/addnorm/kernels/cpu/norm_rows.h
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[test,hf]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info src/addnorm/kernels/cpu/*.so
