"""Accountants: read a node's tallied Gaussian compositions, return (ε, δ) spent.

Each accountant is one module of this package, found by :mod:`.registry` (its ``REGISTRATION``):

- ``zcdp`` (:mod:`.zcdp`): the paper's (DP-PASGD §5), no amplification by sampling;
- ``rdp`` / ``pld`` (:mod:`.rdp`, :mod:`.pld`): tight accounting through Google's dp-accounting,
  with amplification by the sampling each event declares, imported only when one of them is used.

The functions below name an accountant by its ``privacy.accountant`` choice. Each takes the tally of
:class:`testbed.ledger.node.NodeLedger` (signature → count), so a check costs the same after 10 rounds
as after 10,000.

Not every accountant can account for every event: :func:`supports` and :func:`unsupported_reason`
ask the accountant statically (no dp-accounting import, so a config can be checked at start-up in
microseconds), by the same rules :func:`epsilon` enforces before it composes.

Example::

    >>> from collections import Counter
    >>> tally = Counter({(1.0, 2 / 32, "replace_one", "none", 1.0): 100})
    >>> round(epsilon("zcdp", tally, delta=1e-4), 6)
    2.87777
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

from testbed.privacy.accountants.registry import get


def unsupported_reason(accountant: str, events: Iterable) -> str | None:
    """Why ``accountant`` cannot account for ``events`` together, in one line; None when it can.

    Input
    -----
    accountant : str
        A registered accountant's name.
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
    return get(accountant).unsupported_reason(events)


def supports(accountant: str, event) -> bool:
    """Whether ``accountant`` can account for ``event`` (a GaussianEvent or its signature) alone.

    >>> from testbed.ledger.events import GaussianEvent
    >>> supports("rdp", GaussianEvent(0, 0, 1.0, 0.1, 1, adjacency="add_remove", sampling="poisson", sampling_rate=0.1))
    True
    """
    return get(accountant).supports(event)


def epsilon(accountant: str, tally: Mapping[tuple, int], delta: float) -> float:
    """ε spent at δ by the tallied compositions, per the named accountant; ValueError (one line)
    for an unknown accountant or a tally it does not support."""
    return get(accountant).epsilon(tally.items(), delta)


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
