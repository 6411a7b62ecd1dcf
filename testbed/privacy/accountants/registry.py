"""The accountant registry: every module of this package that defines ``REGISTRATION`` is a privacy
accountant; adding one is adding a
module, here or in an installed plugin (docs/extending.md).

A :class:`Registration` says the accountant's name (a ``privacy.accountant`` choice, and a
``privacy.tight_accountant`` one if it is tight), which releases it can account for (asked before
it composes, as dp-accounting's ``PrivacyAccountant.supports()`` is) and how it composes them.
The config's choices, the JSON Schema, budgets, the ledger book and the runner read this registry
and never name an accountant.

A release is described by its signature, the tally key of :class:`testbed.ledger.events.GaussianEvent`:
(σ, sensitivity, adjacency, sampling, sampling rate).

Example::

    >>> names()[:3]  # the built-in ones; an installed plugin's may follow
    ['zcdp', 'rdp', 'pld']
    >>> get("pld").supports((1.0, 0.1, "replace_one", "without_replacement", 0.1))
    False
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable

from testbed.ledger.events import ADJACENCIES, SAMPLINGS
from testbed.util.registrations import GROUPS, registered_in

#: (σ, sensitivity, adjacency, sampling, sampling rate) of one Gaussian composition.
Signature = tuple[float, float, str, str, float]
#: The (signature, count) pairs an accountant composes, e.g. a tally's items.
Items = tuple[tuple[Signature, int], ...]

#: The ``privacy.tight_accountant`` choice that reports no tight ε: no accountant may take it.
NONE = "none"


def signature_of(event) -> Signature:
    """The signature of a GaussianEvent, or a signature given as such (a tally's key)."""
    return event if isinstance(event, tuple) else event.signature


@dataclass(frozen=True)
class Registration:
    """One accountant.

    Attributes:
        name: its ``privacy.accountant`` choice.
        order: where it is listed among the choices (config, JSON Schema), ascending; the first
            listed is ``privacy.accountant``'s default, the first tight one ``tight_accountant``'s.
        refuses: (the {(sampling, adjacency)} of everything it would compose together, each known
            to the ledger) → why it cannot account for them together, in one line naming it, or
            None. Decided statically: it imports nothing slow, so a config is checked at start-up.
        compose: (items it accepted, δ) → ε at δ of their composition. ``items`` come in any order
            (a tally's; a sequence of rounds, repeats allowed), never empty.
        tight: reported beside the enforced ε (a ``privacy.tight_accountant`` choice), computed in
            a child process while the run goes (:mod:`testbed.privacy.accountants.background`).
        preload: what such a child imports before its first request (the slow imports of
            ``compose``), or None.
        min_noise_multiplier: below this noise multiplier σ/Δ computing its ε is impractical
            (while ε is in the hundreds anyway): a report of a planned composition skips it there.
    """

    name: str
    order: int
    refuses: Callable[[frozenset[tuple[str, str]]], str | None]
    compose: Callable[[Items, float], float]
    tight: bool = False
    preload: Callable[[], None] | None = None
    min_noise_multiplier: float = 0.0

    def unsupported_reason(self, events: Iterable) -> str | None:
        """Why it cannot account for ``events`` (GaussianEvents or signatures) together, in one
        line; None when it can. A sampling or adjacency the ledger does not know is refused by
        every accountant."""
        pairs = frozenset((sig[3], sig[2]) for sig in map(signature_of, events))  # {(sampling, adjacency)}
        for sampling, adjacency in sorted(pairs):
            if sampling not in SAMPLINGS:
                return f"unknown sampling {sampling!r} (known: {', '.join(SAMPLINGS)})"
            if adjacency not in ADJACENCIES:
                return f"unknown adjacency {adjacency!r} (known: {', '.join(ADJACENCIES)})"
        return self.refuses(pairs)

    def supports(self, event) -> bool:
        """Whether it can account for ``event`` (a GaussianEvent or its signature) alone."""
        return self.unsupported_reason([event]) is None

    def epsilon(self, items: Iterable[tuple[Signature, int]], delta: float) -> float:
        """ε at δ of the (signature, count) ``items`` composed (0 for none); asks first, and
        raises ValueError with the one-line reason for items it does not support together."""
        items = tuple(items)
        if not items:
            return 0.0
        reason = self.unsupported_reason(sig for sig, _ in items)
        if reason is not None:
            raise ValueError(reason)
        return self.compose(items, delta)


@functools.cache
def registrations() -> dict[str, Registration]:
    """Every accountant of this package and of the installed plugins (testbed.accountants), by name, in their listed order (modules imported once, on
    first use)."""
    import testbed.privacy.accountants as package

    # "none" is privacy.tight_accountant's choice of no accountant.
    return registered_in(package, Registration, "accountant", group=GROUPS["accountant"], order=lambda r: (r.order, r.name), reserved=(NONE,))


def names() -> list[str]:
    """Every accountant's name, in listed order: ``privacy.accountant``'s choices."""
    return list(registrations())


def tight_names() -> list[str]:
    """The tight accountants' names, in listed order: ``privacy.tight_accountant``'s choices besides "none"."""
    return [name for name, reg in registrations().items() if reg.tight]


def get(name: str) -> Registration:
    """The accountant ``name``; ValueError naming the known ones for another."""
    try:
        return registrations()[name]
    except KeyError:
        raise ValueError(f"unknown accountant {name!r}; choose one of {', '.join(names())}") from None
