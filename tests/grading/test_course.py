"""The course's week: the roster, `ember collect` with late days across the March clock change,
hostile and broken repositories, and grading, publishing and regrading from a collection."""
from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.cli import main
from ember.grading.course import decide

D1 = "2027-03-13T10:00"  # Saturday, EST (15:00Z); its 24 late hours end on Sunday 11:00 EDT, after the change
D2 = "2027-03-17T10:00"  # Wednesday, EDT: 14:00Z


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repo), *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, files: dict[str, str] | None = None) -> str:
    """A new commit in repo (made on first use), its files executable."""
    if not repo.exists():
        repo.mkdir(parents=True)
        git(repo, "init", "-q")
    for name, text in (files or {"n": str(len(list(repo.iterdir())))}).items():
        (repo / name).write_text(text)
        (repo / name).chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "work")
    return git(repo, "rev-parse", "HEAD")


def tag(repo: Path, name: str = "week1", files: dict[str, str] | None = None, annotated: bool = False) -> str:
    sha = commit(repo, files)
    git(repo, "tag", "-f", *(["-a", "-m", "hand-in"] if annotated else []), name)
    return sha


def roster(tmp: Path, rows: list[str]) -> Path:
    path = tmp / "roster.csv"
    path.write_text("student,team,repo,extra_late_days\n" + "".join(r + "\n" for r in rows))
    return path


def collect(tmp: Path, now: str, deadline: str = D1, week: int = 1, tagname: str = "week1", *extra: str,
            out: str = "out") -> dict:
    code = main(["collect", "--roster", str(tmp / "roster.csv"), "--week", str(week), "--tag", tagname,
                 "--deadline", deadline, "--state", str(tmp / "state"), "--out", str(tmp / out), "--now", now, *extra])
    assert code == 0
    return json.loads((tmp / out / "collection.json").read_text())


