"""Models as pure functions of a flat parameter vector with a leading node axis: the numpy ones and
their registry of kinds (models), and the PyTorch networks behind the same interface (torch_models)."""
