"""Accounting: every node's ledger of a run as columns, its ε through the accountants (book), and
the budgets a node may not exceed, read off its ledger before it acts (budgets)."""
