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

.PHONY: tour test setup bench extras clean

tour: $(STAMP)
	$(VENV)/bin/addnorm tour

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_add_norm.py

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py src/addnorm/kernels/cpu/autograd_nodes.cpp src/addnorm/kernels/cpu/addnorm_cpu.c $(wildcard src/addnorm/kernels/cpu/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=77"  # the build backend pyproject names (PEP 639 license); the packaging tests drive it directly
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[test,hf]'
	@# the eager fast path's C++ autograd nodes, built against the torch just installed (ninja drives the
	@# compiler); without a C++ compiler addnorm still works, on its Python nodes
	$(PY) -m pip install --quiet ninja
	$(PY) -m addnorm.kernels.cpu.build_nodes --optional
	@# the report's browser test needs Chromium: Debian's package, when we may install it
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
	  echo "note: Chromium is not installed; the report's browser test will be skipped (apt-get install chromium)"
	touch $(STAMP)

# What CI adds on top of the setup, so that no test is skipped there: the MAX extra (and its kernel
# cache warmed once, instead of compiling per test), Triton (the GPU kernels, run in its interpreter
# on CPU), HF's `kernels` (addnorm's norms as its hub layers), the CPU engines the benchmark compares
# with (ONNX Runtime, OpenVINO) and Chromium.
extras: $(STAMP)
	$(PY) -m pip install --quiet -e '.[max,gpu,kernels,peers]'
	$(PY) -m addnorm.max.warm
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

clean:
	rm -rf $(VENV) build src/*.egg-info src/addnorm/kernels/cpu/*.so
