"""Fixtures of the firmware bridge tests: a virtual board (the host build behind a pseudo-terminal)."""

import pytest

from firmware_bridge.board import Board
from firmware_bridge.link import Link
from firmware_bridge.port import open_port
from firmware_bridge.virtual import HostBoard

from conftest import needs_command, require_command

CC_INSTALL = "apt-get install gcc libc6-dev"  # the host build of the firmware (a virtual board)
needs_cc = needs_command("cc", CC_INSTALL)


def require_qemu_board() -> None:
    """The QEMU board (mps2-an385): the firmware's cross build and the machine that runs it."""
    __tracebackhide__ = True
    require_command("arm-none-eabi-gcc", "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi")
    require_command("qemu-system-arm", "apt-get install qemu-system-arm")


needs_qemu_board = pytest.mark.requires.with_args(require_qemu_board)  # with_args: a lone callable is not decorated


@pytest.fixture
def virtual_board():
    """A Board talking to a fresh virtual board, hello done (needs cc: see require_command)."""
    require_command("cc", CC_INSTALL)
    with HostBoard() as process:
        board = Board(Link(open_port(process.url)))
        board.hello()
        yield board
        board.link.close()
