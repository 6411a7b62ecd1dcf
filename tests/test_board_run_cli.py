"""`testbed board run` as docs/boards.md and its --help write it (issue 43, part 2): the board's
flags between DIR and the --, and a board where localhost resolves. The command itself is not run
(that needs root, qemu-user-static and a built board: tests/test_board_arm64.py); what it would
exec is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from testbed.cli import main
from testbed.cli.board import SUB_EXAMPLES
from testbed.orchestration import board_image


@pytest.fixture
def fake_board(tmp_path, monkeypatch):
    """A folder that passes for a built arm64 board, and the exec it would do, caught."""
    root = tmp_path / "pi"
    (root / board_image.DEFAULT_COMMAND.lstrip("/")).parent.mkdir(parents=True)
    (root / board_image.DEFAULT_COMMAND.lstrip("/")).touch()
    (root / board_image.ARCH_FILE.lstrip("/")).write_text("arm64\n")
    monkeypatch.setattr(board_image, "check_host", lambda arch, needs_debootstrap: None)
    execs = []

    def fake_exec(file, argv):
        execs.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execvp", fake_exec)
    return root, execs


@pytest.mark.parametrize("where", ["after DIR", "before DIR"])
def test_bind_is_taken_where_the_docs_write_it(fake_board, tmp_path, monkeypatch, where):
    root, execs = fake_board
    lab = tmp_path / "lab" / "pi-01"
    lab.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    bind = ["--bind", f"{lab}:/etc/testbed"]
    command = ["testbed", "node", "--config", "/etc/testbed/node.toml", "--meter", "model"]
    args = ["board", "run", str(root), *bind, "--", *command] if where == "after DIR" else \
        ["board", "run", *bind, str(root), "--", *command]
    with pytest.raises(SystemExit):
        main(args)
    script = execs[0][-1]
    assert f"mount --bind {lab} {root}/etc/testbed" in script
    assert script.rstrip().endswith("exec testbed node --config /etc/testbed/node.toml --meter model'")


def test_the_help_examples_parse_and_a_command_keeps_its_own_flags(fake_board, tmp_path, monkeypatch):
    root, execs = fake_board
    monkeypatch.chdir(tmp_path)
    assert any("--bind" in example for example in SUB_EXAMPLES["run"])
    with pytest.raises(SystemExit):
        main(["board", "run", str(root), "--", "testbed", "node", "--bind", "x"])  # the command's, not the board's
    assert execs[0][-1].count("mount --bind") == 1  # the working folder's alone: no --bind for the board
    assert execs[0][-1].rstrip().endswith("exec testbed node --bind x'")


def test_a_bad_bind_after_dir_is_one_line(fake_board, tmp_path, capsys):
    root, _ = fake_board
    assert main(["board", "run", str(root), "--bind", "nowhere", "--", "true"]) == 2
    assert "--bind 'nowhere': expected SRC:DST" in capsys.readouterr().err


def test_localhost_resolves_in_a_board(fake_board, tmp_path, monkeypatch):
    """A debootstrap root has no /etc/hosts: the board gets one (and nsswitch.conf) at its build and,
    for a board built before, at `board run`; one it has is left as it is."""
    root, _ = fake_board
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["board", "run", str(root), "--", "getent", "hosts", "localhost"])
    hosts = (root / "etc/hosts").read_text().split()
    assert hosts[:2] == ["127.0.0.1", "localhost"]
    assert "hosts: files dns" in (root / "etc/nsswitch.conf").read_text()
    (root / "etc/hosts").write_text("10.0.0.1 broker.lan\n")
    assert board_image.name_service(root) == [] and (root / "etc/hosts").read_text() == "10.0.0.1 broker.lan\n"


LAB = """run_id = "lab1"
broker = "mqtts://broker.lan:8883"
[defaults]
meter = "model"
[[boards]]
host = "pi-01"
node_id = 0
[[boards]]
host = "pi-02"
node_id = 1
"""


@pytest.mark.parametrize("address,url", [("localhost", "mqtts://localhost:8883"),
                                         ("192.168.1.10", "mqtts://192.168.1.10:8883"),
                                         ("mqtt://10.0.0.2:1884", "mqtt://10.0.0.2:1884")])
def test_provision_takes_the_brokers_address_and_writes_the_coordinators_experiment(tmp_path, small_config_file,
                                                                                   capsys, address, url):
    """The TLS lab on one PC without editing anything: --broker names the broker as the boards reach
    it (the certificate is made for it), --experiment writes the file the coordinator runs."""
    import tomllib

    from testbed.assembly.config import load_config

    (tmp_path / "lab.toml").write_text(LAB)
    tls = ["--tls"] if url.startswith("mqtts") else []
    assert main(["provision", str(tmp_path / "lab.toml"), "--out", str(tmp_path / "lab"), *tls, "--broker", address,
                 "--experiment", str(small_config_file)]) == 0
    said = capsys.readouterr().out
    for host in ("pi-01", "pi-02"):
        node = tomllib.loads((tmp_path / "lab" / "boards" / host / "node.toml").read_text())
        assert node["broker"] == url
    written = tmp_path / "lab" / "coordinator" / "experiment.toml"
    assert f"testbed run {written}" in said
    config = load_config(written)
    assert (config.run.mode, config.data.num_nodes, config.mqtt.broker_url, config.mqtt.run_id) == ("mqtt", 2, url, "lab1")
    assert config.mqtt.emulated is False
    assert config.mqtt.credentials == str((tmp_path / "lab" / "coordinator" / "credentials.json").resolve())
    assert (config.mqtt.tls_ca is not None) == bool(tls)
    assert config.dp_pasgd.steps == 20  # the base experiment's own settings kept
    if tls:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate((tmp_path / "lab" / "broker" / "cert.pem").read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert address in [str(n.value) for n in names]


@pytest.mark.parametrize("address", ["broker lan", "-x", "http://h:1"])
def test_a_broker_address_that_is_not_one_is_refused_in_one_line(tmp_path, capsys, address):
    (tmp_path / "lab.toml").write_text(LAB)
    assert main(["provision", str(tmp_path / "lab.toml"), "--out", str(tmp_path / "lab"), "--broker", address]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--broker" in err and not (tmp_path / "lab").exists()


def test_an_emulated_boards_model_charges_the_hosts_seconds_not_the_emulators(monkeypatch):
    """In a board run through qemu the same step takes ~13x the CPU seconds: the model meter divides
    them by the slowdown measured against the host's own time of the same work (nodes.meters.emulation),
    so the board's joules are the profile's model of the step, and its source says so."""
    from nodes.meters import emulation
    from nodes.meters.model import ModelMeter
    from testbed.devices.profiles import load_profile

    profile = load_profile("pi-4b")
    native = ModelMeter(profile)._end(None, 0.5)
    monkeypatch.setenv(emulation.EMULATOR_VAR, "qemu-aarch64")
    monkeypatch.setenv(emulation.REFERENCE_VAR, "0.01")
    monkeypatch.setattr(emulation, "reference_seconds", lambda repeats=3: 0.128)  # 12.8x slower inside
    emulation.slowdown.cache_clear()
    try:
        meter = ModelMeter(profile)
        inside = meter._end(None, 0.5 * 12.8)  # the same step, as qemu's CPU time has it
    finally:
        emulation.slowdown.cache_clear()
    assert inside.seconds == pytest.approx(native.seconds) and inside.energy_j == pytest.approx(native.energy_j)
    assert inside.measured is False and "under qemu-aarch64" in inside.source and "12.8" in inside.source


@pytest.mark.parametrize("reference", [None, "nan", "-1", "x", "1e9"])
def test_without_a_good_reference_nothing_is_scaled(monkeypatch, reference):
    from nodes.meters import emulation

    monkeypatch.setenv(emulation.EMULATOR_VAR, "qemu-aarch64")
    if reference is None:
        monkeypatch.delenv(emulation.REFERENCE_VAR, raising=False)
    else:
        monkeypatch.setenv(emulation.REFERENCE_VAR, reference)
    emulation.slowdown.cache_clear()
    try:
        assert emulation.slowdown() is None
    finally:
        emulation.slowdown.cache_clear()


def test_board_run_tells_the_board_its_emulation(fake_board, tmp_path, monkeypatch):
    from nodes.meters import emulation

    root, execs = fake_board
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["board", "run", str(root), "--", "true"])
    script = execs[0][-1]
    assert f"{emulation.EMULATOR_VAR}=qemu-aarch64" in script and f"{emulation.REFERENCE_VAR}=" in script
    assert 0 < emulation.reference_seconds() < 5


@given(st.text(max_size=60))
def test_any_broker_address_is_a_url_the_boards_read_or_a_refusal_naming_broker(address):
    """Whatever is typed after --broker: an inventory whose broker the node file's own check takes,
    or a ConfigError naming --broker; never another exception."""
    from nodes import board_config
    from testbed.errors import ConfigError
    from testbed.orchestration.lab import broker_at
    from testbed.orchestration.provision import Inventory

    inventory = Inventory("lab1", "mqtts://broker.lan:8883", None, "/opt/testbed/bin/testbed", ())
    try:
        changed = broker_at(inventory, address)
    except ConfigError as exc:
        assert "--broker" in str(exc) and "\n" not in str(exc)
    else:
        assert board_config.CHECKS["broker"](changed.broker) == changed.broker
