"""Running untrusted programs (students' compilers) so that they harm nothing else.

Every run gets its own empty folder (its HOME and TMPDIR), a clean environment, resource limits
(CPU time, address space, file size, processes, output size) and a wall-clock timeout that
kills every process it started. The containment level is chosen once, by probing:

- `namespaces` (root, with util-linux's unshare): a fresh mount, PID and network namespace per
  run. Inside it the grader's secret folders (tests, submissions, results) are covered by empty
  read-only mounts, /dev/shm and /var/tmp are private, there is no network, and the program
  runs as a separate unprivileged user (one per parallel slot; one group per submission, so a
  submission cannot read another's folder). Folders the program needs that sit under a folder
  only root may enter (/root/.pyenv under /root) are moved onto an otherwise empty mount.
- `user` (root without namespaces): the separate user and the limits, without the hiding.
  The memory limit is on data (RLIMIT_DATA), not address space: CUDA reserves far more address
  space than it uses.
- `rlimits` (not root): the limits and the timeout only; `ember grade` says so.

When a run ends, every process of its slot's user is killed, so nothing outlives it.
"""
from __future__ import annotations

import itertools
import os
import queue
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..backend import cache_root

UID_BASE, GID_BASE = 100000, 200000  # sandbox users and groups; never real accounts


def slot_uids(jobs: int) -> list[int]:
    """This process's sandbox users: a range of its own, so two graders never kill each other's runs."""
    base = UID_BASE + (os.getpid() % 1000) * 64
    return [base + i for i in range(min(max(1, jobs), 64))]
KEEP_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "PYENV_ROOT", "PYENV_VERSION", "CUDA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH", "CC")


@dataclass
class Limits:
    wall: float = 60.0             # seconds before the whole process tree is killed
    cpu: int = 600                 # CPU seconds per process
    memory: int = 16 << 30         # bytes of data (heap and private writable mappings) per process
    file_size: int = 1 << 30       # the largest file a run may write
    processes: int = 256           # processes and threads of the slot's user at once
    output: int = 64 << 20         # bytes of stdout + stderr kept; more kills the run


@dataclass
class Result:
    status: int | None             # the exit status, None when the run was killed
    stdout: str
    stderr: str
    killed: str | None             # 'timeout' or 'output limit' when the grader killed the run
    wall: float                    # seconds

    def failure(self) -> str | None:
        """One line saying why the run failed, or None when it exited 0."""
        if self.killed == "timeout":
            return f"timed out after {self.wall:.3g} s"
        if self.killed:
            return f"killed: {self.killed}"
        if self.status != 0:
            last = (self.stderr.strip().splitlines() or ["(no message)"])[-1][:200]
            signalled = self.status is not None and self.status < 0
            how = f"killed by signal {-self.status}" if signalled else f"exited with status {self.status}"
            return f"{how}: {last}"
        return None


