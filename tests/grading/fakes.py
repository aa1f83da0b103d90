"""Fake compilers for the benchmark tests: Python scripts that need no Ember (the sandbox may hide
it) and no GPU. Each handles one program shape, the sum of a rand i32 vector (SUM below), with the
splitmix64 generator of spec 7; a mode says how honest it is."""
from __future__ import annotations

import sys
from pathlib import Path

N = 262144
SUM = f"""ember 1
x = param i32[{N}]
s = sum x axes=[0]
return s
input x = rand seed=1 lo=-1000 hi=1000
"""

SCRIPT = r'''#!PYTHON
import hashlib, os, re, statistics, sys, time
import numpy as np
MODE, WORK, FIXED = "{mode}", {work}, {fixed}
src = open(sys.argv[1]).read()
seed, lo, hi = map(int, re.search(r"seed=(\d+) lo=(-?\d+) hi=(-?\d+)", src).groups())
n = int(re.search(r"i32\[(\d+)\]", src).group(1))
runs = int(sys.argv[3]) if len(sys.argv) > 3 else None

def gen(seed):
    i = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return lo + ((z >> np.uint64(32)) % np.uint64(hi - lo)).astype(np.int64)

if MODE == "cold" and os.environ.get("EMBER_CACHE"):  # compiles once per program shape into its cache
    mark = os.path.join(os.environ["EMBER_CACHE"], hashlib.sha256(re.sub(r"seed=\d+", "", src).encode()).hexdigest())
    if not os.path.exists(mark):
        time.sleep(1.5)
        open(mark, "w").close()
x = gen(seed)
answer = int(x.sum())
first = runs is not None and runs < 20          # the grader's first run of a round (--bench N1)
if MODE == "athome":                            # the answer computed at home on the suite's own file
    answer = int(gen(1).sum())
if MODE == "stale":                             # one answer per program shape, kept between runs
    d = "/tmp/ember-test-stale-{token}"
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, hashlib.sha256(re.sub(r"seed=\d+", "", src).encode()).hexdigest())
    if os.path.exists(f):
        answer = int(open(f).read())
    else:
        open(f, "w").write(str(answer))
if MODE == "fakerest" and not first:            # only the first run's result is checked, it hopes
    answer = 0
print(f"s = [{{answer}}]")
if runs is None:
    sys.exit(0)
part = x[: max(1, n // 1000)] if MODE == "skimp" else x   # skimp: a thousandth of the work
times = []
if MODE == "sleeper":                           # the work done once; the runs it claims slept (the wall agrees)
    time.sleep(runs * 0.05e-3)
if MODE not in ("zero", "nan", "inf", "negative", "tiny", "skip", "sleeper"):
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(WORK):
            part.sum()
        if FIXED:
            while time.perf_counter() - t < FIXED * 1e-3:
                pass
        times.append((time.perf_counter() - t) * 1e3)
med = FIXED if FIXED else statistics.median(times) if times else 0.5
med = {{"zero": 0, "nan": "nan", "inf": "inf", "negative": -1, "tiny": 1e-6, "skip": 0.05,
        "sleeper": 0.05}}.get(MODE, med)
if MODE == "liar":
    med = med / 10
if MODE == "halver":                            # every run done, a median 2.2 times too small
    med = med / 2.2
print(f"# bench runs={{runs}} median_ms={{med}}")
'''


def fake(folder: Path, name: str, mode: str = "honest", work: int = 1, fixed: float = 0.0, token: str = "") -> None:
    """A submission `name` in folder whose compiler behaves as mode (honest: does every run and
    reports its own median; fixed: busy-waits that many ms a run and reports exactly that)."""
    d = folder / name
    d.mkdir(parents=True)
    exe = d / "compiler"
    exe.write_text(SCRIPT.replace("PYTHON", sys.executable).format(mode=mode, work=work, fixed=fixed, token=token))
    exe.chmod(0o755)
