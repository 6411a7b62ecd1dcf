"""The coordinator's side of an MQTT run: starts (or finds) the broker and the nodes, broadcasts
each round, collects the replies until every live node answered or the round's deadline passed.

A node that misses the deadline, or goes offline (its last will) during the round, is a straggler
for that round; it rejoins with the next round's broadcast, which carries everything it needs.
Replies from another session, another round, or a second copy of one node's reply are logged and
dropped.

Over-the-air algorithms (DWFL) keep one model per node: each node gets its own row on its
downlink, and a channel emulator (testbed.mqtt.channel_emulator, a client of its own started
here) carries the transmit signals between the nodes; the nodes answer with their new models.
"""

from __future__ import annotations

import collections
import json
import logging
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from testbed import protocol, wire
from testbed.algorithms import Algorithm, NodeOutput, RoundResult
from testbed.config import Config
from testbed.errors import ConfigError, UserError
from testbed.mqtt import topics
from testbed.mqtt.broker import EmbeddedBroker
from testbed.mqtt.channel_emulator import ChannelEmulator
from testbed.mqtt.client import MqttClient

log = logging.getLogger(__name__)

_SIGNAL_SHARE = 0.8  # of an over-the-air round's deadline, for the channel to collect the signals


class MqttNodes:
    """The nodes of a run, reached over MQTT.

    Args:
        config: the experiment (its ``[mqtt]`` section says how).
        config_toml: the resolved experiment file every round carries.
        node_ids: the run's nodes.
        quiet: no broker/host chatter on stderr.
        algorithm: the run's algorithm; an ``over_the_air`` one puts the channel emulator between
            the nodes, and its ``shared_tensors`` go with every round.
    """

    def __init__(self, config: Config, config_toml: str, node_ids: Sequence[int], quiet: bool = False,
                 algorithm: Algorithm | None = None):
        m = config.mqtt
        self.config, self.config_toml = config, config_toml
        self.node_ids = list(node_ids)
        self.run = wire.check_id(m.run_id, "mqtt.run_id")
        self.session = secrets.token_hex(8)
        self.round_timeout_s = m.round_timeout_s
        self._hosts: list[_Host] = []
        self.algorithm = algorithm
        self.over_the_air = algorithm is not None and algorithm.over_the_air
        self._channel: ChannelEmulator | None = None
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
            if self.over_the_air:
                user, secret = _credentials(m.credentials, topics.CHANNEL)
                self._channel = ChannelEmulator(self.url, self.run, connect_timeout_s=m.connect_timeout_s,
                                                username=user, password=secret, tls_ca=m.tls_ca,
                                                max_chunk_bytes=m.max_chunk_bytes, protocol=version)
            self.online: set[int] = set()
            if m.emulated:
                self._start_hosts(quiet)
            self._wait_online(m.connect_timeout_s)
        except BaseException:
            self.close("failed")
            raise

    def _start_hosts(self, quiet: bool) -> None:
        m = self.config.mqtt
        if m.credentials:
            _check_credentials(m.credentials, self.node_ids)
        groups = [g for g in np.array_split(np.array(self.node_ids), max(1, min(m.hosts, len(self.node_ids)))) if len(g)]
        for group in groups:
            cmd = [sys.executable, "-m", "testbed", "nodes", "--broker", self.url, "--run", self.run,
                   "--ids", ",".join(str(int(n)) for n in group), "--profile", self.config.nodes.profile,
                   "--protocol", self.client.protocol or "auto", "--max-chunk-bytes", str(m.max_chunk_bytes)]
            if m.credentials:
                cmd += ["--credentials", m.credentials]
            if m.tls_ca:
                cmd += ["--tls-ca", m.tls_ca]
            if self.config.nodes.pacing:
                cmd.append("--pacing")
            self._hosts.append(_Host([int(n) for n in group], cmd, quiet))

    def _wait_online(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        wanted = set(self.node_ids)
        while not wanted <= self.online:
            remaining = deadline - time.monotonic()
            dead = [h for h in self._hosts if h.proc.poll() is not None]
            if dead:
                # The host's own last words say which node and why (refused credentials, a bad
                # CA, a missing data file...): pass them on instead of a bare "exited".
                raise UserError("; ".join(f"the emulated host of nodes {_ids(h.node_ids)} exited "
                                          f"(status {h.proc.returncode}) before its nodes were online: "
                                          f"{h.last_error()}" for h in dead))
            if remaining <= 0:
                missing = sorted(wanted - self.online)
                raise UserError(f"{len(missing)} of {len(wanted)} nodes ({_ids(missing)}) are not connected to "
                                f"{self.url}: not online within {timeout_s:g} s; start them with "
                                f"`testbed node --broker {self.url} --run {self.run} --node-id ID`")
            self._handle(self.client.receive(timeout_s=min(remaining, 0.5)), None, {}, {})

    def step(self, state: np.ndarray, round_index: int) -> RoundResult:
        """Broadcast round ``round_index`` from ``state`` once a quorum of nodes is online; the
        replies of the nodes that were online then."""
        quorum = min(self.config.mqtt.quorum, len(self.node_ids))
        deadline = time.monotonic() + self.round_timeout_s
        while len(self.online & set(self.node_ids)) < quorum and (remaining := deadline - time.monotonic()) > 0:
            self._handle(self.client.receive(timeout_s=min(remaining, 0.5)), None, {}, {})
        expected = set(self.online) & set(self.node_ids)
        if self.over_the_air:
            self._start_on_air(state, round_index, expected)
        else:
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
            params=np.stack([answers[n].tensors["params"] for n in ids]) if ids else np.zeros((0, np.shape(state)[-1])),
            events=[protocol.parse_events(answers[n], n) for n in ids],
        )
        refused = tuple((n, m.meta["budget"], float(m.meta["would_be"]), float(m.meta["limit"]))
                        for n, m in sorted(refusals.items()))
        new_state = None
        if self.over_the_air:  # the answers are the nodes' new models; the silent keep theirs
            new_state = np.array(state, copy=True)
            new_state[list(ids)] = output.params
        return RoundResult(output, stragglers, refused, new_state)

    def _start_on_air(self, state: np.ndarray, round_index: int, expected: set[int]) -> None:
        """Announce the round to the channel emulator, then send each node its own model row.
        The channel collects signals for most of the round's time (a node's first round includes
        building its experiment); finishing an update after that takes milliseconds."""
        shared = self.algorithm.shared_tensors(round_index)  # type: ignore[union-attr]
        self.client.publish(topics.chan(self.run),
                            protocol.transmit(self.run, self.session, round_index, self.config_toml,
                                              sorted(expected), _SIGNAL_SHARE * self.round_timeout_s, shared))
        for node in sorted(expected):
            self.client.publish(topics.down(self.run, str(node)),
                                protocol.round_(self.run, self.session, round_index, self.config_toml,
                                                {"state": np.asarray(state[[node]]), **shared}))

    def _handle(self, item, round_index: int | None, answers: dict, refusals: dict) -> None:
        if item is None:
            return
        if item.kind == topics.STATUS:
            node = topics.node_index(item.node)
            if node is not None:
                (self.online.add if item.payload == topics.STATUS_ONLINE else self.online.discard)(node)
            return
        msg, node = item.message, topics.node_index(item.node)
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
            host.stop(timeout_s=10)
        if self._channel is not None:
            self._channel.close()
        if client is not None:
            client.close()
        if self._broker is not None:
            self._broker.stop()


