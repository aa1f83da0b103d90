"""Running untrusted programs (students' compilers) so that they harm nothing else.

Every run gets its own empty folder (its HOME and TMPDIR), a clean environment, resource limits
(CPU time, memory, file size, processes, output size) and a wall-clock timeout that kills every
process it started. The containment level is chosen once, by probing:

- `namespaces` (root, with util-linux's unshare and pivot_root): fresh mount, PID, IPC and network
  namespaces per run, and a new root holding only an allowlist (`_view`): the toolchain, Python,
  CUDA, a minimal /dev, a fresh /proc, private tmpfs /tmp, /var/tmp and /dev/shm, the run folder
  and the submission's own folder. The program runs as an unprivileged user of its own.
- `user` (root without namespaces): the separate user and the limits, without the view.
- `rlimits` (not root): the limits and the timeout only; `ember grade` says so.

As root, each run also gets a cgroup: its memory cap counts every mapping (RLIMIT_DATA misses
MAP_SHARED ones), and when the run ends `cgroup.kill` and a sweep of its user kill every process.
Without a usable memory cgroup the cap falls back to RLIMIT_DATA per process, with one warning.
Submissions are copied by `_copy` and git, both capped in size, never following a symlink; all
folder walks are iterative on file descriptors, so no depth of nesting breaks them.
"""
from __future__ import annotations

import fcntl
import itertools
import os
import queue
import resource
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
from typing import Iterator

from ..cache import cache_root

UID_BASE, GID_BASE = 400000, 600000  # sandbox users and groups; never real accounts
BLOCK_UIDS, BLOCK_GIDS, BLOCKS = 64, 1024, 256  # a grader holds one block: its uids and its submissions' gids
LOCKS = Path("/run/ember-grade")
NAMESPACES = ["unshare", "--mount", "--pid", "--net", "--ipc", "--fork", "--kill-child"]
KEEP_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "PYENV_ROOT", "PYENV_VERSION", "CUDA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH", "CC")
# the allowlist of the run's file system view, besides Python, PATH and CUDA (see _view)
TOOLCHAIN = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
ETC = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "gai.conf", "protocols", "services", "ld.so.cache",
       "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl/certs", "ssl/openssl.cnf", "ca-certificates", "localtime",
       "timezone", "os-release", "debian_version", "mime.types", "magic")  # no secret: shadow, ssl/private, ...
LIBS = ("lib", "libexec")  # a PREFIX/bin on PATH beside one of these is a toolchain's: PREFIX is in the view
DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout", "stderr")
EMBER = Path(__file__).resolve().parents[1]  # the grader's own package
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")   # each contained run has its own, empty


@dataclass
class Limits:
    wall: float = 60.0             # seconds before the whole process tree is killed
    cpu: int = 600                 # CPU seconds per process
    memory: int = 16 << 30         # bytes: the run's cgroup (all mappings), else data per process
    file_size: int = 1 << 30       # the largest file a run may write
    processes: int = 256           # processes and threads of the run at once
    output: int = 64 << 20         # bytes of stdout + stderr kept; more kills the run
    copy: int = 256 << 20          # bytes a submission's copy (or checkout) may take
    tmp: int = 512 << 20           # bytes of each private tmpfs (/tmp, /var/tmp, /dev/shm)


@dataclass
class Result:
    status: int | None             # the exit status, None when the run was killed
    stdout: str
    stderr: str
    killed: str | None             # 'timeout' or 'output limit' when the grader killed the run
    wall: float                    # seconds
    cpu: float = 0.0               # CPU seconds of the run's processes (exact for runs one at a time:
                                   # the grader's children's rusage; ember bench runs so)

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


# ------------------------------------------------------------------ folder walks without recursion
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _cd(fd: int, name: str) -> int:
    """The folder name (or '..') of the folder open as fd, open in its place."""
    new = os.open(name, DIR_FLAGS, dir_fd=fd)
    os.close(fd)
    return new


def _bytes(st: os.stat_result) -> int:
    """What an entry counts against a cap: apparent or allocated bytes, whichever is more, and 512."""
    return max(st.st_size, st.st_blocks * 512) + 512


