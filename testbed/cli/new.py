"""`testbed new algorithm|dataset|accountant NAME`: a small installable project that adds one entry
to the testbed through an entry point (pyproject.toml, the module, a README and a conformance test
running the testbed's contract suite on it): `pip install -e` it and the config, the JSON Schema
and the command line offer it, without a change to the testbed (docs/extending.md).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from testbed.cli import new_templates as t
from testbed.errors import UserError
from testbed.util.registrations import GROUPS

#: An entry's name: a Python identifier in lower case (it names a config section and a module).
NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


@dataclass(frozen=True)
class Template:
    """What `testbed new KIND` writes for one kind of entry."""

    what: str  # the axis, as testbed.util.registrations.GROUPS names it
    module: str
    experiment: str
    checks: str  # the contract suite's checks (testbed.orchestration.contract_suite)
    use: str
    sim_and_mqtt: bool  # the test also runs its own sim = MQTT check (the data set's checks hold one)


TEMPLATES = {
    "algorithm": Template("algorithm", t.ALGORITHM, t.ALGORITHM_EXPERIMENT, "ALGORITHM_CHECKS", t.ALGORITHM_USE, True),
    "dataset": Template("data set", t.DATASET, t.DATASET_EXPERIMENT, "DATASET_CHECKS", t.DATASET_USE, False),
    "accountant": Template("accountant", t.ACCOUNTANT, t.ACCOUNTANT_EXPERIMENT, "ACCOUNTANT_CHECKS", t.ACCOUNTANT_USE,
                           False),
}


def register(sub: argparse._SubParsersAction) -> None:
    new = sub.add_parser("new", help="write a plugin project adding an algorithm, data set or accountant",
                         description=__doc__.split("\n\n")[0])
    new.add_argument("kind", choices=list(TEMPLATES), help="what the plugin adds")
    new.add_argument("name", help="its name (lower case letters, digits, '_'): run.algorithm, data.dataset or "
                                  "privacy.accountant")
    new.add_argument("--dir", type=Path, help="the project's folder (default: ./testbed-NAME)")
    new.set_defaults(handler=_new)


def write_project(kind: str, name: str, folder: Path) -> list[Path]:
    """Write the plugin project for a ``kind`` (a key of :data:`TEMPLATES`) named ``name`` into
    ``folder`` (created; it must not exist or be empty); the files written.

    Raises:
        UserError: a name that is no identifier, or a folder that holds files.
    """
    if not NAME.fullmatch(name):
        raise UserError(f"new {kind}: {name!r} is not a name of lower case letters, digits and '_' starting with a "
                        "letter (at most 40)")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UserError(f"new {kind}: {folder} exists and is not an empty folder")
    template = TEMPLATES[kind]
    module, dist = f"testbed_{name}", f"testbed-{name.replace('_', '-')}"
    words = dict(name=name, module=module, dist=dist, group=GROUPS[template.what], what=template.what,
                 what_cap=template.what.capitalize(), cli=name.replace("_", "-"))
    experiment = template.experiment.format(**words)
    files = {
        "pyproject.toml": t.PYPROJECT.format(**words),
        "README.md": t.README.format(**words, use=template.use.format(**words)),
        f"{module}.py": template.module.format(**words),
        "tests/test_contract.py": t.TEST.format(
            **words, experiment=experiment, checks=template.checks,
            mqtt="" if kind == "accountant" else ", sim and over MQTT",
            extra=t.SIM_EQUALS_MQTT if template.sim_and_mqtt else ""),
    }
    written = []
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def _new(args: argparse.Namespace) -> int:
    folder = args.dir if args.dir is not None else Path(f"testbed-{args.name.replace('_', '-')}")
    try:
        written = write_project(args.kind, args.name, folder)
    except OSError as exc:
        raise UserError(f"new {args.kind}: cannot write {folder}: {exc.strerror}") from None
    print(f"wrote {folder}/: " + ", ".join(str(p.relative_to(folder)) for p in written))
    print(f"next: pip install -e {folder} && pytest {folder}/tests")
    return 0
