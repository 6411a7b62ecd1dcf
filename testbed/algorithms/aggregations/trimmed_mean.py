"""``"trimmed_mean"``: per coordinate, the mean of the values left after dropping the
``trim_fraction`` largest and as many smallest (Yin et al., ICML 2018), unweighted."""

import numpy as np

from testbed.algorithms.aggregations.registry import Rule


def _trimmed_mean(updates, weights, reference, params):
    m = updates.shape[0]
    k = int(np.floor(params.trim_fraction * m))
    if k == 0:
        return updates.mean(axis=0)
    return np.sort(updates, axis=0)[k:m - k].mean(axis=0)


REGISTRATION = Rule("trimmed_mean", _trimmed_mean, order=3)
