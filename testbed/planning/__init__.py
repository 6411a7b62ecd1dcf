"""Planning: choosing an algorithm's configuration (τ, K, σ) from budgets before a run, from the papers' bounds."""
