"""Utilities with no testbed concept in them: frozen dataclass copies, memoisation, threads and a
worker pool, the memory available, an append-only log file, a run directory's lock, a forked child process, optional
extras. They import nothing of the testbed but testbed.errors."""
