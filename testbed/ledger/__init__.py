"""The ledger: what each node spent (compute, communication, privacy), one module per job.

- :mod:`~testbed.ledger.events`: the events, small immutable records, and batches of them (a
  round's releases of M nodes as columns);
- :mod:`~testbed.ledger.fields`: events to and from plain dicts (the wire, ledger.csv rows), every
  field checked against its rule;
- :mod:`~testbed.ledger.node`: one node's ledger (running totals, privacy tallies, rounds logged);
- :mod:`~testbed.ledger.files`: ``ledger.csv``, written append-only and read back.

A run's book of every node's ledger, which asks the accountants for ε, is a layer above them
(testbed.accounting.book). Events are kept apart from what reads them (accountants, budgets, reports), the way dp-accounting
keeps its ``DpEvent``s apart from its accountants. A node appends the events of a step only after
:meth:`Budgets.would_exceed <testbed.accounting.budgets.Budgets.would_exceed>` said they fit.
"""
