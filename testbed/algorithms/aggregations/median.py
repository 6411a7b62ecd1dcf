"""``"median"``: the coordinate-wise median (Yin et al., ICML 2018), unweighted."""

from testbed.algorithms.aggregations.robust import coordinate_median
from testbed.algorithms.aggregations.registry import Rule


def _median(updates, weights, reference, params):
    return coordinate_median(updates)


REGISTRATION = Rule("median", _median, order=4)
