"""Output shared by the benchmark commands: progress lines and JSON rows."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["stderr_log", "write_rows"]


def stderr_log(line: str) -> None:
    """Print a progress line to standard error (kept apart from the tables on standard out)."""
    print(line, file=sys.stderr, flush=True)


def write_rows(rows: Sequence, path: str | Path, log: Callable[[str], None]) -> None:
    """Write dataclass ``rows`` as a JSON list to ``path`` (parent folders created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    log(f"wrote {p}")
