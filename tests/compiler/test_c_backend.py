"""The C backend's build: the on-disk cache, concurrent compiles, and generated source."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ember import backends
from ember.backend import c

pytestmark = pytest.mark.skipif("c" not in backends.available(), reason="no C compiler")
ROOT = Path(__file__).parents[2]


def test_concurrent_compiles_share_one_cache(tmp_path: Path) -> None:
    """Several processes compiling the same new program at once: each gets a working library."""
    prog = tmp_path / "p.eir"
    prog.write_text("ember 1\nx = param f32[3]\ny = mul x x\nreturn y\ninput x = [1, 2, 3]\nexpect y = [1, 4, 9]\n")
    env = {**os.environ, "EMBER_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "ember", "run", str(prog), "--backend", "c"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert {o for o, _ in outs} == {"y = [1, 4, 9]\n"}
    libs = list((tmp_path / "cache" / "c").iterdir())
    assert len(libs) == 1 and libs[0].suffix == ".so"  # no temporaries left behind


def test_cached_build_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    src = c.PRELUDE + "void ember_run(void** b) {}\n"
    first = c.build(src)
    mtime = first.stat().st_mtime_ns
    assert c.build(src) == first and first.stat().st_mtime_ns == mtime


def test_compile_error_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    with pytest.raises(c.CompileError, match="C compiler failed"):
        c.build("this is not C")


def test_f16_conversions_round_to_nearest_even() -> None:
    """Every f16 bit pattern converts to f32 and back exactly; midpoints round to even."""
    from ember import ir
    from ember import dtype as dt
    from ember.ir import Op
    x = ir.param("x", dt.u16, (65536,))
    h = ir.unary(Op.BITCAST, x, dt.f16)
    back = ir.unary(Op.BITCAST, h, dt.u16)
    bits = np.arange(65536, dtype=np.uint16)
    (got,) = c.run_values([back], {x: bits})
    nan = (bits & 0x7C00) == 0x7C00
    nan &= (bits & 0x3FF) != 0
    assert (got[~nan] == bits[~nan]).all()
