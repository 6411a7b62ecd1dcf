"""Bad input on the command line gets one line on stderr and exit status 2, never a traceback:
experiment paths that are not experiment files, output directories that cannot be written, ids
that cannot be ids. Most cases run `testbed.cli.main` in this process (a traceback would escape as
an exception); a few run `python -m testbed` as a user does. Network: 127.0.0.1 only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.mqtt.broker import free_port

from conftest import REPO


def _fails(capsys, argv: list[str]) -> str:
    """Run the CLI; assert exit 2 and exactly one line on stderr; return that line."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("testbed: ")
    return err


def _testbed(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(REPO)})


def _one_line_exit_2(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---- the experiment file ----------------------------------------------------------------------


def test_a_directory_as_experiment_file(capsys, tmp_path):
    err = _fails(capsys, ["run", str(tmp_path)])
    assert str(tmp_path) in err and "is a directory" in err


def test_a_binary_file_as_experiment_file(capsys, tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    err = _fails(capsys, ["run", str(binary)])
    assert str(binary) in err and "not a text" in err


def test_a_directory_as_experiment_file_via_python_m(tmp_path):
    err = _one_line_exit_2(_testbed("run", str(tmp_path)))
    assert "is a directory" in err


def test_sweep_of_a_directory(capsys, tmp_path):
    err = _fails(capsys, ["sweep", str(tmp_path), "--grid", "dp_pasgd.tau=1,5"])
    assert "is a directory" in err


# ---- output directories -----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["proc", "under_file"])
def test_unwritable_out(capsys, small_config_file, tmp_path, where):
    out = Path("/proc/testbed-no/run") if where == "proc" else small_config_file / "run"
    err = _fails(capsys, ["run", str(small_config_file), "--out", str(out), "--quiet"])
    assert err.startswith(f"testbed: --out {out}: ")


def test_unwritable_output_dir(capsys, small_config_file, tmp_path):
    err = _fails(capsys, ["run", str(small_config_file), "--set", "output.dir='/proc/testbed-no'", "--quiet"])
    assert err.startswith("testbed: output.dir /proc/testbed-no: ")


def test_unwritable_run_directory_is_one_line_where_it_is_made(tmp_path, small_config_file):
    """The run directory itself refuses a bad path with a UserError (for callers other than the CLI)."""
    from testbed.errors import UserError
    from testbed.reports.results import RunDirectory

    with pytest.raises(UserError, match="cannot write the run directory"):
        RunDirectory(small_config_file / "run")


@pytest.mark.parametrize("where", ["proc", "under_file"])
def test_acl_unwritable_out(capsys, tmp_path, where):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = Path("/proc/testbed-no") if where == "proc" else blocker / "secrets"
    err = _fails(capsys, ["acl", "--nodes", "2", "--out", str(out)])
    assert err.startswith(f"testbed: --out {out}: ")


# ---- ids and counts ---------------------------------------------------------------------------


@pytest.mark.parametrize("count", ["0", "-1"])
def test_acl_needs_at_least_one_node(capsys, tmp_path, count):
    err = _fails(capsys, ["acl", "--nodes", count, "--out", str(tmp_path / "s")])
    assert "--nodes: must be >= 1, got " + count in err
    assert not (tmp_path / "s").exists()


def test_acl_refuses_a_reserved_node_id(capsys, tmp_path):
    err = _fails(capsys, ["acl", "--ids", "0,coordinator", "--out", str(tmp_path / "s")])
    assert "coordinator" in err


def test_node_id_must_not_be_negative(capsys):
    # refused before any connection is attempted (the port is not even listened on)
    err = _fails(capsys, ["node", "--node-id", "-1", "--broker", f"mqtt://127.0.0.1:{free_port()}"])
    assert "--node-id: must be >= 0, got -1" in err


def test_nodes_ids_must_not_be_negative(capsys):
    err = _fails(capsys, ["nodes", "--ids", "0,-2", "--broker", f"mqtt://127.0.0.1:{free_port()}"])
    assert "got -2" in err


@pytest.mark.parametrize("ids", ["3,5,3", "0,0"])
def test_nodes_ids_must_not_repeat(capsys, ids):
    err = _fails(capsys, ["nodes", "--ids", ids, "--broker", f"mqtt://127.0.0.1:{free_port()}"])
    assert "--ids: names" in err and "twice" in err


@pytest.mark.parametrize("ids", ["1,2,1", "a,a"])
def test_acl_ids_must_not_repeat(capsys, tmp_path, ids):
    err = _fails(capsys, ["acl", "--ids", ids, "--out", str(tmp_path / "s")])
    assert f"--ids names {ids.split(',')[0]} twice" in err
    assert not (tmp_path / "s").exists()


def test_nodes_count_over_the_open_file_limit_is_refused_before_a_node_starts(capsys, monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    err = _fails(capsys, ["nodes", "--count", "5000", "--broker", f"mqtt://127.0.0.1:{free_port()}"])
    assert "--count 5,000" in err and "open files" in err and "1,024" in err


@pytest.mark.parametrize("argv,words", [
    (["nodes", "--count", "2000000000"], "--count 2,000,000,000 needs about"),
    (["acl", "--nodes", "2000000000"], "--nodes 2,000,000,000 needs about"),
    (["calibrate", "--model-size", "2000000000"], "--model-size 2,000,000,000 needs about"),
])
def test_counts_beyond_memory_are_refused_before_anything_is_made(capsys, tmp_path, argv, words):
    extra = ["--broker", f"mqtt://127.0.0.1:{free_port()}"] if argv[0] == "nodes" else \
        ["--out", str(tmp_path / "s")] if argv[0] == "acl" else ["--out", str(tmp_path / "c.toml")]
    err = _fails(capsys, argv + extra)
    assert words in err and "available" in err
    assert not (tmp_path / "s").exists() and not (tmp_path / "c.toml").exists()


def test_first_id_and_count_beyond_the_largest_id(capsys):
    err = _fails(capsys, ["nodes", "--first-id", "2147483000", "--count", "1000",
                          "--broker", f"mqtt://127.0.0.1:{free_port()}"])
    assert "node ids go up to 2147483647" in err


@pytest.mark.parametrize("grid,repeats", [("dp_pasgd.tau=1,2", "2000000000"), ("dp_pasgd.lr=0.1,0.2,0.3", "900000000")])
def test_sweep_of_more_runs_than_memory_holds_is_refused_before_its_points_are_made(capsys, small_config_file, tmp_path,
                                                                                     grid, repeats):
    err = _fails(capsys, ["sweep", str(small_config_file), "--grid", grid, "--repeats", repeats,
                          "--out", str(tmp_path / "s")])
    assert "--grid and --repeats: a sweep of" in err and "needs about" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("mode", ["sim", "mqtt"])
def test_run_id_with_a_slash_is_refused_in_any_mode(capsys, small_config_file, tmp_path, mode):
    err = _fails(capsys, ["run", str(small_config_file), "--mode", mode, "--set", "mqtt.run_id='a/b'",
                          "--out", str(tmp_path / "r"), "--quiet"])
    assert err.startswith("testbed: config error: mqtt.run_id: must match") and "'a/b'" in err
    assert not (tmp_path / "r").exists()  # refused before anything ran


# ---- testbed broker --host --------------------------------------------------------------------


def test_broker_listens_on_the_host_given(tmp_path):
    """`testbed broker --host 127.0.0.1 --port P` serves MQTT there (a LAN address works the same
    way; tests bind loopback only) and stops on Ctrl-C."""
    from testbed.mqtt.client import MqttClient

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "broker", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"broker listening on mqtt://127.0.0.1:{port}"), line + proc.stderr.read()
        client = MqttClient.for_node(f"mqtt://127.0.0.1:{port}", "r1", "n1", protocol="3.1.1").connect(timeout_s=10)
        assert client.connected
        client.close(timeout_s=1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)  # amqtt shuts its connections down gracefully: slow on a loaded host
        finally:
            proc.kill()
    assert proc.returncode == 0, proc.stderr.read()


def test_broker_bad_port_is_one_line(capsys):
    err = _fails(capsys, ["broker", "--port", "70000"])
    assert "--port" in err


def test_embedded_broker_stays_loopback_unless_told(tmp_path):
    from testbed.errors import UserError
    from testbed.mqtt.embedded_broker import EmbeddedBroker

    with pytest.raises(UserError, match="only loopback"):
        EmbeddedBroker(host="0.0.0.0")
    assert EmbeddedBroker(host="0.0.0.0", allow_remote=True).host == "0.0.0.0"  # not started: binds nothing


@pytest.mark.parametrize("depth", [5_000, 50_000])
def test_an_experiment_nested_too_deeply_is_one_line(depth, tmp_path, capsys):
    """tomllib recurses per nesting level: a file of arrays 50,000 deep was a RecursionError traceback."""
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * depth + "]" * depth + "\n")
    assert main(["run", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("testbed: ") and "\n" not in err and "nested too deeply" in err
