"""From an experiment file to a run's parts: the validated config, assembled from every registry's
sections (config); an experiment from a path, a dict or overrides (experiment); the data, the
model and the algorithm it names (assemble); which nodes are evaluated (evaluation); and whether
the run fits this machine (resources). Above every registry it reads, below what runs it."""
