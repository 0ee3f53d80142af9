"""Trim results folders for the repository: lm-eval's sample logs lose their prompt text (`doc`, `target`,
`arguments`), keeping the hashes, responses, filters and scores the gate reads; everything else is copied as it is.

    python trim_runs.py SOURCE DEST     (SOURCE: a folder of results folders; DEST: created, must not exist)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

DROPPED = ("doc", "target", "arguments")


def trim(source: Path, dest: Path) -> int:
    shutil.copytree(source, dest, symlinks=True)
    trimmed = 0
    for path in dest.rglob("samples_*.jsonl"):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        path.write_text("".join(json.dumps({k: v for k, v in row.items() if k not in DROPPED}) + "\n"
                                for row in rows), encoding="utf-8")
        trimmed += 1
    return trimmed


if __name__ == "__main__":
    if len(sys.argv) != 3 or Path(sys.argv[2]).exists():
        sys.exit(__doc__)
    print(f"trimmed {trim(Path(sys.argv[1]), Path(sys.argv[2]))} sample logs into {sys.argv[2]}")
