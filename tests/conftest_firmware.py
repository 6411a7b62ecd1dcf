"""Fixtures of the firmware bridge tests: a virtual board (the host build behind a pseudo-terminal)."""

import shutil

import pytest

from firmware_bridge.board import Board
from firmware_bridge.link import Link
from firmware_bridge.port import open_port
from firmware_bridge.virtual import HostBoard


@pytest.fixture
def virtual_board():
    """A Board talking to a fresh virtual board, hello done."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler (cc)")
    with HostBoard() as process:
        board = Board(Link(open_port(process.url)))
        board.hello()
        yield board
        board.link.close()
