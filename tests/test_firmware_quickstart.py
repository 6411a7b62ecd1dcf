"""End to end: experiments/mcu_quickstart.toml over MQTT with virtual microcontroller boards (and
with the QEMU Cortex-M3 board) gives sim's final model within float32 rounding."""

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.assembly.config import load_config
from testbed.orchestration.runner import run_experiment

from conftest_firmware import needs_cc, needs_qemu_board

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "experiments" / "mcu_quickstart.toml"


def _run(tmp_path: Path, name: str, *overrides: str):
    cfg = load_config(QUICKSTART, [*overrides, f'output.dir="{tmp_path}"'])
    return run_experiment(cfg, tmp_path / name, quiet=True)


def _same_model(mq, sim):
    a, b = np.load(mq.run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy")
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for result in (mq, sim):
        summary = json.loads((result.run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["stragglers"]["rounds_straggled"] == 0


@pytest.mark.slow
@needs_cc
def test_mcu_quickstart_virtual_boards_equal_sim(tmp_path):
    mq = _run(tmp_path, "mqtt")
    sim = _run(tmp_path, "sim", 'run.mode="sim"')
    _same_model(mq, sim)
    ledger = (mq.run_dir / "ledger.csv").read_text().splitlines()
    boards = [row for row in ledger if row.startswith("compute,2,") or row.startswith("compute,5,")]
    assert len(boards) == 2 * 10 and all(float(row.split(",")[5]) > 0 for row in boards)
    # The boards' seconds and joules are the bridge's model in both modes: the same ledger. Over
    # MQTT each bridge also reports its board's provisioning (the firmware's task, sent down the
    # serial line once), which the summary then shows: raised by the node's own ledger.
    for node in ("2", "5"):
        a, b = mq.summary["nodes"][node], sim.summary["nodes"][node]
        assert (a["compute_s"], a["energy_j"], a["bytes_up"]) == (b["compute_s"], b["energy_j"], b["bytes_up"])
        assert a["bytes_down"] > b["bytes_down"] and set(a["raised_by_node"]) == {"bytes_down", "rounds"}  # one exchange more


@pytest.mark.slow
@needs_qemu_board
def test_mcu_quickstart_qemu_board_equals_sim(tmp_path):
    # one Cortex-M3 board under QEMU, fewer rounds: QEMU's soft-float step is the slow part
    common = ("nodes.mcu=[5]", "dp_pasgd.steps=15")
    mq = _run(tmp_path, "mqtt", *common, 'nodes.mcu_board="mps2-an385"')
    sim = _run(tmp_path, "sim", *common, 'run.mode="sim"')
    _same_model(mq, sim)
