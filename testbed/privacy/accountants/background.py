"""A tight accountant's ε, computed in a child process while a run goes.

``python -m testbed.privacy.accountants.background NAME`` is that child: it imports what the
accountant NAME needs at once (its registration's ``preload``), then answers each JSON request line
on stdin with a line of the list of ε on stdout, until stdin closes.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any, Mapping

from testbed.privacy.accountants import epsilon, epsilon_cache
from testbed.privacy.accountants.registry import get, tight_names


class BackgroundEpsilons:
    """ε of several tallies by a tight accountant, computed in a child process.

    dp-accounting (with scipy.stats) takes about half a second to import and a sampled-without-
    replacement bound a fifth of a second to compute. A run starts this job with its first round,
    so the child imports on the other core while the rounds run, and :meth:`guess` hands it the
    tallies the run will end with if every round goes as planned: their ε is ready when the run
    ends, and only the tallies that came out otherwise (a budget stop, stragglers) are computed then.

    What the ε cache holds (testbed.privacy.accountants.epsilon_cache) is taken from it and what the
    child computes is written to it. With ``settings`` (the experiment's config as a dict, whose
    epsilon_cache.hint_key names what its last run planned), a job whose experiment planned
    tallies that are all cached starts no child until a tally is not.

    Example::

        >>> job = BackgroundEpsilons("rdp", delta=1e-5)
        >>> tally = Counter({(1.0, 0.0625, "replace_one", "none", 1.0): 10})
        >>> job.guess([tally])
        >>> round(job.result([tally])[0], 4) > 0
        True
    """

    def __init__(self, kind: str, delta: float, settings: Mapping[str, Any] | None = None):
        if not get(kind).tight:
            raise ValueError(f"background accounting is for a tight accountant ({', '.join(tight_names())}), "
                             f"not {kind!r}")
        self.kind, self.delta = kind, delta
        self._cached = epsilon_cache.cacheable(kind)
        self._hint = epsilon_cache.hint_key(kind, delta, settings) if self._cached and settings is not None else None
        self._known: dict[tuple, float] = {}  # tally key → ε taken from the cache
        self._proc = None
        self._asked: list[list[tuple]] = []  # the unique tallies of each request sent, in order
        self._planned = epsilon_cache.planned(self._hint) if self._hint is not None else None
        if self._planned is None or len(epsilon_cache.known(self._planned)) < len(self._planned):
            self._start()

    def _start(self) -> None:
        from testbed.util.forked import helper_process

        # A fork of this process where it can: it has numpy and the accountants' modules already.
        self._proc = helper_process(__name__, [self.kind], name="testbed epsilon")

    def guess(self, tallies: list[Counter]) -> None:
        """Start computing the ε of ``tallies`` (the final ones, as planned) without waiting."""
        keys = {_key(t) for t in tallies}
        if self._hint is not None:
            entries = [self._entry(k) for k in keys]
            if None not in entries and sorted(entries) != self._planned:  # written when it changed
                epsilon_cache.plan(self._hint, entries)
        self._ask(keys)

    def result(self, tallies: list[Counter]) -> list[float]:
        """ε of each of ``tallies``, in order: guessed ones from the guess, the rest computed now."""
        import json

        keys = [_key(t) for t in tallies]
        self._ask(set(keys) - {k for asked in self._asked for k in asked})
        found = dict(self._known)
        if self._proc is not None:
            self._proc.stdin.close()
            out, err = self._proc.stdout.read(), self._proc.stderr.read()
            if self._proc.wait() != 0:
                raise RuntimeError(f"the accountant process failed: {err.strip()[-500:]}")
            for asked, line in zip(self._asked, out.splitlines()):
                computed = dict(zip(asked, json.loads(line)))
                found.update(computed)
                if self._cached:
                    for key, eps in computed.items():
                        epsilon_cache.put(self._entry(key), eps)
        return [found[k] for k in keys]

    @property
    def requests(self) -> int:
        """Requests sent to the child so far: a guess that held needs no second."""
        return len(self._asked)

    def _entry(self, key: tuple) -> str | None:
        return epsilon_cache.entry_key(self.kind, self.delta, key)

    def _ask(self, keys: set[tuple]) -> None:
        """Have the child compute the ε of ``keys`` not known already (the cache's taken first)."""
        import json

        keys -= set(self._known)
        if self._cached and keys:
            entries = {key: self._entry(key) for key in keys}
            cached = epsilon_cache.known(entries.values())
            self._known.update({key: cached[entry] for key, entry in entries.items() if entry in cached})
            keys -= set(self._known)
        if not keys:
            return
        if self._proc is None:
            self._start()
        unique = sorted(keys)
        request = {"kind": self.kind, "delta": self.delta, "tallies": [[[list(sig), n] for sig, n in t] for t in unique]}
        self._proc.stdin.write(json.dumps(request).encode() + b"\n")  # json-ok: a pipe to our own child
        self._proc.stdin.flush()
        self._asked.append(unique)

    def close(self) -> None:
        """Stop the child if no result was asked for (a failed run)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def _key(tally: Mapping[tuple, int]) -> tuple:
    return tuple(sorted(tally.items()))


def _serve_requests(kind: str) -> None:
    """Import what the accountant ``kind`` needs at once, then answer each JSON request line on
    stdin with a line of the list of ε on stdout, until stdin closes."""
    import json

    preload = get(kind).preload
    if preload is not None:
        preload()  # the slow imports, done before the first request arrives
    for line in sys.stdin:
        request = json.loads(line)
        tallies = [Counter({tuple(sig): n for sig, n in items}) for items in request["tallies"]]
        # json-ok: a pipe to the parent (json.loads reads Infinity back): a release without noise has ε = ∞
        print(json.dumps([epsilon(request["kind"], t, request["delta"]) for t in tallies]), flush=True)


def serve(argv: list[str]) -> int:
    """The helper process (forked, or ``python -m`` this module ``NAME``): accountant NAME's
    requests served in the background (testbed.util.forked.BACKGROUND_NICENESS: the planned
    tallies' ε is computed while the rounds run, in the gaps the run's processes leave)."""
    from testbed.util.forked import BACKGROUND_NICENESS, at_niceness

    at_niceness(BACKGROUND_NICENESS)
    _serve_requests(argv[0])
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = serve(sys.argv[1:])
    # Everything is written: leave without the interpreter's teardown of the libraries (a tenth of a
    # second that the run would wait for).
    sys.stderr.flush()
    os._exit(code)
