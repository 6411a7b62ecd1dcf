"""The resolved config written as TOML (testbed.assembly.config.to_toml, by tomli-w) reads back to an equal
config: every key of every section, generated from the sections' JSON Schema, and a killed PADPFL
run with an impact schedule resumes from its own config.toml."""

from __future__ import annotations

import copy

import pytest
from hypothesis import assume, given, strategies as st

from testbed.algorithms import registry
from testbed.assembly.config import PATH_KEYS, build_config, load_config, load_config_text, to_toml, used_sections
from testbed.errors import ConfigError

from schema_values import SCHEMA, from_schema, section_schema

#: Repairs tried on a generated experiment before it is given up (each removes the key an error names).
MAX_REPAIRS = 40


_SECTION_VALUES = {name: from_schema(section_schema(name)) for name in SCHEMA["properties"]}


@st.composite
def experiments(draw) -> dict:
    """A raw experiment of one algorithm: every section it uses, each key drawn within its schema
    (or left out); paths absolute, as a run's config.toml holds them."""
    algorithm = draw(st.sampled_from(registry.names()))
    sections = used_sections(build_config({"run": {"algorithm": algorithm}}))
    raw = {name: draw(_SECTION_VALUES[name]) for name in sections}
    raw["run"]["algorithm"] = algorithm
    for section, key in PATH_KEYS:
        if section in raw and isinstance(raw[section].get(key), str):  # the algorithm may not use the section
            raw[section][key] = "/" + raw[section][key].lstrip("/")
    return raw


def valid(raw: dict):
    """``raw`` validated, after removing each key a ConfigError names (cross-key rules reject many
    independent draws); None when an error names no removable key."""
    raw = copy.deepcopy(raw)
    for _ in range(MAX_REPAIRS):
        try:
            return build_config(raw)
        except ConfigError as exc:
            section, _, key = exc.key.partition(".")
            if key not in raw.get(section, {}):
                return None
            del raw[section][key]
    return None


@given(experiments())
def test_every_key_of_every_section_round_trips(tmp_path_factory, raw):
    config = valid(raw)
    assume(config is not None)
    path = tmp_path_factory.mktemp("rt") / "config.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    assert load_config(path) == config


@pytest.mark.parametrize("name", sorted(SCHEMA["properties"]))
def test_the_generator_of_each_section_covers_its_keys(name):
    # Guards the property above against a section whose schema leaves a key out.
    every_section = load_config_text("".join(f"[{s}]\n" for s in SCHEMA["properties"]))
    assert set(section_schema(name)["properties"]) == set(type(getattr(every_section, name)).model_fields)


SCHEDULED = """
[run]
name = "sched"
algorithm = "padpfl"
[data]
num_nodes = 4
samples_per_node = 40
dim = 5
[padpfl]
rounds = 5
local_steps = 2
batch = 8
impact = "given"
parts = [2, 2]
weights = [0.25, 0.25, 0.25, 0.25]
[[padpfl.schedule]]
after_round = {first}
weights = [0.7, 0.1, 0.1, 0.1]
[[padpfl.schedule]]
after_round = 4
ratios = "1-2"
[output]
figures = false
checkpoint_every = 1
"""


@pytest.mark.parametrize("first", [1, 2])
def test_padpfl_schedule_is_written_as_tables(first):
    config = load_config_text(SCHEDULED.format(first=first))
    text = to_toml(config)
    assert text.count("[[padpfl.schedule]]") == 2 and "ImpactChange" not in text
    assert load_config_text(text) == config


@pytest.mark.parametrize("killed_at_evaluation", [2, 4])
def test_a_killed_padpfl_run_with_a_schedule_resumes(killed_at_evaluation, tmp_path, monkeypatch):
    import testbed.orchestration.model_evaluation as model_evaluation
    from testbed.cli import main
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_summary

    config = load_config_text(SCHEDULED.format(first=killed_at_evaluation - 1))
    whole = run_experiment(config, out_dir=tmp_path / "whole", quiet=True).summary
    evaluate, calls = model_evaluation.evaluate, {"n": 0}

    def killed(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == killed_at_evaluation + 1:  # the first call is before round 1
            raise KeyboardInterrupt
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(model_evaluation, "evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, out_dir=tmp_path / "killed", quiet=True)
    monkeypatch.setattr(model_evaluation, "evaluate", evaluate)
    assert main(["run", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    resumed = read_summary(tmp_path / "killed")
    assert resumed["status"] == "completed" and resumed["rounds"] == whole["rounds"] == 5
    assert resumed["final"] == whole["final"]
