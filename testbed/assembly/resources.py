"""Whether a run fits this machine, checked before anything is allocated (the runner's first stage).

``data.num_nodes = 10_000_000`` used to fail after 17 s with a 596 GiB numpy allocation error (or,
with tiny nodes, run on for minutes); now it is one line before any data exist. The estimate is
deliberately rough and errs high: it counts

- the data: nodes × samples × (dim × 8 or 4 bytes by ``data.dtype`` + 8 for the label), for a set
  whose generator writes straight into the final arrays (the synthetic set; its registration says
  so, ``counted`` in testbed.data.registry: the file-based sets are as large as their file, not
  counted). With lazy nodes (client sampling,
  testbed.assembly.assemble.holds_lazily) only the nodes a round samples hold rows, so "nodes" here is the
  sampled count, not N (a file-based set's rows are then memory-mapped, testbed.data.mapped);
- the evaluated nodes' rows (``output.eval_nodes``; every node when unset), held besides the
  training rows when a subset is evaluated, the only other rows when the nodes are lazy;
- the round's stacks: sampled nodes × parameters × 8 bytes × :data:`_STATE_COPIES` (per-node
  state rows, the stacked downlink, uplink, noise and aggregate);
- every node's share of the coordinator's bookkeeping (the ledger book's columns, ids, offsets):
  :data:`_NODE_BYTES` each, ~0.7 KB measured at a million nodes in sim (840 MB peak RSS in all);
- gossip and D-PSGD with a robust rule at the receivers: every receiver's neighbours' payloads
  apart, nodes × the largest degree × parameters × 8 bytes × :data:`_NEIGHBOURHOOD_COPIES` (the
  gathered payloads, their sorted copy, the rule's temporaries); the degree from the topology's kind,
  or block 0's graph × 1.5 for a random one;
- over MQTT with emulated boards, the node hosts on this machine: :data:`_HOST_BYTES` each and
  per node :data:`_HOST_NODE_BYTES` (its client, socket buffers, agent) plus its own copy of its
  data (a synthetic node generates its samples where it runs).

Besides memory, an emulated node is a socket: more nodes per host than the open-file limit allows,
more connections than this machine has ephemeral ports to reach the broker, or (embedded broker,
a thread of the coordinator) more nodes than the coordinator may open files, cannot run at all.
Measured with benchmarks/mqtt_scale.py (10,000 J1 nodes on 10 hosts over Mosquitto): what this
does not see is a broker's own limits (Mosquitto's open files and ``max_queued_messages``, see
:func:`testbed.mqtt.brokers.mosquitto.queued_messages_for`), which are the broker's configuration.

Counts typed on the command line are checked the same way before anything is made
(:func:`check_count`, :func:`check_host`): `testbed nodes --count`, `testbed acl --nodes`, a sweep's
grid and repeats.
"""

from __future__ import annotations

import math
import resource
from pathlib import Path

import numpy as np

from testbed.assembly.config import Config
from testbed.errors import ConfigError, UserError
from testbed.util import memory

_STATE_COPIES = 6
_NODE_BYTES = 1024
_HOST_BYTES = 80 * 2**20
_HOST_NODE_BYTES = 256 * 1024  # besides its data; measured ~60 KB for a J1 node, kept generous
_NEIGHBOURHOOD_COPIES = 3
_FILE_SET_DIM = 128  # at least the feature count of the file-based sets (Adult, Vehicle), before one-hot
_HOST_SPARE_FILES = 64  # a host's own files besides its nodes' sockets (as nodes.host reserves)


def estimate_bytes(config: Config) -> dict[str, float]:
    """What a run of ``config`` would hold in memory on this machine, in bytes, by part."""
    from testbed.assembly.assemble import holds_lazily
    from testbed.data import registry as data_registry
    from testbed.learning.models import build_model

    d = config.data
    dataset = data_registry.get(d.dataset)
    n = d.num_nodes
    sampled = min(n, math.ceil(config.client_sampling.per_round(n)))
    evaluated = n if config.output.eval_nodes is None else min(n, config.output.eval_nodes)
    lazy = holds_lazily(config)
    dim = _FILE_SET_DIM if dataset.features is None else dataset.features(d)
    params = build_model(config.model.kind, dim, d.n_classes, bias=config.model.bias,
                         hidden=config.model.hidden, random_features=config.model.random_features,
                         seed=config.run.seed, network=config.model.network).num_params
    node_bytes = d.samples_per_node * (dim * np.dtype(d.dtype).itemsize + 8)
    held = sampled if lazy else n
    parts = {
        "data": float(held * node_bytes) if dataset.counted else 0.0,
        "evaluation": float(evaluated * node_bytes) if dataset.counted and (lazy or evaluated < n) else 0.0,
        "state": float(_STATE_COPIES * (sampled if lazy else n) * params * 8),
        "nodes": float(n * _NODE_BYTES),
    }
    received = _neighbourhood_bytes(config, params)
    if received:
        parts["neighbourhood"] = received
    if config.run.mode == "mqtt" and config.mqtt.emulated:
        # Each host holds its own nodes' rows besides the coordinator's copy.
        parts["hosts"] = float(min(config.mqtt.hosts, n) * _HOST_BYTES + n * (_HOST_NODE_BYTES + node_bytes))
    return parts


