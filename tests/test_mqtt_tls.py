"""TLS faults are one line, said at once: certificates made on the fly with openssl (a CA, a server
certificate it signed, an expired one, one for another host, a second CA) against Mosquitto on
loopback; mqtt:// to a TLS port and mqtts:// to a plain one; tls_ca with a plain URL, missing or
not PEM. Network: 127.0.0.1 only."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.errors import ConfigError, UserError
from testbed.mqtt.broker import free_port
from testbed.mqtt.brokers.mosquitto import TlsFiles
from testbed.mqtt.client import MqttClient
from testbed.mqtt.probe import check_tls_ca_use

from conftest import require_command
from test_faults_cli import _fails

FAST_S = 3.0  # "at once": far below the connect timeout the tests give (30 s)


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server certificates below
    other_ca: Path  # a CA that signed nothing here
    good: TlsFiles  # for 127.0.0.1
    expired: TlsFiles  # for 127.0.0.1, valid in 2020 only
    other_host: TlsFiles  # for 127.0.0.2 and broker.invalid, not 127.0.0.1


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)
    return d / f"{name}.pem", d / f"{name}.key"


def _server(d: Path, name: str, san: str, ca: tuple[Path, Path], dates: tuple[str, str] | None = None) -> TlsFiles:
    """A server certificate for `san` signed by `ca` (openssl ca: the only way to set past dates)."""
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)
    validity = ["-startdate", dates[0], "-enddate", dates[1]] if dates else ["-days", "2"]
    _openssl("ca", "-batch", "-config", "ca.cnf", "-cert", str(ca[0]), "-keyfile", str(ca[1]), "-in", f"{name}.csr",
             "-out", f"{name}.pem", "-notext", *validity, cwd=d)
    return TlsFiles(cafile=ca[0], certfile=d / f"{name}.pem", keyfile=d / f"{name}.key")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    require_command("openssl", "apt-get install openssl")
    d = tmp_path_factory.mktemp("pki")
    (d / "ca.cnf").write_text("[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n"
                              "policy = p\ndefault_md = sha256\ncopy_extensions = copy\nunique_subject = no\n"
                              "[p]\ncommonName = supplied\n")
    (d / "index.txt").write_text("")
    (d / "serial").write_text("01\n")
    ca = _ca(d, "ca")
    other = _ca(d, "other-ca")
    return Pki(ca=ca[0], other_ca=other[0],
               good=_server(d, "good", "IP:127.0.0.1", ca),
               expired=_server(d, "expired", "IP:127.0.0.1", ca, ("20200101000000Z", "20200102000000Z")),
               other_host=_server(d, "other-host", "IP:127.0.0.2,DNS:broker.invalid", ca))


def _connect_error(url: str, run_id: str, **kwargs) -> tuple[str, float]:
    """The one-line error of connecting a node client to `url`, and how long it took."""
    start = time.monotonic()
    with pytest.raises(UserError) as info:
        MqttClient.for_node(url, run_id, "n1", **kwargs).connect(timeout_s=30)
    message = str(info.value)
    assert "\n" not in message
    return message, time.monotonic() - start


# ---- certificates -----------------------------------------------------------------------------


def test_certificate_signed_by_the_given_ca_connects(start_mosquitto, pki, run_id, connect):
    broker = start_mosquitto(tls=pki.good)
    client = connect(MqttClient.for_node(broker.url, run_id, "n1", tls_ca=pki.ca), timeout_s=10)
    assert client.connected and client.protocol == "5"


def test_unknown_ca_gets_the_ca_hint(start_mosquitto, pki, run_id):
    broker = start_mosquitto(tls=pki.good)
    message, took = _connect_error(broker.url, run_id, tls_ca=pki.other_ca)
    assert "TLS certificate not trusted" in message and "give the CA that signed it" in message
    assert took < FAST_S


def test_expired_certificate_says_expired_without_the_ca_hint(start_mosquitto, pki, run_id):
    broker = start_mosquitto(tls=pki.expired)
    message, took = _connect_error(broker.url, run_id, tls_ca=pki.ca)
    assert "TLS certificate has expired" in message
    assert "give the CA" not in message
    assert took < FAST_S


def test_wrong_host_certificate_names_the_host_without_the_ca_hint(start_mosquitto, pki, run_id):
    broker = start_mosquitto(tls=pki.other_host)
    message, took = _connect_error(broker.url, run_id, tls_ca=pki.ca)
    assert "TLS certificate is not issued for 127.0.0.1" in message
    assert "give the CA" not in message
    assert took < FAST_S


# ---- TLS and plain ports mixed up ------------------------------------------------------------


def test_mqtt_url_to_a_tls_port_is_said_at_once(start_mosquitto, pki, run_id):
    broker = start_mosquitto(tls=pki.good)
    plain_url = broker.url.replace("mqtts://", "mqtt://")
    message, took = _connect_error(plain_url, run_id)
    assert "it is a TLS port; use mqtts://" in message
    assert took < FAST_S


def test_mqtts_url_to_a_plain_port_is_said_at_once(mosquitto_broker, pki, run_id):
    tls_url = mosquitto_broker.url.replace("mqtt://", "mqtts://")
    message, took = _connect_error(tls_url, run_id, tls_ca=pki.ca)
    assert "not a TLS port; use mqtt://" in message
    assert took < FAST_S


def test_mqtts_url_to_a_plain_port_on_the_embedded_broker(embedded_broker, pki, run_id):
    tls_url = embedded_broker.url.replace("mqtt://", "mqtts://")
    message, took = _connect_error(tls_url, run_id, tls_ca=pki.ca)
    assert "not a TLS port; use mqtt://" in message
    assert took < FAST_S


def test_a_server_answering_the_client_hello_in_cleartext(pki, run_id):
    """A server that answers a ClientHello with bytes that are not TLS (here a web server's)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    message, took = _connect_error(f"mqtts://127.0.0.1:{port}", run_id, tls_ca=pki.ca)
    assert "answered a TLS ClientHello with non-TLS bytes" in message and "use mqtt://" in message
    assert took < FAST_S
    thread.join(5)


def test_nothing_listening_waits_out_a_shorter_timeout_and_says_what_it_saw(run_id):
    """A timeout below the grace for a refused connection (tests/test_faults_connect.py) bounds it."""
    start = time.monotonic()
    with pytest.raises(UserError, match=r"not reachable: connection refused for 1 s \(nothing listens on port"):
        MqttClient.for_node(f"mqtt://127.0.0.1:{free_port()}", run_id, "n1").connect(timeout_s=1)
    assert 0.8 < time.monotonic() - start < FAST_S


# ---- tls_ca itself ----------------------------------------------------------------------------


def test_tls_ca_with_a_plain_url_is_refused(pki, run_id):
    with pytest.raises(ConfigError, match=r"mqtt\.tls_ca: is set but broker mqtt://127.0.0.1:1883 is plain"):
        MqttClient.for_node("mqtt://127.0.0.1:1883", run_id, "n1", tls_ca=pki.ca)
    with pytest.raises(ConfigError, match="embedded broker"):
        check_tls_ca_use(None, str(pki.ca))
    check_tls_ca_use("mqtts://127.0.0.1:8883", str(pki.ca))
    check_tls_ca_use("mqtt://127.0.0.1:1883", None)


def test_missing_tls_ca_file_is_one_line(start_mosquitto, pki, run_id, tmp_path):
    broker = start_mosquitto(tls=pki.good)
    missing = tmp_path / "nope.pem"
    message, took = _connect_error(broker.url, run_id, tls_ca=missing)
    assert message == f"tls_ca {missing}: cannot read the CA file (No such file or directory)"


def test_non_pem_tls_ca_file_is_one_line(start_mosquitto, pki, run_id, tmp_path):
    broker = start_mosquitto(tls=pki.good)
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"\x00\x01 not a certificate")
    message, _ = _connect_error(broker.url, run_id, tls_ca=junk)
    assert message.startswith(f"tls_ca {junk}: holds no PEM certificate")


