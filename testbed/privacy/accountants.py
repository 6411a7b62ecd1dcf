"""Accountants: read a node's tallied Gaussian compositions, return (ε, δ) spent.

- ``zcdp``: the paper's (DP-PASGD §5): zCDP composition, Lemma 3 conversion, no subsampling
  amplification, replace-one adjacency. For DP-PASGD it reproduces eq. (9) exactly.
- ``rdp`` / ``pld``: tight accounting through Google's dp-accounting, with amplification by the
  sampling each event declares (fixed-size batches without replacement under replace-one; Poisson
  under add/remove). dp-accounting is imported only when one of them is used.

Each takes the tally of :class:`testbed.ledger.node.NodeLedger` (signature → count), so a check costs
the same after 10 rounds as after 10,000; results are memoised because every node of a run usually
shares one tally.

Not every accountant can account for every event: :func:`supports` and :func:`unsupported_reason`
say so statically (no dp-accounting import, so a config can be checked at start-up in
microseconds), by the same rules :func:`epsilon` enforces.

Example::

    >>> from collections import Counter
    >>> tally = Counter({(1.0, 2 / 32, "replace_one", "none", 1.0): 100})
    >>> round(epsilon("zcdp", tally, delta=1e-4), 6)
    2.87777
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections import Counter
from typing import Iterable, Mapping

from testbed.ledger.events import ADJACENCIES, SAMPLINGS
from testbed.privacy.zcdp import gaussian_rho, rho_to_epsilon

ACCOUNTANTS = ("zcdp", "rdp", "pld")


def _signature(event) -> tuple:
    """(sigma, sensitivity, adjacency, sampling, rate) of a GaussianEvent or of a tally key."""
    return event if isinstance(event, tuple) else event.signature


def unsupported_reason(accountant: str, events: Iterable) -> str | None:
    """Why ``accountant`` cannot account for ``events`` together, in one line; None when it can.

    Decided statically from each event's sampling and adjacency (nothing is imported), by the rules
    :func:`epsilon` enforces, which mirror what dp-accounting can do:

    - ``zcdp`` accounts for every event (it claims no amplification by sampling);
    - ``rdp`` and ``pld`` amplify sampling without replacement only for a sensitivity under
      replace-one adjacency, and Poisson sampling only under add/remove;
    - ``pld`` cannot amplify sampling without replacement at all (dp-accounting's PLDAccountant has
      no bound for SampledWithoutReplacementDpEvent);
    - ``rdp`` cannot compose sampling without replacement with Poisson sampling: they need two
      neighbouring relations, and a dp-accounting accountant composes under one.

    Input
    -----
    accountant : str
        One of ACCOUNTANTS.
    events : iterable of GaussianEvent (or of their ``signature`` tuples, e.g. a tally's keys)
        Everything the accountant will compose, e.g. a node's planned events of the first round.

    Output
    ------
    reason : str or None
        No configuration key is named: the caller knows which key chose the sampling.

    Raises ValueError for an unknown accountant.

    Example
    -------
    >>> from testbed.ledger.events import GaussianEvent
    >>> e = GaussianEvent(0, 0, 1.0, 0.1, 1, adjacency="replace_one", sampling="without_replacement", sampling_rate=0.1)
    >>> unsupported_reason("rdp", [e]) is None
    True
    >>> unsupported_reason("pld", [e])
    'the pld accountant cannot amplify sampling without replacement (dp-accounting has no privacy loss distribution for it); use the rdp or zcdp accountant, or Poisson sampling'
    """
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")
    pairs = {(sig[3], sig[2]) for sig in map(_signature, events)}  # {(sampling, adjacency)}
    for sampling, adjacency in sorted(pairs):
        if sampling not in SAMPLINGS:
            return f"unknown sampling {sampling!r} (known: {', '.join(SAMPLINGS)})"
        if adjacency not in ADJACENCIES:
            return f"unknown adjacency {adjacency!r} (known: {', '.join(ADJACENCIES)})"
    if accountant == "zcdp":
        return None
    samplings = {sampling for sampling, _ in pairs}
    if accountant == "pld" and "without_replacement" in samplings:
        return ("the pld accountant cannot amplify sampling without replacement (dp-accounting has no privacy "
                "loss distribution for it); use the rdp or zcdp accountant, or Poisson sampling")
    if ("without_replacement", "add_remove") in pairs:
        return (f"the {accountant} accountant amplifies sampling without replacement only for a sensitivity "
                "under replace-one adjacency, not add/remove")
    if ("poisson", "replace_one") in pairs:
        return (f"the {accountant} accountant amplifies Poisson sampling only for a sensitivity under add/remove "
                "adjacency, not replace-one")
    if {"without_replacement", "poisson"} <= samplings:
        return (f"the {accountant} accountant cannot compose sampling without replacement (replace-one) with "
                "Poisson sampling (add/remove): dp-accounting composes under one neighbouring relation; "
                "use one sampling or the zcdp accountant")
    return None


def supports(accountant: str, event) -> bool:
    """Whether ``accountant`` can account for ``event`` (a GaussianEvent or its signature) alone.

    >>> from testbed.ledger.events import GaussianEvent
    >>> supports("rdp", GaussianEvent(0, 0, 1.0, 0.1, 1, adjacency="add_remove", sampling="poisson", sampling_rate=0.1))
    True
    """
    return unsupported_reason(accountant, [event]) is None

# Past ~1e6 both accountants report ε = 0; dp-accounting's sampled-without-replacement path fails with
# "math domain error" from ~1e12 (a noise std of 1e15 with unit sensitivity). Clamping it there only
# raises ε (never an under-count), and keeps every multiplier inside what both accountants compute.
_MAX_NOISE_MULTIPLIER = 1e6


def _replace_one_sensitivity(sensitivity: float, adjacency: str) -> float:
    # Replacing a record = removing one and adding one: at most twice the add/remove sensitivity.
    return sensitivity if adjacency == "replace_one" else 2.0 * sensitivity


def zcdp_rho(tally: Mapping[tuple, int]) -> float:
    """Total ρ of the tallied Gaussian compositions (Lemmas 1 and 2), replace-one adjacency."""
    return sum(
        count * gaussian_rho(_replace_one_sensitivity(sens, adj), sigma)
        for (sigma, sens, adj, _sampling, _rate), count in tally.items()
    )


def epsilon(accountant: str, tally: Mapping[tuple, int], delta: float) -> float:
    """ε spent at δ by the tallied compositions, per the named accountant (one of ACCOUNTANTS)."""
    if not tally:
        return 0.0
    if accountant == "zcdp":
        return rho_to_epsilon(zcdp_rho(tally), delta)
    if accountant in ("rdp", "pld"):
        return _dp_accounting_epsilon(accountant, tuple(sorted(tally.items())), delta)
    raise ValueError(f"unknown accountant {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")


@functools.lru_cache(maxsize=4096)
def _dp_accounting_epsilon(kind: str, items: tuple, delta: float) -> float:
    reason = unsupported_reason(kind, (sig for sig, _ in items))
    if reason is not None:
        raise ValueError(reason)
    from dp_accounting import dp_event, privacy_accountant

    # A Gaussian mechanism with L2 sensitivity Δ has one privacy loss distribution whatever the
    # adjacency Δ was computed under; the relation matters only for amplification by sampling.
    samplings = {sampling for (_, _, _, sampling, _), _ in items}
    if "without_replacement" in samplings:
        relation = privacy_accountant.NeighboringRelation.REPLACE_ONE
    else:
        relation = privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE
    if kind == "rdp":
        from dp_accounting.rdp import rdp_privacy_accountant

        acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)
    else:
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)
    for (sigma, sens, _adjacency, sampling, rate), count in items:
        if not sigma > 0 or not sens < math.inf:
            return math.inf
        # Past ~1e6 both accountants already report ε = 0; from ~1e300 they overflow. Clamping the
        # multiplier down can only raise ε: never an under-count, never an exception.
        gaussian = dp_event.GaussianDpEvent(noise_multiplier=min(sigma / sens, _MAX_NOISE_MULTIPLIER))
        if sampling == "poisson":
            event = dp_event.PoissonSampledDpEvent(rate, gaussian)
        elif sampling == "without_replacement":
            # dp-accounting wants sizes; only their ratio enters the bound.
            size = 1_000_000
            event = dp_event.SampledWithoutReplacementDpEvent(size, round(rate * size), gaussian)
        else:
            event = gaussian
        if not acc.supports(event):  # unsupported_reason should have said so: a bug, not a user error
            raise AssertionError(f"dp-accounting's {kind} accountant refuses {event}; update unsupported_reason")
        acc.compose(event, count)
    return float(acc.get_epsilon(delta))


def epsilon_by_observer(accountant: str, tallies: Mapping[str, Mapping[tuple, int]], delta: float) -> dict[str, float]:
    """ε spent at δ against each observer (testbed.ledger.events.OBSERVERS) that saw a release."""
    return {observer: epsilon(accountant, tally, delta) for observer, tally in sorted(tallies.items())}


def worst_epsilon(accountant: str, tallies: Mapping[str, Mapping[tuple, int]], delta: float) -> float:
    """The headline ε: the worst over the observers (0 before any release)."""
    return max(epsilon_by_observer(accountant, tallies, delta).values(), default=0.0)


def tally_of(events) -> Counter:
    """Tally (signature → count) of an iterable of GaussianEvent."""
    tally: Counter = Counter()
    for e in events:
        tally[e.signature] += e.count
    return tally


class BackgroundEpsilons:
    """ε of several tallies by a dp-accounting accountant, computed in a child process.

    dp-accounting (with scipy.stats) takes about half a second to import and a sampled-without-
    replacement bound a fifth of a second to compute. A run starts this job with its first round,
    so the child imports on the other core while the rounds run, and :meth:`guess` hands it the
    tallies the run will end with if every round goes as planned: their ε is ready when the run
    ends, and only the tallies that came out otherwise (a budget stop, stragglers) are computed then.

    Example::

        >>> job = BackgroundEpsilons("rdp", delta=1e-5)
        >>> tally = Counter({(1.0, 0.0625, "replace_one", "none", 1.0): 10})
        >>> job.guess([tally])
        >>> round(job.result([tally])[0], 4) > 0
        True
    """

    def __init__(self, kind: str, delta: float):
        import subprocess

        if kind not in ("rdp", "pld"):
            raise ValueError(f"background accounting is for dp-accounting's rdp or pld, not {kind!r}")
        self.kind, self.delta = kind, delta
        self._proc = subprocess.Popen([sys.executable, "-m", "testbed.privacy.accountants", kind],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._asked: list[list[tuple]] = []  # the unique tallies of each request sent, in order

    def guess(self, tallies: list[Counter]) -> None:
        """Start computing the ε of ``tallies`` (the final ones, as planned) without waiting."""
        self._ask({_key(t) for t in tallies})

    def result(self, tallies: list[Counter]) -> list[float]:
        """ε of each of ``tallies``, in order: guessed ones from the guess, the rest computed now."""
        import json

        keys = [_key(t) for t in tallies]
        self._ask(set(keys) - {k for asked in self._asked for k in asked})
        self._proc.stdin.close()
        out, err = self._proc.stdout.read(), self._proc.stderr.read()
        if self._proc.wait() != 0:
            raise RuntimeError(f"the accountant process failed: {err.decode(errors='replace').strip()[-500:]}")
        found: dict[tuple, float] = {}
        for asked, line in zip(self._asked, out.splitlines()):
            found.update(zip(asked, json.loads(line)))
        return [found[k] for k in keys]

    @property
    def requests(self) -> int:
        """Requests sent to the child so far: a guess that held needs no second."""
        return len(self._asked)

    def _ask(self, keys: set[tuple]) -> None:
        import json

        if not keys:
            return
        unique = sorted(keys)
        request = {"kind": self.kind, "delta": self.delta, "tallies": [[[list(sig), n] for sig, n in t] for t in unique]}
        self._proc.stdin.write(json.dumps(request).encode() + b"\n")
        self._proc.stdin.flush()
        self._asked.append(unique)

    def close(self) -> None:
        """Stop the child if no result was asked for (a failed run)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def _import_accountant(kind: str) -> None:
    """Import dp-accounting's ``kind`` accountant and nothing it does not need, in this child
    process only: the package's ``__init__`` imports every accountant and its mechanism calibration
    (scipy.signal, scipy.optimize: 0.7 s of CPU, where the RDP accountant alone takes 0.26 s). An
    empty package module with the package's path stands in for it, so its submodules import
    alone; the top-level names it would re-export (``dp_accounting.GaussianDpEvent``) are absent."""
    import importlib
    import importlib.util
    import types

    if "dp_accounting" not in sys.modules:
        spec = importlib.util.find_spec("dp_accounting")
        package = types.ModuleType("dp_accounting")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["dp_accounting"] = package
    importlib.import_module("dp_accounting.dp_event")
    importlib.import_module("dp_accounting.rdp.rdp_privacy_accountant" if kind == "rdp"
                            else "dp_accounting.pld.pld_privacy_accountant")


def _key(tally: Mapping[tuple, int]) -> tuple:
    return tuple(sorted(tally.items()))


def _serve_requests(kind: str) -> None:
    """``python -m testbed.privacy.accountants KIND``: imports what dp-accounting's ``kind``
    accountant needs at once, then answers each JSON request line on stdin with a line of the list
    of ε on stdout, until stdin closes."""
    import json

    _import_accountant(kind)  # the slow imports, done before the first request arrives
    for line in sys.stdin:
        request = json.loads(line)
        tallies = [Counter({tuple(sig): n for sig, n in items}) for items in request["tallies"]]
        print(json.dumps([epsilon(request["kind"], t, request["delta"]) for t in tallies]), flush=True)


if __name__ == "__main__":
    # A helper of a run: the run's own threads come first on a busy core; this one works in the gaps.
    os.nice(10)
    _serve_requests(sys.argv[1])
    # Everything is written: leave without the interpreter's teardown of the libraries (a tenth of a
    # second that the run would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
