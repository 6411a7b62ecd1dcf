"""Experiment files on the registry: sections declared where they are used, only the used ones
written, the JSON Schema, relative paths, accountant support checked before anything runs."""

import json
from pathlib import Path

import jsonschema
import pytest

from testbed.algorithms import registry
from testbed.cli import main
from testbed.config import json_schema, load_config, load_config_text, to_toml
from testbed.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_config_toml_holds_only_the_sections_the_run_uses():
    for name, reg in registry.registrations().items():
        text = to_toml(load_config_text(f'[run]\nalgorithm = "{name}"\n'))
        sections = {line.strip("[]") for line in text.splitlines() if line.startswith("[")}
        assert set(reg.sections) <= sections
        others = {s for other in registry.registrations().values() if other is not reg for s in other.sections}
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
    # README: quotes are needed only for a string that reads as another TOML value.
    from testbed.config import parse_override

    assert parse_override(text)[1] == value
    assert type(parse_override(text)[1]) is type(value)
