"""A cost paho-mqtt 2.2 pays on every MQTT v5 packet it decodes that MQTT does not ask for, removed.

paho's ``Properties.__init__`` rebuilds two constant tables (27 property names; 27 ids with their
types, found by 27 list searches) for every packet, and ``Properties.unpack`` deletes 27 absent
attributes and copies the rest of the packet before it reads an empty property list: 12 µs of
the 14 µs paho takes to decode a v5 PUBLISH (2 µs in 3.1.1), measured on this project's 2-core
machine. A coordinator decodes one PUBLISH per node and round, an emulated host one PUBACK per
reply.

:func:`install` makes the ``Properties`` that paho's packet decoder (``paho.mqtt._packet``)
builds a subclass that shares the tables of one instance paho built itself and reads an empty
property list of a fresh instance in one step; any other property list is paho's own code. Where
paho's internals differ from this (another version without that module), it changes nothing:
slower, never different. ``tests/test_mqtt_paho_speedups.py`` checks decoded packets against paho's.
"""

from __future__ import annotations

from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

#: The attributes of a Properties paho built (its constant tables and its packet type), shared.
_TABLES: dict[str, Any] = dict(vars(Properties(PacketTypes.PUBLISH)))


class SharedTableProperties(Properties):
    """paho's ``Properties``, with its constant tables shared by every instance."""

    def __init__(self, packetType: int):  # noqa: N803  paho's name
        vars(self).update(_TABLES)
        object.__setattr__(self, "packetType", packetType)  # what paho's own __setattr__ does for it

    def unpack(self, buffer: bytes | bytearray) -> tuple[Properties, int]:
        # A property length of 0 (one byte) on an instance holding no property yet: nothing to
        # clear, nothing to read.
        if buffer[:1] == b"\x00" and len(vars(self)) == len(_TABLES):
            return self, 1
        return super().unpack(buffer)


def install() -> bool:
    """Make paho's packet decoder build :class:`SharedTableProperties`; True if it now does."""
    try:
        from paho.mqtt import _packet
    except ImportError:  # paho before 2.2 decodes elsewhere: leave it be
        return False
    if getattr(_packet, "Properties", None) not in (Properties, SharedTableProperties):
        return False
    _packet.Properties = SharedTableProperties  # type: ignore[attr-defined]
    return True
