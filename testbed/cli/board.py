"""`testbed board build` and `testbed board run`: an emulated board of another architecture (a
Debian arm64 root file system run through qemu-user-static), the node agent installed in it as on
a Raspberry Pi, and commands run in it (testbed.orchestration.board_image)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from testbed.cli.examples import epilog
from testbed.errors import UserError

#: Each sub-command's examples (tests/test_cli.py parses them).
SUB_EXAMPLES = {
    "build": ("board build --arch arm64", "board build --arch arm64 --out build/pi",
              "board build --arch arm64 --wheel dist/dpfl_testbed-*.whl"),
    "run": ("board run build/pi -- testbed node --config node.toml --meter model",
            "board run build/pi --bind lab/boards/pi-01:/etc/testbed -- testbed node --config /etc/testbed/node.toml "
            "--meter model"),
}


def register(sub: argparse._SubParsersAction) -> None:
    board = sub.add_parser("board", help="build an emulated board of another architecture (Debian arm64 with "
                                         "dpfl-testbed[node]) and run commands in it")
    commands = board.add_subparsers(dest="board_command", required=True)
    build = commands.add_parser("build", help="build (or take from the cache) a Debian bookworm root file system "
                                              "with dpfl-testbed[node] installed by pip",
                                epilog=epilog(SUB_EXAMPLES["build"]))
    build.add_argument("--arch", required=True, choices=("arm64",), help="the board's Debian architecture")
    build.add_argument("--out", type=Path, help="a missing or empty folder to copy the board into (default: use "
                                                "the cache's tree, under $TESTBED_BOARD_CACHE or ~/.cache/testbed/boards)")
    build.add_argument("--wheel", type=Path, help="the wheel to install (python -m build's, in dist/; default: "
                                                  "build this checkout's)")
    build.set_defaults(handler=_build)
    run = commands.add_parser("run", help="run a command in a built board (a chroot in a mount namespace of its own; "
                                          "the current folder is bound in and is the working folder)",
                              epilog=epilog(SUB_EXAMPLES["run"]))
    run.add_argument("dir", type=Path, help="the board (testbed board build's folder)")
    _run_options(run)
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                     help="the command to run in the board (the board's options go before the --, before or "
                          "after DIR)")
    run.set_defaults(handler=_run)


def _run_options(parser: argparse.ArgumentParser) -> None:
    """`board run`'s options, wherever they are written: before DIR (argparse reads them) or between
    DIR and the -- (argparse's REMAINDER takes them with the command: :func:`_split_command`)."""
    parser.add_argument("--bind", action="append", default=[], metavar="SRC:DST",
                        help="bind the host folder or file SRC at DST in the board (repeatable)")


def _split_command(args: argparse.Namespace) -> list[str]:
    """The command to run, from ``args.argv`` (everything after DIR); the board options written
    between DIR and the ``--`` (``board run DIR --bind SRC:DST -- COMMAND``, as the docs write it)
    are added to ``args``."""
    from testbed.cli import Parser

    rest = list(args.argv)
    if rest and rest[0].startswith("-") and rest[0] != "--" and "--" in rest:
        cut = rest.index("--")
        options = Parser(prog="testbed board run", add_help=False)
        _run_options(options)
        more = options.parse_args(rest[:cut])
        args.bind = [*args.bind, *more.bind]
        rest = rest[cut:]
    return rest[1:] if rest[:1] == ["--"] else rest  # argparse keeps the "--" before a REMAINDER or not


def _build(args: argparse.Namespace) -> int:
    from testbed.orchestration.board_image import build

    image = build(args.arch, args.out, wheel=args.wheel)
    print(f"board {args.arch}: {image.root} ({'cached' if image.cached else 'built'} in {image.seconds:.1f} s); "
          f"run a command in it: testbed board run {image.root} -- testbed node --config node.toml")
    return 0


def _run(args: argparse.Namespace) -> int:
    from testbed.orchestration.board_image import board_arch, check_host, emulation_env, name_service, run_argv

    command = _split_command(args)
    if not command:
        raise UserError("board run: no command (testbed board run DIR -- COMMAND ...)")
    binds = []
    for bind in args.bind:
        src, sep, dst = bind.partition(":")
        if not sep or not src or not dst.startswith("/") or not Path(src).exists():
            raise UserError(f"board run: --bind {bind!r}: expected SRC:DST, SRC an existing host path, DST absolute")
        binds.append((Path(src), dst))
    arch = board_arch(args.dir)
    check_host(arch, needs_debootstrap=False)
    name_service(args.dir)  # a board built before it had them: localhost resolves in it
    # The board's model charges the host's CPU seconds, not the emulator's (nodes.meters.emulation).
    argv = run_argv(args.dir, command, cwd=Path.cwd(), binds=tuple(binds), env=emulation_env(arch))
    os.execvp(argv[0], argv)  # the command's own process: its signals and exit status
