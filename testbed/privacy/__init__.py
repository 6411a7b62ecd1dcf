"""Privacy: the papers' calculators (zCDP for DP-PASGD, the ACFL, DWFL and PADPFL bounds), the
statements of what each algorithm protects, canaries and the empirical audit, and the secrecy of a
node's draws. The accountants that read a ledger's tallies (testbed.privacy.accountants) are a layer
below: the calculators use them, never the other way round."""
