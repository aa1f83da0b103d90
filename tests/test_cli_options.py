"""Every numeric option is range-checked: one argparse-style line and exit status 2, before any work."""
from __future__ import annotations

import pytest

from ember.cli import main

BAD = [
    ("train", "--batch", "0"), ("train", "--block", "100000"), ("train", "--steps", "-5"), ("train", "--accum", "0"),
    ("train", "--eval-every", "0"), ("train", "--lr", "-1"), ("train", "--clip", "nan"), ("train", "--gpus", "0"),
    ("train", "--max-bytes", "5"), ("train", "--dim", "0"), ("train", "--layers", "x"), ("train", "--warmup", "-1"),
    ("sample", "--tokens", "-3"), ("sample", "--temperature", "-1"), ("sample", "--seed", "-2"),
    ("test", "x.eir", "--jobs", "-1"), ("test", "x.eir", "--timeout", "0"), ("run", "x.eir", "--bench", "0"),
    ("grade", "--tests", "t", "--submissions", "s", "--out", "o", "--jobs", "-1"),
    ("bench", "--submissions", "s", "--out", "o", "--runs", "0"),
    ("bench", "--submissions", "s", "--out", "o", "--timeout", "-3"),
]


@pytest.mark.parametrize("args", BAD, ids=" ".join)
def test_out_of_range_is_one_line_and_exit_2(args: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    err = capsys.readouterr().err
    option = args[-2]  # the bad one is last
    assert e.value.code == 2 and err.count("\n") == 1 and "error: argument" in err and option in err, err


@pytest.mark.parametrize("args, words", [
    (["--block", "60000"], "GiB of memory"),                     # within the stated maximum, past any memory
    (["--batch", "100000000"], "GiB of memory"),
    (["--dim", "97"], "does not split into 4 heads"),
])
def test_sizes_that_cannot_run_are_one_line(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--device", "cpu", *args]) == 2   # said before anything is read or allocated
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and err.startswith("ember train: --batch")
