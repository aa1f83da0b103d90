"""The sandbox's containment (docs/grading.md, "Threat model: containment"): each test is an attack by
a hostile submission (its `build` or `compiler`, or the files it hands in) and asserts the guarantee."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import pytest

from ember.grading.course import Source
from ember.grading.sandbox import EMBER, Limits, Sandbox, _rmtree, level
from ember.grading.submissions import load_submissions

contained = pytest.mark.skipif(level() != "namespaces", reason="needs root with util-linux unshare (as the course "
                               "machine and CI have)")
LONG = "d" * 250  # 20 of these make a path past PATH_MAX


def _sub(folder: Path, name: str, compiler: str = "exit 0", build: str | None = None) -> Path:
    d = folder / name
    d.mkdir(parents=True)
    for exe, body in (("compiler", compiler), ("build", build)):
        if body is not None:
            (d / exe).write_text("#!/bin/sh\n" + body + "\n")
            (d / exe).chmod(0o755)
    return d


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    sb = Sandbox([], 2, Limits(wall=30, memory=256 << 20, tmp=1 << 20, copy=8 << 20))
    yield sb
    sb.close()


def _load(folder: Path, sb: Sandbox, ref: str | None = None) -> dict[str, str | None]:
    sources = [Source(p.name, p) for p in sorted(folder.iterdir())]
    return {s.name: s.build_error for s in load_submissions(sources, sb, ref, 30, lambda m: None)[1:]}


def test_deep_trees_are_copied_built_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.path.isdir("/dev/shm"):  # a tmpfs: removing 1100 folders on a disk mounted with discard takes seconds
        monkeypatch.setattr(tempfile, "tempdir", "/dev/shm")
    # past the recursion limit (1000) and, as a path, past PATH_MAX
    build = "exec python3 -c \"import os\nfor _ in range(1100): os.mkdir('b'); os.chdir('b')\""
    src = _sub(tmp_path / "subs", "deep", build=build)
    fd = os.open(src, os.O_RDONLY)
    for _ in range(20):  # handed in: a path past PATH_MAX
        os.mkdir(LONG, dir_fd=fd)
        fd, old = os.open(LONG, os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    sb = Sandbox([], 1, Limits(wall=60))
    try:
        assert _load(tmp_path / "subs", sb) == {"deep": None}
    finally:
        sb.close()
        _rmtree(src)  # pytest's own clean-up cannot
    assert not sb.root.exists()


def test_copy_is_capped_and_takes_only_files_folders_links(tmp_path: Path, sandbox: Sandbox) -> None:
    sparse = _sub(tmp_path / "subs", "sparse")
    with open(sparse / "big", "wb") as f:
        f.truncate(2 << 30)  # 8 KB on disk, 2 GiB when copied
    _sub(tmp_path / "subs", "grows", build="head -c 9000000 /dev/zero > blob")  # past the cap by its build
    odd = _sub(tmp_path / "subs", "odd")
    os.mkfifo(odd / "fifo")
    os.symlink("/etc/passwd", odd / "link")
    os.symlink("odd", tmp_path / "subs" / "eve")  # a submission that is another's
    errors = _load(tmp_path / "subs", sandbox)
    assert errors["odd"] is None and "a link" in errors["eve"]  # type: ignore[operator]
    assert "copy cap of 8 MiB" in errors["sparse"] and "\n" not in errors["sparse"]  # type: ignore[operator]
    if os.geteuid() == 0:
        assert "grew past the copy cap of 8 MiB" in errors["grows"]  # type: ignore[operator]
    copies = [p for p in sandbox.root.iterdir() if p.name.startswith("sub")]  # the refused ones are gone
    assert len(copies) == (1 if os.geteuid() == 0 else 2)
    odd_copy = next(p for p in copies if (p / "link").is_symlink())
    assert sorted(p.name for p in odd_copy.iterdir()) == ["compiler", "link"]
    assert os.readlink(odd_copy / "link") == "/etc/passwd"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_only_real_repositories_are_cloned(tmp_path: Path, sandbox: Sandbox) -> None:
    subs = tmp_path / "subs"
    alice = _sub(subs, "alice", "echo alice")
    _git(alice, "init", "-q")
    _git(alice, "add", "-A")
    _git(alice, "commit", "-qm", "x")
    _git(alice, "tag", "week1")
    (subs / "bob").mkdir()
    (subs / "bob" / ".git").write_text("gitdir: ../alice/.git\n")  # bob hands in alice's repository
    _git(subs, "clone", "-q", "--shared", "alice", "carol")  # objects borrowed from alice's
    big = _sub(subs, "big", "exit 0")
    (big / "zeros").write_bytes(bytes(24 << 20))  # 24 KB packed, 24 MiB checked out
    _git(big, "init", "-q")
    _git(big, "add", "-A")
    _git(big, "commit", "-qm", "x")
    _git(big, "tag", "week1")
    errors = _load(subs, sandbox, "week1")
    assert errors["alice"] is None
    assert "only real repositories" in errors["bob"]  # type: ignore[operator]
    assert "alternates" in errors["carol"]  # type: ignore[operator]
    assert "larger than the copy cap" in errors["big"]  # type: ignore[operator]
    assert [p.name for p in sandbox.root.iterdir() if p.name.startswith(("sub", "git"))] == ["sub1"]


@contained
def test_memory_cap_counts_shared_mappings(tmp_path: Path, sandbox: Sandbox) -> None:
    if not sandbox.memory_cgroup:
        pytest.skip("no usable memory cgroup here (the grader warns and falls back to RLIMIT_DATA)")
    touch = ("import mmap\nm = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_SHARED)\n"
             "for i in range(0, len(m), 4096): m[i] = 1\nprint('touched')")
    r = sandbox.run([sys.executable, "-c", touch])
    assert "touched" not in r.stdout and r.failure(), r


@contained
def test_each_run_has_private_capped_tmp_and_folder(tmp_path: Path, sandbox: Sandbox) -> None:
    name = f"ember-test-{os.getpid()}-{threading.get_ident()}"
    places = [f"{d}/{name}" for d in ("/tmp", "/var/tmp", "/dev/shm")]
    a, b = (sandbox.add_submission(n, _sub(tmp_path, n)) for n in ("a", "b"))
    r = sandbox.run(["sh", "-c", "".join(f"echo secret > {p}; " for p in places)], submission=a)
    assert r.status == 0, r
    r = sandbox.run(["sh", "-c", "cat " + " ".join(places) + " 2>/dev/null; head -c 2000000 /dev/zero > /tmp/big; "
                     "head -c 2000000 /dev/zero > big"], submission=b)  # and the run folder is capped too
    assert "secret" not in r.stdout and r.status != 0 and r.stderr.count("No space left") == 2, r
    assert not any(os.path.lexists(p) for p in places)  # the host's temporary folders got nothing


@contained
def test_two_graders_never_share_a_uid(sandbox: Sandbox) -> None:
    other = Sandbox([], 8)
    code = "from ember.grading.sandbox import Sandbox\nsb = Sandbox([], 8)\nprint(*sb.uids, flush=True)\ninput()\nsb.close()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(EMBER.parent)})
    try:
        theirs = set(map(int, child.stdout.readline().split()))  # type: ignore[union-attr]
        assert len(theirs) == 8 and not set(sandbox.uids) & set(other.uids)
        assert not theirs & (set(sandbox.uids) | set(other.uids))
    finally:
        child.communicate("\n")
        other.close()


@contained
@pytest.mark.parametrize("allow_ember", [False, True])
def test_only_the_allowlist_is_visible(tmp_path: Path, allow_ember: bool) -> None:
    secret_dir = Path(tempfile.mkdtemp(prefix=".ember-secret-", dir="/"))  # world-readable, outside the allowlist
    try:
        secret_dir.chmod(0o755)
        (secret_dir / "key").write_text("SECRET\n")
        (secret_dir / "key").chmod(0o644)
        hidden = Path(sys.base_prefix) / "include"  # a folder to hide inside the allowlist (Python's)
        sb = Sandbox([hidden], 1, allow_ember=allow_ember)
        probe = (f"cat {secret_dir}/key {__file__} {EMBER.parent}/README.md 2>/dev/null | head -c 100\n"
                 f"ls {hidden} >/dev/null 2>&1 && echo listed {hidden}\n"
                 "printf 'int main(void) { return 7; }' > t.c && cc t.c -o t; ./t; echo cc=$?\n"
                 "python3 -c 'import ember; print(\"ember ok\")'")
        try:
            r = sb.run(["sh", "-c", probe])
        finally:
            sb.close()
        assert "SECRET" not in r.stdout and "import" not in r.stdout and "Ember" not in r.stdout, r
        assert "listed" not in r.stdout or not hidden.is_dir(), r
        assert "cc=7" in r.stdout, r
        assert ("ember ok" in r.stdout) == allow_ember and ("No module named 'ember'" in r.stderr) != allow_ember, r
    finally:
        shutil.rmtree(secret_dir)


@contained
def test_no_unix_socket_outside_the_run_is_reachable(tmp_path: Path, sandbox: Sandbox) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ember-sock-"))
    folder.chmod(0o755)
    servers = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
    try:
        servers[0].bind(str(folder / "s"))
        (folder / "s").chmod(0o777)
        servers[1].bind(f"\0ember-test-{os.getpid()}")
        for s in servers:
            s.listen()
        tries = (f"import socket\nfor a in [{str(folder / 's')!r}, '\\0ember-test-{os.getpid()}']:\n"
                 "    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.connect(a); print('connected', a)\n"
                 "    except OSError as e:\n        print('refused', e)")
        r = sandbox.run([sys.executable, "-c", tries])
        assert [line.split()[0] for line in r.stdout.splitlines()] == ["refused", "refused"], r
    finally:
        for s in servers:
            s.close()
        shutil.rmtree(folder)


@contained
def test_nothing_survives_a_run(tmp_path: Path, sandbox: Sandbox) -> None:
    r = sandbox.run(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & (sleep 300 &) ; id -u"])
    uid = r.stdout.strip()
    assert r.status == 0 and int(uid) in sandbox.uids, r
    assert subprocess.run(["pgrep", "-u", uid], capture_output=True).returncode == 1
    for parent, _ in sandbox.cgroups:  # the run's cgroups are gone too
        assert not (parent / f"{sandbox.block}-1").exists() and not (parent / f"ember-{sandbox.block}-1").exists()
