# Quick start: `make demo` (set up and run the quickstart), `make test` (set up and run the tests).
# Each creates .venv when missing and installs what it needs; torch is pinned by constraints.txt.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP_INSTALL := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo test test-plain-paho bench board firmware clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.core-installed: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e '.[coordinator,node,watch]'
	touch $@

$(VENV)/.test-installed: $(VENV)/.core-installed
	$(PIP_INSTALL) -e '.[coordinator,node,watch,channel,test]'
	touch $@

demo: $(VENV)/.core-installed
	$(BIN)/testbed run experiments/quickstart.toml

# -rs: each skip and its reason at the end (under CI=true a missing tool fails instead: tests/conftest.py)
test: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q -rs

# The contract's sim-equals-MQTT tests of every algorithm once more with paho's plain client
# (TESTBED_MQTT_SPEEDUPS=0, testbed/mqtt/fence.py): the speed layer changes no result. CI runs it.
test-plain-paho: $(VENV)/.test-installed
	TESTBED_MQTT_SPEEDUPS=0 $(BIN)/python -m pytest -q -rs tests/test_algorithm_contract.py \
		-k "sim_equals_mqtt and not cnn"

bench: $(VENV)/.core-installed
	$(BIN)/python benchmarks/j1.py

# The emulated arm64 board (docs/boards.md; root, debootstrap, qemu-user-static): cached in ~/.cache/testbed/boards.
board: $(VENV)/.core-installed
	$(BIN)/testbed board build --arch arm64

# The microcontroller firmware: the virtual board (cc) and the QEMU Cortex-M3 image (arm-none-eabi-gcc).
firmware:
	$(MAKE) -C firmware_bridge/firmware BUILD=$(CURDIR)/build/firmware host mps2-an385

clean:
	rm -rf $(VENV) runs build
