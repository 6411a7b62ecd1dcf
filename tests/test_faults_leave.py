"""A node that leaves mid-run reports its own ledger before it goes (issue 27, invariant 1: nodes
report their ledger totals when they leave or when the run closes; before, only at the close, so a
node gone mid-run stayed "unconfirmed" in the summary).

The host of nodes 3 and 4 gets a signal (SIGTERM as a service manager sends, or SIGINT as Ctrl-C)
just after node 3 logged round 1 or round 4: the host is interrupted before that round's update goes
out, its nodes send their ledgers and disconnect, the run goes on with nodes 0 to 2. The summary
then calls nodes 3 and 4 confirmed (or raised) by their own reports, and charges node 3's round that
never arrived, as its report says. The control (SIGKILL: no chance to report) leaves them
unconfirmed, so the test can tell the difference. Over both brokers.
"""

from __future__ import annotations

import os
import signal

import pytest

from test_algorithm_contract import _text
from testbed.assembly.config import load_config_text, replace
from testbed.ledger.files import read_ledger
from testbed.orchestration.runner import run_experiment

#: The tests patch node code, which reaches emulated hosts only when they are forked (conftest).
pytestmark = pytest.mark.usefixtures("forked_hosts")

LEAVER = 3  # its host serves nodes 3 and 4 (mqtt.hosts = 2 of 5 nodes: 0-2 and 3-4)


def _leave_after(monkeypatch, round_index: int, sig: signal.Signals) -> None:
    """The host of node LEAVER sends itself ``sig`` once that node logged ``round_index`` (before its
    update goes out); emulated hosts are forked from this process and inherit the patch."""
    from nodes.agent import NodeAgent

    log_release = NodeAgent._log_release  # a host logs every node's release, then makes the replies

    def leaving(self, admitted, charged):
        logged = log_release(self, admitted, charged)
        if self.node == LEAVER and admitted.ctx.round_index == round_index:
            os.kill(os.getpid(), sig)
        return logged

    monkeypatch.setattr(NodeAgent, "_log_release", leaving)


def _run(broker_url: str, tmp_path):
    config = replace(load_config_text(_text("dp_pasgd")), run={"mode": "mqtt"},
                     mqtt={"broker_url": broker_url, "hosts": 2, "round_timeout_s": 5.0})
    return run_experiment(config, out_dir=tmp_path / "r", quiet=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("round_index", [1, 4])
def test_a_node_that_leaves_mid_run_reports_its_ledger(round_index, sig, broker, monkeypatch, tmp_path):
    _leave_after(monkeypatch, round_index, sig)
    result = _run(broker.url, tmp_path)
    summary = result.summary
    assert summary["status"] == "completed", summary.get("failure")
    checks = {node: entry["ledger_check"] for node, entry in summary["nodes"].items()}
    assert checks["0"] == checks["1"] == checks["2"] == "confirmed"
    assert checks["3"] in ("confirmed", "raised") and checks["4"] in ("confirmed", "raised"), checks
    # Node 3 logged round_index, whose update never went out: charged all the same, from its report.
    charged = {e.round for e in read_ledger(result.run_dir / "ledger.csv") if e.node == LEAVER and e.kind == "privacy"}
    assert charged == set(range(round_index + 1))
    assert summary["nodes"][str(LEAVER)]["rounds"] == round_index + 1


def test_control_a_node_killed_without_a_chance_to_report_stays_unconfirmed(mosquitto_broker, monkeypatch, tmp_path):
    _leave_after(monkeypatch, 1, signal.SIGKILL)
    summary = _run(mosquitto_broker.url, tmp_path).summary
    assert summary["status"] == "completed", summary.get("failure")
    assert summary["nodes"]["3"]["ledger_check"] == summary["nodes"]["4"]["ledger_check"] == "unconfirmed"
