"""`testbed board run` as docs/boards.md and its --help write it (issue 43, part 2): the board's
flags between DIR and the --, and a board where localhost resolves. The command itself is not run
(that needs root, qemu-user-static and a built board: tests/test_board_arm64.py); what it would
exec is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.cli.board import SUB_EXAMPLES
from testbed.orchestration import board_image


@pytest.fixture
def fake_board(tmp_path, monkeypatch):
    """A folder that passes for a built arm64 board, and the exec it would do, caught."""
    root = tmp_path / "pi"
    (root / board_image.DEFAULT_COMMAND.lstrip("/")).parent.mkdir(parents=True)
    (root / board_image.DEFAULT_COMMAND.lstrip("/")).touch()
    (root / board_image.ARCH_FILE.lstrip("/")).write_text("arm64\n")
    monkeypatch.setattr(board_image, "check_host", lambda arch, needs_debootstrap: None)
    execs = []

    def fake_exec(file, argv):
        execs.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execvp", fake_exec)
    return root, execs


@pytest.mark.parametrize("where", ["after DIR", "before DIR"])
def test_bind_is_taken_where_the_docs_write_it(fake_board, tmp_path, monkeypatch, where):
    root, execs = fake_board
    lab = tmp_path / "lab" / "pi-01"
    lab.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    bind = ["--bind", f"{lab}:/etc/testbed"]
    command = ["testbed", "node", "--config", "/etc/testbed/node.toml", "--meter", "model"]
    args = ["board", "run", str(root), *bind, "--", *command] if where == "after DIR" else \
        ["board", "run", *bind, str(root), "--", *command]
    with pytest.raises(SystemExit):
        main(args)
    script = execs[0][-1]
    assert f"mount --bind {lab} {root}/etc/testbed" in script
    assert script.rstrip().endswith("exec testbed node --config /etc/testbed/node.toml --meter model'")


def test_the_help_examples_parse_and_a_command_keeps_its_own_flags(fake_board, tmp_path, monkeypatch):
    root, execs = fake_board
    monkeypatch.chdir(tmp_path)
    assert any("--bind" in example for example in SUB_EXAMPLES["run"])
    with pytest.raises(SystemExit):
        main(["board", "run", str(root), "--", "testbed", "node", "--bind", "x"])  # the command's, not the board's
    assert execs[0][-1].count("mount --bind") == 1  # the working folder's alone: no --bind for the board
    assert execs[0][-1].rstrip().endswith("exec testbed node --bind x'")


def test_a_bad_bind_after_dir_is_one_line(fake_board, tmp_path, capsys):
    root, _ = fake_board
    assert main(["board", "run", str(root), "--bind", "nowhere", "--", "true"]) == 2
    assert "--bind 'nowhere': expected SRC:DST" in capsys.readouterr().err


def test_localhost_resolves_in_a_board(fake_board, tmp_path, monkeypatch):
    """A debootstrap root has no /etc/hosts: the board gets one (and nsswitch.conf) at its build and,
    for a board built before, at `board run`; one it has is left as it is."""
    root, _ = fake_board
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["board", "run", str(root), "--", "getent", "hosts", "localhost"])
    hosts = (root / "etc/hosts").read_text().split()
    assert hosts[:2] == ["127.0.0.1", "localhost"]
    assert "hosts: files dns" in (root / "etc/nsswitch.conf").read_text()
    (root / "etc/hosts").write_text("10.0.0.1 broker.lan\n")
    assert board_image.name_service(root) == [] and (root / "etc/hosts").read_text() == "10.0.0.1 broker.lan\n"
