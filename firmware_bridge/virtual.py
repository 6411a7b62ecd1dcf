"""Boards without hardware: the firmware built for the host and run behind a pseudo-terminal, or
built for the Cortex-M3 of Arm's MPS2 AN385 and run under ``qemu-system-arm`` with its UART on a
TCP socket. Either gives a pyserial URL the bridge opens like a real board's. Which boards exist is
the virtual-board registry's (:mod:`testbed.devices.virtual_boards`: one folder each); this module
builds a board's firmware and runs it by its registration's ``runner`` (:data:`RUNNERS`).

Builds go to ``$TESTBED_FIRMWARE_BUILD`` or ``build/firmware`` of the source tree (git-ignored), by
the firmware's Makefile, one build at a time (a file lock: two bridges may start together).

Example::

    with start("host", "virtual-3", "rp2040") as board:   # builds once, then starts the process
        bridge_url = board.url                            # /dev/pts/N
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

from testbed.devices import virtual_boards
from testbed.devices.virtual_boards import VirtualBoard
from testbed.errors import UserError

FIRMWARE_DIR = Path(__file__).with_name("firmware")


def build_dir() -> Path:
    return Path(os.environ.get("TESTBED_FIRMWARE_BUILD", Path(__file__).resolve().parents[1] / "build" / "firmware"))


def build(target: str) -> Path:
    """The firmware image of virtual board ``target`` (a registry name), built if it is out of date.

    Raises:
        UserError: an unknown target, a missing compiler, or a failed build (its last lines).
    """
    board = virtual_boards.get(target)
    compiler = os.environ.get(board.compiler_env, board.compiler)
    if shutil.which(compiler) is None:
        raise UserError(f"building the {target} firmware needs {compiler} (Debian: apt-get install {board.install})")
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(["make", "-s", "-C", str(FIRMWARE_DIR), f"BUILD={out}", target],
                              capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UserError(f"building the {target} firmware failed: {' / '.join(tail)}")
    return out / target / board.artifact


class BoardProcess:
    """A board process: started on enter, killed on exit."""

    proc: subprocess.Popen
    url: str

    def __enter__(self) -> "BoardProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Unplug the board: end its process."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


class HostBoard(BoardProcess):
    """The virtual board: the firmware as a host process, its UART a pseudo-terminal.

    Args:
        board_id, profile: what its hello says.
        link: a path made a symlink to the pseudo-terminal (like /dev/serial/by-id/...): a board
            started again behind the same link is the same board plugged in again.
        reset_at_round, stall_at_round, damage_at_round: fault emulation, each once at that
            round's go: the board resets itself; blocks ``stall_s`` seconds (reads and writes
            nothing) before it runs the round; flips a bit of the first frame of its update (with
            ``damage_summary``: of its summary, the last).
    """

    def __init__(self, board_id: str = "host", profile: str = "rp2040", link: Path | None = None,
                 reset_at_round: int | None = None, stall_at_round: int | None = None, stall_s: float = 0.0,
                 damage_at_round: int | None = None, damage_summary: bool = False, *, board: str = "host"):
        env = {**os.environ, "TB_BOARD_ID": board_id, "TB_BOARD_PROFILE": profile}
        faults = {"TB_RESET_AT_ROUND": reset_at_round, "TB_STALL_AT_ROUND": stall_at_round,
                  "TB_DAMAGE_AT_ROUND": damage_at_round}
        env.update({name: str(r) for name, r in faults.items() if r is not None})
        if stall_at_round is not None:
            env["TB_STALL_S"] = repr(float(stall_s))
        if damage_summary:
            env["TB_DAMAGE_SUMMARY"] = "1"
        self.proc = subprocess.Popen([str(build(board))], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     env=env, text=True)
        assert self.proc.stdout is not None
        path = self.proc.stdout.readline().strip()
        if not path.startswith("/dev/"):
            self.stop()
            raise UserError(f"the virtual board did not start (it said {path!r})")
        self.pty = path
        if link is not None:
            tmp = link.with_name(link.name + ".new")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(path)
            tmp.replace(link)  # atomic: a bridge reopening the link never sees it missing
        self.url = str(link) if link is not None else path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QemuBoard(BoardProcess):
    """A Cortex-M firmware under ``qemu-system-arm -M <its machine>``, UART0 on a loopback TCP
    port the bridge opens as ``socket://127.0.0.1:PORT``. QEMU waits for that connection before
    the board runs, so nothing it says at boot is lost.

    Args:
        port: the loopback port (default: a free one).
        board: the virtual board (registry name) whose image runs: one of runner "qemu".
    """

    def __init__(self, port: int | None = None, *, board: str = "mps2-an385"):
        if shutil.which("qemu-system-arm") is None:
            raise UserError("the QEMU board needs qemu-system-arm (Debian: apt-get install qemu-system-arm)")
        machine = virtual_boards.get(board).qemu_machine
        if machine is None:
            raise UserError(f"the virtual board {board!r} names no qemu_machine in its board.toml")
        image = build(board)
        self.port = port or _free_port()
        self.proc = subprocess.Popen(
            ["qemu-system-arm", "-M", machine, "-kernel", str(image), "-nographic", "-monitor", "none",
             "-serial", f"tcp:127.0.0.1:{self.port},server=on,wait=on"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url = f"socket://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # listening once a probe connects... which QEMU would
            # take as the board's line: wait for the listening socket in /proc/net/tcp instead
            if self.proc.poll() is not None:
                raise UserError(f"qemu-system-arm exited: {(self.proc.stderr.read() or '').strip()[-200:]}")
            if _listening(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise UserError(f"qemu-system-arm did not listen on 127.0.0.1:{self.port}")


def _listening(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (Linux /proc/net/tcp, state 0A)."""
    want = f"0100007F:{port:04X}"
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return True  # cannot tell: let the connect try
    return any(f.split()[1] == want and f.split()[3] == "0A" for f in lines)


#: How a registration's ``runner`` starts its board: (registration, board id, profile) → the board
#: process (a context manager with ``url``). A board whose firmware runs another way adds a runner.
RUNNERS: dict[str, Callable[[VirtualBoard, str, str], BoardProcess]] = {
    "pty": lambda board, board_id, profile: HostBoard(board_id, profile, board=board.name),
    "qemu": lambda board, board_id, profile: QemuBoard(board=board.name),
}


def start(name: str, board_id: str, profile: str) -> BoardProcess:
    """Start the virtual board ``name`` (its hello says ``board_id`` and, where its firmware takes
    one at start, ``profile``); a context manager with the ``url`` the bridge opens.

    Raises:
        UserError: an unknown board or runner, or the board did not start (why).
    """
    board = virtual_boards.get(name)
    try:
        runner = RUNNERS[board.runner]
    except KeyError:
        raise UserError(f"the virtual board {name!r} names the runner {board.runner!r}; "
                        f"known: {', '.join(RUNNERS)}") from None
    return runner(board, board_id, profile)
