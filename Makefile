# Quick start: `make demo` (set up and run the quickstart), `make test` (set up and run the tests).
# Each creates .venv when missing and installs what it needs; torch is pinned by constraints.txt.
# The package and its site (docs/install.md): `make dist`, `make check-wheel`, `make docs`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_INSTALL := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test test-plain-paho bench bench-flower board firmware dist check-wheel docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.core-installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e '.[coordinator,node,watch]'
	touch $@

$(VENV)/.test-installed: $(VENV)/.core-installed
	$(PIP_INSTALL) -e '.[coordinator,node,watch,channel,scene,test,docs]'
	touch $@

demo: $(VENV)/.core-installed
	$(BIN)/testbed run experiments/quickstart.toml

# -rs: each skip and its reason at the end (under CI=true a missing tool fails instead: tests/conftest.py)
# The suite on the machine's cores (pytest-xdist): one worker per core, at most four (each may start
# brokers, hosts and boards of its own); TEST_WORKERS=0 runs it in this process, one test at a time.
TEST_WORKERS ?= auto
test: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --maxprocesses 4

# The contract's sim-equals-MQTT tests of every algorithm once more with paho's plain client
# (TESTBED_MQTT_SPEEDUPS=0, testbed/mqtt/fence.py): the speed layer changes no result. CI runs it.
test-plain-paho: $(VENV)/.test-installed
	TESTBED_MQTT_SPEEDUPS=0 $(BIN)/python -m pytest -q -rs tests/test_algorithm_contract.py \
		-k "sim_equals_mqtt and not cnn"

bench: $(VENV)/.core-installed
	$(BIN)/python benchmarks/j1.py

# J1 against Flower's simulation (benchmarks/flower_j1.py): Flower in its own venv, .venv-flower, from
# the flower-bench extra (flwr pins ray and typer against the coordinator's amqtt); the testbed in $(VENV).
FLOWER_VENV ?= .venv-flower
$(FLOWER_VENV)/.installed: pyproject.toml
	test -x $(FLOWER_VENV)/bin/python || $(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/python -m pip install --quiet --disable-pip-version-check '.[flower-bench]'
	touch $@

bench-flower: $(VENV)/.core-installed $(FLOWER_VENV)/.installed
	FLOWER_PYTHON=$(FLOWER_VENV)/bin/python $(BIN)/python benchmarks/flower_j1.py --repeats 3

# The emulated arm64 board (docs/boards.md; root, debootstrap, qemu-user-static) with dist/'s wheel
# installed, as a user installs the published package: cached in ~/.cache/testbed/boards.
board: $(VENV)/.core-installed dist
	$(BIN)/testbed board build --arch arm64 --wheel "$$(ls dist/dpfl_testbed-*.whl)"

# The microcontroller firmware: the virtual board (cc) and the QEMU Cortex-M3 image (arm-none-eabi-gcc).
firmware:
	$(MAKE) -C firmware_bridge/firmware BUILD=$(CURDIR)/build/firmware host mps2-an385

# The package as the index ships it: dist/dpfl_testbed-VERSION-py3-none-any.whl and the sdist
# (python -m build, in an isolated build environment from pyproject.toml's build-system).
dist: | $(BIN)/python
	$(PIP_INSTALL) build
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	rm -rf dpfl_testbed.egg-info  # the sdist step's metadata, left in the work tree: pip would take it for an install

# The wheel installed (not editable) into a fresh venv, and the quick start's experiment run from it
# in a folder outside the checkout, without PYTHONPATH: what a user of the published package gets.
WHEEL_VENV := $(CURDIR)/build/wheel-venv
check-wheel: dist
	rm -rf $(WHEEL_VENV)
	$(PYTHON) -m venv $(WHEEL_VENV)
	# --no-compile: pip's wheel cache makes the install mostly unpacking, and compiling every module of
	# scipy and matplotlib took a third of it (46 s against 67 s here); the run compiles what it imports
	env -u PYTHONPATH $(WHEEL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-compile \
		-c constraints.txt "$$(ls dist/dpfl_testbed-*.whl)[coordinator,node]"
	cd "$$(mktemp -d)" && env -u PYTHONPATH $(WHEEL_VENV)/bin/python -c \
		"import sys, testbed; sys.exit(not testbed.__file__.startswith('$(WHEEL_VENV)/'))" && \
		env -u PYTHONPATH $(WHEEL_VENV)/bin/testbed run $(CURDIR)/experiments/quickstart.toml --quiet && \
		ls runs/quickstart-*/summary.json

$(VENV)/.docs-installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e '.[docs]'
	touch $@

# The documentation site, strictly: a broken link, a page missing from the nav or an API reference
# naming nothing fails (mkdocs.yml).
docs: $(VENV)/.docs-installed
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) runs build dist