def _probe_namespaces() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv") and shutil.which("prlimit")):
        return False
    try:
        proc = subprocess.run(["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child", "--mount-proc",
                               "sh", "-c", "mount -t tmpfs -o size=4k ember-probe /mnt && echo ok"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def level() -> str:
    if not hasattr(level, "value"):
        level.value = ("namespaces" if _probe_namespaces()  # type: ignore[attr-defined]
                       else "user" if os.geteuid() == 0 and shutil.which("setpriv") else "rlimits")
    return level.value  # type: ignore[attr-defined]


def _closed_ancestor(path: Path) -> Path | None:
    """The outermost folder above path that other users may not enter (/root), or None."""
    for parent in reversed(path.parents):
        if parent != Path("/") and parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            return parent
    return None


def _q(s: "str | Path") -> str:
    return "'" + str(s).replace("'", "'\\''") + "'"


class Sandbox:
    """A folder of submissions and runs; `run` executes one command in containment."""

    def __init__(self, hide: list[Path], jobs: int, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.level = level()
        self.root = Path(tempfile.mkdtemp(prefix="ember-grade-"))
        os.chmod(self.root, 0o711)              # others may pass through, not list
        self.hide = [p.resolve() for p in hide if p.exists() and not self._contains(p.resolve(), self.root)]
        self.slots: queue.Queue[int] = queue.Queue()
        self.uids = slot_uids(jobs)
        for uid in self.uids:
            self.slots.put(uid)
        self.groups: dict[Path, int] = {}
        self.ids = itertools.count(1)
        self.expose = self._needed_folders()

    @staticmethod
    def _contains(outer: Path, inner: Path) -> bool:
        return inner == outer or outer in inner.parents

    def _needed_folders(self) -> dict[Path, list[Path]]:
        """Folders a program needs (PATH, the Python that runs Ember) below a closed folder:
        {closed folder: [its children to keep visible]}."""
        wanted = [Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parent.parent]
        wanted += [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
        out: dict[Path, list[Path]] = {}
        for w in wanted:
            w = w.resolve() if w.exists() else w
            top = _closed_ancestor(w)
            if top is None or any(self._contains(h, w) for h in self.hide):
                continue
            child = top / w.relative_to(top).parts[0]
            if child.exists() and child not in out.setdefault(top, []):
                out[top].append(child)
        return out

    # ----------------------------------------------------------------------- submissions
    def add_submission(self, name: str, src: Path, ref: str | None = None) -> Path:
        """A private copy of a submission (a git repository checked out at ref, if given)."""
        n = next(self.ids)
        dest = self.root / f"sub{n}"
        if ref is not None:
            proc = subprocess.run(["git", "-c", "safe.directory=*", "-c", "protocol.file.allow=always", "clone",
                                   "--quiet", "--no-hardlinks", "--depth", "1", "--branch", ref, f"file://{src.resolve()}",
                                   str(dest)], capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                raise OSError(f"cannot check out '{ref}' of {src}: {proc.stderr.strip()[-300:]}")
        else:
            shutil.copytree(src, dest, symlinks=True)
        self.groups[dest] = GID_BASE + n
        self._own(dest, 0, writable=False)
        return dest

    def _own(self, folder: Path, uid: int, writable: bool) -> None:
        """Give folder to uid and the submission's group: writable for its build, else read-only."""
        if os.geteuid() != 0:
            return
        gid = self.groups[folder]
        for path in [folder, *folder.rglob("*")]:
            if path.is_symlink():
                continue
            executable = path.is_dir() or path.stat().st_mode & stat.S_IXUSR
            os.chown(path, uid, gid)
            os.chmod(path, (0o770 if writable else 0o750) if executable else (0o660 if writable else 0o640))

    # ------------------------------------------------------------------------------ runs
    def run(self, cmd: list[str], files: dict[str, bytes] | None = None, submission: Path | None = None,
            wall: float | None = None, build: bool = False, trusted: bool = False) -> Result:
        """Run cmd in a fresh folder holding files ('{dir}' in cmd names that folder), removed
        afterwards. build=True runs in the submission's own folder, writable for the run.
        trusted: the reference compiler, run as the grader (same folder, limits and timeout)."""
        uid = self.slots.get()
        work = submission if build and submission else self.root / f"run{next(self.ids)}"
        contained = not trusted and self.level != "rlimits"
        try:
            if not build:
                work.mkdir(mode=0o700)
                for name, content in (files or {}).items():
                    (work / name).write_bytes(content)
            if contained and build:
                self._own(work, uid, writable=True)
            elif contained:
                gid = self.groups.get(submission, GID_BASE) if submission else GID_BASE
                for p in [work, *work.iterdir()]:
                    os.chown(p, uid, gid)
            cmd = [c.replace("{dir}", str(work)) for c in cmd]
            return self._spawn(cmd, work, uid, submission, wall or self.limits.wall, contained)
        finally:
            self._sweep(uid)
            if build and contained:
                self._own(work, 0, writable=False)
            elif not build:
                shutil.rmtree(work, ignore_errors=True)
            self.slots.put(uid)

    def _env(self, work: Path, contained: bool) -> dict[str, str]:
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        if not contained:  # the reference compiler: Ember from where the grader runs it, and its compile cache
            here = str(Path(__file__).resolve().parent.parent)
            env["PYTHONPATH"] = os.pathsep.join([here] + ([env["PYTHONPATH"]] if "PYTHONPATH" in env else []))
            env["EMBER_CACHE"] = str(cache_root())
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(HOME=str(work), TMPDIR=str(work), LANG=env.get("LANG", "C.UTF-8"))
        # the runs at once share the cores: each run's OpenMP threads (any compiler's) get a share
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // len(self.uids)))
        return env

    def _command(self, cmd: list[str], work: Path, uid: int, submission: Path | None, contained: bool) -> list[str]:
        lim = self.limits
        limited = ["prlimit", f"--cpu={lim.cpu}", f"--data={lim.memory}", f"--fsize={lim.file_size}",
                   f"--nproc={lim.processes}", "--core=0", "--"] + cmd
        if not shutil.which("prlimit"):
            limited = cmd
        if not contained:
            return limited
        gid = self.groups.get(submission, GID_BASE) if submission else GID_BASE
        drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"] + limited
        if self.level != "namespaces":
            return drop
        script = ["set -e"]
        for i, (top, keep) in enumerate(self.expose.items()):
            for j, child in enumerate(keep):  # park what stays visible, cover the closed folder, put it back
                park = self.root / f"park{i}_{j}"
                script.append(f"mkdir -p {_q(park)} && mount --bind {_q(child)} {_q(park)}")
            script.append(f"mount -t tmpfs -o size=1m,mode=755 ember-closed {_q(top)}")
            for j, child in enumerate(keep):
                script.append(f"mkdir -p {_q(child)} && mount --move {_q(self.root / f'park{i}_{j}')} {_q(child)}")
        for h in self.hide:
            script.append(f"mount -t tmpfs -o ro,size=4k,mode=0 ember-hidden {_q(h)}")
        for shared in ("/dev/shm", "/var/tmp"):
            if os.path.isdir(shared):
                script.append(f"mount -t tmpfs -o size=256m,mode=1777 ember-private {shared}")
        script.append(f'cd {_q(work)} && exec "$@"')
        return ["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child", "--mount-proc",
                "sh", "-c", "\n".join(script), "sh"] + drop

    def _spawn(self, cmd: list[str], work: Path, uid: int, submission: Path | None, wall: float,
               contained: bool) -> Result:
        full = self._command(cmd, work, uid, submission, contained)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(full, cwd=work, env=self._env(work, contained), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            return Result(None, "", f"cannot start {cmd[0]}: {e.strerror}", None, 0.0)
        out, err, killed = bytearray(), bytearray(), None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        sel.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        deadline = start + wall
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                killed = "timeout"
                break
            for key, _ in sel.select(timeout=min(left, 1.0)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if len(out) + len(err) > self.limits.output:
                    killed = f"printed more than {self.limits.output >> 20} MiB"
                    break
            if killed:
                break
        sel.close()
        if killed is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed = "timeout"
        if killed is not None:
            self._kill(proc)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
        status = None if killed else proc.returncode
        return Result(status, out.decode(errors="replace"), err.decode(errors="replace"), killed,
                      time.monotonic() - start)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # unshare dies, and with it the namespace's processes
        except ProcessLookupError:
            pass
        proc.wait()

    def _sweep(self, uid: int) -> None:
        """Kill every process of the slot's user, those that left the process group too; again
        until none is left (a process forking at that moment, or a namespace still dying)."""
        if os.geteuid() != 0 or self.level == "rlimits":
            return
        for _ in range(100):
            subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={GID_BASE}", "--clear-groups", "--",
                            "kill", "-9", "-1"], capture_output=True)
            if subprocess.run(["pgrep", "-u", str(uid)], capture_output=True).returncode != 0:
                return
            time.sleep(0.02)

    def close(self) -> None:
        for uid in self.uids:
            self._sweep(uid)
        shutil.rmtree(self.root, ignore_errors=True)
