"""The --json option's writer shared by the CLI commands, `rlx-triton perf` and bench/run.py."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional


def write_json(path: Optional[str], data: Any) -> bool:
    """Writes `data` to path ("-": stdout); True when stdout now holds the JSON (print nothing else there)."""
    if path is None:
        return False
    text = json.dumps(data, indent=2, default=str)
    if path == "-":
        print(text)
        return True
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")
    return False
