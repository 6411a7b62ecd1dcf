"""Privacy loss distributions through dp-accounting's ``PLDAccountant``: tight up to
discretisation, with amplification by Poisson sampling (:mod:`testbed.privacy.accountants._dp_accounting`);
dp-accounting has no privacy loss distribution for sampling without replacement.

Example::

    >>> REGISTRATION.unsupported_reason([(1.0, 0.1, "replace_one", "without_replacement", 0.1)])
    'the pld accountant cannot amplify sampling without replacement (dp-accounting has no privacy loss distribution for it); use the rdp or zcdp accountant, or Poisson sampling'
"""

from __future__ import annotations

import functools

from testbed.privacy.accountants import _dp_accounting
from testbed.privacy.accountants.registry import Registration


def _refuses(pairs: frozenset[tuple[str, str]]) -> str | None:
    if any(sampling == "without_replacement" for sampling, _ in pairs):
        return ("the pld accountant cannot amplify sampling without replacement (dp-accounting has no privacy "
                "loss distribution for it); use the rdp or zcdp accountant, or Poisson sampling")
    return _dp_accounting.sampling_refusal("pld", pairs)


def _accountant(relation):
    from dp_accounting.pld import pld_privacy_accountant

    return pld_privacy_accountant.PLDAccountant(neighboring_relation=relation)


REGISTRATION = Registration(
    name="pld", order=2, tight=True, refuses=_refuses,
    compose=functools.partial(_dp_accounting.compose, "pld", _accountant),
    preload=functools.partial(_dp_accounting.import_alone, "pld.pld_privacy_accountant"),
    # PLD discretises the privacy loss; below a noise multiplier of 0.1 its grid explodes.
    min_noise_multiplier=0.1,
)
