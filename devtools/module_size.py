"""`python -m devtools.module_size`: fail when a module of the installed package is over `LIMIT` lines.

A module over 500 lines holds several concepts (DESIGN §6: one concept per module); the limit is checked in
`make lint` so that the next one to grow past it is split when it does, not found later by a reader.
"""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 500
PACKAGE = Path(__file__).resolve().parent.parent / "extender"


def oversized(root: Path = PACKAGE, limit: int = LIMIT) -> list[tuple[str, int]]:
    """Every module under `root` over `limit` lines, with its count, by path."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append((str(path.relative_to(root.parent)), lines))
    return found


def main() -> int:
    found = oversized()
    for path, lines in found:
        print(f"{path}: {lines} lines, over the limit of {LIMIT}: split it by concept", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
