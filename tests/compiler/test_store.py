"""Schedules cached on disk (compiler/store.py): a loaded schedule is the compiled one, node for
node, and a different program, target or plan knob never loads another's."""
from __future__ import annotations

from pathlib import Path

import pytest

from ember import text
from ember.backend import c, cuda
from ember.compiler import pipeline, plans, store
from ember.target import cpu, gpu

EIR = Path(__file__).parents[1] / "eir"
PROGRAMS = ["compositions/softmax.eir", "compositions/layernorm.eir", "compositions/batched_matmul_transposed.eir",
            "grad/attention.eir", "grad/cross_entropy.eir"]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path))
    return tmp_path / "schedules"


def _outputs(name: str) -> list:
    return text.parse_file(str(EIR / name)).output_nodes


@pytest.mark.parametrize("name", PROGRAMS)
def test_loaded_schedule_renders_the_same_source(name: str, cache: Path) -> None:
    outputs = _outputs(name)
    compiled = {"c": c.render(c.prepare(outputs)).text, "sm_86": cuda.source(outputs, "sm_86"),
                "sm_90a": cuda.source(outputs, "sm_90a")}
    assert len(list(cache.iterdir())) == 3
    loaded = {"c": c.render(c.prepare(outputs)).text, "sm_86": cuda.source(outputs, "sm_86"),
              "sm_90a": cuda.source(outputs, "sm_90a")}
    assert loaded == compiled and len(list(cache.iterdir())) == 3


def test_loaded_flash_attention_renders_the_same_source(cache: Path) -> None:
    from tests.compiler.test_attention import case
    outputs, _ = case("bf16_heads")
    compiled = [cuda.source(outputs, arch) for arch in ("sm_86", "sm_90a")]
    assert "ember_flash" in compiled[1] and len(list(cache.iterdir())) == 2
    assert [cuda.source(outputs, arch) for arch in ("sm_86", "sm_90a")] == compiled


def test_loaded_schedule_takes_the_callers_params(monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = _outputs("compositions/softmax.eir")
    first = pipeline.compile_schedule(outputs, cpu())
    monkeypatch.setattr(pipeline, "_compile", lambda *a: pytest.fail("compiled again"))
    again = pipeline.compile_schedule(outputs, cpu())
    assert again is not first and list(again.inputs) == list(first.inputs)   # the same param nodes
    assert [b.node for b in again.outputs] == [b.node for b in first.outputs]


def test_key_tells_programs_targets_and_plans_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    a = _outputs("compositions/softmax.eir")
    b = text.parse(open(EIR / "compositions/softmax.eir").read().replace("f32[", "f64[")).output_nodes
    keys = {store.key(a, "c", "", 0), store.key(b, "c", "", 0), store.key(a, "cuda", "sm_86", 0),
            store.key(a, "cuda", "sm_90a", 0, plans.choice_key(gpu("sm_90a")))}
    monkeypatch.setenv("EMBER_TC_PLAN", "mma.sync,128,128,32,2,2,4")
    keys.add(store.key(a, "cuda", "sm_90a", 0, plans.choice_key(gpu("sm_90a"))))
    assert len(keys) == 5 and store.key(a, "c", "", 0) == store.key(_outputs("compositions/softmax.eir"), "c", "", 0)


def test_unreadable_entry_is_compiled_again(cache: Path) -> None:
    outputs = _outputs("compositions/layernorm.eir")
    source = cuda.source(outputs, "sm_86")
    (entry,) = cache.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])   # cut short, as by a full disk
    assert cuda.source(outputs, "sm_86") == source
    assert len(entry.read_bytes()) > 100   # written whole again


def test_a_planted_entry_builds_nothing_but_embers_own_types(cache: Path, tmp_path: Path) -> None:
    """A cache entry is data: one naming another module's class (here os.system's neighbour
    subprocess.Popen) is refused, even with a matching hash, and the program is compiled again."""
    import hashlib
    import json
    outputs = _outputs("compositions/softmax.eir")
    source = c.render(c.prepare(outputs)).text
    (entry,) = cache.iterdir()
    marker = tmp_path / "ran"
    body = json.dumps({"format": store.FORMAT, "nodes": [],
                       "value": ["o", "subprocess:Popen", {"args": ["touch", str(marker)]}]}).encode()
    entry.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    assert c.render(c.prepare(outputs)).text == source and not marker.exists()
    assert store.load(entry.stem) is not None   # written whole again


def test_an_edited_entry_fails_its_hash(cache: Path) -> None:
    outputs = _outputs("compositions/softmax.eir")
    pipeline.compile_schedule(outputs, cpu())
    (entry,) = cache.iterdir()
    entry.write_bytes(entry.read_bytes().replace(b'"f32"', b'"f64"', 1))
    assert store.load(entry.stem) is None


def test_a_replaced_shared_library_is_built_again(tmp_path: Path) -> None:
    """A cached .so is loaded only when it matches the hash written with it: a planted library
    (whose constructor would run at load) or a truncated one is compiled again."""
    import numpy as np

    from ember.cache import cache_dir
    marker = tmp_path / "constructor-ran"
    program = "int x;\n"
    lib = c.build(program)
    evil = c.build(f'#include <stdio.h>\n__attribute__((constructor)) static void f(void) '
                   f'{{ fopen("{marker}", "w"); }}\n')
    lib.write_bytes(evil.read_bytes())
    assert c.build(program) == lib and lib.read_bytes() != evil.read_bytes()
    lib.write_bytes(lib.read_bytes()[:64])   # cut short, as by a full disk
    outputs = _outputs("compositions/softmax.eir")
    prog = text.parse_file(str(EIR / "compositions/softmax.eir"))
    values = c.run_values(outputs, {prog.nodes[p]: prog.input_values(p) for p in prog.params})
    assert np.all(np.isfinite(values[0])) and len(c.build(program).read_bytes()) > 64
    assert not marker.exists() and cache_dir("c").is_dir()


def test_a_cache_others_may_write_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import os

    from ember.cli import main
    prog = tmp_path / "p.eir"   # a program no earlier test compiled (compiled programs stay in memory)
    prog.write_text("ember 1\nx = param f32[3]\ny = exp2 x\nz = exp2 y\nreturn z\ninput x = [1, 2, 3]\n")
    os.chmod(tmp_path, 0o777)
    assert main(["run", str(prog), "--backend", "c"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "may be written by others" in err[0] and str(tmp_path) in err[0]
