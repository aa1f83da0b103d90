"""Gradient agreement per test of tests/eir/grad: the compiled gradient (symbolic rules, C
backend) and the reference's numeric reverse pass, each against the file's expectation
(central finite differences in f64). Prints the max relative error of each.
    python tests/tools/grad_agreement.py"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ember import runners, text  # noqa: E402


def rel(a: np.ndarray, e: np.ndarray) -> float:
    a, e = a.astype(np.float64).ravel(), e.astype(np.float64).ravel()
    return float(np.max(np.abs(a - e)) / max(np.max(np.abs(e)), 1e-12))


print(f"{'test':28s} {'compiled (C)':>13s} {'reference':>10s}")
worst = {"c": 0.0, "ref": 0.0}
for path in sorted((Path(__file__).parents[1] / "eir" / "grad").glob("*.eir")):
    prog = text.parse_file(str(path))
    row = []
    for backend in ("c", "ref"):
        got = dict(zip(prog.outputs, runners.run_program(prog, backend)))
        err = max(rel(got[n], prog.expected_values(n)) for n in prog.expects)
        worst[backend] = max(worst[backend], err)
        row.append(err)
    print(f"{path.stem:28s} {row[0]:13.1e} {row[1]:10.1e}")
print(f"{'worst':28s} {worst['c']:13.1e} {worst['ref']:10.1e}")
