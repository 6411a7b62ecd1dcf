"""The resource: a board's serial line, any pyserial URL (a device path, ``socket://`` for QEMU,
``rfc2217://`` for ser2net, ``loop://`` in tests), opened without resetting the board.

Example::

    >>> port = open_port("loop://")
    >>> port.write(b"x"); port.read(1)
    1
    b'x'
    >>> port.close()
"""

from __future__ import annotations

import serial

from testbed.errors import UserError


def open_port(url: str, baudrate: int = 115200, read_timeout_s: float = 0.02) -> serial.SerialBase:
    """The line at ``url``, open, its input buffer emptied.

    DTR and RTS are set inactive before the port opens, so pyserial never pulses them: a board whose
    reset circuit hangs on them (ESP32's auto-reset, which needs RTS without DTR) keeps running. A
    board with a capacitor from DTR to reset (classic Arduino) still resets at the kernel's open.

    Raises:
        UserError: the line cannot be opened (one line naming it and why).
    """
    try:
        port = serial.serial_for_url(url, do_not_open=True, baudrate=baudrate, timeout=read_timeout_s,
                                     write_timeout=5.0)
        port.dtr = False
        port.rts = False
        port.open()
        port.reset_input_buffer()
    except (serial.SerialException, ValueError, OSError) as exc:
        raise UserError(f"cannot open serial line {url}: {exc}") from None
    return port