def _walk(fd: int) -> Iterator[tuple[str, int, str, os.stat_result | None]]:
    """Every entry below the folder open as fd (the walk owns it), never following a symlink:
    ('entry', folder fd, name, lstat), then for a folder its contents and ('up', folder fd, name, None).
    Iterative with one fd open, going up by '..': only for trees nothing else changes meanwhile."""
    stack, names = [iter(os.listdir(fd))], []
    try:
        while stack:
            name = next(stack[-1], None)
            if name is None:
                stack.pop()
                if names:
                    fd = _cd(fd, "..")
                    yield "up", fd, names.pop(), None
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            yield "entry", fd, name, st
            if stat.S_ISDIR(st.st_mode):
                fd = _cd(fd, name)
                names.append(name)
                stack.append(iter(os.listdir(fd)))
    finally:
        os.close(fd)


def _rmtree(path: Path) -> None:
    """Remove a folder, however deep; what cannot be removed stays."""
    try:
        fd = os.open(path, DIR_FLAGS)
    except OSError:
        return
    for kind, parent, name, st in _walk(fd):
        if kind == "up" or not stat.S_ISDIR(st.st_mode):  # type: ignore[union-attr]
            try:
                (os.rmdir if kind == "up" else os.unlink)(name, dir_fd=parent)
            except OSError:
                pass
    try:
        path.rmdir()
    except OSError:
        pass


def _copy(src: Path, dest: Path, cap: int, links: bool = True) -> None:
    """Copy regular files, folders and (if links) symlinks, as links, from src to a new dest; other
    kinds (FIFOs, sockets, devices) are left out. More than cap bytes (_bytes) raises ValueError and
    leaves nothing."""
    sfd = os.open(src, DIR_FLAGS)
    os.mkdir(dest, 0o700)
    dfd, total = os.open(dest, DIR_FLAGS), 0
    try:
        for kind, parent, name, st in _walk(sfd):
            if kind == "up":
                dfd = _cd(dfd, "..")
                continue
            assert st is not None
            total += _bytes(st)
            if total > cap:
                raise ValueError(f"larger than the copy cap of {cap >> 20} MiB (at {name[:80]!r})")  # one line
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(name, 0o700, dir_fd=dfd)
                dfd = _cd(dfd, name)
            elif stat.S_ISLNK(st.st_mode) and links:
                os.symlink(os.readlink(name, dir_fd=parent), name, dir_fd=dfd)
            elif stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1 and links:   # another name of a file elsewhere (a root-only secret, say);
                    # a .git copy (links=False) only feeds git's own clone, which reads objects, not names
                    raise ValueError(f"holds a hard-linked file ({name[:80]!r}): a copy takes only files of its own")
                fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
                with open(fin, "rb") as r, open(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                                        st.st_mode & 0o700, dir_fd=dfd), "wb") as w:
                    if stat.S_ISREG(os.fstat(fin).st_mode):
                        shutil.copyfileobj(r, w)
    except BaseException:
        os.close(dfd)
        _rmtree(dest)
        raise
    os.close(dfd)


def _children_cpu() -> float:
    """User and system seconds of the grader's ended children and what they waited for (a run's
    PID namespace reaps its processes, so they count too)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# ----------------------------------------------------------------------------- probing the host
def _probe_namespaces() -> bool:
    tools = ("unshare", "setpriv", "prlimit", "pivot_root", "mount")
    if os.geteuid() != 0 or not all(shutil.which(t) for t in tools):
        return False
    with tempfile.TemporaryDirectory(prefix="ember-probe-") as d:
        try:
            script = f"mount -t tmpfs -o size=64k p {d} && mkdir {d}/old && cd {d} && pivot_root . old && echo ok"
            proc = subprocess.run(NAMESPACES + ["sh", "-c", script], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def level() -> str:
    if not hasattr(level, "value"):
        level.value = ("namespaces" if _probe_namespaces()  # type: ignore[attr-defined]
                       else "user" if os.geteuid() == 0 and shutil.which("setpriv") else "rlimits")
    return level.value  # type: ignore[attr-defined]


def _cgroup_parents() -> list[tuple[Path, str]]:
    """Where runs' cgroups go, with the kind: 'v2' (cgroup.kill, and memory.max and pids.max where
    those controllers can be enabled) and 'v1' (a cgroup v1 memory hierarchy, as hybrid hosts have)."""
    if os.geteuid() != 0:
        return []
    own = {c: line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
           for c in line.split(":", 2)[1].split(",")}
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, after = line.split(" - ")[0].split(), line.split(" - ")[1].split()
        root, mount, fstype, opts = fields[3], Path(fields[4]), after[0], after[2].split(",")
        try:
            if fstype == "cgroup2" and not any(k == "v2" for _, k in out):
                parent = mount / "ember-grade"  # at the top: a cgroup with processes cannot enable controllers
                parent.mkdir(exist_ok=True)
                for g in (mount, parent):
                    want = {"memory", "pids"} & set((g / "cgroup.controllers").read_text().split())
                    if want:
                        (g / "cgroup.subtree_control").write_text(" ".join("+" + c for c in want))
                out.append((parent, "v2"))
            elif fstype == "cgroup" and "memory" in opts and "memory" in own:  # below our own cgroup
                rel = os.path.relpath(own["memory"], root)
                if not rel.startswith(".."):
                    out.append((mount / rel, "v1"))
        except OSError:
            continue
    return out


def _claim_block() -> tuple[int, int | None]:
    """A block of uids and gids no other grader holds (flock on a file, released when this process
    dies), swept of processes a dead grader left; (0, None) when not root."""
    if os.geteuid() != 0:
        return 0, None
    LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
    for b in range(BLOCKS):
        fd = os.open(LOCKS / f"block-{b}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return b, fd
        except BlockingIOError:
            os.close(fd)
    raise OSError(f"all {BLOCKS} sandbox uid blocks are held by other graders ({LOCKS})")


def _q(s: str | Path) -> str:
    return "'" + str(s).replace("'", "'\\''") + "'"


def _r(p: Path) -> str:
    """p inside the run's new root, for its mount script."""
    return '"$R"' + _q(p)


