"""The privacy statements (issue 39, part 5): docs/privacy.md, docs/guarantees.md and `testbed privacy NAME`
say the same thing, generated from one declaration per algorithm; every registered algorithm has
one; every test a statement names as evidence exists; the bare command prints the statement and a
calculator's arguments still run the calculator."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from testbed.algorithms import registry
from testbed.cli import main
from testbed.cli.algorithm_commands import command_name
from testbed.privacy.statements import generated_part, markdown_sections, markdown_table

ROOT = Path(__file__).resolve().parents[1]
STATEMENTS = registry.privacy_statements(plugins=False)  # the built-in ones, which the docs hold
NAMES = [s.name for s in STATEMENTS]


def test_every_registered_algorithm_states_its_privacy_first_under_its_own_name():
    for name, reg in registry.registrations().items():
        assert reg.privacy_statements and reg.privacy_statements[0].name == name, name
    assert len(set(NAMES)) == len(NAMES) and "mcu_logistic" in NAMES


def test_the_docs_are_what_the_statements_generate():
    """python tools/write_privacy_docs.py rewrites them after a statement changes."""
    assert generated_part((ROOT / "docs" / "privacy.md").read_text()) == markdown_sections(STATEMENTS)
    guarantees = (ROOT / "docs" / "guarantees.md").read_text()
    assert generated_part(guarantees) == markdown_table(STATEMENTS)
    assert guarantees.startswith("# Privacy guarantees") and "](privacy.md)" in guarantees
    assert "](docs/guarantees.md)" in (ROOT / "README.md").read_text()  # the front page leads there


@pytest.mark.parametrize("statement", STATEMENTS, ids=NAMES)
def test_the_cli_prints_the_lines_the_docs_hold(statement, capsys):
    assert main(["privacy", command_name(statement.name)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == statement.lines()
    docs = (ROOT / "docs" / "privacy.md").read_text()
    for label, text in statement.fields():
        assert f"- **{label}**: {text}" in docs
    assert main(["privacy", command_name(statement.name), "--json"]) == 0
    assert [(d["label"], d["text"]) for d in json.loads(capsys.readouterr().out)["lines"]] == statement.fields()


@pytest.mark.parametrize("statement", STATEMENTS, ids=NAMES)
def test_every_test_a_statement_names_exists(statement):
    tests = [e for e in statement.evidence if e.startswith("tests/")]
    assert tests or statement.evidence, statement.name
    for ref in tests:
        path, _, name = ref.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in defined, f"{statement.name}: {ref} does not exist"


@pytest.mark.parametrize("statement", STATEMENTS, ids=NAMES)
def test_every_statement_says_each_thing_the_issue_asks(statement):
    for label, text in statement.fields():
        assert text.strip(), (statement.name, label)
    assert statement.unit.split(":")[0] in ("record", "node", "entry", "none")
    assert statement.not_protected and statement.delta and statement.amplification


def test_a_calculator_needs_its_inputs_only_once_one_is_given(capsys):
    code = main(["privacy", "padpfl", "--clip", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--min-samples" in err and "--weights or --parts" in err
    assert main(["privacy", "padpfl", "--weights", "0.5,0.5", "--min-samples", "10", "--clip", "1", "--rounds", "2",
                 "--uploads", "2", "--epsilon", "1", "--delta", "0.01", "--json"]) == 0
    assert "sigma_client" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name, says", [("dwfl", ["x_j^(t−1/2) as fixed", "colluding receivers"]),
                                        ("gossip", ["model before the step as fixed"]),
                                        ("dpsgd", ["model before the step as fixed"]),
                                        ("acfl", ["ε-MI-DP in nats", "not covered"]),
                                        ("dp_pasgd", []), ("fedavg", []), ("padpfl", [])])
def test_each_run_says_what_its_epsilon_rests_on(name, says):
    """The summary's assumptions of a default run of each algorithm (the conformance suite's small
    experiments): the papers' assumptions the code cannot make true, nothing for the others."""
    from test_algorithm_contract import _text

    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import load, run_assumptions

    config = load_config_text(_text(name))
    said = run_assumptions(config, load(config)[0])
    assert bool(said) == bool(says) and all(any(s in line for line in said) for s in says), said
