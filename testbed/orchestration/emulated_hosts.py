"""The emulated boards of an MQTT run: the `testbed nodes` hosts (the nodes split over
``mqtt.hosts`` processes, forked from the coordinator where it can) and a `testbed bridge --virtual`
per microcontroller board; each host's keys file and, with ``links.netns``, its link; a host that
dies takes its nodes offline. :class:`EmulatedHosts` is the coordinator's part that starts and
watches them (testbed.orchestration.coordinator.MqttNodes); :class:`Host` is one process."""

from __future__ import annotations

import collections
import functools
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from testbed.algorithms.contract import Algorithm
from testbed.assembly.config import LinksSection
from testbed.errors import ConfigError
from testbed.mqtt import auth
from testbed.mqtt.broker import parse_broker_url
from testbed.mqtt.brokers import registry as brokers
from testbed.orchestration.links import LinkRounds, Links
from testbed.orchestration.run_access import check_credentials
from testbed.util.forked import ForkedCommand, can_fork
from testbed.util.oneline import shown_ids

# The coordinator's one logger, whichever of its modules writes: what users and tests filter on.
log = logging.getLogger("testbed.orchestration.coordinator")


class EmulatedHosts:
    """The coordinator's emulated hosts (a part of :class:`testbed.orchestration.coordinator.MqttNodes`,
    whose bookkeeping holds ``_hosts``, ``_links``, ``_keys_dir`` and what they are started from)."""

    def _host_groups(self) -> list[list[int]]:
        """The node ids of each emulated `testbed nodes` host (not the microcontroller boards')."""
        mcu = set(self.nodes_section.mcu)
        others = [n for n in self.node_ids if n not in mcu]
        return [[int(n) for n in g] for g in np.array_split(np.array(others), max(1, min(self.mqtt.hosts, len(others))))
                if len(g)]

    def _open_links(self, links: LinksSection, managed: brokers.Registration | None) -> None:
        """Each emulated host's link (links.netns), its rate resolved (links.rate_bps), before the
        broker starts (it listens on their broker ends)."""
        if not self.mqtt.emulated:
            raise ConfigError("links.netns", "puts the emulated hosts behind links; mqtt.emulated is false")
        if managed is None or not managed.listens_beyond_loopback:
            raise ConfigError("links.netns", "needs the run's own broker listening on the links' addresses, which "
                              "mqtt.broker = \"mosquitto\" does (not an external broker_url, not the embedded broker)")
        if self.nodes_section.mcu:
            raise ConfigError("links.netns", "the microcontroller boards' bridges (nodes.mcu) are not put behind links")
        hosts = self._host_groups()
        self._links = Links.open(host_rates(links.rate_bps, hosts, self.alg))
        self._link_rounds = LinkRounds(self._links, hosts)

    def _start_hosts(self, protocol_version: str, broadcast: str, quiet: bool) -> None:
        """The emulated boards: a `testbed bridge --virtual` per microcontroller, and the other nodes
        split over ``mqtt.hosts`` `testbed nodes` processes (forked from this one where it can)."""
        m = self.mqtt
        if m.credentials:
            check_credentials(m.credentials, self.node_ids)
        boards = [n for n in self.node_ids if n in set(self.nodes_section.mcu)]
        groups = self._host_groups()
        keys_env = self._host_keys([[n] for n in boards] + groups)
        for node in boards:  # a microcontroller board: a virtual one behind its own bridge
            cmd = ["bridge", "--virtual", self.nodes_section.mcu_board,
                   "--broker", self.url, "--run", self.run, "--node-id", str(node),
                   "--profile", self.nodes_section.mcu_profile, "--protocol", protocol_version,
                   "--max-chunk-bytes", str(m.max_chunk_bytes)]
            cmd += ["--credentials", m.credentials] if m.credentials else []
            cmd += ["--tls-ca", m.tls_ca] if m.tls_ca else []
            self._hosts.append(Host([node], cmd, quiet, keys_env([node])))
        # Each emulated host gets its share of this machine's cores for torch (a torch model's step),
        # so that hosts do not oversubscribe them (testbed.learning.torch_models reads the variable).
        env = {"TESTBED_TORCH_THREADS": os.environ.get("TESTBED_TORCH_THREADS",
                                                       str(max(1, (os.cpu_count() or 1) // max(1, len(groups)))))}
        for index, group in enumerate(groups):
            url = self.url if self._links is None else url_at(self.url, self._links.links[index].broker_address)
            cmd = ["nodes", "--broker", url, "--run", self.run,
                   "--ids", ",".join(str(int(n)) for n in group), "--profile", self.nodes_section.profile,
                   "--protocol", protocol_version, "--max-chunk-bytes", str(m.max_chunk_bytes),
                   "--broadcast", broadcast,
                   # This session only, and only while this process lives: a killed coordinator's
                   # hosts must not answer (nor be charged for) its resumed successor's rounds.
                   "--session", self.session, "--coordinator-pid", str(os.getpid())]
            if m.credentials:
                cmd += ["--credentials", m.credentials]
            if m.tls_ca:
                cmd += ["--tls-ca", m.tls_ca]
            if self.nodes_section.pacing:
                cmd.append("--pacing")
            env = {**env, **keys_env(group)}
            if self._links is not None:  # a new interpreter in the host's namespace (`ip netns exec` execs it)
                self._hosts.append(Host(group, cmd, quiet, env, wrap=functools.partial(self._links.command, index)))
            else:
                self._hosts.append(Host(group, cmd, quiet, env, fork=can_fork()))

    def _host_keys(self, groups: list[list[int]]) -> Callable[[list[int]], dict[str, str]]:
        """Each emulated host's keys file (its nodes' keys only, mode 0600 in a folder only this user
        enters, removed by close()); the environment that names it to the host (never its command
        line, which any user of the machine can read)."""
        if self.keys is None:
            return lambda group: {auth.NO_AUTH_ENV: "1"}
        self._keys_dir = Path(tempfile.mkdtemp(prefix=f"testbed-keys-{self.run}-"))
        files = {}
        for group in groups:
            path = self._keys_dir / f"keys-{group[0]}.json"
            auth.write_keys(path, self.keys.only(str(n) for n in group))
            files[tuple(group)] = str(path)
        return lambda group: {auth.KEYS_ENV: files[tuple(group)]}

    def _reap_hosts(self) -> None:
        """An emulated host that died takes its nodes offline (their rounds straggle)."""
        for host in self._hosts:
            if host.proc.poll() is not None and not host.reaped:
                host.reaped = True
                log.error("the emulated host of nodes %s exited (status %s): %s", shown_ids(host.node_ids),
                          host.proc.returncode, host.last_error())
                with self._lock:
                    self._offline(set(host.node_ids))


class Host:
    """One `testbed ARGS` process (`nodes`, `bridge --virtual`) serving ``node_ids``, with ``env``
    added to this process's environment; a fork of this process with ``fork``
    (testbed.util.forked), else a new interpreter (its command line through ``wrap``: a link's
    namespace). Its stderr goes through a thread that passes it on
    (unless quiet) and keeps the last lines, to explain an early exit."""

    def __init__(self, node_ids: list[int], args: list[str], quiet: bool, env: dict[str, str] | None = None,
                 fork: bool = False, wrap: Callable[[list[str]], list[str]] | None = None):
        self.node_ids = node_ids
        self.reaped = False
        self.proc: subprocess.Popen | ForkedCommand
        if fork:
            self.proc = ForkedCommand(args, env, name=f"nodes {span(node_ids)}")
        else:
            command = [sys.executable, "-m", "testbed", *args]
            self.proc = subprocess.Popen(wrap(command) if wrap else command, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                         errors="replace", env={**os.environ, **(env or {})})
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
            if timeout_s > 0:
                log.warning("the emulated host of nodes %s did not leave within %g s of the stop; terminated",
                            shown_ids(self.node_ids), timeout_s)
            self.proc.terminate()
            self.proc.wait(timeout=5)
        self._reader.join(timeout=2.0)


def span(ids: Sequence[int]) -> str:
    """``first-last`` of consecutive ids, else the ids with commas: a host's name in ps."""
    return f"{ids[0]}-{ids[-1]}" if list(ids) == list(range(ids[0], ids[-1] + 1)) else ",".join(map(str, ids))


def url_at(url: str, address: str) -> str:
    """``url`` (the run's own broker, on loopback) at ``address`` instead: a link's broker end."""
    parsed = parse_broker_url(url)
    return f"{'mqtts' if parsed.tls else 'mqtt'}://{address}:{parsed.port}"


def host_rates(rate_bps: str | int | list[int] | None, hosts: list[list[int]], algorithm: Algorithm) -> list[int | None]:
    """Each host's link rate in bit/s (None: unshaped) from links.rate_bps: one for all, one per
    host (0: unshaped), or "channel": the algorithm's link model's rate for the host's slowest node
    (its ``link_rate_bps(nodes)``, (N,) bit/s)."""
    if rate_bps is None:
        return [None] * len(hosts)
    if isinstance(rate_bps, int):
        return [rate_bps] * len(hosts)
    if isinstance(rate_bps, list):
        if len(rate_bps) != len(hosts):
            raise ConfigError("links.rate_bps", f"lists {len(rate_bps)} rates for {len(hosts)} emulated hosts "
                              "(mqtt.hosts): one each")
        return [rate or None for rate in rate_bps]
    model = getattr(algorithm, "link_rate_bps", None)
    if model is None:
        raise ConfigError("links.rate_bps", f"\"channel\": this run's algorithm has no link model to take a rate "
                          "from; give the rate in bit/s")
    rates = np.asarray(model([n for group in hosts for n in group]), dtype=float)
    by_node = dict(zip((n for group in hosts for n in group), rates.tolist()))
    return [max(1, int(min(by_node[n] for n in group))) for group in hosts]
