"""The files `testbed new KIND NAME` writes: a small installable project adding one algorithm, data
set or accountant to the testbed through an entry point (docs/extending.md). ``{name}`` is the
entry's name, ``{module}`` the project's module, ``{dist}`` its distribution, ``{group}`` the
entry-point group; ``{{`` and ``}}`` are braces.
"""

from __future__ import annotations

PYPROJECT = '''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "{what} {name!r} for the testbed (dpfl-testbed)"
requires-python = ">=3.10"
dependencies = ["dpfl-testbed"]

[project.optional-dependencies]
test = ["pytest>=8"]

# The testbed finds the entry by this: a module whose REGISTRATION is taken as a built-in module's.
[project.entry-points."{group}"]
{name} = "{module}"

[tool.setuptools]
py-modules = ["{module}"]
'''

README = '''# {dist}

{what_cap} `{name}` for the testbed, installed as a plugin: the testbed finds it through the
entry point `{name}` of the group `{group}` (pyproject.toml), so nothing in the testbed changes.

    pip install -e .             # into the testbed's environment
    testbed schema | grep {name}   # offered by the config, the JSON Schema and the CLI
    pytest tests                 # the testbed's contract suite on it, sim and over MQTT

Its module is `{module}.py`; the contract it is held to is `testbed.orchestration.contract_suite`
(tests/test_contract.py here). {use}
'''

ALGORITHM_USE = '''Run it with `[run] algorithm = "{name}"` and its own section `[{name}]`.'''
DATASET_USE = '''Use it with `[data] dataset = "{name}"`.'''
ACCOUNTANT_USE = '''Enforce budgets with it by `[privacy] accountant = "{name}"`.'''

ALGORITHM = '''"""{name}: local SGD from the global model on every node, then the server's plain mean of
the nodes' models (FedAvg with equal weights; McMahan et al., AISTATS 2017, Algorithm 1).
Not private. Change ``node_step`` and ``server_step`` to make it yours."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from testbed.algorithms.base import BaseAlgorithm
from testbed.algorithms.batches import check_batches, uniform_batches
from testbed.algorithms.contract import NodeResult, RoundContext, ServerResult, State
from testbed.algorithms.registry import BuildContext, Registration
from testbed.data.federated import Split
from testbed.privacy.statements import PrivacyStatement
from testbed.checked.sections import Positive, Section


class Options(Section):
    """[{name}]: ``rounds`` rounds of ``local_steps`` SGD steps of ``batch`` samples at ``lr``."""

    rounds: Positive[int] = 20
    local_steps: Positive[int] = 3
    batch: Positive[int] = 16
    lr: Positive[float] = 0.1


class Algorithm(BaseAlgorithm):
    def __init__(self, model, options: Options):
        self.model, self.rounds_planned, self.local_steps = model, options.rounds, options.local_steps
        self.batch, self.lr = options.batch, options.lr

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        ids = tuple(int(n) for n in node_ids)
        idx = uniform_batches(train, ids, ctx.round_index, ctx.seed, self.local_steps, self.batch, ctx.secrets)
        weights = np.full(idx.shape[:1] + idx.shape[2:], 1.0 / self.batch)
        params = np.array(received["model"], dtype=np.float64)
        for step in range(self.local_steps):
            rows = idx[:, step]
            _, grad = self.model.loss_and_grad(params, train.x[rows], train.y[rows], weights)
            params -= self.lr * grad
        return self.result(ids, {{"update": params}}, train, ctx)

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        if not result.node_ids:
            return ServerResult(state)
        return ServerResult({{"model": result.tensors["update"].mean(axis=0)}})

    def describe(self) -> dict[str, Any]:
        return {{"rounds": self.rounds_planned, "local_steps": self.local_steps, "batch": self.batch,
                "lr": self.lr, "private": False}}


def build(sections: dict[str, Any], ctx: BuildContext) -> Algorithm:
    options: Options = sections["{name}"]
    check_batches("{name}", ctx.data.train, ctx.data.node_ids, options.local_steps, options.batch, "local_steps")
    return Algorithm(ctx.model, options)


#: What it guarantees, to whom (`testbed privacy {cli}`): nothing, until its releases carry noise.
STATEMENT = PrivacyStatement(
    name="{name}", title="{name}", unit="none: not private (no noise; the summary says \\"not private\\")",
    adjacency="none", observers="the server sees each node's local model in the clear",
    accountant="none: an ε budget on it is a config error", paper_accountant="none", amplification="none",
    assumptions=(), delta="not used", not_protected=("everything a local model reveals of its data",),
    evidence=("tests/test_contract.py",))

REGISTRATION = Registration(name="{name}", sections={{"{name}": Options}}, build=build, privacy_statements=(STATEMENT,))
'''

