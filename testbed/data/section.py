"""The experiment file's ``[data]`` section: which data set (one of testbed.data.registry's) and
the keys its loader reads (each registration says which: ``options``). One section for every set,
so what a user writes does not depend on the set.

Example::

    >>> DataSection(dataset="adult-2", num_nodes=8).num_nodes
    8
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from testbed.checked.sections import NonNegative, OnlyWith, Positive, Section
from testbed.data import registry
from testbed.checked.sections import NonNegative, OnlyWith, Positive, Section, one_of

#: The data sets ``data.dataset`` may name: one module of testbed/data/ or of a plugin each
#: (testbed.data.registry), as registered when a value is checked.
DatasetName = one_of(registry.names)


class DataSection(Section):
    ONLY_WITH = {"alpha": (OnlyWith("partition", ("dirichlet",)),),
                 "features": (OnlyWith("dataset", registry.image_sets),)}

    dataset: DatasetName = "synthetic"  # type: ignore[valid-type]
    path: str | None = None
    """The data file or its folder (else $TESTBED_DATA, the cache, or a download)."""
    num_nodes: Positive[int] = 16
    samples_per_node: Positive[int] = 500
    dim: Positive[int] = 100
    n_classes: int = Field(2, ge=2)
    heterogeneity: NonNegative[float] = 0.0
    outputs: Positive[int] = 10
    """regression: o, the target columns (the ACFL paper's multi-output linear regression)."""
    include_education: bool = False
    numeric: bool = False
    scaling: Literal["per_node", "public_bound", "pooled"] = "per_node"
    """How rows are put into the unit ball: each node's own statistics, a public bound, or
    statistics pooled over all nodes (the papers'; a leak between nodes, kept to reproduce them)."""
    parts: list[Positive[int]] | None = None
    """mnist, mnist-5k, digits, cifar10: clients per part (consecutive node ids; sum num_nodes)."""
    part_samples: list[Positive[int]] | None = None
    """mnist, mnist-5k, digits, cifar10: samples of each client of a part, before the 80/10/10 split."""
    part_noise: list[Literal["severe", "moderate", "slight", "none"] | Annotated[float, Field(ge=0, le=1)]] | None = None
    """mnist, mnist-5k, digits, cifar10: salt-and-pepper density of each part's training rows (severe 0.5,
    moderate 0.3, slight 0.1, none 0; or a number)."""
    partition: Literal["iid", "dirichlet"] = "iid"
    """mnist, mnist-5k, digits, cifar10: which images each client holds: i.i.d., or label-skewed with class
    proportions ~ Dirichlet(alpha) per client (testbed.data.partition)."""
    alpha: Positive[float] = 0.5
    """The Dirichlet concentration of partition = "dirichlet" (small: few classes per client)."""
    features: Literal["pixels", "scattering"] = "pixels"
    """Image sets: the pixels, or their scattering transform (J = 2, L = 8; Tramèr and Boneh's fixed
    features for private learning; testbed.data.scattering; pip install 'dpfl-testbed[scattering]'),
    rows of norm 1 for a linear model or an MLP."""
    dtype: Literal["float64", "float32"] = "float64"
    """The features' type: "float32" halves the data's memory, and DP-PASGD then steps in float32
    (its results agree with float64 to float32 rounding); the server's model stays float64."""