def _neighbourhood_bytes(config: Config, params: int) -> float:
    """Gossip's and D-PSGD's receivers' neighbourhoods under a robust rule (0 under the mean: the
    channel's sparse product holds one row per node)."""
    algorithm = config.run.algorithm
    if algorithm not in ("gossip", "dpsgd") or getattr(config, algorithm).aggregation == "mean":
        return 0.0
    t, n = config.topology, config.data.num_nodes
    known = {"complete": n - 1, "ring": 2, "torus": 4, "k_regular": t.degree}
    if t.kind in known:
        degree = float(min(known[t.kind], n - 1))
    else:
        from testbed.topology import Topology

        section = getattr(config, algorithm)
        drawn = Topology(t, n, config.run.seed, section.link_budget()).graph(0).degrees
        degree = min(1.5 * float(drawn.max()), n - 1.0)
    return _NEIGHBOURHOOD_COPIES * n * degree * params * 8.0


def check_fits(config: Config) -> None:
    """Refuse, in one line naming the key, a run this machine cannot hold or serve.

    Raises:
        ConfigError: the estimate is over the available memory; an emulated host would need more
            sockets than the open-file limit allows; more emulated nodes than ephemeral ports.
    """
    _check_memory(config)
    if config.run.mode == "mqtt" and config.mqtt.emulated:
        _check_sockets(config)


def _check_memory(config: Config) -> None:
    parts = estimate_bytes(config)
    need, have = sum(parts.values()), memory.available_bytes()
    if have is None or need <= have:
        return
    shown = ", ".join(f"{name} {_size(b)}" for name, b in parts.items() if b >= 0.01 * need)
    if parts["evaluation"] == max(parts.values()):
        raise ConfigError("output.eval_nodes", f"evaluating {config.output.eval_nodes or config.data.num_nodes:,} "
                                               f"nodes needs about {_size(need)} of memory ({shown}), this machine "
                                               f"has {_size(have)} available; evaluate on fewer nodes")
    if parts.get("neighbourhood", 0.0) == max(parts.values()):
        raise ConfigError(f"{config.run.algorithm}.aggregation",
                          f"a robust rule at the receivers holds every node's neighbours' payloads apart: about "
                          f"{_size(need)} of memory ({shown}), this machine has {_size(have)} available; use "
                          f'aggregation = "mean", a sparser [topology] or fewer nodes')
    raise ConfigError("data.num_nodes", f"{config.data.num_nodes:,} nodes need about {_size(need)} of memory "
                                        f"({shown}), this machine has {_size(have)} available; use fewer nodes, "
                                        f"samples or features")


def check_count(count: int, bytes_each: float, what: str) -> None:
    """Refuse, in one line naming ``what`` (the option the user typed), ``count`` things of about
    ``bytes_each`` bytes each that this machine's available memory cannot hold; call it before
    making any of them.

    Raises:
        UserError: ``count × bytes_each`` is over the available memory.
    """
    need, have = count * bytes_each, memory.available_bytes()
    if have is not None and need > have:
        raise UserError(f"{what} {count:,} needs about {_size(need)} of memory, this machine has {_size(have)} "
                        f"available")


def check_host(nodes: int, what: str) -> None:
    """Refuse, in one line naming ``what``, an emulated host (`testbed nodes`) of ``nodes`` nodes
    that this machine cannot serve: their clients' memory, or a socket each over the open-file limit.

    Raises:
        UserError: too little memory, or more sockets than the hard open-file limit allows.
    """
    check_count(nodes, _HOST_NODE_BYTES, what)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and nodes + _HOST_SPARE_FILES > hard:
        raise UserError(f"{what} {nodes:,}: one host of {nodes:,} nodes needs {nodes + _HOST_SPARE_FILES:,} open "
                        f"files, over this machine's hard limit of {hard:,}; serve them from several hosts")


def _check_sockets(config: Config) -> None:
    n, hosts = config.data.num_nodes, min(config.mqtt.hosts, config.data.num_nodes)
    per_host = -(-n // hosts)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = hard - _HOST_SPARE_FILES
    if hard != resource.RLIM_INFINITY and per_host > room:
        raise ConfigError("mqtt.hosts", f"{per_host:,} emulated nodes per host need {per_host + _HOST_SPARE_FILES:,} "
                                        f"open files, over this machine's hard limit of {hard:,}; use mqtt.hosts "
                                        f">= {-(-n // room):,}")
    if config.mqtt.broker_url is None and hard != resource.RLIM_INFINITY and n + _HOST_SPARE_FILES > hard:
        raise ConfigError("mqtt.broker_url", f"the embedded broker runs in the coordinator and holds a socket per "
                                             f"node: {n:,} nodes need {n + _HOST_SPARE_FILES:,} open files, over this "
                                             f"machine's hard limit of {hard:,}; use a Mosquitto broker_url")
    # One connection per node (a host's first node also probes the broker first) and the
    # coordinator's, each holding an ephemeral port of this machine towards the broker's address.
    connections = n + hosts + 1
    ports = _ephemeral_ports()
    if ports is not None and connections > ports:
        raise ConfigError("data.num_nodes", f"{n:,} emulated nodes need {connections:,} connections to the broker, "
                                            f"over the {ports:,} ephemeral ports of this machine "
                                            f"(/proc/sys/net/ipv4/ip_local_port_range)")


def _ephemeral_ports() -> int | None:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return None
    return high - low + 1


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.0f} KiB"
