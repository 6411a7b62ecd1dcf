"""Experiment files on the registry: sections declared where they are used, only the used ones
written, the JSON Schema, relative paths, accountant support checked before anything runs."""

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, strategies as st

from testbed.algorithms import registry
from testbed.cli import main
from testbed.assembly.config import json_schema, load_config, load_config_text, to_toml
from testbed.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_config_toml_holds_only_the_sections_the_run_uses():
    for name, reg in registry.registrations().items():
        text = to_toml(load_config_text(f'[run]\nalgorithm = "{name}"\n'))
        sections = {line.strip("[]") for line in text.splitlines() if line.startswith("[")}
        assert set(reg.sections) <= sections
        # A section several algorithms declare (the decentralised ones' [topology]) is each one's own.
        others = {s for other in registry.registrations().values() if other is not reg
                  for s in other.sections} - set(reg.sections)
        assert not sections & others, f"{name} writes another algorithm's section"
        assert load_config_text(text) == load_config_text(f'[run]\nalgorithm = "{name}"\n')


def test_schema_describes_every_section_and_checks_the_shipped_experiments(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft7Validator.check_schema(schema)
    sections = {s for reg in registry.registrations().values() for s in reg.sections}
    assert sections | {"run", "data", "budget", "stragglers", "mqtt"} <= set(schema["properties"])
    assert schema["$defs"]["RunSection"]["properties"]["algorithm"]["enum"] == registry.names()
    assert schema["$defs"]["DpPasgdSection"]["properties"]["steps"]["description"]
    import tomllib

    files = sorted(REPO.glob("experiments/**/*.toml"))
    assert files
    for path in files:
        jsonschema.validate(tomllib.loads(path.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"dp_pasgd": {"steps": "many"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"dwfl": {"nosuch": 1}}, schema)


def test_schema_out_file(tmp_path, capsys):
    out = tmp_path / "experiment.schema.json"
    assert main(["schema", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json_schema()
    assert main(["schema", "--out", str(tmp_path / "missing" / "x.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_relative_paths_resolve_against_the_experiment_file(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "e.toml").write_text('[data]\npath = "data/adult.data"\n[mqtt]\ncredentials = "secrets/c.json"\n'
                                   'tls_ca = "/abs/ca.pem"\nbroker_url = "mqtts://127.0.0.1:8883"\n')
    config = load_config(folder / "e.toml")
    assert config.data.path == str(folder / "data/adult.data")
    assert config.mqtt.credentials == str(folder / "secrets/c.json")
    assert config.mqtt.tls_ca == "/abs/ca.pem"


@pytest.mark.parametrize("text,key", [
    ('[run]\nalgorithm = "nosuch"\n', "run.algorithm"),
    ('[fedavg]\nrounds = 0\n', "fedavg.rounds"),
    ('[stragglers]\nmodel = "deadline"\n', "stragglers.deadline_s"),
    ('[stragglers]\np = 1.0\n', "stragglers.p"),
    ('[data]\nscaling = "global"\n', "data.scaling"),
    ('[dwfl]\nsigma2 = 1.0\nepsilon = 1.0\n', "dwfl.sigma2"),
])
def test_errors_name_the_key(text, key):
    with pytest.raises(ConfigError) as err:
        load_config_text(text)
    assert str(err.value).startswith(f"config error: {key}:"), str(err.value)


def test_an_accountant_that_cannot_account_is_a_config_error_before_round_1(small_config_file, capsys, tmp_path):
    code = main(["run", str(small_config_file), "--set", 'privacy.tight_accountant="pld"', "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("testbed: config error: privacy.tight_accountant: the pld accountant cannot amplify")
    assert not (tmp_path / "r" / "config.toml").exists()


def test_microcontroller_nodes_need_an_algorithm_the_firmware_runs(small_config_file, capsys, tmp_path):
    code = main(["run", str(small_config_file), "--set", 'run.algorithm="fedavg"', "--set", "nodes.mcu=[1]",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("testbed: config error: nodes.mcu: fedavg has no")


@pytest.mark.parametrize("text,value", [
    ("stragglers.model=bernoulli", "bernoulli"), ("stragglers.model='bernoulli'", "bernoulli"),
    ('stragglers.model="bernoulli"', "bernoulli"), ("data.dataset=adult-2", "adult-2"),
    ("mqtt.protocol=3.1.1", "3.1.1"), ("run.name='2024'", "2024"), ("run.name=my run", "my run"),
    ("budget.epsilon=2", 2), ("budget.epsilon=1e-1", 0.1), ("output.figures=false", False)])
def test_set_reads_toml_and_takes_other_text_as_a_string(text, value):
    # docs/experiment-files.md: quotes are needed only for a string that reads as another TOML value.
    from testbed.assembly.config import parse_override

    assert parse_override(text)[1] == value
    assert type(parse_override(text)[1]) is type(value)


# ---- a key that matters only under another key's choice (testbed.checked.sections.OnlyWith) ----------------

def _dependent_keys() -> list[tuple[str, str]]:
    """(section, key) of every key that matters only under another key's choice."""
    every = load_config_text("".join(f"[{s}]\n" for s in json_schema()["properties"]))
    return [(name, key) for name in json_schema()["properties"] for key in type(getattr(every, name)).ONLY_WITH]


DEPENDENT = _dependent_keys()


def test_the_dependent_keys_include_the_known_ones():
    assert {("stragglers", "p"), ("stragglers", "deadline_s"), ("stragglers", "jitter_sigma"), ("model", "network"),
            ("model", "hidden"), ("model", "rf_gamma"), ("nodes", "mcu_board"), ("data", "alpha")} <= set(DEPENDENT)
    assert {key for name, key in DEPENDENT if name == "padpfl"} >= {"trim_fraction", "score_temperature"}


@given(st.data())
def test_a_key_set_while_its_choice_is_off_is_refused_naming_both(data):
    from schema_values import from_schema, section_schema
    from testbed.assembly.config import build_config
    from testbed.checked.sections import field_default

    section, key = data.draw(st.sampled_from(DEPENDENT))
    every = load_config_text(f"[{section}]\n")
    cls = type(getattr(every, section))
    properties = section_schema(section)["properties"]
    value = data.draw(from_schema(properties[key]).filter(lambda v: v != field_default(cls, key)), label=key)
    choices = cls.ONLY_WITH[key]
    controls = {c.key: data.draw(from_schema(properties[c.key]), label=c.key) for c in choices}
    for control in list(controls):  # a control that is itself off would be refused first: leave it out
        if control in cls.ONLY_WITH and not any(c.holds(cls.model_construct(**controls)) for c in cls.ONLY_WITH[control]):
            controls[control] = field_default(cls, control)
    on = any(c.holds(cls.model_construct(**controls)) for c in choices)
    try:
        build_config({section: {**controls, key: value}})
        refused = None
    except ConfigError as exc:
        refused = exc
    if on:  # another rule may refuse the section, never this one
        assert refused is None or refused.key != f"{section}.{key}" or "matters only" not in refused.problem
    else:
        assert refused is not None and (refused.key == f"{section}.{key}" or refused.key.startswith(f"{section}.{key}.")), \
            refused
        if refused.key != f"{section}.{key}":  # a sub-table's value ([dwfl.scene]) its own rule refused first
            return
        assert "matters only with" in refused.problem and all(c.key in refused.problem for c in choices)


@pytest.mark.parametrize("override,key,choice", [
    ("stragglers.p=0.3", "stragglers.p", 'model = "bernoulli"'),
    ("stragglers.jitter_sigma=0.5", "stragglers.jitter_sigma", 'model = "deadline"'),
    ("model.hidden=64", "model.hidden", 'kind = "mlp" or network = "mlp"'),
    ("nodes.mcu_board=mps2-an385", "nodes.mcu_board", "mcu set"),
    ("data.alpha=0.1", "data.alpha", 'partition = "dirichlet"')])
def test_a_key_without_its_choice_is_one_config_error(override, key, choice, small_config_file):
    with pytest.raises(ConfigError) as exc:
        load_config(small_config_file, [override])
    assert exc.value.key == key and choice in exc.value.problem


@pytest.mark.parametrize("overrides", [["stragglers.model=bernoulli", "stragglers.p=0.3"],
                                       ["stragglers.model=deadline", "stragglers.deadline_s=2", "stragglers.jitter_sigma=0"],
                                       ["model.kind=mlp", "dp_pasgd.clip=true", "model.hidden=8"], ["data.partition=dirichlet", "data.alpha=2"]])
def test_a_key_with_its_choice_is_taken(overrides, small_config_file):
    from testbed.assembly.config import parse_override

    config = load_config(small_config_file, overrides)
    (section, key), value = parse_override(overrides[-1])
    assert getattr(getattr(config, section), key) == value
