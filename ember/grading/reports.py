"""Writing the grader's reports (JSON, CSV, markdown) into the output folder."""
from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any


def _cell(s: str | None) -> str:
    return (s or "").replace("|", "\\|").replace("\n", " ")[:300]


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a reader never sees half a report


def _write_json(path: Path, obj: Any) -> None:
    _write_text(path, json.dumps(obj, indent=1, allow_nan=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"not JSON: {type(o).__name__}")


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    _write_text(path, buf.getvalue())


