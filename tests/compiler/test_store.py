"""Schedules cached on disk (compiler/store.py): a loaded schedule is the compiled one, node for
node, and a different program, target or plan knob never loads another's."""
from __future__ import annotations

from pathlib import Path

import pytest

from ember import text
from ember.backend import c, cuda
from ember.compiler import pipeline, store
from ember.target import cpu

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
            store.key(a, "cuda", "sm_90a", 0)}
    monkeypatch.setenv("EMBER_TC_PLAN", "mma.sync,128,128,32,2,2,4")
    keys.add(store.key(a, "cuda", "sm_90a", 0))
    assert len(keys) == 5 and store.key(a, "c", "", 0) == store.key(_outputs("compositions/softmax.eir"), "c", "", 0)


def test_unreadable_entry_is_compiled_again(cache: Path) -> None:
    outputs = _outputs("compositions/layernorm.eir")
    source = cuda.source(outputs, "sm_86")
    (entry,) = cache.iterdir()
    entry.write_bytes(entry.read_bytes()[:100])   # cut short, as by a full disk
    assert cuda.source(outputs, "sm_86") == source
    assert len(entry.read_bytes()) > 100   # written whole again
