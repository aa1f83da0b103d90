"""Code generators and runtimes: C for the CPU (c.py), CUDA for NVIDIA GPUs (cuda.py), sharing
the C-like renderer (render.py)."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import data
from ..ir import Node


def cache_root() -> Path:
    """Where compiled programs and searched plans are kept between runs ($EMBER_CACHE)."""
    return Path(os.environ.get("EMBER_CACHE") or Path.home() / ".cache" / "ember")


class CacheError(RuntimeError):
    """A compile cache Ember will not use: what it loads runs as this process."""


def cache_dir(kind: str) -> Path:
    """The cache's folder for one kind of artifact (c, cuda, plans), created if missing. A folder
    that another user owns or may write is refused: whoever writes the cache runs code here."""
    root = cache_root()
    d = root / kind
    d.mkdir(mode=0o755, parents=True, exist_ok=True)
    for folder in (root, d):
        st = folder.stat()
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            who = "is owned by another user" if st.st_uid not in (os.geteuid(), 0) else "may be written by others"
            raise CacheError(f"the compile cache {folder} {who}: refusing it (chmod go-w it, or set EMBER_CACHE "
                             f"to a folder of your own)")
    return d


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).hexdigest().encode()


def cache_read(path: Path) -> bytes | None:
    """A cached artifact's bytes, or None when it is missing or does not match the hash it was
    written with (cut short, replaced, edited): the caller builds it again."""
    try:
        data, digest = path.read_bytes(), path.with_name(path.name + ".sha256").read_bytes()
    except OSError:
        return None
    return data if _digest(data) == digest else None


def cache_write(path: Path, data: bytes) -> None:
    """Publish an artifact and its hash, each atomically (a reader sees the old state or the whole
    file; an artifact seen before its hash is missing, so built again)."""
    for target, content in ((path, data), (path.with_name(path.name + ".sha256"), _digest(data))):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)


def cached(make: Callable[[list[Node]], Any]) -> Callable[[list[Node]], Any]:
    """One compiled program per list of output nodes (nodes are hash-consed: equal graphs hit)."""
    programs: dict[tuple[Node, ...], Any] = {}

    def program(outputs: list[Node]) -> Any:
        key = tuple(outputs)
        if key not in programs:
            programs[key] = make(outputs)
        return programs[key]
    program.programs = programs  # type: ignore[attr-defined]
    return program


def run_values(program: Any, inputs: dict[Node, np.ndarray]) -> list[np.ndarray]:
    """Run a compiled program on values as the reference evaluator holds them; returns the same."""
    return _values(program, program(_stored(inputs)))


def timed_values(program: Any, inputs: dict[Node, np.ndarray], runs: int) -> tuple[list[np.ndarray], list[float]]:
    """run_values, then the milliseconds of each of `runs` more runs on the same bound inputs."""
    arrays, times = program.timed(_stored(inputs), runs)
    return _values(program, arrays), times


def _stored(inputs: dict[Node, np.ndarray]) -> dict[Node, np.ndarray]:
    return {n: data.to_storage(v, n.dtype) for n, v in inputs.items()}


def _values(program: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [data.from_storage(a, b.dtype) for a, b in zip(arrays, program.sched.outputs)]
