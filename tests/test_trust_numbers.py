"""Every number a user types is checked before it is used (issue 27, invariant 2): on the command
line and in experiment files, finite, 0, negative, nan, inf, 1e308, 1e-308, 2**70 and generated
values each give a one-line refusal naming the option or key, or a correct result.

The tests walk what is registered, so an argument or a config key added later is covered for free:
every sub-command's parser (testbed.cli.build_parser) and every section of every algorithm
(testbed.assembly.config's registry of sections)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from hypothesis import given, strategies as st

from testbed.assembly.config import _section_classes, json_schema, load_config_text
from testbed.checked.arguments import Number, NumberList
from testbed.checked.limits import MAX_FLOAT, MAX_INT
from testbed.cli import build_parser, main
from testbed.errors import ConfigError, UserError

#: The values of the issue, and then any float or integer.
EDGES = [0, -1, float("nan"), float("inf"), -float("inf"), 1e308, 1e-308, 2**70, -2**70]
VALUES = st.one_of(st.sampled_from(EDGES), st.floats(), st.integers())


def typed(value: int | float) -> str:
    """``value`` as a user types it on the command line (``nan``, ``inf``, ``1e+308``, ``123``)."""
    return repr(value) if isinstance(value, float) else str(value)


def toml(value: int | float) -> str:
    """``value`` as a TOML value (TOML spells the non-finite floats nan, inf, -inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return typed(value)


# ---- the command line -------------------------------------------------------------------------


def _leaf_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(argv prefix, parser) of every command and sub-command that takes options."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from _leaf_parsers(child, path + (name,))


LEAVES = list(_leaf_parsers(build_parser()))
NUMERIC = [(path, parser, action) for path, parser in LEAVES for action in parser._actions
           if hasattr(action.type, "describe")]


def test_every_numeric_argument_has_a_checked_type_and_states_its_range():
    plain = [f"{' '.join(path)} {action.option_strings}" for path, parser in LEAVES for action in parser._actions
             if action.type in (int, float)]
    assert not plain, f"numeric arguments without a checked type (testbed.checked.arguments): {plain}"
    assert len(NUMERIC) > 50  # the walk found them: run, nodes, privacy, plan, sweep...
    for path, parser, action in NUMERIC:  # argparse shows no help line for an option without help
        assert action.help, (path, action.option_strings)
        assert action.type.describe() in parser._get_formatter()._get_help_string(action)


def _sample(kind) -> str:
    """A valid value of a checked type, as typed."""
    if isinstance(kind, NumberList):
        items = [v for v in (1, 0.5, 0, 2, 3) if kind.item.contains(v)][:max(kind.min_len, 1)]
        return ",".join(typed(kind.item.kind(v)) for v in items)
    if isinstance(kind, Number):
        return typed(next((v for v in (1, 0.5, 0) if kind.contains(v)), kind.low))
    return "1:1"  # --parts


def _argv(path: tuple[str, ...], parser: argparse.ArgumentParser, target: argparse.Action, text: str) -> list[str]:
    """argv that gives ``target`` the text ``text`` and every other required argument a valid value."""
    argv = list(path)
    in_groups = {a for g in parser._mutually_exclusive_groups for a in g._group_actions}
    for action in parser._actions:
        if action is target:
            argv += [action.option_strings[0], text] if action.option_strings else [text]
        elif not action.option_strings and action.nargs is None:
            argv.append("x")  # a positional: a file or a directory
        elif action.required and action not in in_groups:
            value = action.choices[0] if action.choices else _sample(action.type) if action.type else "x"
            argv += [action.option_strings[0], str(value)]
    for group in parser._mutually_exclusive_groups:
        if group.required and target not in group._group_actions:
            first = group._group_actions[0]
            argv += [first.option_strings[0]] + ([] if first.nargs == 0 else
                                                 [first.choices[0] if first.choices else
                                                  _sample(first.type) if first.type else "x"])
    return argv


def _parses(path, parser, action, text: str) -> object | None:
    """The parsed value of ``action`` for ``text``; None if refused, after checking the refusal."""
    argv = _argv(path, parser, action, text)
    try:
        args = build_parser(path[0]).parse_args(argv)
    except UserError as exc:
        message = str(exc)
        assert "\n" not in message and action.option_strings[0] in message, message
        return None
    return getattr(args, action.dest)


def _valid(kind, value) -> bool:
    """Whether a parsed value is what the type promises: finite numbers within its range."""
    if isinstance(kind, NumberList):
        return all(_valid(kind.item, v) for v in value)
    if isinstance(kind, Number):
        return isinstance(value, kind.kind) and math.isfinite(value) and kind.contains(value)
    counts, ratios = value  # --parts
    return all(_valid(type(kind).count, n) for n in counts) and all(_valid(type(kind).ratio, r) for r in ratios)


@pytest.mark.parametrize("value", EDGES, ids=typed)
def test_every_numeric_argument_refuses_the_edge_values_in_one_line_or_takes_them_in_range(value):
    for path, parser, action in NUMERIC:
        for text in (typed(value), f"1,{typed(value)}", f"{typed(value)}:1", f"1:{typed(value)}"):
            parsed = _parses(path, parser, action, text)
            assert parsed is None or _valid(action.type, parsed), (path, action.option_strings, text, parsed)


@given(index=st.integers(0, len(NUMERIC) - 1), value=VALUES)
def test_every_numeric_argument_refuses_generated_values_in_one_line_or_takes_them_in_range(index, value):
    path, parser, action = NUMERIC[index]
    parsed = _parses(path, parser, action, typed(value))
    assert parsed is None or _valid(action.type, parsed)
    if isinstance(action.type, Number):  # accepted exactly when finite and in range
        in_range = (isinstance(value, int) or action.type.kind is float) and math.isfinite(value) \
            and action.type.contains(value)
        assert (parsed is not None) == in_range, (path, action.option_strings, value)


#: The calculators, each with a base command line per way of using it (σ or ε, weights or parts):
#: each runs in milliseconds with --json, so every numeric option is run through to its answer.
CALCULATORS = [
    ("privacy", "dp-pasgd", "--steps", "100", "--lipschitz", "1", "--batch", "32", "--delta", "1e-4", "--sigma", "1"),
    ("privacy", "dp-pasgd", "--steps", "100", "--lipschitz", "1", "--batch", "32", "--delta", "1e-4", "--epsilon", "1"),
    ("privacy", "dwfl", "--gains", "1,0.5,0.8", "--power-w", "1", "--sigma2", "0.1", "--noise-var", "0.01",
     "--lr", "0.1", "--gmax", "1", "--delta", "1e-4", "--beta", "0.5"),
    ("privacy", "dwfl", "--gains", "1,0.5,0.8", "--power-w", "1", "--epsilon", "1", "--noise-var", "0.01",
     "--lr", "0.1", "--gmax", "1", "--delta", "1e-4"),
    ("privacy", "dwfl", "--gains", "1,0.5,0.8,0.9", "--power-w", "1", "--sigma2", "0.1", "--noise-var", "0.01",
     "--lr", "0.1", "--gmax", "1", "--delta", "1e-4", "--topology", "k_regular", "--degree", "2", "--seed", "0"),
    ("privacy", "dwfl", "--gains", "1,0.5,0.8,0.9", "--power-w", "1", "--epsilon", "1", "--noise-var", "0.01",
     "--lr", "0.1", "--gmax", "1", "--delta", "1e-4", "--topology", "erdos_renyi", "--p", "0.9", "--seed", "1"),
    ("privacy", "dwfl", "--gains", "1,0.5,0.8,0.9,1,1,1,1,1", "--power-w", "1", "--sigma2", "0.1", "--noise-var",
     "0.01", "--lr", "0.1", "--gmax", "1", "--delta", "1e-4", "--topology", "torus", "--rows", "3"),
    ("privacy", "padpfl", "--weights", "0.5,0.25,0.25", "--min-samples", "100", "--clip", "1", "--rounds", "10",
     "--uploads", "5", "--epsilon", "0.5", "--delta", "1e-4"),
    ("privacy", "padpfl", "--parts", "2:1,3:2", "--min-samples", "100", "--clip", "1", "--rounds", "10",
     "--uploads", "5", "--epsilon", "0.5", "--delta", "1e-4"),
    ("privacy", "acfl", "--dim", "10", "--outputs", "10", "--sigma1-sq", "1", "--sigma2-sq", "1"),
    ("privacy", "acfl", "--dim", "10", "--outputs", "10", "--epsilon", "5", "--ratio", "2"),
    ("plan", "acfl", "--dim", "10", "--outputs", "10", "--sigma1-sq", "1", "--sigma2-sq", "1", "--nodes", "10",
     "--straggler-p", "0.1", "--beta", "1", "--model-bound", "1", "--strong-convexity", "1", "--iterations", "100"),
]
CALCULATOR_OPTIONS = [(base, option) for base in CALCULATORS for option in base if option.startswith("--")]


def test_the_calculators_bases_reach_every_numeric_option():
    reached = {(base[:2], option) for base, option in CALCULATOR_OPTIONS}
    for path, _, action in NUMERIC:
        if path in {base[:2] for base in CALCULATORS}:
            assert (path, action.option_strings[0]) in reached, (path, action.option_strings)


def _calculate(capsys, base, option, text) -> None:
    argv = list(base) + ["--json"]
    argv[argv.index(option) + 1] = text
    code = main(argv)
    out = capsys.readouterr()
    if code == 2:
        assert len(out.err.strip().splitlines()) == 1 and out.err.startswith("testbed: "), out.err
        return
    assert code == 0, out.err
    result = json.loads(out.out, parse_constant=lambda word: pytest.fail(f"{word} in {base} {option}={text}"))
    assert all(math.isfinite(v) for v in _numbers(result)), result


def _numbers(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v)


@pytest.mark.parametrize("base,option", CALCULATOR_OPTIONS,
                         ids=[f"{' '.join(base[:2])} {option}" for base, option in CALCULATOR_OPTIONS])
def test_calculators_give_a_finite_answer_or_a_one_line_refusal_at_the_edges(capsys, base, option):
    for value in EDGES + [MAX_INT, MAX_FLOAT, 1e-30]:
        _calculate(capsys, base, option, typed(value))


@given(index=st.integers(0, len(CALCULATOR_OPTIONS) - 1), value=VALUES)
def test_calculators_give_a_finite_answer_or_a_one_line_refusal(capsys, index, value):
    base, option = CALCULATOR_OPTIONS[index]
    _calculate(capsys, base, option, typed(value))


# ---- experiment files -------------------------------------------------------------------------

SCHEMA = json_schema()
FIELDS = [(section, name, SCHEMA["$defs"][cls.__name__]["properties"][name])
          for section, cls in _section_classes().items() for name in cls.model_fields]


def _field_takes(prop: dict, value) -> bool | None:
    """Whether the field's own type and range take ``value`` (None: not a plain number field)."""
    kinds = [prop] + prop.get("anyOf", [])
    numeric = [k for k in kinds if k.get("type") in ("integer", "number")]
    if not numeric:
        return None
    return any(_in(k, value) for k in numeric)


def _in(kind: dict, value) -> bool:
    if isinstance(value, float) and (kind["type"] == "integer" or not math.isfinite(value)):
        return False
    return (value >= kind.get("minimum", -math.inf) and value > kind.get("exclusiveMinimum", -math.inf)
            and value <= kind.get("maximum", math.inf) and value < kind.get("exclusiveMaximum", math.inf))


def _load(section: str, name: str, prop: dict, value, route: str) -> None:
    """Load ``value`` into ``section.name`` by file or by ``--set``: a ConfigError of one line naming
    the key when the field refuses it, else a load or a one-line ConfigError of that section."""
    try:
        if route == "file":
            config = load_config_text(f"[{section}]\n{name} = {toml(value)}\n")
        else:
            config = load_config_text("", [f"{section}.{name}={toml(value)}"])
    except ConfigError as exc:
        assert "\n" not in str(exc)
        if _field_takes(prop, value) is False:
            assert exc.key == f"{section}.{name}", str(exc)
        else:  # a check across keys may name another key of the run
            assert exc.key.split(".")[0] in _section_classes(), str(exc)
        return
    loaded = getattr(getattr(config, section), name)
    assert _field_takes(prop, value) is not False, f"{section}.{name} took {value!r} outside its range"
    for number in _numbers(loaded):
        assert math.isfinite(number) and abs(number) <= max(MAX_FLOAT, 2**63), (section, name, loaded)


@pytest.mark.parametrize("route", ["file", "set"])
@pytest.mark.parametrize("value", EDGES, ids=typed)
def test_every_config_key_refuses_the_edge_values_naming_the_key_or_loads_them_in_range(value, route):
    for section, name, prop in FIELDS:
        _load(section, name, prop, value, route)
        if prop.get("type") == "array" or any(k.get("type") == "array" for k in prop.get("anyOf", [])):
            try:
                load_config_text(f"[{section}]\n{name} = [{toml(value)}]\n")
            except ConfigError as exc:
                assert "\n" not in str(exc) and exc.key.startswith(section), str(exc)


@given(index=st.integers(0, len(FIELDS) - 1), value=VALUES, route=st.sampled_from(["file", "set"]))
def test_every_config_key_refuses_generated_values_naming_the_key_or_loads_them_in_range(index, value, route):
    section, name, prop = FIELDS[index]
    _load(section, name, prop, value, route)


def test_every_number_field_is_bounded_on_both_sides_in_the_schema_and_says_so():
    for section, name, prop in FIELDS:
        for kind in [prop] + prop.get("anyOf", []) + ([prop["items"]] if isinstance(prop.get("items"), dict) else []):
            if kind.get("type") in ("integer", "number"):
                assert {"minimum", "exclusiveMinimum"} & set(kind), (section, name)
                assert {"maximum", "exclusiveMaximum"} & set(kind), (section, name)
                assert "Range: " in prop["description"], (section, name)


# ---- accepted at the extremes: the run runs, or is refused in one line before anything exists --


def _run(capsys, config_file, out, *overrides: str) -> tuple[int, str]:
    argv = ["run", str(config_file), "--out", str(out), "--quiet"]
    for item in overrides:
        argv += ["--set", item]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code in (0, 2) and "Traceback" not in err, err
    if code == 2:
        assert len(err.splitlines()) == 1, err
        assert not (out / "config.toml").exists()  # refused before the run directory held anything
    return code, err


@pytest.mark.parametrize("overrides", [
    ['client_sampling.method="uniform"', f"client_sampling.count={MAX_INT}"],  # more than the run's 4 nodes
    [f"output.eval_nodes={MAX_INT}"],
])
def test_counts_above_the_nodes_run_with_every_node(capsys, small_config_file, tmp_path, overrides):
    code, err = _run(capsys, small_config_file, tmp_path / "r", *overrides, 'privacy.tight_accountant="none"')
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["nodes"]) == 4


