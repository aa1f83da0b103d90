"""Programs that toolchains under Ember miscompiled (issue 14), kept right by Ember's workarounds:
every available backend against the reference, and the generated source checked for the form
that avoids the bug (so CI without a GPU still guards the CUDA workaround)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ember import ref, runners
from ember.backend import cuda
from ember.compiler import optimize
from ember.compiler.simplify import simplify
from ember.ir import Op, toposort
from ember.text import parse_file

from .randprog import compare

HERE = Path(__file__).parent / "toolchain"


@pytest.fixture(autouse=True)
def lanes_for_small_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The repros are small, and the forms GCC miscompiled come with the C backend's lanes (and
    no schedule cached without them)."""
    monkeypatch.setattr(optimize, "TILE_WORK", 0)
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
CASES = sorted(HERE.glob("*.eir"))
COMPILED = [b for b in ("c", "cuda") if b in runners.available()]


@pytest.mark.parametrize("backend", COMPILED)
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_matches_reference(path: Path, backend: str) -> None:
    prog = parse_file(str(path))
    inputs = {prog.nodes[p]: prog.input_values(p) for p in prog.params}
    want = ref.evaluate(prog.output_nodes, inputs)
    got = runners.BACKENDS[backend].run(prog.output_nodes, inputs)
    assert compare(prog.output_nodes, got, want) is None


def test_nested_where_on_one_condition_folds() -> None:
    prog = parse_file(str(HERE / "gcc12_avx2_nested_where.eir"))
    (out,) = simplify(prog.output_nodes)
    wheres = [n for n in toposort([out]) if n.op is Op.WHERE]
    assert len(wheres) == 1 and wheres[0].srcs[1] is prog.nodes["v0"] and wheres[0].srcs[2] is prog.nodes["v12"]


def test_cuda_int_max_has_no_compare_select() -> None:
    src = cuda.source(parse_file(str(HERE / "ptxas13_vimnmx3_neg.eir")).output_nodes)
    kernels = src[src.index('extern "C"'):]
    assert "ember_imax<int>" in kernels
    assert not re.search(r"\(t\d+ > (t\d+|acc\d+) \?", kernels)


def test_cuda_narrow_int_to_float_goes_through_int() -> None:
    src = cuda.source(parse_file(str(HERE / "nvvm13_i8_to_f32.eir")).output_nodes)
    assert re.search(r"\(\(float\)\(\(\(int\)\(t\d+\)\)\)\)", src)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_nvvm_emits_no_16_bit_convert_for_i8(tmp_path: Path) -> None:
    """The miscompiled conversion is visible in PTX, so this needs no GPU."""
    src = tmp_path / "k.cu"
    src.write_text(cuda.source(parse_file(str(HERE / "nvvm13_i8_to_f32.eir")).output_nodes))
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-w", "-o", str(tmp_path / "k.ptx"), str(src)], check=True)
    ptx = (tmp_path / "k.ptx").read_text()
    assert "cvt.rn.f32.s16" not in ptx and ptx.count("cvt.s32.s8") == 28


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_nvvm_compares_i8_maxima_in_32_bits(tmp_path: Path) -> None:
    """The dropped sign extension sat before a 16-bit compare (setp.lt.s16), visible in PTX."""
    src = tmp_path / "k.cu"
    src.write_text(cuda.source(parse_file(str(HERE / "nvvm13_i8_max.eir")).output_nodes))
    subprocess.run(["nvcc", "-arch=sm_90a", "-ptx", "-w", "-o", str(tmp_path / "k.ptx"), str(src)], check=True)
    compares = re.findall(r"setp\.\w+\.([su]\d+)", (tmp_path / "k.ptx").read_text())
    assert len(compares) >= 40 and set(compares) == {"s32"}


def test_c_kernels_with_lanes_skip_the_loop_vectorizer() -> None:
    from ember.backend import c
    text = c.render(c.program(parse_file(str(HERE / "gcc12_lanes_in_short_loop.eir")).output_nodes).sched).text
    assert 'optimize("no-tree-loop-vectorize")' in text


def test_c_signed_sums_accumulate_unsigned() -> None:
    """The form that avoids GCC 12.2's miscompile, checked on any host (the miscompile needs AVX2)."""
    src = runners.BACKENDS["c"].source(parse_file(str(HERE / "gcc12_int_sum_lanes.eir")).output_nodes)
    kernels = src[src.index("void k"):]
    assert re.search(r"unsigned acc\d+\[\d+\];", kernels) and "unsigned long long acc" in kernels
    assert not re.search(r"\(int\)\(\(unsigned\)\(acc", kernels)
