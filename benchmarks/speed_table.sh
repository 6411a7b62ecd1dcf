#!/bin/bash
# Issue 44's table (docs/performance.md, "Issue 44's table"): each row's benchmark, one after another,
# on a machine with nothing else running. Prints each row's output under a header with the time and
# the load average. The Flower row runs when FLOWER_PYTHON names the interpreter of a venv with
# flwr[simulation] (the flower-bench extra), else it says so.
#
# Usage: benchmarks/speed_table.sh [PYTHON]   (default: the python on PATH)
set -u
cd "$(dirname "$0")/.."
PY=${1:-python}
row() {  # NAME COMMAND...: the command's last lines, its figures
    local name=$1; shift
    echo "=== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    "$@" 2>&1 | tail -12
    echo "(exit ${PIPESTATUS[0]})"
}
flower() {  # its figures only: Flower and Ray log between them
    "$PY" benchmarks/flower_j1.py --repeats 2 2>&1 | grep -E "^(J1 |  (testbed|flower))"
}
row "J1 against its floor, the other core idle" "$PY" benchmarks/j1.py --pairs 5 --only idle
row "J1 against its floor, the other core busy" "$PY" benchmarks/j1.py --pairs 3 --only busy
row "a million nodes, 100 sampled x 100 rounds" "$PY" benchmarks/scale_sim.py --only 1m --repeats 3
row "ACFL over MQTT against sim" "$PY" benchmarks/acfl.py --only-mqtt --brokers mosquitto --repeats 5
row "start to round 1" "$PY" benchmarks/startup.py --repeats 5
row "10,000 boards over Mosquitto" "$PY" benchmarks/mqtt_scale.py
if [ -n "${FLOWER_PYTHON:-}" ]; then
    row "J1 against Flower" flower
else
    echo "=== J1 against Flower: skipped (set FLOWER_PYTHON to a venv with flwr[simulation])"
fi