class _Host:
    """One `testbed nodes` subprocess serving ``node_ids``. Its stderr goes through a thread that
    passes it on (unless quiet) and keeps the last lines, to explain an early exit."""

    def __init__(self, node_ids: list[int], cmd: list[str], quiet: bool):
        self.node_ids = node_ids
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, text=True, errors="replace")
        self._tail: collections.deque[str] = collections.deque(maxlen=20)
        self._reader = threading.Thread(target=self._read, args=(quiet,), daemon=True,
                                        name=f"node-host-{self.proc.pid}-stderr")
        self._reader.start()

    def _read(self, quiet: bool) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self._tail.append(line.rstrip("\n"))
                if not quiet:
                    try:
                        sys.stderr.write(line)
                        sys.stderr.flush()
                    except (OSError, ValueError):  # our own stderr is gone: keep draining the pipe
                        pass

    def last_error(self) -> str:
        """The host's error line (`testbed: ...`, else the last line it wrote) once it exited."""
        self._reader.join(timeout=2.0)  # the pipe ends with the process: everything is read
        lines = [line for line in self._tail if line.strip()]
        errors = [line.removeprefix("testbed: ") for line in lines if line.startswith("testbed: ")]
        return (errors or lines or ["no output"])[-1]

    def stop(self, timeout_s: float) -> None:
        """Wait for the host to leave (it was told to stop), terminate it if it does not."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=5)
        self._reader.join(timeout=2.0)


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in list(ids)[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def _check_credentials(path: str, node_ids: Sequence[int]) -> None:
    """Every emulated node needs its password in the credentials file (checked before any host
    starts, so the error names the nodes rather than a host that exited)."""
    passwords = _read_credentials(path)
    missing = [n for n in node_ids if str(n) not in passwords]
    if missing:
        raise ConfigError("mqtt.credentials", f"{path} has no password for node(s) {_ids(missing)} "
                          f"(`testbed acl --run RUN --nodes N` writes one for each of nodes 0..N-1)")


def _read_credentials(path: str) -> dict:
    try:
        passwords = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError("mqtt.credentials", f"cannot read {path}: {exc}") from None
    if not isinstance(passwords, dict):
        raise ConfigError("mqtt.credentials", f"{path} is not a credentials file of `testbed acl`")
    return passwords


def _credentials(path: str | None, user: str) -> tuple[str | None, str | None]:
    """(username, password) of ``user`` from a `testbed acl` credentials file, or (None, None)."""
    if path is None:
        return None, None
    passwords = _read_credentials(path)
    if user not in passwords:
        raise ConfigError("mqtt.credentials", f"{path} has no password for {user!r}")
    return user, passwords[user]
