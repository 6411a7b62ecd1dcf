"""What the tight accountants (``rdp``, ``pld``) share: Google's dp-accounting, with amplification
by the sampling each event declares (fixed-size batches without replacement under replace-one;
Poisson under add/remove). dp-accounting is imported only when one of them composes.

Results are memoised because every node of a run usually shares one tally.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import sys
import types
from typing import Callable

from testbed.privacy.accountants.registry import Items

# Past ~1e6 both accountants report ε = 0; dp-accounting's sampled-without-replacement path fails with
# "math domain error" from ~1e12 (a noise std of 1e15 with unit sensitivity). Clamping it there only
# raises ε (never an under-count), and keeps every multiplier inside what both accountants compute.
_MAX_NOISE_MULTIPLIER = 1e6


def sampling_refusal(name: str, pairs: frozenset[tuple[str, str]]) -> str | None:
    """Why dp-accounting's accountant ``name`` cannot amplify the {(sampling, adjacency)} ``pairs``
    together, or None. The rules mirror what dp-accounting can do:

    - sampling without replacement is amplified only for a sensitivity under replace-one
      adjacency, and Poisson sampling only under add/remove;
    - sampling without replacement cannot compose with Poisson sampling: they need two
      neighbouring relations, and a dp-accounting accountant composes under one.
    """
    samplings = {sampling for sampling, _ in pairs}
    if ("without_replacement", "add_remove") in pairs:
        return (f"the {name} accountant amplifies sampling without replacement only for a sensitivity "
                "under replace-one adjacency, not add/remove")
    if ("poisson", "replace_one") in pairs:
        return (f"the {name} accountant amplifies Poisson sampling only for a sensitivity under add/remove "
                "adjacency, not replace-one")
    if {"without_replacement", "poisson"} <= samplings:
        return (f"the {name} accountant cannot compose sampling without replacement (replace-one) with "
                "Poisson sampling (add/remove): dp-accounting composes under one neighbouring relation; "
                "use one sampling or the zcdp accountant")
    return None


def compose(name: str, accountant: Callable, items: Items, delta: float) -> float:
    """ε at δ of ``items`` composed by ``accountant`` (neighbouring relation → a dp-accounting
    accountant), in a canonical order: equal tallies give the same ε however they were built."""
    return _epsilon(name, accountant, tuple(sorted(items)), delta)


@functools.lru_cache(maxsize=4096)
def _epsilon(name: str, accountant: Callable, items: Items, delta: float) -> float:
    from dp_accounting import dp_event, privacy_accountant

    # A Gaussian mechanism with L2 sensitivity Δ has one privacy loss distribution whatever the
    # adjacency Δ was computed under; the relation matters only for amplification by sampling.
    samplings = {sampling for (_, _, _, sampling, _), _ in items}
    if "without_replacement" in samplings:
        relation = privacy_accountant.NeighboringRelation.REPLACE_ONE
    else:
        relation = privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE
    acc = accountant(relation)
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
        if not acc.supports(event):  # the registration's refuses should have said so: a bug, not a user error
            raise AssertionError(f"dp-accounting's {name} accountant refuses {event}; update its refuses")
        acc.compose(event, count)
    return float(acc.get_epsilon(delta))


def import_alone(module: str) -> None:
    """Import dp-accounting's accountant ``module`` (e.g. "rdp.rdp_privacy_accountant") and
    nothing it does not need, in a child process only: the package's ``__init__`` imports every
    accountant and its mechanism calibration (scipy.signal, scipy.optimize: 0.7 s of CPU, where the
    RDP accountant alone takes 0.26 s). An empty package module with the package's path stands in
    for it, so its submodules import alone; the top-level names it would re-export
    (``dp_accounting.GaussianDpEvent``) are absent."""
    if "dp_accounting" not in sys.modules:
        spec = importlib.util.find_spec("dp_accounting")
        package = types.ModuleType("dp_accounting")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["dp_accounting"] = package
    importlib.import_module("dp_accounting.dp_event")
    importlib.import_module(f"dp_accounting.{module}")
