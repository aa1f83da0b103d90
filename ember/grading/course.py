"""The course's week (docs/grading.md): the roster of students and teams, `ember collect` (every
repository fetched at the week's tag, at the moment it runs, into a log the grader owns) with the
syllabus's late days, and the submissions that `ember grade` and `ember bench` take from a collection.

Students control their repositories and their commit dates, so only the grader's own fetch counts:
the commits it got are kept in the state folder and, per week, as git bundles beside
collection.json, so that grading and regrading reproduce the same figures from them.
"""
from __future__ import annotations

import argparse
import csv
import fcntl
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

from .reports import _write_json

COURSE_TZ = ZoneInfo("America/New_York")  # a deadline without an offset is local time there
LATE_DAYS = 3
LATE_WINDOW = timedelta(hours=24)  # one late day: 24 hours of elapsed time, across a clock change too
HEADER = ("student", "team", "repo", "extra_late_days")
PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")

REFERENCE = "reference"   # the submission Ember itself takes part as


class CourseError(ValueError):
    """A bad roster, option, collection or state folder: its lines are printed as they are, status 2."""


@dataclass
class Student:
    name: str
    team: str
    repo: str
    extra: int


def read_roster(path: Path) -> dict[str, list[Student]]:
    """{NAME: its students}, NAME being the team or the student who works alone. Every problem
    is one line `FILE:LINE: message`."""
    try:
        rows = csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"), newline=""))  # -sig: a spreadsheet's BOM
        header = [c.strip() for c in next(rows, [])]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise CourseError(f"{path}: cannot read the roster: {e}") from None
    if set(header) - set(HEADER) or len(set(header)) < len(header) or not {"student", "team", "repo"} <= set(header):
        raise CourseError(f"{path}:1: the header must be {','.join(HEADER)} (extra_late_days may be left out), "
                          f"not {','.join(header)}")
    problems = []
    students: dict[str, tuple[Student, int]] = {}
    for row in rows:
        line = rows.line_num
        if not any(c.strip() for c in row):
            continue
        if header[-1] == "extra_late_days" and len(row) == len(header) - 1:
            row.append("")  # the optional last column left out
        if len(row) != len(header):
            problems.append(f"{path}:{line}: {len(row)} fields where the header has {len(header)}")
            continue
        f = {k: v.strip() for k, v in zip(header, row)}
        extra = f.get("extra_late_days") or "0"
        for what, value in (("student", f["student"]), ("team", f["team"])):
            if value and (not PLAIN.fullmatch(value) or value == REFERENCE):
                problems.append(f"{path}:{line}: {what} '{value}' must be a plain name (letters, digits, . _ -), "
                                f"not 'reference'")
        if not f["student"]:
            problems.append(f"{path}:{line}: no student name")
        elif f["student"] in students:
            problems.append(f"{path}:{line}: student '{f['student']}' is listed twice "
                            f"(first on line {students[f['student']][1]})")
        elif f["repo"].startswith("-"):
            problems.append(f"{path}:{line}: repo '{f['repo']}' is not a URL or a path")
        else:
            whole = re.fullmatch(r"[+-]?\d{1,3}", extra)  # negative: days taken away (a student who joins late)
            if not whole:
                problems.append(f"{path}:{line}: extra_late_days '{extra}' is not a whole number")
            students[f["student"]] = (Student(f["student"], f["team"], f["repo"], int(extra) if whole else 0), line)
    roster: dict[str, list[Student]] = {}
    for s, line in students.values():
        name = s.team or s.name
        if s.team and s.team in students:
            problems.append(f"{path}:{line}: team '{s.team}' has the name of a student")
        elif not s.team and name in roster:
            problems.append(f"{path}:{line}: student '{name}' has the name of a team")
        elif len(roster.get(name, [])) == 2:
            problems.append(f"{path}:{line}: team '{name}' has more than two students")
        else:
            roster.setdefault(name, []).append(s)
    for name, team in roster.items():  # a team's repository may be given on one partner's line only
        repos = {s.repo.removeprefix("file://").rstrip("/"): s for s in team if s.repo}
        if len(repos) != 1:
            line = students[team[-1].name][1]
            problems.append(f"{path}:{line}: " + (f"team '{name}': its partners name different repos" if repos
                                                  else f"student '{team[-1].name}' has no repo URL"))
        for s in team:
            s.repo = s.repo or team[0].repo or team[-1].repo
    if problems:  # in the file's order
        raise CourseError("\n".join(sorted(problems, key=lambda p: int(p[len(str(path)) + 1:].split(":")[0]))))
    if not roster:
        raise CourseError(f"{path}:2: the roster names no student")
    return roster


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 time; without an offset, local time in America/New_York (daylight saving included)."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise CourseError(f"{option} '{text}': not an ISO 8601 time (2027-03-17T10:00, 2027-03-17T14:00Z)") from None
    # in UTC, so that adding 24 hours adds 24 elapsed hours (aware arithmetic in one zone is wall-clock)
    return (t.replace(tzinfo=COURSE_TZ) if t.tzinfo is None else t).astimezone(timezone.utc)


