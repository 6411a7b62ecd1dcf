"""Pytest fixtures for MQTT tests: brokers on loopback (always stopped), run ids and clients (always
closed). Registered from tests/conftest.py with `pytest_plugins = ["conftest_mqtt"]`."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.mqtt import acl
from testbed.mqtt.broker import EmbeddedBroker, MosquittoBroker
from testbed.mqtt.client import MqttClient

MOSQUITTO_SKIP_REASON = "mosquitto binary not on PATH (apt-get install mosquitto)"


@pytest.fixture
def embedded_broker() -> Iterator[EmbeddedBroker]:
    """A running amqtt broker on 127.0.0.1 and a free port."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def mosquitto_broker() -> Iterator[MosquittoBroker]:
    """A running anonymous mosquitto on 127.0.0.1 and a free port (skips if mosquitto is absent)."""
    if shutil.which("mosquitto") is None:
        pytest.skip(MOSQUITTO_SKIP_REASON)
    broker = MosquittoBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(params=["amqtt", "mosquitto"])
def broker(request: pytest.FixtureRequest) -> EmbeddedBroker | MosquittoBroker:
    """Each test runs against both brokers; both have `.url`, `.start()` and `.stop()`."""
    return request.getfixturevalue("embedded_broker" if request.param == "amqtt" else "mosquitto_broker")


@pytest.fixture
def run_id() -> str:
    """A fresh run id, so retained messages of other tests never match."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def secured_mosquitto(tmp_path: Path, run_id: str) -> Iterator[tuple[MosquittoBroker, dict[str, str]]]:
    """Mosquitto with the run's ACL and per-user passwords for nodes "a", "b" and the coordinator.

    Yields (broker, {username: password}).
    """
    if shutil.which("mosquitto") is None:
        pytest.skip(MOSQUITTO_SKIP_REASON)
    acl_text, passwords = acl.generate_acl(run_id, ["a", "b"])
    broker = MosquittoBroker(acl_file=acl.write_acl_file(tmp_path / "acl", acl_text),
                             password_file=acl.write_password_file(tmp_path / "passwords", passwords))
    broker.start()
    try:
        yield broker, passwords
    finally:
        broker.stop()


@pytest.fixture
def connect() -> Iterator[Callable[..., MqttClient]]:
    """`connect(client, timeout_s=10)` connects `client` and closes it at teardown."""
    made: list[MqttClient] = []

    def _connect(client: MqttClient, timeout_s: float = 10.0) -> MqttClient:
        made.append(client)
        return client.connect(timeout_s)

    yield _connect
    for client in reversed(made):
        client.close(timeout_s=1.0)
