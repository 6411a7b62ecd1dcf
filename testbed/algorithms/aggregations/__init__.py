"""The server's aggregation rules (``ALGORITHM.aggregation``), one module each: a module that
defines ``REGISTRATION`` (a :class:`~testbed.algorithms.aggregations.registry.Rule`, or a tuple of
them) adds its rules; a project of one's own adds one through the entry-point group
``testbed.aggregations`` (docs/extending.md). testbed.algorithms.aggregate applies them.
"""
