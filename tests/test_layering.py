"""DESIGN.md's layering, checked on the sources: no module imports a layer above its own."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Orchestration modules of testbed/ (everything else in testbed/ outside testbed/mqtt is core).
ORCHESTRATION = {"testbed.runner", "testbed.coordinator", "testbed.channel_emulator", "testbed.sim_nodes",
                 "testbed.sweep", "testbed.plots", "testbed.cli", "testbed.progress", "testbed.nodes_api",
                 "testbed.__main__", "testbed.provision", "testbed.watch", "testbed.report_html", "testbed.forked",
                 "testbed.sweep_figures"}


def _layer(module: str) -> int:
    """0 channel, 1 testbed core, 2 transport, 3 nodes, 4 firmware bridge, 5 orchestration."""
    if module.startswith("channel"):
        return 0
    if module.startswith("testbed.mqtt"):
        return 2
    if module.startswith("nodes"):
        return 3
    if module.startswith("firmware_bridge"):
        return 4
    if any(module == o or module.startswith(o + ".") for o in ORCHESTRATION):
        return 5
    return 1


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in ("testbed", "nodes", "channel", "firmware_bridge")}


def test_no_module_imports_upward():
    upward = []
    for package in ("channel", "testbed", "nodes", "firmware_bridge"):
        for path in sorted((REPO / package).rglob("*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            mine = _layer(module)
            for imported in _imports(path):
                target = _layer(imported)
                if target > mine:
                    upward.append(f"{module} ({mine}) imports {imported} ({target})")
    assert not upward, "\n".join(upward)


def test_transport_and_node_side_name_no_algorithm():
    names = ("dp_pasgd", "dwfl", "fedavg")
    offenders = []
    for path in list((REPO / "testbed" / "mqtt").glob("*.py")) + list((REPO / "nodes").glob("*.py")) + [
            REPO / "testbed" / "coordinator.py", REPO / "testbed" / "channel_emulator.py", REPO / "testbed" / "runner.py",
            REPO / "testbed" / "sim_nodes.py"]:
        imported = _imports(path)
        offenders += [f"{path.name}: {m}" for m in imported if any(m.startswith(f"testbed.algorithms.{n}") for n in names)]
    assert not offenders, offenders
