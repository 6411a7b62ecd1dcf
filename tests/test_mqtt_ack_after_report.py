"""A round's broadcast is acknowledged while the round before is reported (issue 44, ACFL over MQTT).

The coordinator hands a round's broadcast to its client, reports the round before (evaluation,
metrics row, checkpoint) while the broker acknowledges it, and only then awaits the ack
(``MqttClient.publish_then``, ``BrokerOutages._publish_then``): under load the ack came 7-17 ms
after the publish and the report, made after it, fell into the replies' arrival. What an ack still
decides is unchanged: a broadcast the broker does not acknowledge closes its round with every
expected node offline (an outage), and the run goes on. Whole MQTT runs through the real
coordinator and honest in-process agents (tests/loopback_coordinator.py)."""

from __future__ import annotations

import csv

from loopback_coordinator import LoopbackClient, loopback
from test_faults_charged_on_ask import ACFL, DP_PASGD, NODES
from testbed.assembly.config import load_config_text
from testbed.mqtt import topics, wire
from testbed.orchestration.runner import run_experiment
from testbed.rounds import protocol


def _run(tmp_path, monkeypatch, text: str, unacked: set[int]):
    """A run whose broadcasts of the rounds in ``unacked`` time out; per round broadcast, the
    metrics rows written when its ack was awaited."""
    rows_at_ack: dict[int, int] = {}
    config = load_config_text(text)
    run_dir = tmp_path / "run"

    def publish_then(self, topic, payload, *, timeout_s=30.0):
        msg = wire.decode(payload)
        self.loopback.published(topic, payload)

        def acked():
            if topic == topics.bcast(self.run) and msg.kind == protocol.ROUND:
                with open(run_dir / "metrics.csv") as f:
                    rows_at_ack[msg.round] = len(list(csv.DictReader(f)))
                if msg.round in unacked:
                    raise TimeoutError(f"publish to {topic} not acknowledged within {timeout_s:g} s")
        return acked

    monkeypatch.setattr(LoopbackClient, "publish_then", publish_then)
    with loopback(monkeypatch, NODES, lambda *a: [(a[2], 0)]):
        result = run_experiment(config, out_dir=run_dir, quiet=True)
    with open(run_dir / "metrics.csv") as f:
        metrics = list(csv.DictReader(f))
    return result, rows_at_ack, metrics


def test_the_round_before_is_reported_before_the_broadcasts_ack_is_awaited(tmp_path, monkeypatch):
    result, rows_at_ack, metrics = _run(tmp_path, monkeypatch, DP_PASGD, set())
    assert result.summary["status"] == "completed" and sorted(rows_at_ack) == list(range(6))
    # Round r's ack (0-based) is awaited with the r rounds before it reported: a metrics row each.
    assert all(rows == r for r, rows in rows_at_ack.items()), rows_at_ack
    assert [int(row["stragglers"]) for row in metrics] == [0] * 6


def test_a_broadcast_the_broker_did_not_acknowledge_still_closes_its_round_offline(tmp_path, monkeypatch):
    for name, text, lost in (("dp_pasgd", DP_PASGD, 2), ("acfl", ACFL, 1)):
        result, _, metrics = _run(tmp_path / name, monkeypatch, text, {lost})
        assert result.summary["status"] == "completed"
        stragglers = {int(row["round"]): int(row["stragglers"]) for row in metrics}
        assert stragglers[lost + 1] == len(NODES)  # every expected node offline in that round
        assert all(n == 0 for r, n in stragglers.items() if r != lost + 1)
