"""Privacy accountants: the papers' own (zCDP for DP-PASGD) and tight ones through dp-accounting."""
