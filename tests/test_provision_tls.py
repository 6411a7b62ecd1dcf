"""`testbed provision --tls`: the lab's CA and the broker's certificate (signed by it, for the broker
URL's host), a mosquitto.conf whose every path is inside the output folder (or --broker-dir) and
that Mosquitto starts from as written, and docs/lab.md's inventory example run end to end over TLS:
provision, Mosquitto from the generated conf, two boards from their bundles, a run completes."""

from __future__ import annotations

import datetime
import ipaddress
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from nodes.board_config import load_board_config
from testbed.assembly.config import load_config
from testbed.cli import main
from testbed.ledger.files import read_ledger
from testbed.mqtt.broker import free_port, wait_for_broker
from testbed.mqtt.brokers.mosquitto import find_binary
from testbed.orchestration.certificates import BACKDATE, make_broker_tls
from testbed.orchestration.provision import load_inventory, provision
from testbed.orchestration.runner import run_experiment

from conftest import REPO, adult_file, require_module, require_tool

x509 = require_module("cryptography.x509", "coordinator")

#: The conf's keys that name files.
PATH_KEYS = ("password_file", "acl_file", "cafile", "certfile", "keyfile")


def lab_inventory() -> str:
    """The inventory example of docs/lab.md ("A lab of boards"), as written there."""
    chapter = (REPO / "docs" / "lab.md").read_text()
    section = chapter[chapter.index("## Provisioning a lab"):]
    return re.search(r"```toml\n(.*?)```", section, re.S).group(1)


def _lab(folder: Path, broker: str | None = None, adult: Path | None = None) -> Path:
    """docs/lab.md's lab.toml in ``folder`` (its broker line replaced by ``broker``), beside
    shards/adult.data (a copy of ``adult``, else a stand-in)."""
    text = lab_inventory()
    if broker is not None:
        text, count = re.subn(r'^broker = ".*"$', f'broker = "{broker}"', text, flags=re.M)
        assert count == 1
    (folder / "shards").mkdir(parents=True)
    if adult is None:
        (folder / "shards" / "adult.data").write_text("39, State-gov, 77516\n")
    else:
        shutil.copyfile(adult, folder / "shards" / "adult.data")
    (folder / "lab.toml").write_text(text)
    return folder / "lab.toml"


def _conf_paths(conf: str) -> dict[str, Path]:
    return {key: Path(value) for key, value in (line.split(" ", 1) for line in conf.splitlines()
                                                if line and not line.startswith("#")) if key in PATH_KEYS}


def _certificate(path: Path):  # type: ignore[no-untyped-def]
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_readme_inventory_provisions_as_written(tmp_path, capsys):
    lab = _lab(tmp_path)
    out = tmp_path / "lab"
    assert main(["provision", str(lab), "--out", str(out), "--tls"]) == 0
    printed = capsys.readouterr().out
    conf = (out / "broker" / "mosquitto.conf").read_text()
    paths = _conf_paths(conf)
    assert set(paths) == set(PATH_KEYS)
    for key, path in paths.items():  # every file it names was written, inside the output folder
        assert path.is_absolute() and path.is_file() and path.is_relative_to((out / "broker").resolve()), key
    assert "/etc/mosquitto" not in conf and f"mosquitto -c {(out / 'broker' / 'mosquitto.conf').resolve()}" in printed
    ca = (out / "coordinator" / "ca.pem").read_bytes()
    assert ca == (out / "broker" / "ca.pem").read_bytes()
    for host in ("pi-01", "pi-02"):
        node = load_board_config(out / "boards" / host / "node.toml")
        assert Path(node["tls_ca"]).read_bytes() == ca and node["broker"] == "mqtts://broker.lan:8883"
    cert = _certificate(out / "broker" / "cert.pem")
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
        .get_values_for_type(x509.DNSName) == ["broker.lan"]
    assert f'tls_ca = "{(out / "coordinator" / "ca.pem").resolve()}"' in printed


def test_broker_dir_names_the_conf_paths(tmp_path):
    out = tmp_path / "lab"
    assert main(["provision", str(_lab(tmp_path)), "--out", str(out), "--tls",
                 "--broker-dir", "/srv/mosquitto/lab1"]) == 0
    conf = (out / "broker" / "mosquitto.conf").read_text()
    assert all(str(path.parent) == "/srv/mosquitto/lab1" for path in _conf_paths(conf).values())
    assert "\nuser " not in conf  # started as root there, Mosquitto's own user reads the copied files


