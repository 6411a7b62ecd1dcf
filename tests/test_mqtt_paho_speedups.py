"""paho's v5 packet decoding with shared property tables (testbed.mqtt.paho_speedups) gives what
paho's own gives: packets with and without properties, and instances that already hold some."""

from __future__ import annotations

import struct

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from testbed.mqtt import paho_speedups

_packet = pytest.importorskip("paho.mqtt._packet")


def _publish(properties: bytes) -> bytes:
    """A v5 PUBLISH's variable header and payload (after the fixed header), QoS 1, message id 7."""
    topic = b"tb/v1/run/up/3"
    return struct.pack("!H", len(topic)) + topic + struct.pack("!H", 7) + properties + b"payload bytes"


def _with_properties() -> bytes:
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 30
    props.UserProperty = [("node", "3"), ("round", "12")]
    props.ContentType = "application/x-tbwm"
    return props.pack()


@pytest.mark.parametrize("properties", [b"\x00", _with_properties()], ids=["none", "some"])
def test_decoded_publish_equals_pahos_own(monkeypatch, properties):
    monkeypatch.setattr(_packet, "Properties", Properties)
    theirs = _packet.decode_publish(0x32, _publish(properties), 5)
    assert paho_speedups.install()
    ours = _packet.decode_publish(0x32, _publish(properties), 5)
    assert type(ours.properties) is paho_speedups.SharedTableProperties
    assert ours.properties.json() == theirs.properties.json()
    assert (ours.topic, ours.mid, ours.qos, ours.payload) == (theirs.topic, theirs.mid, theirs.qos, theirs.payload)
    assert ours.payload == b"payload bytes"


def test_tables_are_shared_and_instances_stay_apart():
    a, b = paho_speedups.SharedTableProperties(PacketTypes.PUBLISH), paho_speedups.SharedTableProperties(
        PacketTypes.CONNACK)
    assert a.names is b.names and a.properties is b.properties
    assert (a.packetType, b.packetType) == (PacketTypes.PUBLISH, PacketTypes.CONNACK)
    b.SessionExpiryInterval = 60  # paho's own checks still apply: a CONNACK property
    assert not hasattr(a, "SessionExpiryInterval")
    with pytest.raises(Exception, match="does not apply"):
        a.SessionExpiryInterval = 60


def test_an_instance_holding_properties_is_cleared_by_pahos_unpack():
    props = paho_speedups.SharedTableProperties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 30
    props.unpack(b"\x00")
    assert props.json() == {}


def test_install_leaves_an_unknown_decoder_alone(monkeypatch):
    class Other:
        pass

    monkeypatch.setattr(_packet, "Properties", Other)
    assert not paho_speedups.install()
    assert _packet.Properties is Other
