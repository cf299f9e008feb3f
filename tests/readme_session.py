"""Pastes code blocks into one Python session, as a user at the interactive prompt would (for test_readme.py).

    python tests/readme_session.py README_PATH RESULT_JSON < blocks.json

Only the standard library is imported here, so that the modules the session
ends up with are the ones its blocks imported.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import sys
import traceback
from typing import Any


def run_session(blocks: list[dict[str, Any]], filename: str) -> dict[str, Any]:
    """Every top-level statement of every block, in order, in one namespace, until the first error.

    Each statement is compiled in "single" mode, as the interactive prompt
    compiles it, so an expression statement shows its repr. Returns, per
    statement, its block, its first and last line within the block, what it
    printed or showed, and the traceback if it raised; and the modules loaded.
    ``blocks``: ``{"code": ..., "line": README line of its first line}``.
    """
    namespace: dict[str, Any] = {"__name__": "__main__"}
    statements: list[dict[str, Any]] = []
    for number, block in enumerate(blocks):
        tree = ast.parse(block["code"])
        ast.increment_lineno(tree, block["line"] - 1)  # tracebacks name lines of the README
        for node in tree.body:
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            entry: dict[str, Any] = {
                "block": number,
                "first": first - block["line"] + 1,
                "last": node.end_lineno - block["line"] + 1,
            }
            captured = io.StringIO()
            try:
                code = compile(ast.Interactive(body=[node]), filename, "single")
                with contextlib.redirect_stdout(captured):
                    exec(code, namespace)
            except BaseException:  # noqa: BLE001 - reported to the caller, which fails on it
                entry["error"] = traceback.format_exc()
            entry["output"] = captured.getvalue()
            statements.append(entry)
            if "error" in entry:
                return {"statements": statements, "modules": sorted(sys.modules)}
    return {"statements": statements, "modules": sorted(sys.modules)}


if __name__ == "__main__":
    result = run_session(json.load(sys.stdin), sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