def _inside(outer: Path, inner: Path) -> bool:
    return inner == outer or outer in inner.parents


def ember_hidden(allow_ember: bool) -> str | None:
    """Why the runs could not import the grader's own Ember that --allow-ember lets them use: it
    is installed under a folder that each run's own empty copy hides (a checkout under /tmp made
    every run fail with "No module named 'ember'"); None where they can."""
    if not allow_ember or level() != "namespaces":
        return None
    under = next((d for d in PRIVATE if _inside(Path(d).resolve(), EMBER)), None)
    return None if under is None else (f"--allow-ember: this Ember ({EMBER.parent}) is under {under}, which each run "
                                       f"has an empty one of its own: install it from a checkout elsewhere")


class Sandbox:
    """A folder of submissions and runs; `run` executes one command in containment.
    allow_ember: the runs may import the grader's own Ember (a course that lets students use it)."""
    warned = False

    def __init__(self, hide: list[Path], jobs: int, limits: Limits | None = None, allow_ember: bool = False):
        self.limits = limits or Limits()
        self.level = level()
        self.root = Path(tempfile.mkdtemp(prefix="ember-grade-"))
        os.chmod(self.root, 0o711)              # others may pass through, not list
        (self.root / "view").mkdir()            # where each run's new root is mounted, in its own namespace
        self.hide = [p.resolve() for p in hide if p.exists() and not _inside(p.resolve(), self.root)]
        self.block, self.lock = _claim_block()
        self.uids = [UID_BASE + self.block * BLOCK_UIDS + i for i in range(min(max(1, jobs), BLOCK_UIDS))]
        self.slots: queue.Queue[int] = queue.Queue()
        for uid in self.uids:
            self._sweep(uid, [])
            self.slots.put(uid)
        self.groups: dict[Path, int] = {}
        self.ids, self.subs = itertools.count(1), itertools.count(1)  # runs, submissions
        self.cgroups = _cgroup_parents() if self.level != "rlimits" else []
        probe = self._make_cgroups(0)  # runs count from 1
        self.memory_cgroup = any((g / "memory.max").exists() or (g / "memory.limit_in_bytes").exists() for g in probe)
        self._remove_cgroups(probe)
        if self.level != "rlimits" and not self.memory_cgroup and not Sandbox.warned:
            Sandbox.warned = True
            print("ember: no usable memory cgroup here: the memory cap is per process and misses shared mappings "
                  "(docs/grading.md)", file=sys.stderr)
        self.view = self._view(allow_ember) if self.level == "namespaces" else []

    def _view(self, allow_ember: bool) -> list[str]:
        """The commands that build a run's new root $R from the allowlist: folders bound read-only;
        files, links and devices of /etc and /dev copied (one cp, not a mount each); a fresh /proc."""
        wanted = [Path(p) for p in TOOLCHAIN] + [Path(sys.prefix), Path(sys.base_prefix)]
        for var in ("PATH", "LD_LIBRARY_PATH"):
            wanted += [Path(p) for p in os.environ.get(var, "").split(os.pathsep) if p.startswith("/")]
        # /opt/gcc/bin needs /opt/gcc/libexec; a home folder's bin is not a toolchain's
        wanted += [p.parent for p in wanted if p.name == "bin" and len(p.parts) > 2
                   and any((p.parent / d).is_dir() for d in LIBS)]
        wanted += [Path(os.environ[v]) for v in ("PYENV_ROOT", "CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
        wanted += sorted(Path("/usr/local").glob("cuda*")) + ([EMBER] if allow_ember else [])
        copied = [Path("/etc", n) for n in ETC] + [Path("/dev", d) for d in DEVICES]
        copied += sorted(Path("/dev").glob("nvidia*"))
        covered = self.hide + ([] if allow_ember else [EMBER])
        binds: set[Path] = set()
        copies: set[Path] = set()
        todo = [(p, binds) for p in wanted] + [(p, copies) for p in copied]
        while todo:  # it grows with links' targets
            p, into = todo.pop()
            p = Path(os.path.normpath(p))
            if p == Path("/") or not os.path.lexists(p) or any(_inside(h, p) for h in covered):
                continue
            if p.is_symlink():
                copies.add(p)
                if not _inside(Path("/dev"), p):  # /dev/fd is /proc/self/fd: the run's own
                    todo.append((p.resolve(), binds if p.resolve().is_dir() else copies))
            else:
                into.add(p)
        binds = {p for p in binds if not any(_inside(q, p.parent) for q in binds)}  # not visible through another
        copies = {p for p in copies if not any(_inside(q, p) for q in binds)}
        lines = ['mount -t tmpfs -o size=16m,mode=755 ember-view "$R"',
                 " ".join(["mkdir -p", *map(_r, [Path("/.old"), Path("/proc"), *map(Path, PRIVATE),
                                                 *sorted(binds)])])]
        if copies:
            rel = [_q(p.relative_to("/")) for p in sorted(copies)]  # cp --parents fails on some absolute paths
            lines.append(" ".join(["cd / && cp -a --parents", *rel, '"$R"']))
        lines += [f"mount --rbind -o ro {_q(p)} {_r(p)}" for p in sorted(binds)]
        # a hidden folder inside a visible one (a course below /usr, Ember installed in site-packages)
        lines += [f"mount -t tmpfs -o ro,size=4k,mode=0 ember-hidden {_r(h)}" for h in covered
                  if any(_inside(q, h) for q in binds)]
        lines.append('mount -t proc proc "$R/proc"')
        lines += [f'mount -t tmpfs -o size={self.limits.tmp},mode=1777,nosuid,nodev ember-tmp "$R"{d}'
                  for d in PRIVATE]
        return lines

    # ----------------------------------------------------------------------- submissions
    def add_submission(self, name: str, src: Path, ref: str | None = None) -> Path:
        """A private copy of a submission (a git repository checked out at ref, if given)."""
        n = next(self.subs)
        if n >= BLOCK_GIDS:
            raise OSError(f"more than {BLOCK_GIDS - 1} submissions in one grading")
        if src.is_symlink():  # eve -> ../bob, or -> /root
            raise ValueError("is a link, not a folder of its own")
        dest = self.root / f"sub{n}"
        if ref is not None:
            self._clone(src, ref, dest)
        else:
            _copy(src, dest, self.limits.copy)
        self.groups[dest] = GID_BASE + self.block * BLOCK_GIDS + n
        self._own(dest, 0, writable=False)
        return dest

    def _clone(self, src: Path, ref: str, dest: Path) -> None:
        """Check out ref of a real repository: .git a folder, no gitdir link, no borrowed objects; its
        config and hooks are not used (the clone is made from a capped copy of .git holding neither)."""
        dotgit = src / ".git"
        if dotgit.is_symlink() or not dotgit.is_dir():
            raise ValueError("its .git is not a folder (a link to another repository?): only real repositories "
                             "are cloned")
        bare = self.root / f"git{dest.name}"
        _copy(dotgit, bare, self.limits.copy, links=False)
        try:
            for borrowed in ("objects/info/alternates", "objects/info/http-alternates", "commondir"):
                if (bare / borrowed).exists():
                    raise ValueError(f"its .git has {borrowed} (objects of another repository): refused")
            for own in ("config", "hooks", "info"):
                _rmtree(bare / own) if (bare / own).is_dir() else (bare / own).unlink(missing_ok=True)
            (bare / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")
            git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(bare), "GIT_CONFIG_NOSYSTEM": "1"}

            def step(args: list[str]) -> str:
                try:
                    proc = subprocess.run(git + args, capture_output=True, text=True, timeout=300, env=env)
                except subprocess.TimeoutExpired:
                    raise OSError(f"cannot check out '{ref}': git took more than 300 s") from None
                if proc.returncode != 0:
                    raise OSError(f"cannot check out '{ref}': {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}")
                return proc.stdout
            step(["-c", "protocol.file.allow=always", "clone", "--quiet", "--no-hardlinks", "--no-checkout",
                  "--depth", "1", "--branch", ref, f"file://{bare}", str(dest)])
            tree = step(["-C", str(dest), "ls-tree", "-r", "-l", "-z", "HEAD"]).split("\0")
            sizes = [rec.split("\t")[0].split()[3] for rec in tree if rec]
            if sum(int(s) + 512 for s in sizes if s.isdigit()) > self.limits.copy:
                raise ValueError(f"its checkout is larger than the copy cap of {self.limits.copy >> 20} MiB")
            step(["-C", str(dest), "checkout", "--quiet", "--force", "HEAD"])
        except BaseException:
            _rmtree(dest)
            raise
        finally:
            _rmtree(bare)

    def _own(self, folder: Path, uid: int, writable: bool) -> int:
        """Give folder to uid and the submission's group: writable for its build, else read-only.
        Returns its size as _copy counts it."""
        if os.geteuid() != 0:
            return 0
        gid, size = self.groups[folder], 0
        top = ("entry", None, str(folder), os.lstat(folder))
        for kind, parent, name, st in itertools.chain([top], _walk(os.open(folder, DIR_FLAGS))):
            if kind == "up" or st is None:
                continue
            size += _bytes(st)
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode):
                x = stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR
                os.chmod(name, (0o770 if writable else 0o750) if x else (0o660 if writable else 0o640), dir_fd=parent)
        return size

    # ------------------------------------------------------------------------------ runs
    def run(self, cmd: list[str], files: dict[str, bytes] | None = None, submission: Path | None = None,
            wall: float | None = None, build: bool = False, trusted: bool = False) -> Result:
        """Run cmd in a fresh folder holding files ('{dir}' in cmd names that folder), removed
        afterwards. build=True runs in the submission's own folder, writable for the run.
        trusted: the reference compiler, run as the grader (same folder, limits and timeout)."""
        uid, n = self.slots.get(), next(self.ids)
        work = submission if build and submission else self.root / f"run{n}"
        contained = not trusted and self.level != "rlimits"
        cgroups: list[Path] = []
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
            cgroups = self._make_cgroups(n) if contained else []
            cmd = [c.replace("{dir}", str(work)) for c in cmd]
            full = self._command(cmd, work, uid, submission, cgroups) if contained else self._limited(cmd)
            result = self._spawn(full, cmd[0], work, wall or self.limits.wall, contained)
        finally:
            self._sweep(uid, cgroups)
            size = self._own(work, 0, writable=False) if build and contained else 0
            if not build:
                _rmtree(work)
            self.slots.put(uid)
        if size > self.limits.copy:  # what a build leaves is capped as a copy is
            _rmtree(work)
            result.status, result.killed = None, f"its folder grew past the copy cap of {self.limits.copy >> 20} MiB"
        return result

    def _make_cgroups(self, n: int) -> list[Path]:
        """The run's cgroups, made and limited."""
        made = []
        for parent, kind in self.cgroups:
            g = parent / (f"ember-{self.block}-{n}" if kind == "v1" else f"{self.block}-{n}")
            try:
                g.mkdir(exist_ok=True)
            except OSError:
                continue
            made.append(g)
            files = {"memory.max": self.limits.memory, "memory.swap.max": 0, "pids.max": self.limits.processes,
                     "memory.limit_in_bytes": self.limits.memory, "memory.memsw.limit_in_bytes": self.limits.memory}
            for f, v in files.items():
                if (g / f).exists():
                    (g / f).write_text(str(v))
        return made

    def _remove_cgroups(self, groups: list[Path]) -> None:
        for g in groups:
            for _ in range(200):  # its processes may take a moment to die
                try:
                    if (g / "cgroup.kill").exists():
                        (g / "cgroup.kill").write_text("1")
                    else:
                        for pid in (g / "cgroup.procs").read_text().split():
                            os.kill(int(pid), signal.SIGKILL)
                    g.rmdir()
                    break
                except (ProcessLookupError, FileNotFoundError):
                    if not g.exists():
                        break
                except OSError:
                    time.sleep(0.01)

    def _env(self, work: Path, contained: bool) -> dict[str, str]:
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        if not contained:  # the reference compiler: Ember from where the grader runs it, and its compile cache
            env["PYTHONPATH"] = os.pathsep.join([str(EMBER.parent)] + [env[k] for k in ["PYTHONPATH"] if k in env])
            env["EMBER_CACHE"] = str(cache_root())
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.update(HOME=str(work), TMPDIR=str(work), LANG=env.get("LANG", "C.UTF-8"))
        # the runs at once share the cores: each run's OpenMP threads (any compiler's) get a share
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // len(self.uids)))
        return env

    def _limited(self, cmd: list[str]) -> list[str]:
        lim = self.limits
        if not shutil.which("prlimit"):
            return cmd
        return ["prlimit", f"--cpu={lim.cpu}", f"--data={lim.memory}", f"--fsize={lim.file_size}",
                f"--nproc={lim.processes}", "--core=0", "--"] + cmd

    def _command(self, cmd: list[str], work: Path, uid: int, submission: Path | None, cgroups: list[Path]) -> list[str]:
        """cmd as the run's user, in its cgroups and (at the namespaces level) in its view."""
        gid = self.groups.get(submission, GID_BASE) if submission else GID_BASE
        drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"] + self._limited(cmd)
        script = ["set -e"] + [f"echo 0 > {_q(g / 'cgroup.procs')}" for g in cgroups]
        if self.level == "namespaces":
            script += [f"R={_q(self.root / 'view')}"] + self.view
            if sub := submission:  # read-only, but for its own build
                mode = "rw" if sub == work else "ro"
                script.append(f"mkdir -p {_r(sub)} && mount --bind -o {mode},nosuid {_q(sub)} {_r(sub)}")
            if submission != work:  # the run folder: a capped tmpfs holding a copy of the grader's files
                script.append(f"mkdir -p {_r(work)} && mount -t tmpfs -o size={self.limits.tmp},mode=700,uid={uid},"
                              f"gid={gid},nosuid,nodev ember-run {_r(work)} && cp -a {_q(work)}/. {_r(work)}")
            script += ["mount -o remount,ro,bind \"$R\"", "cd \"$R\" && pivot_root . .old && umount -l /.old"]
        script.append(f'cd {_q(work)} && exec "$@"')
        body = ["sh", "-c", "\n".join(script), "sh"] + drop
        return NAMESPACES + body if self.level == "namespaces" else body

    def _spawn(self, full: list[str], name: str, work: Path, wall: float, contained: bool) -> Result:
        start, cpu0 = time.monotonic(), _children_cpu()
        try:
            proc = subprocess.Popen(full, cwd=work, env=self._env(work, contained), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            return Result(None, "", f"cannot start {name}: {e.strerror}", None, 0.0)
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
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # unshare dies, and with it the namespace's processes
            except ProcessLookupError:
                pass
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
        status = None if killed else proc.returncode
        return Result(status, out.decode(errors="replace"), err.decode(errors="replace"), killed,
                      time.monotonic() - start, _children_cpu() - cpu0)

    def _sweep(self, uid: int, cgroups: list[Path]) -> None:
        """Kill every process of the run: its cgroups, then every process of its user (those that left
        the process group too), again until none is left. Without the view, also remove what the user
        left at the top of the shared temporary folders, so the next submission on this uid finds nothing."""
        self._remove_cgroups(cgroups)
        if os.geteuid() != 0 or self.level == "rlimits":
            return
        for _ in range(100):
            subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={GID_BASE}", "--clear-groups", "--",
                            "kill", "-9", "-1"], capture_output=True)
            if subprocess.run(["pgrep", "-u", str(uid)], capture_output=True).returncode != 0:
                break
            time.sleep(0.02)
        if self.level == "user":
            for shared in PRIVATE:
                for e in os.scandir(shared) if os.path.isdir(shared) else []:
                    if e.stat(follow_symlinks=False).st_uid == uid:
                        _rmtree(Path(e.path)) if e.is_dir(follow_symlinks=False) else os.unlink(e.path)

    def close(self) -> None:
        for uid in self.uids:
            self._sweep(uid, [])
        _rmtree(self.root)
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None
