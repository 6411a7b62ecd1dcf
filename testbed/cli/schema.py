"""`testbed schema`: the JSON Schema of an experiment file, for editors that complete and check
TOML against a schema (Taplo, VS Code's Even Better TOML: `#:schema ./experiment.schema.json` on
the first line of a file, or a `[[rule]]` in .taplo.toml)."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    schema = sub.add_parser("schema", help="write the JSON Schema of experiment files")
    schema.add_argument("--out", type=Path, help="write it here (default: standard output)")
    schema.set_defaults(handler=_schema)


def _schema(args: argparse.Namespace) -> int:
    from testbed.assembly.config import json_schema_text

    text = json_schema_text()
    if args.out is None:
        print(text, end="")
        return 0
    try:
        args.out.write_text(text)
    except OSError as exc:
        raise UserError(f"cannot write {args.out}: {exc.strerror}") from None
    print(f"wrote {args.out}")
    return 0
