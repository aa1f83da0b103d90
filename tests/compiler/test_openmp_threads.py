"""Compiled C programs share the CPU: threads from the free cores, waiting threads sleep."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ember import runners
from ember.backend import c

pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
ROOT = Path(__file__).resolve().parents[2]


def test_threads_are_the_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert 1 <= c.threads() <= 4
    monkeypatch.setattr(os, "getloadavg", lambda: (2.6, 1.0, 1.0))
    assert c.threads() == 1  # 3 busy of 4
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 1.0, 1.0))
    assert c.threads() == 1


def test_a_loaded_program_runs_with_a_passive_wait_policy(tmp_path: Path) -> None:
    """libgomp reads its settings once, when the first compiled program loads it: they are set
    by then (OMP_DISPLAY_ENV prints what libgomp took)."""
    if "-fopenmp" not in c._flags():
        pytest.skip("the C compiler has no OpenMP")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env.update(OMP_DISPLAY_ENV="verbose", PYTHONPATH=str(ROOT))
    # a program with parallel loops (a small one has none and never loads libgomp)
    code = "import numpy as np, ember.tensor as et; x = et.tensor(np.ones((256, 256), np.float32)); print((x @ x).sum().item())"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "16777216.0", proc.stderr
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in proc.stderr and "GOMP_SPINCOUNT = '0'" in proc.stderr
    threads = int(proc.stderr.split("OMP_NUM_THREADS = '")[1].split("'")[0])
    assert 1 <= threads <= len(os.sched_getaffinity(0))
