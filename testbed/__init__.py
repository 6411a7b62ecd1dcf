"""The testbed: differentially private federated learning on wireless IoT, hardware in the loop.

Kept light on purpose: a node on a small board imports only the modules it runs.
"""

__version__ = "0.1.0"
