"""What the README's and the docs pages' tests check of a block's output: shared by test_readme.py and
test_docs_pages.py."""

from __future__ import annotations

import io
import re
import tokenize


def expectations(code: str) -> dict[int, str]:
    """Line (in the block) -> the EXPECTED of a ``# ... -> EXPECTED`` comment on it."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT and "-> " in token.string:
            found[token.start[0]] = token.string.split("-> ", 1)[1].strip()
    return found


def fits(expected: str, output: str) -> bool:
    """``output`` (one statement's) is ``expected``, with ``...`` matching any text."""
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, output.strip(), flags=re.DOTALL) is not None
