"""Rewrite the generated privacy statements in docs/privacy.md (every statement's section) and
docs/guarantees.md (the table) from the algorithms' registered statements (testbed.privacy.statements):
run after changing a statement; tests/test_privacy_statements.py fails until the documents match.

Usage: python tools/write_privacy_docs.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rewritten(path: Path, generated: str) -> str:
    """``path``'s text with its generated part replaced by ``generated``."""
    from testbed.privacy.statements import generated_part

    text = path.read_text()
    return text.replace(generated_part(text), generated)


def main() -> None:
    from testbed.algorithms.registry import privacy_statements
    from testbed.privacy.statements import markdown_sections, markdown_table

    statements = privacy_statements(plugins=False)  # the testbed's own: an installed plugin's is not documented here
    for path, generated in ((ROOT / "docs" / "privacy.md", markdown_sections(statements)),
                            (ROOT / "docs" / "guarantees.md", markdown_table(statements))):
        path.write_text(rewritten(path, generated))
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