ALGORITHM_EXPERIMENT = '''[run]
algorithm = "{name}"
[data]
dataset = "synthetic"
num_nodes = 5
samples_per_node = 60
dim = 6
[{name}]
rounds = 6
local_steps = 3
batch = 8
lr = 0.5
'''

DATASET = '''"""{name}: two Gaussian blobs per node, one per class, on the unit sphere (a generated set: it
reads no file). Change ``load`` to make it yours: it returns the nodes' rows, in the unit ball,
split 80/10/10 on every node (testbed.data.split.split_flat)."""

from __future__ import annotations

import numpy as np

from testbed.data.registry import Registration
from testbed.data.split import check_scaling, split_flat
from testbed.streams.rng import Purpose, stream


def load(num_nodes, samples_per_node, dim, seed=0, scaling="per_node", nodes=None):
    check_scaling(scaling)
    ids = list(range(num_nodes)) if nodes is None else [int(m) for m in nodes]
    xs, ys = [], []
    for m in ids:  # each node's rows from its own stream: a board draws its own without the others'
        rng = stream(seed, m, -1, Purpose.DATA)
        y = rng.integers(0, 2, samples_per_node)
        x = rng.normal(0.0, 0.3, (samples_per_node, dim)) + np.outer(2 * y - 1, np.ones(dim))
        xs.append(x / np.linalg.norm(x, axis=1, keepdims=True))
        ys.append(y.astype(np.int64))
    offsets = np.arange(len(ids) + 1) * samples_per_node
    return split_flat(np.concatenate(xs), np.concatenate(ys), offsets, seed=seed, n_classes=2, name="{name}",
                      node_ids=ids)


REGISTRATION = Registration(
    "{name}", load, options=lambda d: dict(num_nodes=d.num_nodes, samples_per_node=d.samples_per_node, dim=d.dim),
    no_path="dataset is generated and reads no file", features=lambda d: d.dim, counted=True)
'''

DATASET_EXPERIMENT = '''[data]
dataset = "{name}"
num_nodes = 4
samples_per_node = 60
dim = 3
'''

ACCOUNTANT = '''"""{name}: basic composition of the classic Gaussian bound (Dwork and Roth, Theorem A.1: each of
the k compositions at δ/k, ε_i = Δ/σ sqrt(2 ln(1.25 k/δ)), summed), for replace-one releases.
Loose, but simple; change ``refuses`` and ``compose`` to make it yours."""

from __future__ import annotations

import math

from testbed.privacy.accountants.registry import Registration


def refuses(pairs):
    """Why it cannot compose these (sampling, adjacency) pairs together, or None. Sampled releases
    are composed as if unsampled: an upper bound (sampling only amplifies privacy)."""
    if any(adjacency != "replace_one" for _, adjacency in pairs):
        return "the {name} accountant composes replace-one sensitivities only"
    return None


def compose(items, delta):
    k = sum(count for _, count in items)
    per_unit = math.sqrt(2 * math.log(1.25 * k / delta))
    return sum(count * sensitivity / sigma for (sigma, sensitivity, *_), count in items) * per_unit


REGISTRATION = Registration(name="{name}", order=100, refuses=refuses, compose=compose)
'''

ACCOUNTANT_EXPERIMENT = '''[privacy]
accountant = "{name}"
'''

TEST = '''"""The testbed's contract suite on {name} (testbed.orchestration.contract_suite): the checks every
built-in {what} passes{mqtt}."""

import pytest

from testbed.orchestration import contract_suite as suite

EXPERIMENT = """
{experiment}"""


@pytest.mark.parametrize("check", suite.{checks}, ids=suite.check_name)
def test_the_contract(check, tmp_path):
    check(EXPERIMENT, tmp_path)
{extra}'''

SIM_EQUALS_MQTT = '''

def test_sim_equals_mqtt(tmp_path):
    """The same run in sim and over MQTT (every node its own client, the embedded broker)."""
    suite.check_sim_equals_mqtt(EXPERIMENT, tmp_path)
'''