def show(t: datetime) -> str:
    return t.astimezone(COURSE_TZ).isoformat()


# --------------------------------------------------------------------------------- git

GIT_SAFE = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "protocol.allow=never",
            "-c", "protocol.https.allow=always", "-c", "protocol.ssh.allow=always",
            "-c", "protocol.file.allow=always", "-c", "transfer.fsckObjects=true", "-c", "submodule.recurse=false",
            "-c", "fetch.recurseSubmodules=false", "-c", "credential.interactive=false"]


def git(gitdir: Path, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run git on the grader's own repository gitdir: (status, stdout or the last line of stderr).
    The whole process group (upload-pack, ssh) is killed at the timeout."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_ASKPASS": "/bin/false", **(env or {})}
    proc = subprocess.Popen(["git", *GIT_SAFE, f"--git-dir={gitdir}", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return -1, f"timed out after {timeout:g} s"
    last = (err.strip().splitlines() or [""])[-1]
    return proc.returncode, out if proc.returncode == 0 else last


def source_url(repo: str, base: Path) -> str:
    """The URL to fetch. A local repository (a path or file:// URL) is checked first, and fetched
    through the file protocol (a pack, never its files or hardlinks): it is refused when its .git
    is a file (gitdir) or a link, or when it borrows objects (alternates)."""
    if "://" in repo and not repo.startswith("file://") or re.match(r"[\w.-]+@[\w.-]+:", repo):
        return repo  # https, ssh: protocol.allow=never refuses any other
    local = Path(repo[len("file://"):] if repo.startswith("file://") else repo)
    local = local if local.is_absolute() else base / local
    dotgit = local / ".git"
    if dotgit.is_symlink() or dotgit.is_file():
        raise CourseError(f"{repo}: its .git is a file or a link (gitdir): refused")
    gitdir = dotgit if dotgit.is_dir() else local
    if not (gitdir / "objects").is_dir():
        raise CourseError(f"{repo}: no git repository there")
    info = gitdir / "objects" / "info"
    if (gitdir / "objects").is_symlink() or (gitdir / "commondir").exists() or (info / "alternates").exists() \
            or (info / "http-alternates").exists():
        raise CourseError(f"{repo}: it borrows objects from another repository (alternates): refused")
    return f"file://{local.resolve()}"


def fetch(url: str, tag: str, store: Path, timeout: float) -> tuple[str | None, str | None, str]:
    """(commit, tag object, problem): the tag's target commit fetched into the grader's store."""
    if not store.exists():
        store.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        code, err = git(store, "init", "--quiet", "--bare")
        if code:
            raise OSError(f"cannot create {store}: {err}")
    code, err = git(store, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--", url,
                    f"+refs/tags/{tag}:refs/ember/fetched", timeout=timeout)
    if code:
        return None, None, (f"no tag '{tag}'" if "couldn't find remote ref" in err else f"cannot fetch: {err}")
    code, obj = git(store, "rev-parse", "--verify", "refs/ember/fetched")
    code2, commit = git(store, "rev-parse", "--verify", "--quiet", "refs/ember/fetched^{commit}")
    if code or code2:
        return None, None, f"tag '{tag}' does not point at a commit"
    commit = commit.strip()
    git(store, "update-ref", f"refs/ember/commits/{commit}", commit)  # kept: what the grader got
    return commit, obj.strip(), ""


def checkout(bundle: Path, commit: str, dest: Path) -> None:
    """Write the files of `commit`, from a collection's bundle, into the new folder dest."""
    with tempfile.TemporaryDirectory() as tmp:
        g = Path(tmp) / "g.git"
        code, err = git(g, "init", "--quiet", "--bare")
        code = code or git(g, "fetch", "--quiet", "--no-tags", str(bundle), f"refs/ember/commits/{commit}:refs/c")[0]
        got = git(g, "rev-parse", "--verify", "refs/c^{commit}")[1].strip() if code == 0 else None
        if got != commit:
            raise CourseError(f"{bundle}: does not hold the collected commit {commit}")
        dest.mkdir()
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        for args in (("read-tree", commit), ("checkout-index", "--all")):
            code, err = git(g, f"--work-tree={dest}", *args, env=index)
            if code:
                raise CourseError(f"{bundle}: cannot check out {commit}: {err}")


# ------------------------------------------------------------------------------- state

def _private(path: Path) -> None:
    st = path.stat()
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_uid != os.geteuid():
        raise CourseError(f"--state {path}: writable by others than the grader: refused (chmod go-w)")


def balances(roster: dict[str, list[Student]], state: dict[str, Any]) -> dict[str, int]:
    """Late days left: LATE_DAYS plus extensions, less the charges of every week (the state's)."""
    used = Counter(s for week in state["weeks"].values() for e in week["submissions"].values() for s in e["charged"])
    return {s.name: LATE_DAYS + s.extra - used[s.name] for team in roster.values() for s in team}


def _entry(commit: str | None, at: str, note: str, late: bool = False, on_time: str | None = None,
           on_time_at: str | None = None, charged: list[str] | None = None) -> dict[str, Any]:
    return {"commit": commit, "fetched_at": at, "late": late, "note": note, "on_time": on_time,
            "on_time_at": on_time_at, "charged": charged or []}


def decide(old: dict[str, Any] | None, got: tuple[str | None, str | None, str], now: datetime,
           deadline: datetime, partners: list[str], left: dict[str, int]) -> tuple[dict[str, Any], str]:
    """The syllabus's rules: a submission's new entry in the state after a collection at `now`
    (`got` from `fetch`), and what this collection adds to its note."""
    commit, _, problem = got
    at = show(now)
    if old is not None and old["commit"] is not None and commit in (None, old["commit"]):
        return old, f"at {at}: {problem}; the collection of {old['fetched_at']} stands" if commit is None else ""
    if now <= deadline:  # a recorded commit is never erased, but the last on-time one counts
        return _entry(commit, at, problem or "on time", on_time=commit, on_time_at=at if commit else None), ""
    if commit is None:
        return _entry(None, at, f"{problem} (at {at}, after the deadline)"), ""
    on_time, on_time_at = (old["on_time"], old["on_time_at"]) if old else (None, None)
    moved = "moved" if on_time else "appeared"
    if old is not None and commit == on_time:
        return _entry(commit, on_time_at, "on time: the tag went back to the on-time commit, so the late day "
                      "charged is given back", on_time=on_time, on_time_at=on_time_at), ""
    if old is not None and old["late"]:
        return {**old, "commit": commit, "fetched_at": at}, ""
    short = [s for s in partners if left[s] < 1]
    if short:
        kept = f"the on-time collection of {on_time_at} stands" if on_time else "nothing is collected"
        return {**(old or _entry(None, at, "")), "note": f"the tag {moved} after the deadline (at {at}) but "
                f"{', '.join(short)} has no late day left: {kept}, and nobody is charged"}, ""
    return _entry(commit, at, f"late: the tag {moved} after the deadline; one late day charged to "
                  f"{', '.join(partners)}", True, on_time, on_time_at, list(partners)), ""


def cmd_collect(args: argparse.Namespace) -> int:
    try:
        return _collect(args)
    except CourseError as e:
        print(e, file=sys.stderr)
        return 2


def _collect(args: argparse.Namespace) -> int:
    roster_path = Path(args.roster)
    roster = read_roster(roster_path)
    deadline = parse_time(args.deadline, "--deadline")
    now = parse_time(args.now, "--now") if args.now else datetime.now(timezone.utc)
    if not TAG.fullmatch(args.tag) or ".." in args.tag:
        raise CourseError(f"--tag '{args.tag}': not a plain tag name")
    if args.week < 1:
        raise CourseError(f"--week {args.week}: weeks are numbered from 1")
    folder, out = Path(args.state), Path(args.out)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(folder)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one collection at a time writes the state
        state_file = folder / "state.json"
        if state_file.exists():
            _private(state_file)
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError) as e:
                raise CourseError(f"{state_file}: not a state file: {e}") from None
        else:
            state = {"weeks": {}}
        key = f"{args.kind} week {args.week}"
        week = state["weeks"].setdefault(key, {"tag": args.tag, "deadline": show(deadline), "collected_at": [],
                                               "submissions": {}, "log": []})
        if (week["tag"], week["deadline"]) != (args.tag, show(deadline)):
            raise CourseError(f"{state_file}: {key} was collected with --tag {week['tag']} --deadline "
                              f"{week['deadline']}, not {args.tag} {show(deadline)}")
        latest = max((parse_time(t, "state") for t in week["collected_at"]), default=now)
        why = ("tests are never late" if args.kind == "tests" and now > deadline else
               "more than 24 h after the deadline" if now > deadline + LATE_WINDOW else
               f"before the latest collection ({show(latest)})" if now < latest else None)
        closed = why is not None  # a replay of an earlier collection changes nothing either
        names = sorted(roster)
        got: dict[str, tuple[str | None, str | None, str]] = {}
        if not closed:
            def one(name: str) -> tuple[str | None, str | None, str]:
                try:
                    url = source_url(roster[name][0].repo, roster_path.parent)
                except CourseError as e:
                    return None, None, str(e)
                return fetch(url, args.tag, folder / "repos" / f"{name}.git", args.git_timeout)
            with ThreadPoolExecutor(max_workers=8) as pool:
                got = dict(zip(names, pool.map(one, names)))
        report = {}
        for name in names:
            old = week["submissions"].get(name)
            if closed:
                entry, event = old, f"collected again at {show(now)}, {why}: nothing changes"
                if old is None:
                    entry = {"commit": None, "fetched_at": show(now), "late": False, "note": "not collected in time"}
            else:
                entry, event = decide(old, got[name], now, deadline, [s.name for s in roster[name]],
                                      balances(roster, state))
                week["submissions"][name] = entry
                log = {"at": show(now), "name": name, "commit": got[name][0], "tag_object": got[name][1],
                       "problem": got[name][2] or None}
                if log not in week["log"]:
                    week["log"].append(log)
            report[name] = {"commit": entry["commit"], "fetched_at": entry["fetched_at"], "late": entry["late"],
                            "note": "; ".join(n for n in (entry["note"], event) if n)}
        if not closed:
            if show(now) not in week["collected_at"]:
                week["collected_at"].append(show(now))
            state["late_days"] = balances(roster, state)
            _write_json(state_file, state)
    out.mkdir(parents=True, exist_ok=True)
    (out / "repos").mkdir(mode=0o700, exist_ok=True)
    for name, entry in report.items():  # the collected commits, for grading and regrading
        bundle = out / "repos" / f"{name}.bundle"
        bundle.unlink(missing_ok=True)
        if entry["commit"]:
            code, err = git(folder / "repos" / f"{name}.git", "bundle", "create", "--quiet", str(bundle),
                            f"refs/ember/commits/{entry['commit']}")
            if code:
                raise OSError(f"cannot write {bundle}: {err}")
        if args.checkout and entry["commit"]:  # the files, e.g. a tests week's for `ember grade --tests`
            tree = Path(args.checkout) / name
            if tree.exists():
                shutil.rmtree(tree)
            tree.parent.mkdir(parents=True, exist_ok=True)
            checkout(bundle, entry["commit"], tree)
    _write_json(out / "collection.json", {"submissions": report, "late_days": balances(roster, state)})
    _write_json(out / "log.json", week["log"])
    for name, e in report.items():
        print(f"{name}: {(e['commit'] or 'nothing')[:12]}{' (late)' if e['late'] else ''}: {e['note']}")
    print(f"collected {sum(e['commit'] is not None for e in report.values())} of {len(report)} submissions: "
          f"{out / 'collection.json'}")
    return 0


# ------------------------------------------------------------ grading from a collection

class Source(NamedTuple):
    name: str
    path: Path | None          # a folder, a git repository (checked out at --ref) or a collection's bundle
    commit: str | None = None  # with a bundle: the collected commit
    problem: str | None = None  # why there is nothing to grade


def read_collection(folder: Path) -> dict[str, Any]:
    try:
        coll = json.loads((folder / "collection.json").read_text())
        assert isinstance(coll["submissions"], dict) and isinstance(coll["late_days"], dict)
        return coll
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
        raise CourseError(f"--collection {folder}: no collection.json of `ember collect` there ({e})") from None


def sources(args: argparse.Namespace) -> tuple[list[Source], list[Path]]:
    """The submissions `ember grade` and `ember bench` take: a folder's subfolders, or a roster's
    NAMEs at their collected commits; and the folders that runs must not see."""
    if args.roster is None:
        folder = Path(args.submissions)
        if not folder.is_dir():
            raise CourseError(f"ember {args.cmd}: --submissions {folder} is not a folder")
        found = [Source(p.name, p) for p in sorted(folder.iterdir()) if p.is_dir() and not p.name.startswith(".")]
        if any(s.name == REFERENCE for s in found):  # one student's folder name must not stop a week's grading
            print(f"ember {args.cmd}: {folder / REFERENCE}: not graded: the name '{REFERENCE}' is kept for Ember "
                  "itself (rename the folder)", file=sys.stderr)
            found = [s for s in found if s.name != REFERENCE]
        hide = [folder]
    else:
        if args.collection is None:
            raise CourseError(f"ember {args.cmd}: --roster needs --collection DIR (what `ember collect` wrote)")
        roster, folder = read_roster(Path(args.roster)), Path(args.collection)
        coll = read_collection(folder)["submissions"]
        if set(roster) - set(coll):
            raise CourseError(f"--collection {folder}: has no entry for {', '.join(sorted(set(roster) - set(coll)))} "
                              f"(collected with another roster?)")
        found = [Source(n, folder / "repos" / f"{n}.bundle", coll[n]["commit"],
                        None if coll[n]["commit"] else f"nothing collected: {coll[n]['note']}") for n in sorted(roster)]
        hide = [folder]
    published = getattr(args, "compare_to", None)
    if published and not (Path(published) / "grade.json").is_file():
        raise CourseError(f"ember {args.cmd}: --compare-to {published} has no grade.json")
    unknown = set(args.only or []) - {s.name for s in found}
    if unknown:
        raise CourseError(f"ember {args.cmd}: --only {', '.join(sorted(unknown))}: no such submission")
    return [s for s in found if not args.only or s.name in args.only], hide


def copy_in(sandbox: Any, src: Source, ref: str | None) -> Path:
    """The sandbox's private copy of a submission (sandbox.Sandbox.add_submission)."""
    if src.problem or src.path is None:
        raise CourseError(src.problem or "nothing to grade")
    if src.commit is None:
        return sandbox.add_submission(src.name, src.path, ref if (src.path / ".git").exists() else None)
    with tempfile.TemporaryDirectory() as tmp:  # removed before any run starts
        checkout(src.path, src.commit, Path(tmp) / src.name)
        return sandbox.add_submission(src.name, Path(tmp) / src.name)
