"""Examples at the end of each command's ``--help``: one or two real invocations per command
(tests/test_cli.py parses every one). The algorithms' own sub-commands (`testbed privacy NAME`,
`testbed plan NAME`) show their registration's examples (testbed.algorithms.registry.Command), and
their parent command the first of each.

Example::

    >>> print(epilog(["report runs/mine"]))
    examples:
      testbed report runs/mine
"""

from __future__ import annotations

from typing import Iterable

#: Command → invocations (what follows ``testbed``), in the order shown.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "run": ("run experiments/quickstart.toml --mode sim",
            "run experiments/quickstart.toml --set budget.epsilon=2 --set stragglers.model=bernoulli "
            "--set stragglers.p=0.2 --seed 3 --out runs/mine",
            "run --resume runs/mine"),
    "watch": ("watch runs/mine", "watch runs/mine --host 0.0.0.0 --port 8766"),
    "report": ("report runs/mine", "report runs/mine --html", "report runs/mine --json"),
    "runs": ("runs", "runs runs/s1 --json"),
    "audit": ("audit experiments/quickstart.toml",
              "audit experiments/dp_pasgd/learns.toml --canaries 4000 --confidence 0.99 --out runs/audit"),
    "node": ("node --config /etc/testbed/node.toml",
             "node --broker mqtt://192.168.1.10:1883 --run lab --node-id 3 --profile pi-zero-2w --meter model"),
    "nodes": ("nodes --broker mqtt://127.0.0.1:1883 --count 8",
              "nodes --broker mqtt://127.0.0.1:1883 --run lab --ids 3,5,7"),
    "bridge": ("bridge --serial /dev/ttyACM0 --broker mqtt://127.0.0.1:1883 --node-id 0",
               "bridge --virtual host --broker mqtt://127.0.0.1:1883 --run lab --node-id 1"),
    "broker": ("broker", "broker --host 0.0.0.0 --port 1883"),
    "acl": ("acl --run lab --nodes 30 --out secrets/", "acl --run lab --ids 3,5,7 --out secrets/"),
    "provision": ("provision inventory.toml --out lab/", "provision inventory.toml --out lab/ --run lab2"),
    "board": ("board build --arch arm64 --out build/pi",
              "board run build/pi -- testbed node --config node.toml --meter model"),
    "sweep": ("sweep experiments/quickstart.toml --grid budget.epsilon=1,4 --grid data.num_nodes=8,16 --repeats 5 "
              "--out runs/s1",
              "sweep experiments/quickstart.toml --grid budget.epsilon=1,2,4 --engine ray"),
    "compare": ("compare runs/s1 --a epsilon=1 --b epsilon=4",
                "compare runs/s1 --a epsilon=1 num_nodes=8 --b epsilon=4 num_nodes=8 --metric test_accuracy --json"),
    "calibrate": ("calibrate", "calibrate --profile host --model-size 1000 --out calibration.toml"),
    "topology": ("topology show experiments/dwfl/base.toml",
                 "topology show experiments/dwfl/base.toml --set topology.kind=ring --round 5 --edges ring.txt"),
    "scene": ("scene show examples/scene_dwfl.toml -o scene.png",
              "scene show examples/scene_dwfl.toml -o coverage.png --radio-map 3 --cell 1"),
    "schema": ("schema --out experiment.schema.json",),
    "new": ("new algorithm my_fedavg", "new dataset my_blobs --dir ../my-blobs", "new accountant my_basic"),
}


def epilog(invocations: Iterable[str]) -> str:
    """The ``examples:`` block of a help text, one ``testbed ...`` line per invocation."""
    return "examples:\n" + "".join(f"  testbed {line}".rstrip() + "\n" for line in invocations).rstrip("\n")
