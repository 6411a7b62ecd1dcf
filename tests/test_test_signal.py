"""The suite's own signal (tests/conftest.py): a missing tool is a skip here and a failure under
CI=true, with the same one-line reason; wait_until returns what it waited for, or fails naming it."""

from __future__ import annotations

import threading
import time

import pytest

import conftest
from conftest import require_command, require_module, require_tool, wait_until


@pytest.mark.parametrize("in_ci, outcome", [(False, pytest.skip.Exception), (True, pytest.fail.Exception)])
def test_a_missing_tool_skips_here_and_fails_in_ci(monkeypatch, in_ci, outcome):
    monkeypatch.setattr(conftest, "IN_CI", in_ci)
    with pytest.raises(outcome, match=r"^no-such-tool-x: not on PATH \(apt-get install x\)") as info:
        require_command("no-such-tool-x", "apt-get install x")
    assert "\n" not in str(info.value)
    with pytest.raises(outcome, match=r"^no_such_module_y: cannot be imported .*pip install -e '\.\[extra\]'"):
        require_module("no_such_module_y", "extra")
    with pytest.raises(outcome, match="^rabbitmq-server: did not start"):
        require_tool("rabbitmq-server", False, "did not start")


@pytest.mark.parametrize("in_ci", [False, True])
def test_a_present_tool_goes_on(monkeypatch, in_ci):
    monkeypatch.setattr(conftest, "IN_CI", in_ci)
    assert require_command("sh", "apt-get install dash").endswith("/sh")
    assert require_module("json", "core").dumps([1]) == "[1]"
    require_tool("anything", True, "never said")


def test_wait_until_returns_the_event_when_it_happens():
    got: list[int] = []
    timer = threading.Timer(0.05, got.append, (7,))
    timer.start()
    assert wait_until(lambda: got[:], 30, "the timer") == [7]
    timer.join()


def test_wait_until_fails_naming_what_never_happened():
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"^timed out after 0\.1 s waiting for the impossible$"):
        wait_until(lambda: False, 0.1, "the impossible")
    assert time.monotonic() - started >= 0.1
