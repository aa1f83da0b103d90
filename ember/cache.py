"""Ember's folder of compiled artifacts ($EMBER_CACHE, else ~/.cache/ember): shared libraries,
cubins, schedules and searched plans, each kind in a folder of its own, safe to delete."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


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
