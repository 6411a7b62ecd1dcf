"""The coordinator's side of an MQTT run: starts (or finds) the broker and the nodes, broadcasts
each round, collects the replies until every live node answered or the round's deadline passed.

A node that misses the deadline, or goes offline (its last will) during the round, is a straggler
for that round; it rejoins with the next round's broadcast, which carries everything it needs.
Replies from another session, another round, or a second copy of one node's reply are logged and
dropped.
"""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from testbed import protocol, wire
from testbed.algorithms import NodeOutput, RoundResult
from testbed.config import Config
from testbed.errors import ConfigError, UserError
from testbed.mqtt import topics
from testbed.mqtt.broker import EmbeddedBroker
from testbed.mqtt.client import MqttClient

log = logging.getLogger(__name__)


class MqttNodes:
    """The nodes of a run, reached over MQTT.

    Args:
        config: the experiment (its ``[mqtt]`` section says how).
        config_toml: the resolved experiment file every round carries.
        node_ids: the run's nodes.
        quiet: no broker/host chatter on stderr.
    """

    def __init__(self, config: Config, config_toml: str, node_ids: Sequence[int], quiet: bool = False):
        m = config.mqtt
        self.config, self.config_toml = config, config_toml
        self.node_ids = list(node_ids)
        self.run = wire.check_id(m.run_id, "mqtt.run_id")
        self.session = secrets.token_hex(8)
        self.round_timeout_s = m.round_timeout_s
        self._hosts: list[subprocess.Popen] = []
        self._broker = EmbeddedBroker().start() if m.broker_url is None else None
        self.url = self._broker.url if self._broker else m.broker_url
        username, password = _credentials(m.credentials, "coordinator")
        try:
            # amqtt speaks 3.1.1 only: skip the v5 probe it would log a warning about.
            version = "3.1.1" if self._broker else "auto"
            self.client = MqttClient.for_coordinator(self.url, self.run, username=username, password=password,
                                                     tls_ca=m.tls_ca, max_chunk_bytes=m.max_chunk_bytes,
                                                     protocol=version)
            self.client.connect(timeout_s=m.connect_timeout_s)
            self.online: set[int] = set()
            if m.emulated:
                self._start_hosts(quiet)
            self._wait_online(m.connect_timeout_s)
        except BaseException:
            self.close("failed")
            raise

    def _start_hosts(self, quiet: bool) -> None:
        m = self.config.mqtt
        groups = [g for g in np.array_split(np.array(self.node_ids), max(1, min(m.hosts, len(self.node_ids)))) if len(g)]
        for group in groups:
            cmd = [sys.executable, "-m", "testbed", "nodes", "--broker", self.url, "--run", self.run,
                   "--ids", ",".join(str(int(n)) for n in group), "--profile", self.config.nodes.profile,
                   "--protocol", self.client.protocol or "auto", "--max-chunk-bytes", str(m.max_chunk_bytes)]
            if m.credentials:
                cmd += ["--credentials", m.credentials]
            if self.config.nodes.pacing:
                cmd.append("--pacing")
            self._hosts.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL if quiet else None))

    def _wait_online(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        wanted = set(self.node_ids)
        while not wanted <= self.online:
            remaining = deadline - time.monotonic()
            dead = [h.args for h in self._hosts if h.poll() is not None]
            if remaining <= 0 or dead:
                missing = sorted(wanted - self.online)
                why = "an emulated node host exited" if dead else f"not online within {timeout_s:g} s"
                raise UserError(f"{len(missing)} of {len(wanted)} nodes ({_ids(missing)}) are not connected to "
                                f"{self.url}: {why}; start them with `testbed node --broker {self.url} "
                                f"--run {self.run} --node-id ID`")
            self._handle(self.client.receive(timeout_s=min(remaining, 0.5)), None, {}, {})

    def step(self, state: np.ndarray, round_index: int) -> RoundResult:
        """Broadcast round ``round_index`` from ``state`` once a quorum of nodes is online; the
        replies of the nodes that were online then."""
        quorum = min(self.config.mqtt.quorum, len(self.node_ids))
        deadline = time.monotonic() + self.round_timeout_s
        while len(self.online & set(self.node_ids)) < quorum and (remaining := deadline - time.monotonic()) > 0:
            self._handle(self.client.receive(timeout_s=min(remaining, 0.5)), None, {}, {})
        expected = set(self.online) & set(self.node_ids)
        self.client.publish(topics.bcast(self.run),
                            protocol.round_(self.run, self.session, round_index, self.config_toml,
                                            {"state": np.asarray(state)}))
        answers: dict[int, wire.Message] = {}
        refusals: dict[int, wire.Message] = {}
        deadline = time.monotonic() + self.round_timeout_s
        while not expected <= set(answers) | set(refusals):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._handle(self.client.receive(timeout_s=remaining), round_index, answers, refusals)
            expected &= self.online | set(answers) | set(refusals)  # gone offline: stop waiting
        stragglers = tuple(sorted(set(self.node_ids) - set(answers) - set(refusals)))
        if stragglers:
            log.warning("round %d: %d straggler(s): %s", round_index, len(stragglers), _ids(stragglers))
        ids = tuple(sorted(answers))
        output = NodeOutput(
            node_ids=ids,
            params=np.stack([answers[n].tensors["params"] for n in ids]) if ids else np.zeros((0, len(state))),
            events=[protocol.parse_events(answers[n], n) for n in ids],
        )
        refused = tuple((n, m.meta["budget"], float(m.meta["would_be"]), float(m.meta["limit"]))
                        for n, m in sorted(refusals.items()))
        return RoundResult(output, stragglers, refused)

    def _handle(self, item, round_index: int | None, answers: dict, refusals: dict) -> None:
        if item is None:
            return
        if item.kind == topics.STATUS:
            node = _node_id(item.node)
            if node is not None:
                (self.online.add if item.payload == topics.STATUS_ONLINE else self.online.discard)(node)
            return
        msg, node = item.message, _node_id(item.node)
        if msg is None or node is None or round_index is None:
            return
        if protocol.session_of(msg) != self.session or msg.round != round_index:
            log.info("dropped %s of node %s for round %d (session %s): not this round", msg.kind, node,
                     msg.round, protocol.session_of(msg))
            return
        if node in answers or node in refusals:
            log.warning("dropped a second %s of node %d for round %d", msg.kind, node, round_index)
            return
        try:
            if msg.kind == protocol.UPDATE:
                protocol.parse_events(msg, node)
                if "params" not in msg.tensors or msg.tensors["params"].ndim != 1:
                    raise wire.WireError("bad_header", "an update needs a 1-D params tensor")
                answers[node] = msg
            elif msg.kind == protocol.REFUSED:
                refusals[node] = msg
        except wire.WireError as exc:
            log.warning("rejected %s of node %d for round %d: %s", msg.kind, node, round_index, exc)

    def close(self, status: str) -> None:
        """Tell the nodes the run is over, wait for the emulated hosts, stop the embedded broker."""
        client = getattr(self, "client", None)
        try:
            if client is not None and client.connected:
                client.publish(topics.bcast(self.run), protocol.stop(self.run, self.session, status), timeout_s=5)
        except (TimeoutError, UserError) as exc:
            log.warning("could not broadcast stop: %s", exc)
        for host in self._hosts:
            try:
                host.wait(timeout=10)
            except subprocess.TimeoutExpired:
                host.terminate()
                host.wait(timeout=5)
        if client is not None:
            client.close()
        if self._broker is not None:
            self._broker.stop()


def _node_id(name: str | None) -> int | None:
    try:
        return int(name) if name is not None else None
    except ValueError:
        return None


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in list(ids)[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def _credentials(path: str | None, user: str) -> tuple[str | None, str | None]:
    """(username, password) of ``user`` from a `testbed acl` credentials file, or (None, None)."""
    if path is None:
        return None, None
    try:
        passwords = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("mqtt.credentials", f"cannot read {path}: {exc}") from None
    if user not in passwords:
        raise ConfigError("mqtt.credentials", f"{path} has no password for {user!r}")
    return user, passwords[user]
