"""Rényi DP through dp-accounting's ``RdpAccountant``: a tight upper bound, with amplification by
sampling (:mod:`testbed.privacy.accountants._dp_accounting`).

Example::

    >>> REGISTRATION.supports((1.0, 0.1, "add_remove", "poisson", 0.1))
    True
"""

from __future__ import annotations

import functools

from testbed.privacy.accountants import _dp_accounting
from testbed.privacy.accountants.registry import Registration


def _accountant(relation):
    from dp_accounting.rdp import rdp_privacy_accountant

    return rdp_privacy_accountant.RdpAccountant(neighboring_relation=relation)


REGISTRATION = Registration(
    name="rdp", order=1, tight=True,
    refuses=functools.partial(_dp_accounting.sampling_refusal, "rdp"),
    compose=functools.partial(_dp_accounting.compose, "rdp", _accountant),
    preload=functools.partial(_dp_accounting.import_alone, "rdp.rdp_privacy_accountant"),
)
