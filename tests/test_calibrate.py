"""`testbed calibrate`: end to end through a real broker (embedded, or given with --broker), the
file the planner reads (exactly its keys), and the one-line user errors."""

import tomllib

import pytest

from testbed.cli import main
from testbed.cli.calibrate import Calibration, Cost, to_toml

KEYS = {"calibration": {"profile", "model_params", "measured"}, "c1": {"joules", "seconds"},
        "c2": {"joules", "seconds"}}


def _run(capsys, tmp_path, *args):
    out = tmp_path / "cal.toml"
    code = main(["calibrate", "--repeats", "2", "--out", str(out), *args])
    printed = capsys.readouterr().out
    assert code == 0
    return tomllib.loads(out.read_text()), printed


def _check_file(cal, profile, params):
    assert {k: set(v) for k, v in cal.items()} == KEYS
    assert cal["calibration"]["profile"] == profile and cal["calibration"]["model_params"] == params
    for cost in ("c1", "c2"):
        assert all(isinstance(v, float) and v > 0 for v in cal[cost].values())


@pytest.mark.slow
def test_emulated_board_through_the_embedded_broker(capsys, tmp_path):
    cal, printed = _run(capsys, tmp_path, "--profile", "pi-zero-2w", "--model-size", "100")
    _check_file(cal, "pi-zero-2w", 202)
    assert cal["calibration"]["measured"] is False  # an emulated board's joules are always modelled
    assert "model:pi-zero-2w (modelled)" in printed and "c1 round" in printed and "c2 step" in printed
    # A round costs the radio airtime of its messages (1.8 kB each way here) and the board time of
    # its codec and MQTT client on top. (Not necessarily more than a step: with orjson the codec
    # of a 202-parameter message costs about what one step does.)
    from nodes.meters.clock import comm_cost
    from testbed.devices.profiles import load_profile

    airtime_s, radio_j = comm_cost(1800, 1800, load_profile("pi-zero-2w"))
    assert cal["c1"]["seconds"] > airtime_s and cal["c1"]["joules"] > radio_j


@pytest.mark.slow
def test_host_through_a_given_broker(capsys, tmp_path, embedded_broker):
    cal, printed = _run(capsys, tmp_path, "--broker", embedded_broker.url, "--model-size", "10")
    _check_file(cal, "host", 22)
    assert isinstance(cal["calibration"]["measured"], bool)  # true where RAPL or an INA is readable
    assert embedded_broker.url in printed


def test_toml_values_are_always_floats():
    cal = Calibration("host", 202, True, Cost(2.0, 1e-5), Cost(1.23456789e-4, 3.0), "rapl:package-0", 3,
                      "embedded", 1816, 0.0012)
    parsed = tomllib.loads(to_toml(cal))
    assert parsed["calibration"] == {"profile": "host", "model_params": 202, "measured": True}
    assert parsed["c1"] == {"joules": 1e-5, "seconds": 2.0}
    assert parsed["c2"] == {"joules": 3.0, "seconds": 0.000123457}


@pytest.mark.parametrize("args,words", [
    (["--profile", "pi-6"], "unknown device profile 'pi-6'"),
    (["--profile", "pi-5", "--meter", "rapl"], "emulated board"),
    (["--meter", "joulemeter"], "unknown meter"),
    (["--repeats", "0"], "must be >= 1"),
])
def test_user_errors_are_one_line(capsys, tmp_path, args, words):
    code = main(["calibrate", "--out", str(tmp_path / "cal.toml"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and "\n" not in err
    assert not (tmp_path / "cal.toml").exists()
