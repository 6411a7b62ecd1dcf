"""The kinds of ``[topology] kind``, one module each: a module that defines ``REGISTRATION`` (a
:class:`~testbed.topology.families.registry.Kind`) adds its kind; a project of one's own adds one
through the entry-point group ``testbed.topologies`` (docs/extending.md). The section's choices,
testbed.topology.Topology, the summaries and `testbed privacy dwfl --topology` read the registry.
"""
