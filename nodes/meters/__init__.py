"""Meters: the seconds and joules of an interval, measured on a real board or modelled.

Every meter reports a :class:`~nodes.meters.base.Measurement` whose ``seconds`` are the process's
CPU time over the interval (``time.process_time``: all threads of this process, so an MQTT client's
network thread counts) and whose ``energy_j`` comes from one meter of this package, each a module
with a ``REGISTRATION`` found by :mod:`nodes.meters.registry` (adding a meter is adding a module):

- ``rapl``: Linux powercap RAPL package counters (x86), measured. Package energy covers the
  whole CPU package, so other processes' work counts too;
- ``ina219`` / ``ina260``: a TI current/power monitor on I²C at the board's supply (needs the
  optional ``smbus2`` package), measured: bus voltage × current sampled by a background thread and
  integrated (trapezoid rule) over the interval's wall time;
- ``model``: the device profile's cost model (nodes/meters/clock.py), modelled. For an emulated board
  its ``seconds`` are board seconds (CPU seconds × compute_time_factor).

Use: ``with meter.measure() as span: <the step>`` then ``span.result``.
``nodes.meters.registry.make_meter`` picks a meter. Kept light (no imports here), as ``nodes`` is.
"""
