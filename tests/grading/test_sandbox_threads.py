"""`ember grade --jobs N`: N runs at once share the cores, so each run's OpenMP gets a share."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ember.grading.sandbox import Sandbox


def test_each_run_gets_its_share_of_the_cores(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    for jobs in (1, 2, 64):
        box = Sandbox([], jobs)
        try:
            assert box._env(tmp_path, True)["OMP_NUM_THREADS"] == str(max(1, cores // jobs))
        finally:
            shutil.rmtree(box.root, ignore_errors=True)
