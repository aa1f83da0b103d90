"""Writing the grader's reports (JSON, CSV, markdown) into the output folder."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def _cell(s: str | None) -> str:
    """Text a student controls (a name, a reason) as one markdown table cell: no pipe, no line end."""
    return (s or "").replace("|", "\\|").replace("\r", " ").replace("\n", " ")[:300]


def prepare_out(out: Path) -> Path:
    """--out made safe for root to write into, before any submission runs: a folder the grader
    creates itself, or an existing one of the grader's that no one else can write, below
    folders no one else can write (or sticky, as /tmp). Raises ValueError (one line) otherwise."""
    out = Path(os.path.abspath(out))
    if not os.path.lexists(out):
        _closed(out.parent, out)  # before creating anything: no one may swap what is made
        out.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(out, 0o755)
        os.chmod(out, 0o755)  # whatever the umask
    _closed(out, out)
    return out


def _closed(folder: Path, out: Path) -> None:
    """Raise ValueError unless folder, and every folder above it and above where its links lead,
    is a real folder of root or the grader that no one else can write; folders above out may be
    sticky instead (others cannot rename in them)."""
    real = Path(os.path.realpath(folder))
    for p in sorted({folder, *folder.parents, real, *real.parents}, key=lambda p: -len(p.parts)):
        if not os.path.lexists(p):
            continue  # the grader creates it
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode) and p != out:
            continue  # the folder holding the link is checked, and so is where it leads
        others = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid not in (0, os.getegid()))
        why = ("is a symlink" if stat.S_ISLNK(st.st_mode) else "is not a folder" if not stat.S_ISDIR(st.st_mode)
               else "belongs to another user" if st.st_uid not in (0, os.geteuid())
               else "is writable by others" if others and (p == out or not st.st_mode & stat.S_ISVTX) else None)
        if why:
            where = ": it " + why if p == out else f" ({p} {why})"
            raise ValueError(f"--out {out}: refusing to write reports there{where}; give a new folder (the grader "
                             "creates it) or one that only the grader can write")


def _write_text(path: Path, text: str) -> None:
    """Atomically, through a temporary file of a random name created exclusively, never through a
    link (mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW); os.replace replaces a link at path, not its target."""
    _closed(Path(os.path.abspath(path.parent)), Path(os.path.abspath(path.parent)))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # UTF-8 always; a name that is not (a file named with byte 0xff) is written escaped, never a crash
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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


