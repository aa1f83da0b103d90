"""The C backend's build: the on-disk cache, concurrent compiles, and generated source."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ember import runners
from ember.backend import c

pytestmark = pytest.mark.skipif("c" not in runners.available(), reason="no C compiler")
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
    libs = sorted(p.name for p in (tmp_path / "cache" / "c").iterdir())
    assert len(libs) == 2 and libs[0].endswith(".so") and libs[1] == libs[0] + ".sha256", libs  # no temporaries


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
    from ember import dtype as dt
    from ember import ir
    from ember.ir import Op
    x = ir.param("x", dt.u16, (65536,))
    h = ir.unary(Op.BITCAST, x, dt.f16)
    back = ir.unary(Op.BITCAST, h, dt.u16)
    bits = np.arange(65536, dtype=np.uint16)
    (got,) = c.run_values([back], {x: bits})
    nan = (bits & 0x7C00) == 0x7C00
    nan &= (bits & 0x3FF) != 0
    assert (got[~nan] == bits[~nan]).all()


def test_exp2_float_accuracy_and_special_values() -> None:
    """Ember's branch-free exp2 for float against exp2 in f64, rounded to f32: within 2 ulp
    everywhere it is normal, exact at the special values."""
    from ember import dtype as dt
    from ember import ir
    from ember.ir import Op
    xs = np.concatenate([np.linspace(-150, 130, 200_001), np.random.default_rng(1).uniform(-30, 30, 100_000),
                         [0.0, -0.0, 1.0, -1.0, 0.5, 127.99, 128.0, -126.0, -149.0, -150.0, -160, 200, np.inf, -np.inf,
                          np.nan]]).astype(np.float32)
    x = ir.param("x", dt.f32, xs.shape)
    (got,) = c.run_values([ir.unary(Op.EXP2, x)], {x: xs})
    with np.errstate(over="ignore"):
        want = np.exp2(xs.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want) & (want > np.float32(2.0**-126))
    ulp = np.abs(got[finite].view(np.int32) - want[finite].view(np.int32))
    assert ulp.max() <= 2
    tiny = np.isfinite(want) & ~finite
    assert np.abs(got[tiny] - want[tiny]).max() <= 2.0**-149 * 2  # subnormal results: within 2 steps
    assert np.array_equal(np.isinf(got), np.isinf(want))


def test_generated_source_is_the_same_in_every_process() -> None:
    """The disk cache is keyed by the source: it must not depend on memory addresses (it once
    did, through the order of a set of temporaries)."""
    prog = ROOT / "tests" / "eir" / "grad" / "attention.eir"
    outs = {subprocess.run([sys.executable, "-m", "ember", "source", str(prog), "--backend", backend],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
            for backend in ("c", "c", "c", "cuda", "cuda", "cuda")}
    assert len(outs) == 2 and all(outs)


def test_values_of_2_to_the_31_elements_index_in_64_bits(tmp_path: Path) -> None:
    """Spec 2: a value that is not stored may have up to 2^62 - 1 elements. Reshaping 2^31 of
    them to one axis needs a 64-bit loop and flat index (it was rejected before); the C result
    matches numpy, and the CUDA source compiles."""
    import numpy as np

    from ember import runners, text
    from ember.backend import cuda

    from .cuda_compile import COMPILER, compile_cuda
    src = ("ember 1\nx = param u8[65536]\nxr = reshape x shape=[65536,1]\nxe = expand xr shape=[65536,32768]\n"
           "f = reshape xe shape=[2147483648]\nc = cast f dtype=u64\ns = sum c axes=[0]\n"
           "d = cast f dtype=i32\nm = reshape d shape=[32768,65536]\nn = max m axes=[1]\nreturn s n\n")
    prog = text.parse(src)
    x = np.random.default_rng(0).integers(0, 256, 65536).astype(np.uint8)
    s, n = runners.BACKENDS["c"].run(prog.output_nodes, {prog.nodes["x"]: x})
    assert int(np.asarray(s).ravel()[0]) == int(x.astype(np.uint64).sum()) * 32768
    want = x.reshape(32768, 2).max(1).astype(np.int32)  # row r of [32768, 65536] holds x[2r], x[2r + 1]
    assert np.array_equal(np.asarray(n).ravel(), want)
    if COMPILER is not None:
        code = cuda.source(prog.output_nodes, "sm_90a")
        assert "long long t" in code[code.index('extern "C"'):]  # the flat index in 64 bits
        assert compile_cuda(code, "sm_90a", tmp_path) is None


@pytest.mark.parametrize("debug", ["0", "1"])
def test_layers_of_one_shape_are_one_function_each_called_with_its_buffers(debug: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Five layers of one shape (a matmul, a relu): each kind of kernel is one C function,
    called once a layer with that layer's buffers (GCC compiled every layer's copy: `ember
    train`'s default model 4.9 -> 2.6 s of cc), and the values are the reference's; also with
    EMBER_DEBUG=1, which runs and times the kernels one at a time through their functions."""
    monkeypatch.setenv("EMBER_DEBUG", debug)
    import re

    from ember import ref, text

    from .randprog import layers_text
    program = text.parse(layers_text(5, 8, 32))
    sched = c.prepare(program.output_nodes)
    src = c.render(sched)
    calls = re.findall(r"^  (k\d+)\(", src.entry, re.M)
    assert len(calls) == len(sched.kernels) >= 3 and len(src.kernels) == len(set(calls)) < len(calls)
    rng = np.random.default_rng(0)
    inputs = {program.nodes[p]: (rng.standard_normal(program.nodes[p].shape) / 4).astype(np.float32)
              for p in program.params}
    got = c.run_values(program.output_nodes, inputs)
    want = ref.evaluate(program.output_nodes, inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