def test_roster_problems_are_file_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = roster(tmp_path, ["ann,,r1,", "bob,t,r2,x", "ann,,r3,", "cy,t,r2,", "di,t,r2,", "eve,,r4,1,2", "fay,,,"])
    assert main(["collect", "--roster", str(path), "--week", "1", "--tag", "w", "--deadline", D1,
                 "--state", str(tmp_path / "s"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{path}:3: extra_late_days 'x' is not a whole number",
                   f"{path}:4: student 'ann' is listed twice (first on line 2)",
                   f"{path}:6: team 't' has more than two students",
                   f"{path}:7: 5 fields where the header has 4",
                   f"{path}:8: student 'fay' has no repo URL"], err
    path.write_text("\ufeffstudent,team,repo\nann,,r1,0\n")  # a spreadsheet's byte-order mark is fine
    assert main(["grade", "--tests", str(tmp_path), "--roster", str(path), "--collection", str(tmp_path),
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"{path}:2: 4 fields where the header has 3")
    path.write_text("student,team,repo,late\nann,,r1,0\n")
    assert main(["grade", "--tests", str(tmp_path), "--roster", str(path), "--collection", str(tmp_path),
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"{path}:1: the header must be student,team,repo,extra_late_days")


def test_a_semester_of_late_days_across_the_clock_change(tmp_path: Path) -> None:
    a, b = tmp_path / "alice", tmp_path / "bc"
    roster(tmp_path, [f"alice,,{a}", f"bob,bc,{b},1", f"carol,bc,file://{b},"])
    # week 1: alice moves her tag before the deadline, the team after it (23.5 elapsed hours later, on the
    # wall clock 24.5 hours: the clocks went forward at 2 AM on March 14), alice again 25 hours after
    tag(a)
    a1 = tag(a)
    b1 = tag(b)
    c = collect(tmp_path, "2027-03-13T10:00:00-05:00")
    assert c["submissions"]["alice"] == {"commit": a1, "fetched_at": "2027-03-13T10:00:00-05:00", "late": False,
                                         "note": "on time"}
    b2 = tag(b)
    c = collect(tmp_path, "2027-03-14T10:30")
    assert c["submissions"]["bc"]["commit"] == b2 and c["submissions"]["bc"]["late"] is True
    assert c["submissions"]["bc"]["fetched_at"] == "2027-03-14T10:30:00-04:00"
    assert "charged to bob, carol" in c["submissions"]["bc"]["note"]
    assert c["late_days"] == {"alice": 3, "bob": 3, "carol": 2}
    tag(a)
    c = collect(tmp_path, "2027-03-14T16:00Z")  # 25 hours after the deadline
    assert c["submissions"]["alice"]["commit"] == a1 and not c["submissions"]["alice"]["late"]
    assert "more than 24 h after the deadline: nothing changes" in c["submissions"]["alice"]["note"]
    assert c["late_days"] == {"alice": 3, "bob": 3, "carol": 2} and c["submissions"]["bc"]["commit"] == b2
    assert b1 != b2
    # week 2: the deadline is EDT (14:00Z); 14:30Z is late, though it is before 10 AM EST
    tag(b, "week2")
    c = collect(tmp_path, "2027-03-17T09:00", D2, 2, "week2")
    assert c["submissions"]["alice"] == {"commit": None, "fetched_at": "2027-03-17T09:00:00-04:00", "late": False,
                                         "note": "no tag 'week2'"}
    a3, b3 = tag(a, "week2"), tag(b, "week2")
    c = collect(tmp_path, "2027-03-17T14:30Z", D2, 2, "week2")
    assert c["submissions"]["alice"]["commit"] == a3 and "appeared after the deadline" in c["submissions"]["alice"]["note"]
    assert c["submissions"]["bc"]["commit"] == b3
    assert c["late_days"] == {"alice": 2, "bob": 2, "carol": 1}
    # weeks 3 and 4: carol spends her last late day, then the team's late tag is refused for both
    for week, day, expect_late in ((3, 24, True), (4, 31, False)):
        on_time = tag(b, f"week{week}")
        deadline = f"2027-03-{day}T10:00"
        collect(tmp_path, f"2027-03-{day}T09:59", deadline, week, f"week{week}")
        late = tag(b, f"week{week}")
        c = collect(tmp_path, f"2027-03-{day}T20:00", deadline, week, f"week{week}")
        assert c["submissions"]["bc"]["commit"] == (late if expect_late else on_time), week
        assert c["submissions"]["bc"]["late"] is expect_late
    assert c["submissions"]["bc"]["note"].startswith("the tag moved after the deadline")
    assert "carol has no late day left: the on-time collection of 2027-03-31T09:59:00-04:00 stands, and nobody is " \
           "charged" in c["submissions"]["bc"]["note"]
    assert c["late_days"] == {"alice": 2, "bob": 1, "carol": 0}
    # a negative extension takes days away: a partner without late days from the start
    roster(tmp_path, [f"alice,,{a},-2", f"bob,bc,{b},1", f"carol,bc,{b},"])
    assert collect(tmp_path, "2027-03-31T20:00", "2027-03-31T10:00", 4, "week4")["late_days"]["alice"] == 0
    # a tag that appears late for a partner without late days: nothing is collected
    tag(a, "week5"), tag(b, "week5")
    c = collect(tmp_path, "2027-04-07T11:00", "2027-04-07T10:00", 5, "week5")
    assert c["submissions"]["bc"]["commit"] is None and "nothing is collected" in c["submissions"]["bc"]["note"]
    assert c["submissions"]["alice"]["commit"] is None and "alice has no late day" in c["submissions"]["alice"]["note"]
    assert c["late_days"] == {"alice": 0, "bob": 1, "carol": 0}


def test_collecting_again_changes_nothing(tmp_path: Path) -> None:
    a = tmp_path / "a"
    roster(tmp_path, [f"ann,,{a},"])
    tag(a)
    collect(tmp_path, "2027-03-13T09:00")
    tag(a)
    first = collect(tmp_path, "2027-03-13T12:00")
    state = (tmp_path / "state" / "state.json").read_text()
    assert collect(tmp_path, "2027-03-13T12:00") == first and first["late_days"] == {"ann": 2}
    assert (tmp_path / "state" / "state.json").read_text() == state
    replay = collect(tmp_path, "2027-03-13T09:00")  # an earlier collection, replayed: nothing changes
    assert replay["submissions"]["ann"]["commit"] == first["submissions"]["ann"]["commit"]
    assert "before the latest collection" in replay["submissions"]["ann"]["note"]
    assert (tmp_path / "state" / "state.json").read_text() == state
    tag(a)  # moving it again within the 24 hours: the newest commit, still one late day
    again = collect(tmp_path, "2027-03-13T18:00")
    assert again["submissions"]["ann"]["late"] and again["late_days"] == {"ann": 2}
    assert again["submissions"]["ann"]["commit"] != first["submissions"]["ann"]["commit"]


def test_tests_are_never_late(tmp_path: Path) -> None:
    a = tmp_path / "a"
    roster(tmp_path, [f"ann,,{a},"])
    t1 = tag(a)
    collect(tmp_path, "2027-03-15T10:00", "2027-03-15T10:00", 1, "week1", "--kind", "tests")
    tag(a)
    c = collect(tmp_path, "2027-03-15T10:05", "2027-03-15T10:00", 1, "week1", "--kind", "tests", "--checkout",
                str(tmp_path / "tests"))
    assert git(tmp_path / "a", "show", f"{t1}:n") == (tmp_path / "tests" / "ann" / "n").read_text()
    assert c["submissions"]["ann"]["commit"] == t1 and c["late_days"] == {"ann": 3}
    assert "tests are never late" in c["submissions"]["ann"]["note"]


def test_broken_and_hostile_repositories(tmp_path: Path) -> None:
    good, annotated = tmp_path / "good", tmp_path / "annotated"
    tag(good)
    sha = tag(annotated, annotated=True)
    assert git(annotated, "rev-parse", "week1") != sha  # the tag object, not its commit
    notag = tmp_path / "notag"
    commit(notag)
    gitfile = tmp_path / "gitfile"
    gitfile.mkdir()
    (gitfile / ".git").write_text(f"gitdir: {good}/.git\n")
    borrow = tmp_path / "borrow"
    subprocess.run(["git", "clone", "-q", "--shared", str(good), str(borrow)], check=True)
    roster(tmp_path, [f"ann,,{annotated},", f"bob,,{tmp_path}/nothing,", f"cy,,{notag},", f"di,,{gitfile},",
                      f"ed,,{borrow},", f"gus,,{good},"])
    c = collect(tmp_path, "2027-03-13T09:00")["submissions"]
    assert c["ann"]["commit"] == sha
    assert c["bob"]["commit"] is None and "no git repository" in c["bob"]["note"]
    assert c["cy"] == {"commit": None, "fetched_at": "2027-03-13T09:00:00-05:00", "late": False, "note": "no tag 'week1'"}
    assert c["di"]["commit"] is None and "gitdir" in c["di"]["note"]
    assert c["ed"]["commit"] is None and "alternates" in c["ed"]["note"]
    assert c["gus"]["commit"] == git(good, "rev-parse", "HEAD")
    # unreachable at a later collection: what was collected stands
    subprocess.run(["rm", "-rf", str(good)], check=True)
    c = collect(tmp_path, "2027-03-13T10:00")["submissions"]
    assert c["gus"]["commit"] is not None and "the collection of 2027-03-13T09:00:00-05:00 stands" in c["gus"]["note"]


def test_state_writable_by_others_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tag(tmp_path / "a")
    roster(tmp_path, [f"ann,,{tmp_path / 'a'},"])
    (tmp_path / "state").mkdir(mode=0o777)
    os.chmod(tmp_path / "state", 0o777)
    assert main(["collect", "--roster", str(tmp_path / "roster.csv"), "--week", "1", "--tag", "week1",
                 "--deadline", D1, "--state", str(tmp_path / "state"), "--out", str(tmp_path / "o")]) == 2
    assert "writable by others" in capsys.readouterr().err
    os.chmod(tmp_path / "state", 0o700)
    collect(tmp_path, "2027-03-13T09:00")
    assert main(["collect", "--roster", str(tmp_path / "roster.csv"), "--week", "1", "--tag", "week1",
                 "--deadline", "2027-03-14T10:00", "--state", str(tmp_path / "state"), "--out", str(tmp_path / "o"),
                 "--now", "2027-03-13T10:00"]) == 2
    assert "was collected with --tag week1 --deadline 2027-03-13T10:00:00-05:00" in capsys.readouterr().err


NEG = "ember 1\nx = param i32[3]\ny = neg x\nreturn y\ninput x = [1, 2, -3]\nexpect y = [-1, -2, 3]\n"
BENCH = '[ "$2" = --bench ] && echo "# bench runs=$3 median_ms=0.5"; true\n'
RIGHT = '#!/bin/sh\nexec python3 -m ember run --backend c "$@"\n'   # graded with --allow-ember; benchmarks honestly
WRONG = "#!/bin/sh\necho 'y = [1, 2, 3]'\n" + BENCH


def test_grade_publish_and_regrade_from_a_collection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tests = tmp_path / "tests"
    (tests / "staff").mkdir(parents=True)
    (tests / "staff" / "neg.eir").write_text(NEG)
    (tests / "staff" / "secret.eir").write_text("# visibility: hidden\n" + NEG.replace("[-1, -2, 3]\n", "[-1, -2, 4]\n"))
    a, b = tmp_path / "alice", tmp_path / "bc"
    roster(tmp_path, [f"alice,,{a},", f"bob,bc,{b},", f"carol,bc,{b},", f"dan,,{tmp_path / 'dan'},"])
    commit(tmp_path / "dan")  # no tag: nothing to grade
    tag(a, files={"compiler": RIGHT})
    tag(b, files={"compiler": WRONG})
    collect(tmp_path, "2027-03-13T09:00", out="w1")
    tag(a, files={"compiler": WRONG})  # after the collection: grading uses the collected commit
    grade = ["grade", "--tests", str(tests), "--roster", str(tmp_path / "roster.csv"), "--collection",
             str(tmp_path / "w1"), "--timeout", "60", "--jobs", "2", "--allow-ember"]
    assert main([*grade, "--out", str(tmp_path / "g1")]) == 0
    report = json.loads((tmp_path / "g1" / "grade.json").read_text())
    assert report["tests"]["staff/secret.eir"]["valid"] is False
    assert {n: s["rate"] for n, s in report["submissions"].items()} == {"reference": 1.0, "alice": 1.0, "bc": 0.0,
                                                                         "dan": 0.0}
    assert report["submissions"]["dan"]["failures"]["staff/neg.eir"] == "nothing collected: no tag 'week1'"
    # a staff test fixed: regrading reproduces alice's figures, and the diff shows bc's
    (tests / "staff" / "secret.eir").write_text("# visibility: hidden\n" + NEG)
    assert main([*grade, "--out", str(tmp_path / "g2"), "--compare-to", str(tmp_path / "g1")]) == 0
    changes = (tmp_path / "g2" / "changes.md").read_text()
    assert "- test staff/secret.eir: now valid" in changes and "- alice: unchanged, 100.0%" in changes
    assert "- bc: 0.0% -> 0.0%; now fails staff/secret.eir" in changes
    assert main([*grade, "--out", str(tmp_path / "g3"), "--only", "alice", "--compare-to", str(tmp_path / "g2")]) == 0
    assert json.loads((tmp_path / "g3" / "grade.json").read_text())["submissions"].keys() == {"reference", "alice"}
    assert "- alice: unchanged, 100.0%" in (tmp_path / "g3" / "changes.md").read_text()
    publish = ["publish", "--roster", str(tmp_path / "roster.csv"), "--collection", str(tmp_path / "w1"),
               "--grade", str(tmp_path / "g2"), "--tests", str(tests), "--out", str(tmp_path / "pub")]
    assert main(publish) == 0
    bc = (tmp_path / "pub" / "bc.md").read_text()
    assert "Passed 0 of 2 tests: 0.0%." in bc and "Late days left: bob 3, carol 3" in bc
    assert "Hidden tests (named after their release): 1, 0 passed, 1 failed." in bc
    assert "| staff/neg.eir |" in bc and "secret" not in bc
    assert main([*publish, "--release"]) == 0
    assert "| staff/secret.eir |" in (tmp_path / "pub" / "bc.md").read_text()
    suite = tmp_path / "suite"
    suite.mkdir()
    # a program long enough to time (the grader drops one whose runs it cannot judge), reseeded by it
    (suite / "neg.eir").write_text("ember 1\nx = param i32[262144]\ny = neg x\ns = sum y axes=[0]\nreturn s\n"
                                   "input x = rand seed=1 lo=-9 hi=9\n")
    assert main(["bench", "--suite", str(suite), "--roster", str(tmp_path / "roster.csv"), "--collection",
                 str(tmp_path / "w1"), "--out", str(tmp_path / "b1"), "--runs", "1", "--rounds", "1",
                 "--allow-ember"]) == 0
    bench = json.loads((tmp_path / "b1" / "bench.json").read_text())["programs"]["neg.eir"]
    assert bench["bc"]["status"] == "wrong" and bench["alice"]["status"] == "ok", bench
    assert main([*publish, "--bench", str(tmp_path / "b1")]) == 0
    alice = (tmp_path / "pub" / "alice.md").read_text()
    assert "## Benchmark" in alice and re.search(r"\| neg\.eir \| [0-9.e+-]+ \| ok \|", alice), alice


def test_a_hanging_fetch_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_SSH_COMMAND", "sleep 31.7 #")  # a server that never answers
    roster(tmp_path, ["ann,,ssh://example.invalid/ann.git,"])
    c = collect(tmp_path, "2027-03-13T09:00", D1, 1, "week1", "--git-timeout", "1")
    assert c["submissions"]["ann"]["commit"] is None and "timed out after 1 s" in c["submissions"]["ann"]["note"]
    assert subprocess.run(["pgrep", "-f", "sleep 31.7"], capture_output=True).stdout == b""  # nothing left behind


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-30, 24), st.sampled_from([None, "a", "b", "c"])), max_size=8),
       st.integers(0, 1))
def test_decide_is_idempotent_and_charges_at_most_once(steps: list[tuple[int, str | None]], left: int) -> None:
    deadline = datetime(2027, 3, 13, 15, tzinfo=timezone.utc)
    old, on_time, seen_late = None, None, set()
    for hours, commit in sorted(steps, key=lambda s: s[0]):
        now = deadline + timedelta(hours=hours)
        got = (commit, commit, "" if commit else "no tag 'week1'")
        new, _ = decide(old, got, now, deadline, ["ann", "bob"], {"ann": left, "bob": 1})
        assert decide(new, got, now, deadline, ["ann", "bob"], {"ann": left, "bob": 1})[0] == new  # idempotent
        assert new["charged"] in ([], ["ann", "bob"]) and new["late"] == bool(new["charged"])
        assert not (new["late"] and left == 0)                          # nobody is charged unless all can pay
        if old is not None and old["commit"] and not commit:
            assert new["commit"] == old["commit"]                       # a failed fetch erases nothing
        on_time = commit if hours <= 0 and commit else on_time
        seen_late |= {commit} if hours > 0 else set()
        assert new["commit"] == on_time or new["late"] and new["commit"] in seen_late  # on time, or paid for
        old = new
