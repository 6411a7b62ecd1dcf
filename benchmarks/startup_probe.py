"""The child benchmarks/startup.py times: `testbed ARGS...` as the command line runs it, with the
moment round 1 begins written down.

``python benchmarks/startup_probe.py ARGS...`` runs ``python -m testbed ARGS...`` in this process.
Before, it wraps :meth:`testbed.reports.startup.Startup.done` (the end of a run's set-up: the
rounds' clock starts there) so that the wall-clock time (``time.time()``, the parent's clock) of
its call is written to the file named by ``STARTUP_MARK``. With ``STARTUP_STAGES`` set, the
run's stages (the parser, the config, each stage of testbed.orchestration.runner, the waits of
its finish, the interpreter's exit) are written as ``[name, time]`` pairs, JSON, to that file
instead, with the heavy libraries the process imported.

What the probe adds to the child: importing testbed.reports.startup a little earlier than the run
would (a few ms); with ``STARTUP_STAGES``, also testbed.orchestration.runner and what it imports.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time

#: Libraries whose import a start-up pays seconds for, reported by --stages.
HEAVY = ("torch", "sionna", "drjit", "mitsuba", "scipy", "matplotlib", "dp_accounting", "pydantic", "paho", "amqtt")


def _wrap(owner, name: str, label: str, marks: list) -> None:
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        marks.append([f"{label} begins", time.time()])
        try:
            return inner(*args, **kwargs)
        finally:
            marks.append([f"{label} ends", time.time()])

    setattr(owner, name, timed)


def _stages(marks: list) -> None:
    """Wrap the run's stages (imports what they live in: the run imports it all anyway)."""
    import testbed.cli as cli
    from testbed.assembly import assemble, experiment
    from testbed.orchestration import runner
    from testbed.privacy.accountants.background import BackgroundEpsilons
    from testbed.reports.plots import BackgroundFigures

    marks.append(["probe's imports done", time.time()])
    _wrap(cli, "build_parser", "the command line's parser", marks)
    _wrap(experiment, "experiment_config", "reading the experiment file", marks)
    for name in ("load", "plan", "open_run", "build_nodes", "run_rounds", "finish"):
        _wrap(runner, name, f"runner.{name}", marks)
    _wrap(assemble, "build_algorithm", "assemble.build_algorithm", marks)
    _wrap(BackgroundEpsilons, "result", "waiting for the tight accountant", marks)
    _wrap(BackgroundFigures, "wait", "waiting for the figures", marks)

    def written() -> None:
        marks.append(["exit", time.time()])
        with open(os.environ["STARTUP_MARK"], "w") as f:
            json.dump({"marks": marks, "heavy": [m for m in HEAVY if m in sys.modules]}, f, allow_nan=False)

    atexit.register(written)


def main() -> None:
    marks = [["interpreter up", time.time()]]
    sys.path.pop(0)  # this script's folder: benchmarks/*.py must not shadow a module the run imports
    from testbed.reports import startup

    done = startup.Startup.done

    def round_1(self) -> float:
        now = time.time()
        if os.environ.get("STARTUP_STAGES"):
            marks.append(["round 1 begins", now])
        else:
            with open(os.environ["STARTUP_MARK"], "w") as f:
                f.write(repr(now))
        return done(self)

    startup.Startup.done = round_1
    if os.environ.get("STARTUP_STAGES"):
        _stages(marks)
    sys.argv = ["testbed", *sys.argv[1:]]
    runpy.run_module("testbed", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
