"""MkDocs hooks of the documentation site (mkdocs.yml's ``hooks``).

The docstrings cross-reference in Sphinx's roles (:func:`run`, :class:`Run`, :attr:`Run.metrics`),
which the code's readers know and mkdocstrings' Markdown leaves as text before the code span: the
role's name is dropped, the code span kept.
"""

from __future__ import annotations

import re

#: ``:role:`` just before a rendered code span (``<code>``), the Python domain's roles.
_ROLE = re.compile(r":(?:py:)?(?:func|class|attr|meth|mod|data|exc|obj|const):(?=<code>)")


def on_page_content(html: str, **_: object) -> str:
    """The page's HTML without the Sphinx role names before code spans."""
    return _ROLE.sub("", html)
