"""White-box canary gradients for the one-run audit (testbed.privacy.audit; Steinke, Nasr and
Jagielski 2023, §6's white-box setting with Dirac canaries).

While a :class:`Canaries` is :func:`active`, every Gaussian release of the model's size passes its
perturbation (the σZ the node adds to its pre-noise value; testbed.algorithms.base.gaussian_release,
DP-PASGD's per-step noise, DWFL's transmit) through :func:`insert`, which

- adds each canary of the node that is in: a vector of norm ``reach`` along its direction, what one
  record can move the pre-noise value by (the algorithm states it from the mechanism: a clip norm,
  a model's gradient bound; never the ledger's claimed sensitivity, so a claim that is too small is
  caught); under replace-one adjacency canary i adds ±reach/2 (in / out: two records a distance reach
  apart), under add/remove reach (in) or nothing (out); with a sampling rate q < 1 each canary takes
  part in each composition with probability q, as a record would be drawn into a batch;
- scores each canary by the inner product of the perturbation it then adds (canaries and noise:
  the release minus its pre-noise value) with the canary's direction, summed over the run, in units
  of reach.

The scores measure the mechanism the code runs: the noise it draws, the compositions it releases,
the reach it claims, not the data's gradient (which the white-box auditor subtracts; it is
independent of the coins, so the theorem's bound holds for any such scoring).

Each node carries up to its model's size of canaries, along distinct coordinates with random signs
(Dirac canaries: orthogonal, so a node's canaries do not mask each other, and an inner product is a
gather). Which canaries are in, their coordinates and signs, and when one is sampled come from the
node's own AUDIT streams, so the audit moves no other draw of the run.

Example::

    >>> c = Canaries(seed=0, nodes=[0], per_node=4)
    >>> noise = np.zeros((1, 1, 8))
    >>> with active(c):
    ...     insert(noise, [0], 0, reach=2.0, adjacency="add_remove", rates=[1.0], observer="server")
    >>> bool(np.abs(noise).sum() == 2.0 * c.members().sum()), c.scores().tolist() == c.members().astype(float).tolist()
    (True, True)
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence

import numpy as np

from testbed.streams.rng import GLOBAL, Purpose, stream

#: adjacency → (amplitude of an "in" canary, of an "out" one), in units of the reach: two records a
#: reach apart under replace-one; a record present or absent under add/remove.
IN_OUT = {"replace_one": (0.5, -0.5), "add_remove": (1.0, 0.0)}


class AuditUnsupported(ValueError):
    """A release this audit does not model (raised by the algorithm's hook; `testbed audit` says it in one line)."""


#: The audit the releases of this process report to (None: no audit, no cost). A module global, not a
#: context variable: the node steps draw their noise on worker threads (testbed.util.parallel).
_ACTIVE: "Canaries | None" = None


class Canaries:
    """The canaries of one audited run and their scores.

    Args:
        seed: the run's seed (keys the AUDIT streams).
        nodes: the nodes that carry canaries.
        per_node: canaries on each node (at most the released vectors' size).
    """

    def __init__(self, seed: int, nodes: Sequence[int], per_node: int):
        if per_node < 1 or not len(nodes):
            raise ValueError("an audit needs at least one node and one canary per node")
        self.seed, self.per_node = int(seed), int(per_node)
        self.nodes = tuple(int(n) for n in nodes)
        self.dim: int | None = None  # the size of the audited releases: the first release's that holds the canaries
        self.compositions = dict.fromkeys(self.nodes, 0)  # compositions each node's canaries rode
        self.skipped = 0  # releases of another size (a noised score): not audited
        self.largest_skipped = 0  # the size of the largest of them
        self.observers: set[str] = set()  # whom the audited releases protect against
        self._scores = {n: np.zeros(self.per_node) for n in self.nodes}
        self._layout: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._rounds: dict[tuple[int, int], np.random.Generator] = {}
        self._expected = dict.fromkeys(self.nodes, 0.0)  # Σ over compositions of q (a_in + a_out): 2 × the midpoint
        #: Planted, not yet heard (superposed releases): node → (reach, adjacency).
        self._planted: dict[int, tuple[float, str]] = {}
        #: The one receiver whose view a superposed release is audited from (chosen by the algorithm),
        #: and (round, what it would hear of the canary-free releases) of the round in flight.
        self.receiver: int | None = None
        self.heard_clean: tuple[int | None, np.ndarray | None] = (None, None)
        self._lock = threading.Lock()

    @property
    def disjoint(self) -> bool:
        """Whether every node's canaries have coordinates no other node's have (when all fit in one
        release): needed where an observer hears the nodes' releases superposed (DWFL)."""
        return self.dim is not None and len(self.nodes) * self.per_node <= self.dim

    def layout(self, node: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Node ``node``'s canaries: coordinates (k,), signs (k,) ±1, and which are in (k,) bool, from
        ``stream(seed, node, -1, AUDIT)``; the coordinates are the node's slice of one permutation of
        ``stream(seed, GLOBAL, -1, AUDIT)`` when :attr:`disjoint`."""
        if node not in self._layout:
            assert self.dim is not None
            rng = stream(self.seed, node, -1, Purpose.AUDIT)
            coords = rng.permutation(self.dim)[: self.per_node]  # drawn either way: the coins come next
            if self.disjoint:
                start = self.nodes.index(node) * self.per_node
                coords = stream(self.seed, GLOBAL, -1, Purpose.AUDIT).permutation(self.dim)[start:start + self.per_node]
            signs = np.where(rng.random(self.per_node) < 0.5, -1.0, 1.0)
            members = rng.random(self.per_node) < 0.5  # the secret coins S_i
            self._layout[node] = (coords, signs, members)
        return self._layout[node]

    def _round_stream(self, node: int, round_index: int) -> np.random.Generator:
        """``stream(seed, node, round, AUDIT)``, one generator for all of the node's releases of the
        round (a second release continues the first's draws)."""
        key = (node, round_index)
        if key not in self._rounds:
            self._rounds[key] = stream(self.seed, node, round_index, Purpose.AUDIT)
        return self._rounds[key]

    def insert(self, perturbation: np.ndarray, node_ids: Sequence[int], round_index: int, reach: Sequence[float],
               adjacency: str, rates: Sequence[float], observer: str) -> None:
        """See :func:`insert`."""
        m, compositions = perturbation.shape[0], perturbation.shape[1]
        flat = perturbation.reshape(m, compositions, -1)  # a view of a C-contiguous array
        with self._lock:
            if self.dim is None and flat.shape[2] >= self.per_node:
                self.dim = flat.shape[2]
            if flat.shape[2] != self.dim:
                self.skipped += 1
                self.largest_skipped = max(self.largest_skipped, flat.shape[2])
                return
            if not np.shares_memory(flat, perturbation):
                raise ValueError("a release's perturbation must be C-contiguous (its canaries are added in place)")
            self.observers.add(observer)
            for i, node in enumerate(int(n) for n in node_ids):
                if node not in self._scores:
                    continue
                coords, signs, members = self.layout(node)
                size = float(reach[i])
                if not (size > 0 and np.isfinite(size)):
                    raise AuditUnsupported(f"node {node}'s release states no finite reach to size its canaries ({size})")
                amplitude = np.where(members, *IN_OUT[adjacency]) * size  # (k,)
                rate = float(rates[i])
                taking_part = np.ones((compositions, self.per_node), dtype=bool) if rate >= 1.0 else \
                    self._round_stream(node, round_index).random((compositions, self.per_node)) < rate
                row = flat[i]  # (C, D), a view
                row[:, coords] += (taking_part * (amplitude * signs)).astype(row.dtype, copy=False)
                self._scores[node] += (row[:, coords] * signs).sum(axis=0, dtype=np.float64) / size
                self.compositions[node] += compositions
                self._expected[node] += compositions * min(rate, 1.0) * sum(IN_OUT[adjacency])

    def plant(self, values: np.ndarray, node_ids: Sequence[int], reach: float, adjacency: str) -> None:
        """See :func:`plant`."""
        with self._lock:
            if self.dim is None and values.shape[1] >= len(self.nodes) * self.per_node:
                self.dim = values.shape[1]
            if values.shape[1] != self.dim or not self.disjoint:
                self.skipped += 1
                self.largest_skipped = max(self.largest_skipped, values.shape[1] // len(self.nodes))
                return
            for i, node in enumerate(int(n) for n in node_ids):
                if node in self._scores:
                    coords, signs, members = self.layout(node)
                    values[i, coords] += np.where(members, *IN_OUT[adjacency]) * reach * signs
                    self._planted[node] = (reach, adjacency)

    def observe(self, perturbation: np.ndarray, senders: Sequence[int], observer: str) -> None:
        """See :func:`observe`."""
        with self._lock:
            if perturbation.shape[-1] != self.dim or not self.disjoint:
                return
            self.observers.add(observer)
            for node in (int(n) for n in senders):
                if node in self._planted:
                    reach, adjacency = self._planted.pop(node)
                    coords, signs, _ = self.layout(node)
                    self._scores[node] += perturbation[coords] * signs / reach
                    self.compositions[node] += 1
                    self._expected[node] += sum(IN_OUT[adjacency])

    def scores(self, nodes: Sequence[int] | None = None) -> np.ndarray:
        """(m,) the canaries' scores, node by node, of ``nodes`` (default: all) in their order."""
        return np.concatenate([self._scores[int(n)] for n in (self.nodes if nodes is None else nodes)])

    def midpoints(self, nodes: Sequence[int] | None = None) -> np.ndarray:
        """(m,) each canary's threshold for a membership test, fixed by the mechanism's structure alone:
        halfway between the expected score of an "in" canary and an "out" one with no noise (the
        compositions it rode, times its sampling rate, times its amplitude in reach units)."""
        chosen = self.nodes if nodes is None else nodes
        return np.concatenate([np.full(self.per_node, self._expected[int(n)] / 2.0) for n in chosen])

    def members(self, nodes: Sequence[int] | None = None) -> np.ndarray:
        """(m,) which canaries were in (the secret coins), in :meth:`scores`' order. Raises if no
        release was audited (the layout needs the releases' size)."""
        if self.dim is None:
            raise ValueError("no release of the run was audited")
        return np.concatenate([self.layout(int(n))[2] for n in (self.nodes if nodes is None else nodes)])


@contextlib.contextmanager
def active(canaries: Canaries) -> Iterator[Canaries]:
    """Audit the releases made inside the block with ``canaries`` (one audit at a time)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("an audit is already active in this process")
    _ACTIVE = canaries
    try:
        yield canaries
    finally:
        _ACTIVE = None


def auditing() -> bool:
    """Whether an audit is active (the releases' hook is a no-op otherwise)."""
    return _ACTIVE is not None


def insert(perturbation: np.ndarray, node_ids: Sequence[int], round_index: int, *, reach: float | Sequence[float],
           adjacency: str, rates: float | Sequence[float], observer: str) -> None:
    """The releases' hook: when an audit is active, add the canaries of ``node_ids`` to
    ``perturbation`` in place and score them; otherwise nothing.

    Args:
        perturbation: (M, C, ...) C-contiguous: row i is what node ``node_ids[i]`` adds to its C
            compositions' pre-noise values this round (σZ), before it is added.
        node_ids, round_index: whose releases, which round.
        reach: how far one record can move one composition's pre-noise value (L2), per node or one
            for all (the canaries' norm).
        adjacency: the releases' neighbouring relation ("replace_one" or "add_remove").
        rates: each node's sampling rate (1: every record in every composition).
        observer: whom the releases protect against (GaussianEvent.observer): the audit's adversary.
    """
    audit = _ACTIVE
    if audit is None or not len(node_ids):
        return
    m = len(node_ids)
    audit.insert(perturbation, node_ids, round_index, np.broadcast_to(np.asarray(reach, dtype=np.float64), (m,)),
                 adjacency, np.broadcast_to(np.asarray(rates, dtype=np.float64), (m,)), observer)


def active_canaries() -> "Canaries | None":
    """The active audit, for an algorithm whose releases are superposed (:func:`plant`, :func:`observe`)."""
    return _ACTIVE


def plant(values: np.ndarray, node_ids: Sequence[int], *, reach: float, adjacency: str) -> None:
    """The hook of a release that an observer hears superposed with other nodes' (DWFL's over-the-air
    exchange): when an audit is active, add each node's canaries to its pre-noise values (M, D) in
    place (no sampling: every record in every round); :func:`observe` scores them where they are heard.
    The canaries of different nodes then need different coordinates: a run with more than fit in one
    release is not audited."""
    if _ACTIVE is not None and len(node_ids):
        _ACTIVE.plant(values, node_ids, reach, adjacency)


def observe(perturbation: np.ndarray, senders: Sequence[int], observer: str) -> None:
    """What one receiver heard of the planted releases of ``senders`` beyond their pre-noise values
    (D,), in the values' units (the canaries and all the noise it heard): score them."""
    if _ACTIVE is not None:
        _ACTIVE.observe(perturbation, senders, observer)