def test_cli_tls_ca_with_plain_url(capsys, small_config_file, pki, tmp_path):
    err = _fails(capsys, ["run", str(small_config_file), "--mode", "mqtt", "--quiet", "--out", str(tmp_path / "r"),
                          "--set", f"mqtt.broker_url='mqtt://127.0.0.1:{free_port()}'",
                          "--set", f"mqtt.tls_ca='{pki.ca}'"])
    assert "mqtt.tls_ca" in err and "cleartext" in err


def test_cli_missing_tls_ca(capsys, small_config_file, start_mosquitto, pki, tmp_path):
    broker = start_mosquitto(tls=pki.good)
    err = _fails(capsys, ["run", str(small_config_file), "--mode", "mqtt", "--quiet", "--out", str(tmp_path / "r"),
                          "--set", f"mqtt.broker_url='{broker.url}'", "--set", f"mqtt.tls_ca='{tmp_path / 'nope.pem'}'"])
    assert "nope.pem: cannot read the CA file" in err


def test_mismatch_diagnosis_sends_no_password_in_cleartext(secured_mosquitto, pki, run_id):
    """mqtts:// to a plain port: the plain CONNECT that recognises the broker is anonymous (its
    refusal is answer enough), so the password meant for TLS never crosses in cleartext."""
    broker, pw = secured_mosquitto
    tls_url = broker.url.replace("mqtt://", "mqtts://")
    message, took = _connect_error(tls_url, run_id, tls_ca=pki.ca, username="a", password=pw["a"])
    assert "not a TLS port; use mqtt://" in message and took < FAST_S
    assert "u'a'" not in broker.log_text()
