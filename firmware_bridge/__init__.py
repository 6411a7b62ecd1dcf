"""Microcontroller boards as nodes of a run: a serial protocol, a host bridge and portable firmware.

Layered like labgrid: a *resource* (:mod:`firmware_bridge.port`, the serial line: any pyserial URL,
opened without resetting the board), a *driver* (:mod:`firmware_bridge.framing` and
:mod:`firmware_bridge.link`: COBS frames with a CRC, credit-based flow control, retries), and the
*protocol* the board offers (:mod:`firmware_bridge.board`: hello, provisioning, a round's node
step; :mod:`firmware_bridge.agent`: that board as an MQTT node). :mod:`firmware_bridge.virtual`
starts boards without hardware (the firmware as a host process behind a pseudo-terminal, or the
Cortex-M3 build under QEMU). docs/serial-protocol.md specifies the wire format and the firmware.
"""
