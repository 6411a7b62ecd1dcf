"""How many threads numpy's OpenBLAS runs (testbed.util.threads): the `testbed` program loads it with
one, unless the environment says how many, and a run raises it where ``run.blas_threads`` asks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

threadpoolctl = pytest.importorskip("threadpoolctl")

#: numpy's BLAS threads once loaded, printed: in a fresh interpreter (OpenBLAS reads its variable once).
LOADED = ("import numpy, threadpoolctl; "
          "print([i['num_threads'] for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas'][0])")


def _threads(code: str, **env: str) -> int:
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env},
                          check=True)
    return int(proc.stdout.split()[-1])


def test_the_program_sets_one_thread_before_any_command_runs():
    code = ("import os, testbed.cli as cli; "
            "cli.main = lambda: print(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in __import__('sys').modules) or 0; "
            "cli.program()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"})
    assert proc.stdout.split() == ["1", "False"]  # set, and numpy not loaded yet: OpenBLAS will read it


def test_openblas_loads_with_one_thread_unless_the_environment_says():
    setup = "from testbed.util.threads import one_blas_thread_at_load; one_blas_thread_at_load(); "
    assert _threads(setup + LOADED) == 1
    assert _threads(setup + LOADED, OPENBLAS_NUM_THREADS="2") == 2  # the user's choice stands


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS runs at most a thread per core")
def test_a_run_raises_the_threads_it_asks_for():
    """run.blas_threads = 2 after a load with one: threadpoolctl starts the second thread."""
    code = ("from testbed.util.threads import one_blas_thread_at_load, limit_blas_threads; "
            "one_blas_thread_at_load(); " + LOADED.replace("; print", "; limit_blas_threads(2); print"))
    assert _threads(code) == 2
