"""Emulated hosts behind network links of their own (the ``[links]`` section; Linux, root, iproute2).

Each host gets a network namespace joined to this one (the broker's) by a veth pair with a /30 of
:data:`SUBNET` (the first free one): the broker's end its first address (the broker listens there
too), the host's end its second, so the host's nodes reach the broker over an interface with an
address of its own, not loopback. A host's rate shapes
both ends with tc's token bucket filter (``tbf``): the broker's end sends the host's downlink, the
host's end its uplink. The host runs under ``ip netns exec`` (which execs: it stays the
coordinator's child, and its coordinator watch still works).

Delay and loss (tc's ``netem``) are not offered: this project's CI kernel has no ``sch_netem``
("Specified qdisc kind is unknown"); docs/multi-host.md says so.

Cleaning up: every name carries the coordinator's pid (namespace ``testbed-PID-I``, broker-side
device ``tbPIDxI``). :meth:`Links.close` deletes them (a namespace's deletion takes its veth pair
with it); a killed coordinator (SIGKILL included) leaves that to a watchdog started with them, a
``sh`` in a session of its own that waits for its parent, the coordinator, to change, then deletes
them; and every start first sweeps the names of coordinators no longer alive (a watchdog killed
too).
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import ConfigError, UserError
from testbed.orchestration.measured_bounds import wire_limit_s

log = logging.getLogger(__name__)

#: The addresses the links take, one /30 per host.
SUBNET = ipaddress.ip_network("10.213.0.0/16")
_NETNS = re.compile(r"^testbed-(\d+)-(\d+)$")
_DEVICE = re.compile(r"^tb(\d+)x(\d+)$")
_MTU_BYTES = 1514  # an Ethernet frame: tbf's bucket holds at least one (a larger packet is never sent)
_QUEUE_S = 10.0  # how long a packet may wait in a shaped link's queue before tbf drops it
_LOCK = Path(tempfile.gettempdir()) / "testbed-links.lock"  # one run allocates addresses at a time


@dataclass(frozen=True)
class Link:
    """One host's link: its namespace, the broker's end (device and address), the host's end
    address, and its rate (None: unshaped)."""

    netns: str
    device: str
    broker_address: str
    host_address: str
    rate_bps: int | None

    def counters(self) -> tuple[int, int]:
        """(bytes down, bytes up) the link has carried so far, frames and headers included: the
        broker's end's sent and received bytes."""
        stats = Path("/sys/class/net") / self.device / "statistics"
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


def missing() -> str | None:
    """Why this machine cannot make links (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "the ip and tc commands are not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "making network namespaces takes root"
    return None


def tbf_args(rate_bps: int) -> list[str]:
    """tc's arguments for a ``tbf`` at ``rate_bps``: a bucket of :func:`burst_bytes`, a queue of
    :data:`_QUEUE_S` of the rate (TCP's packets wait, not dropped)."""
    burst = burst_bytes(rate_bps)
    limit = max(64 * 1024, int(rate_bps / 8 * _QUEUE_S)) + burst
    return ["tbf", "rate", f"{rate_bps}bit", "burst", str(burst), "limit", str(limit)]


def burst_bytes(rate_bps: int) -> int:
    """The bytes tbf lets pass unpaced after an idle spell (its bucket): one frame or 10 ms of the
    rate, whichever is more; at a slow rate one frame, so that a round's few kilobytes take the
    time the rate says."""
    return max(_MTU_BYTES, rate_bps // 8 // 100)


def rate_s(bytes_down: int, bytes_up: int, rate_bps: int) -> float:
    """The seconds a link at ``rate_bps`` takes to carry a round's bytes each way, one after the
    other (a round's downlink comes before its uplink), past the bucket each direction starts the
    round with (full: the link idles between rounds)."""
    burst = burst_bytes(rate_bps)
    return (max(0, bytes_down - burst) + max(0, bytes_up - burst)) * 8 / rate_bps


def split_wire_s(wire_s: float, bytes_by_node: dict[int, int]) -> dict[int, float]:
    """A host's round on its link (``wire_s``, measured) split among its answered nodes
    (``bytes_by_node``: each one's payload bytes up and down, its communication events'), in
    proportion to their bytes: the share of the shared link's time that carried each node's update,
    comparable with the airtime its communication event models for the same bytes. The shares sum
    to ``wire_s`` (rounding aside); none is negative; nodes of no bytes share it equally when none
    of them has any (the round still took that long for them), else take none.

    Example::

        >>> split_wire_s(3.0, {8: 100, 9: 200})
        {8: 1.0, 9: 2.0}
        >>> split_wire_s(3.0, {8: 0, 9: 0})
        {8: 1.5, 9: 1.5}
    """
    if not bytes_by_node:
        return {}
    if any(b < 0 for b in bytes_by_node.values()):
        raise ValueError("a node's bytes on a link cannot be negative")
    total = sum(bytes_by_node.values())
    if total == 0:
        return {node: wire_s / len(bytes_by_node) for node in bytes_by_node}
    return {node: wire_s * b / total for node, b in bytes_by_node.items()}


def _run(command: list[str]) -> None:
    """Run an ``ip`` or ``tc`` command; UserError with its message if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"links: `{' '.join(command)}` failed: {done.stderr.strip() or done.returncode}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Delete the namespaces and devices of coordinators no longer alive; the names deleted."""
    swept = []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
    for name in (line.split()[0] for line in listed if line.strip()):
        if (m := _NETNS.match(name)) and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            swept.append(name)
    for device in os.listdir("/sys/class/net"):
        if (m := _DEVICE.match(device)) and not _alive(int(m.group(1))):
            subprocess.run(["ip", "link", "del", device], capture_output=True)
            swept.append(device)
    if swept:
        log.warning("links: removed %d namespace(s) and device(s) of coordinators no longer running: %s",
                    len(swept), ", ".join(swept))
    return swept


def _used_networks() -> set[ipaddress.IPv4Network]:
    """The /30s of :data:`SUBNET` an interface of this namespace already has an address in."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    used = set()
    for address in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out):
        ip = ipaddress.ip_address(address)
        if ip in SUBNET:
            used.add(ipaddress.ip_network(f"{ip}/30", strict=False))
    return used


class Links:
    """The links of one run's hosts (see the module's docstring), made by :meth:`open`.

    Args:
        links: one per host, in the order of the hosts.
        watchdog: the process that deletes them if this one dies first.
    """

    def __init__(self, links: list[Link], watchdog: subprocess.Popen | None):
        self.links = links
        self._watchdog = watchdog

    @classmethod
    def open(cls, rates_bps: list[int | None]) -> "Links":
        """A link for each host, shaped to its rate (None: unshaped); stale ones swept first.

        Raises:
            ConfigError: this machine cannot make them (links.netns).
            UserError: an ``ip`` or ``tc`` command failed (its message).
        """
        if (why := missing()) is not None:
            raise ConfigError("links.netns", why)
        sweep()
        pid = os.getpid()
        links: list[Link] = []
        watchdog = None
        try:
            with open(_LOCK, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                used = _used_networks()
                free = (net for net in SUBNET.subnets(new_prefix=30) if net not in used)
                for i, rate in enumerate(rates_bps):
                    net = next(free, None)
                    if net is None:
                        raise UserError(f"links: no free /30 left in {SUBNET}")
                    broker_end, host_end = (str(a) for a in list(net.hosts())[:2])
                    link = Link(f"testbed-{pid}-{i}", f"tb{pid}x{i}", broker_end, host_end, rate)
                    links.append(link)
                    if watchdog is None:  # before the first name exists: nothing made is left behind
                        watchdog = _watchdog(pid, len(rates_bps))
                    _make(link, peer=f"tb{pid}y{i}")
            for link in links:
                log.info("links: host %s at %s (broker at %s), %s", link.netns, link.host_address,
                         link.broker_address, f"{link.rate_bps} bit/s" if link.rate_bps else "unshaped")
            return cls(links, watchdog)
        except BaseException:
            cls(links, watchdog).close()
            raise

    def command(self, host: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.links[host].netns, *argv]

    def counters(self) -> list[tuple[int, int]]:
        """Each link's (bytes down, bytes up) so far (:meth:`Link.counters`)."""
        return [link.counters() for link in self.links]

    def close(self) -> None:
        """Delete every namespace (its veth pair with it) and device; stop the watchdog."""
        for link in self.links:
            subprocess.run(["ip", "netns", "del", link.netns], capture_output=True)
            subprocess.run(["ip", "link", "del", link.device], capture_output=True)  # if never moved
        if self._watchdog is not None:
            self._watchdog.terminate()
            self._watchdog.wait()
            self._watchdog = None


def link_commands(link: Link, peer: str) -> list[list[str]]:
    """The commands that make ``link`` (``peer``: the host's end before it moves into the
    namespace): the namespace, the veth pair, their addresses, and the shaping of both ends.
    docs/multi-host.md lists them (tests/test_links.py checks it)."""
    commands = [["ip", "netns", "add", link.netns],
                ["ip", "link", "add", link.device, "type", "veth", "peer", "name", peer],
                ["ip", "link", "set", peer, "netns", link.netns],
                ["ip", "addr", "add", f"{link.broker_address}/30", "dev", link.device],
                ["ip", "link", "set", link.device, "up"],
                ["ip", "-n", link.netns, "addr", "add", f"{link.host_address}/30", "dev", peer],
                ["ip", "-n", link.netns, "link", "set", peer, "up"],
                ["ip", "-n", link.netns, "link", "set", "lo", "up"]]
    if link.rate_bps:
        commands += [["tc", "qdisc", "replace", "dev", link.device, "root", *tbf_args(link.rate_bps)],
                     ["tc", "-n", link.netns, "qdisc", "replace", "dev", peer, "root", *tbf_args(link.rate_bps)]]
    return commands


def _make(link: Link, peer: str) -> None:
    """Run :func:`link_commands`."""
    for command in link_commands(link, peer):
        _run(command)


def _watchdog(pid: int, hosts: int) -> subprocess.Popen:
    """A ``sh`` that deletes run ``pid``'s namespaces and devices once its parent is no longer
    ``pid`` (the coordinator died, however), in a session of its own (a terminal's Ctrl-C to the
    coordinator's group does not reach it)."""
    names = " ".join(f"testbed-{pid}-{i}" for i in range(hosts))
    devices = " ".join(f"tb{pid}x{i}" for i in range(hosts))
    script = (f'while [ "$(cut -d" " -f4 /proc/$$/stat)" = "{pid}" ]; do sleep 0.5; done; '
              f"for n in {names}; do ip netns del $n 2>/dev/null; done; "
              f"for d in {devices}; do ip link del $d 2>/dev/null; done")
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


class LinkRounds:
    """What each host's link carried in each round, measured, beside what the rate implies and the
    airtime the run's cost model charged its nodes.

    Args:
        links: the run's links, one per host.
        hosts: each host's node ids, in the order of ``links``.

    Per host and round: ``wire_s``, the seconds from just before the round was published to the
    host's last reply at the coordinator (the downlink, its nodes' steps, their uplinks, over
    this link: measured; at most :func:`~testbed.orchestration.measured_bounds.wire_limit_s` of the
    round's window); ``bytes_down``/``bytes_up``, the bytes the link carried meanwhile
    (frames and headers: the broker's end's counters); ``rate_s``, the seconds those bytes take at
    the link's rate (:func:`rate_s`; None unshaped); ``airtime_s``, the modelled airtime of the
    ledger's communication events of the host's nodes that answered, summed (they share the link);
    ``nodes_wire_s``, ``wire_s`` split among those nodes (:func:`split_wire_s`: what each one's
    WireEvent in the ledger says).
    """

    def __init__(self, links: Links, hosts: list[list[int]]):
        self.links = links
        self.hosts = hosts
        self._rows: list[list[dict]] = [[] for _ in hosts]
        self._start_s = 0.0
        self._start_counters: list[tuple[int, int]] = []

    def start(self) -> None:
        """A round is about to be published."""
        self._start_counters = self.links.counters()
        self._start_s = time.monotonic()

    def end(self, round_index: int, arrived_s: dict[int, float], airtime_s: dict[int, float],
            bytes_by_node: dict[int, int]) -> dict[int, float]:
        """The round closed: ``arrived_s`` node → monotonic time its reply came, ``airtime_s`` node
        → its modelled airtime, ``bytes_by_node`` node → its payload bytes up and down (answering
        nodes). Returns each answering node's share of its host's wire seconds (:func:`split_wire_s`)."""
        counters = self.links.counters()
        limit_s = wire_limit_s(time.monotonic() - self._start_s)
        shares: dict[int, float] = {}
        for rows, link, nodes, (down0, up0), (down1, up1) in zip(self._rows, self.links.links, self.hosts,
                                                                  self._start_counters, counters):
            came = [arrived_s[n] for n in nodes if n in arrived_s]
            if not came:  # none of its nodes answered: no round over this link to time
                continue
            down, up = down1 - down0, up1 - up0
            wire_s = min(max(came) - self._start_s, limit_s)
            split = split_wire_s(wire_s, {n: bytes_by_node.get(n, 0) for n in nodes if n in arrived_s})
            shares.update(split)
            rows.append({"round": round_index, "wire_s": wire_s, "bytes_down": down,
                         "bytes_up": up, "rate_s": rate_s(down, up, link.rate_bps) if link.rate_bps else None,
                         "airtime_s": sum(airtime_s.get(n, 0.0) for n in nodes),
                         "nodes_wire_s": {str(n): s for n, s in split.items()}})
        return shares

    def summary(self) -> list[dict]:
        """summary.json's ``links``: per host, its link, its totals (``nodes_wire_s``: each node's
        wire seconds over the rounds, as its ledger's WireEvents sum) and its rounds."""
        out = []
        for link, nodes, rows in zip(self.links.links, self.hosts, self._rows):
            total = {key: sum(r[key] for r in rows) for key in ("wire_s", "bytes_down", "bytes_up", "airtime_s")}
            total["nodes_wire_s"] = {str(n): sum(r["nodes_wire_s"].get(str(n), 0.0) for r in rows) for n in nodes}
            implied_s = sum(r["rate_s"] for r in rows) if link.rate_bps else None
            out.append({"netns": link.netns, "host_address": link.host_address,
                        "broker_address": link.broker_address, "rate_bps": link.rate_bps, "nodes": nodes,
                        "rounds_timed": len(rows), **total, "rate_s": implied_s, "rounds": rows})
        return out