@pytest.mark.parametrize("args, inventory_extra, broker, said", [
    (["--tls"], "", "mqtt://broker.lan:1883", "--tls: the inventory's broker mqtt://broker.lan:1883 is plain mqtt://"),
    (["--tls"], 'ca = "own-ca.pem"\n', None, "--tls makes the lab's CA, but the inventory names its own ca"),
    (["--tls", "--broker-dir", "rel/dir"], "", None, "--broker-dir rel/dir: must be an absolute path"),
])
def test_contradictory_tls_requests_are_one_line(tmp_path, capsys, args, inventory_extra, broker, said):
    lab = _lab(tmp_path, broker)
    (tmp_path / "own-ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    lab.write_text(inventory_extra + lab.read_text())
    assert main(["provision", str(lab), "--out", str(tmp_path / "lab"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err
    assert not (tmp_path / "lab").exists()  # refused before anything is written


_HOSTS = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,40}(\.[a-z][a-z0-9-]{0,40}){0,5}", fullmatch=True)
    .filter(lambda h: not h.endswith("-") and "-." not in h),
    st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))


@given(host=_HOSTS)
def test_the_ca_signs_the_brokers_certificate_for_exactly_its_host(host):
    tls = make_broker_tls(host, "lab1")
    ca = x509.load_pem_x509_certificate(tls.ca_pem)
    cert = x509.load_pem_x509_certificate(tls.cert_pem)
    cert.verify_directly_issued_by(ca)  # raises unless the CA's key signed it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    try:
        assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(host)]
        assert names.get_values_for_type(x509.DNSName) == []
    except ValueError:
        assert names.get_values_for_type(x509.DNSName) == [host]
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(tls.key_pem, password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # the key of this certificate
    now = datetime.datetime.now(datetime.timezone.utc)
    for one in (ca, cert):
        assert one.not_valid_before_utc <= now - BACKDATE + datetime.timedelta(minutes=5)
        assert one.not_valid_after_utc > now + datetime.timedelta(days=365)


@given(port=st.integers(1, 65535), tls=st.booleans(), broker_dir=st.sampled_from([None, "/etc/mosquitto/lab"]))
def test_every_path_in_the_conf_is_inside_the_broker_folder(port, tls, broker_dir):
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "inventory.toml"
        inventory.write_text(f'broker = "{"mqtts" if tls else "mqtt"}://10.0.0.7:{port}"\n'
                             '[[boards]]\nhost = "pi-a"\nnode_id = 0\n')
        out = Path(tmp) / "out"
        provision(load_inventory(inventory), out, tls=tls, broker_dir=broker_dir)
        conf = (out / "broker" / "mosquitto.conf").read_text()
        folder = Path(broker_dir) if broker_dir else (out / "broker").resolve()
        paths = _conf_paths(conf)
        assert set(paths) == set(PATH_KEYS if tls else PATH_KEYS[:2])
        for path in paths.values():
            assert path.parent == folder
            assert broker_dir or path.is_file()  # written where the conf says, when it stays here
        assert f"listener {port}\n" in conf


EXPERIMENT = """
[run]
name = "lab"
seed = 3
mode = "mqtt"
[data]
dataset = "adult-2"
path = "{shards}"
num_nodes = 2
[dp_pasgd]
steps = 4
tau = 2
batch = 16
lr = 0.5
sigma = 1.0
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[privacy]
delta = 1e-5          # below 1/m: each board holds about 16,000 of Adult's rows (issue 39)
[mqtt]
round_timeout_s = 60.0
connect_timeout_s = 60.0
quorum = 2
[output]
figures = false
"""


@pytest.mark.slow
def test_the_readme_lab_runs_over_tls_from_its_generated_files(tmp_path):
    """provision --tls from docs/lab.md's inventory as written, its broker given on the command line
    (--broker: on loopback here) and the coordinator's experiment file written by --experiment,
    Mosquitto started from the generated conf as written, both boards from their bundles (the PC's
    overrides of the board defaults: --meter model, --state-dir), the written experiment run over
    TLS completes; one board prints its state lines, the --quiet one nothing."""
    mosquitto = find_binary()
    require_tool("mosquitto", mosquitto is not None, "not installed (apt-get install mosquitto)")
    port = free_port()
    url = f"mqtts://127.0.0.1:{port}"
    out = tmp_path / "lab"
    base = tmp_path / "base.toml"
    base.write_text(EXPERIMENT.format(shards=tmp_path / "shards"))
    assert main(["provision", str(_lab(tmp_path, adult=adult_file())), "--out", str(out), "--tls", "--broker", url,
                 "--experiment", str(base)]) == 0
    broker = subprocess.Popen([mosquitto, "-c", str(out / "broker" / "mosquitto.conf")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    boards: list[subprocess.Popen[str]] = []
    try:
        wait_for_broker(url, timeout_s=10)
        for host, quiet in (("pi-01", []), ("pi-02", ["--quiet"])):
            boards.append(subprocess.Popen(
                [sys.executable, "-m", "testbed", "node", "--config", str(out / "boards" / host / "node.toml"),
                 "--meter", "model", "--state-dir", str(tmp_path / "state" / host), *quiet],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        config = load_config(out / "coordinator" / "experiment.toml")
        result = {}
        coordinator = threading.Thread(target=lambda: result.update(
            r=run_experiment(config, out_dir=tmp_path / "run", quiet=True)))
        coordinator.start()
        coordinator.join(timeout=240)
        assert not coordinator.is_alive()
        outputs = [board.communicate(timeout=60) for board in boards]
    finally:
        for board in boards:
            board.kill()
            board.wait()
        broker.terminate()
        log = broker.communicate(timeout=10)[0]
    assert result["r"].summary["status"] == "completed", (outputs, log)
    assert [board.returncode for board in boards] == [0, 0], outputs
    events = list(read_ledger(result["r"].run_dir / "ledger.csv"))
    assert {(e.node, e.round) for e in events if e.kind == "compute"} == {(n, r) for n in range(2) for r in range(2)}
    assert "Config loaded from" in log and "New connection" in log and "Error" not in log, log  # as written
    said = [line.split(" ", 1)[1] for line in outputs[0][0].splitlines()]
    assert said[:3] == [f"node 0: connecting to {url}", said[1], "node 0: waiting for a run (run id lab1)"]
    assert said[1].startswith(f"node 0: connected to {url} in ")
    assert said[3].startswith("node 0: joined run lab1 (coordinator session ")
    assert said[4:] == ["node 0: round 1 done", "node 0: round 2 done",  # as the summary's 2 rounds
                        "node 0: run lab1 ended (the coordinator ended it); 2 round(s) answered"]
    assert outputs[1][0] == ""  # --quiet
