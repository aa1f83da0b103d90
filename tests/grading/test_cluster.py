"""Grading on a Dask cluster of two local workers (`--scheduler` with two `dask worker`s, and
`--workers 2`): the same reports as a run on threads, and no result lost when a worker dies mid-run."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ember.cli import main

from .fakes import SUM, fake

pytest.importorskip("dask.distributed")
psutil = pytest.importorskip("psutil")  # comes with distributed

NEG = r'''#!PYTHON
import re, sys, time
vals = re.search(r"input x = \[(.*)\]", open(sys.argv[1]).read()).group(1).split(",")
time.sleep(1.5)
print("y = [" + ", ".join(str(WRONG * -int(v)) for v in vals) + "]")
'''


def _neg_compiler(folder: Path, name: str, wrong: bool) -> None:
    (folder / name).mkdir(parents=True)
    exe = folder / name / "compiler"
    exe.write_text(NEG.replace("PYTHON", sys.executable).replace("WRONG", "0" if wrong else "1"))
    exe.chmod(0o755)


def _normal(report: dict[str, Any]) -> dict[str, Any]:
    """bench.json without what the reference's timing and the fresh seeds change from run to run."""
    rows = {p: {n: {"status": r["status"], "score": r["score"],
                    "note": re.sub(r"-?\d[\d.e-]*", "#", r["note"] or ""),
                    "ms": r["rounds_ms"] if n != "reference" else None} for n, r in row.items()}
            for p, row in report["programs"].items()}
    return {"programs": rows, "bands": report["bands"], "dropped": report["dropped"], "submissions": report["submissions"]}


def test_bench_on_two_workers_equals_a_local_run(tmp_path: Path) -> None:
    subs = tmp_path / "subs"
    fake(subs, "fixed", fixed=4.0)  # busy-waits 4 ms a run (its sum takes about 0.1) and reports exactly that
    fake(subs, "zero", "zero")
    fake(subs, "athome", "athome")
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "sum.eir").write_text(SUM)
    # a course's cluster: a scheduler and two workers of one GPU each, as docs/grading.md says
    info = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_"]
    procs = [subprocess.Popen([dask[0], dask[1], dask[2] + "scheduler", "--scheduler-file", str(info), "--port", "0",
                               "--no-dashboard"], stderr=subprocess.DEVNULL)]
    procs += [subprocess.Popen([dask[0], dask[1], dask[2] + "worker", "--scheduler-file", str(info), "--nthreads", "1",
                                "--resources", "GPU=1", "--no-dashboard"], stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        reports = []
        for extra in ([], ["--scheduler", address]):
            out = tmp_path / f"out{len(reports)}"
            assert main(["bench", "--suite", str(tmp_path / "suite"), "--submissions", str(subs), "--out", str(out),
                         "--runs", "5", "--rounds", "1", "--clock-noise", "0.25", *extra]) == 0
            reports.append(json.loads((out / "bench.json").read_text()))
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    local, cluster = map(_normal, reports)
    # (the whole entries on a difference: one in a full suite under load showed only "...ok'}")
    assert local == cluster, "\n".join(f"{p} {n}: local {r}, cluster {cluster['programs'][p].get(n)}"
                                       for p, row in local["programs"].items() for n, r in row.items()
                                       if cluster["programs"].get(p, {}).get(n) != r) or (local, cluster)
    assert local["programs"]["sum.eir"]["fixed"] == {"status": "ok", "score": 0.0, "note": "", "ms": [4.0]}


def _workers() -> list[Any]:
    found = []
    for p in psutil.Process().children():
        try:   # a child that has just exited (a validation's) is a zombie without a command line
            if any("spawn_main" in a for a in p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_grade_on_two_workers_loses_nothing_when_a_worker_dies(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "ann").mkdir(parents=True)
    for i in range(4):
        (tests / "ann" / f"t{i}.eir").write_text(f"ember 1\nx = param i32[2]\ny = neg x\nreturn y\n"
                                                 f"input x = [{i}, 7]\nexpect y = [{-i}, -7]\n")
    subs = tmp_path / "subs"
    _neg_compiler(subs, "right", wrong=False)
    _neg_compiler(subs, "wrong", wrong=True)
    args = ["grade", "--tests", str(tests), "--submissions", str(subs), "--timeout", "60"]
    assert main(args + ["--out", str(tmp_path / "local"), "--jobs", "2"]) == 0
    codes: list[int] = []
    run = threading.Thread(target=lambda: codes.append(main(args + ["--out", str(tmp_path / "cluster"),
                                                                    "--workers", "2"])))
    run.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and run.is_alive() and time.monotonic() < deadline:
        for w in _workers():  # kill the first worker seen running a compiler
            try:
                if any(a.endswith("/compiler") for c in w.children(recursive=True) for a in c.cmdline()[1:2]):
                    w.send_signal(signal.SIGKILL)
                    killed = w.pid
                    break
            except psutil.Error:
                continue
        time.sleep(0.05)
    run.join(300)
    assert killed is not None and codes == [0]
    local, cluster = (json.loads((tmp_path / d / "grade.json").read_text()) for d in ("local", "cluster"))
    assert local == cluster
    assert local["submissions"]["right"]["rate"] == 1.0 and local["submissions"]["wrong"]["rate"] == 0.0