@pytest.mark.parametrize("overrides,key", [
    ([f"data.num_nodes={MAX_INT}"], "data.num_nodes"),
    ([f"data.num_nodes={MAX_INT}", 'client_sampling.method="uniform"', "client_sampling.count=2",
      "output.eval_nodes=2"], "data.num_nodes"),  # lazy nodes: still a ledger row per node
    ([f"data.num_nodes={2**70}"], "data.num_nodes"),
    ([f"data.samples_per_node={MAX_INT}"], "data.num_nodes"),
    (["nodes.mcu=[1, 2, 1]"], "nodes.mcu"),
    (["nodes.mcu=[0, 0]"], "nodes.mcu"),
    ([f"client_sampling.count={2**70}", 'client_sampling.method="uniform"'], "client_sampling.count"),
    (["output.eval_nodes=0"], "output.eval_nodes"),
])
def test_extreme_counts_are_refused_in_one_line_naming_the_key_before_anything_is_allocated(
        capsys, small_config_file, tmp_path, overrides, key):
    code, err = _run(capsys, small_config_file, tmp_path / "r", *overrides)
    assert code == 2 and err.startswith(f"testbed: config error: {key}:"), err


@pytest.mark.parametrize("key,value", [("node_id", 2**70), ("node_id", -1), ("node_id", 2**31), ("max_chunk_bytes", 1),
                                       ("max_chunk_bytes", 2**40), ("node_id", 1.5), ("node_id", True)])
def test_a_node_files_numbers_are_refused_in_one_line_out_of_range(key, value):
    """A board's node file (testbed node --config) is held to the command line's ranges."""
    from nodes.board_config import parse_board_config

    with pytest.raises(ConfigError, match=key):
        parse_board_config(f"{key} = {str(value).lower()}\n", "node.toml")


@pytest.mark.parametrize("section,key", [("dp_pasgd", "tau"), ("fedavg", "local_steps"), ("padpfl", "local_steps")])
def test_local_steps_beyond_memory_are_refused_naming_the_key_before_a_round(section, key):
    """A round's mini-batches of 2**31 - 1 steps were a numpy MemoryError traceback in round 0."""
    from test_algorithm_contract import _text

    from testbed.assembly import assemble

    from testbed.orchestration.runner import load

    config = load_config_text(_text(section), [f"{section}.{key}={2**31 - 1}"]
                              + (["dp_pasgd.steps=2147483647"] if section == "dp_pasgd" else []))
    data, model = load(config)
    with pytest.raises(ConfigError, match=f"{section}.{key}"):
        assemble.build_algorithm(config, model, data)
