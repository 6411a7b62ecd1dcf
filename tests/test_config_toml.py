"""The resolved config written as TOML (testbed.config.to_toml, by tomli-w) reads back to an equal
config: every key of every section, generated from the sections' JSON Schema, and a killed PADPFL
run with an impact schedule resumes from its own config.toml."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import assume, given, strategies as st

from testbed.algorithms import registry
from testbed.config import PATH_KEYS, build_config, load_config, load_config_text, to_toml, used_sections
from testbed.config import json_schema
from testbed.errors import ConfigError

SCHEMA = json_schema()
#: Repairs tried on a generated experiment before it is given up (each removes the key an error names).
MAX_REPAIRS = 40


def _resolved(schema: dict) -> dict:
    """``schema`` with its ``$ref`` (into the experiment schema's $defs) followed."""
    while "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _section_schema(name: str) -> dict:
    return _resolved(SCHEMA["properties"][name])


def from_schema(schema: dict) -> st.SearchStrategy:
    """Values valid under ``schema``, for the JSON Schema the sections' pydantic models write
    (types, enums, ranges, patterns, anyOf, arrays, nested tables); an optional key may be left out."""
    schema = _resolved(schema)
    if "anyOf" in schema:
        return st.one_of([from_schema(alternative) for alternative in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        if kind == "integer":
            return st.integers(None if low is None else low + ("exclusiveMinimum" in schema),
                               None if high is None else high - ("exclusiveMaximum" in schema))
        return st.floats(low, high, exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema,
                         allow_nan=False, allow_infinity=False)
    if kind == "string":
        return st.from_regex(schema["pattern"], fullmatch=True) if "pattern" in schema else st.text(max_size=12)
    if kind == "array":
        return st.lists(from_schema(schema["items"]), max_size=4)
    if kind == "object":
        required = set(schema.get("required", ()))
        properties = {key: from_schema(value) for key, value in schema["properties"].items()}
        return st.fixed_dictionaries({k: v for k, v in properties.items() if k in required},
                                     optional={k: v for k, v in properties.items() if k not in required})
    raise AssertionError(f"a schema this generator does not read: {schema}")


_SECTION_VALUES = {name: from_schema(_section_schema(name)) for name in SCHEMA["properties"]}


@st.composite
def experiments(draw) -> dict:
    """A raw experiment of one algorithm: every section it uses, each key drawn within its schema
    (or left out); paths absolute, as a run's config.toml holds them."""
    algorithm = draw(st.sampled_from(registry.names()))
    sections = used_sections(build_config({"run": {"algorithm": algorithm}}))
    raw = {name: draw(_SECTION_VALUES[name]) for name in sections}
    raw["run"]["algorithm"] = algorithm
    for section, key in PATH_KEYS:
        if isinstance(raw[section].get(key), str):
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
    assert set(_section_schema(name)["properties"]) == set(type(getattr(every_section, name)).model_fields)


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
    import testbed.orchestration.runner as runner
    from testbed.cli import main
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_summary

    config = load_config_text(SCHEDULED.format(first=killed_at_evaluation - 1))
    whole = run_experiment(config, out_dir=tmp_path / "whole", quiet=True).summary
    evaluate, calls = runner.evaluate, {"n": 0}

    def killed(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == killed_at_evaluation + 1:  # the first call is before round 1
            raise KeyboardInterrupt
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, out_dir=tmp_path / "killed", quiet=True)
    monkeypatch.setattr(runner, "evaluate", evaluate)
    assert main(["run", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    resumed = read_summary(tmp_path / "killed")
    assert resumed["status"] == "completed" and resumed["rounds"] == whole["rounds"] == 5
    assert resumed["final"] == whole["final"]
