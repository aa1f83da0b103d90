"""`ember grade --similarity`: submissions whose code is suspiciously alike, and each one against
Ember itself, by winnowing (Schleimer, Wilkerson and Aiken, SIGMOD 2003, the method of MOSS).

Any language: a file's text becomes tokens with every identifier one symbol (a few keywords kept),
every number one, every string one, punctuation kept, white space and `#`, `//`, `/* */` comments
dropped, so renaming and reformatting change nothing. Each K tokens in a row are hashed, and of
each W hashes in a row the smallest is kept with its position: a fingerprint. Any run of
K + W - 1 tokens that two submissions share yields a shared fingerprint. docs/grading.md says how
to read the report. The folders are hostile: only regular files are read (no symlink is followed),
binary files are skipped, and files, folders and bytes are capped.
"""
from __future__ import annotations

import itertools
import os
import re
import stat
import zlib
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .reports import _cell

K, W = 20, 10                        # tokens per k-gram; hashes per window
FILE_CAP, TOTAL_CAP, ENTRY_CAP, DEPTH_CAP = 512 << 10, 4 << 20, 20000, 32  # bytes, bytes, entries, levels
POSITIONS = 4                        # places kept per fingerprint (repeats beyond are noise)
MIN_SHARED = 10                      # fewer shared fingerprints than this never make a pair (tiny files)
# a string runs to its closing quote or the end of its line: every match consumes what it scans (linear time)
TOKEN = re.compile(r'''(\s+|\#[^\n]*|//[^\n]*|/\*.*?(?:\*/|\Z))|("""[\s\S]*?(?:"""|\Z)|\'\'\'[\s\S]*?(?:\'\'\'|\Z)|'''
                   r'''"(?:\\.|[^"\\\n])*+"?|'(?:\\.|[^'\\\n])*+'?)|([A-Za-z_]\w*)|(\d[\w.]*)|(.)''', re.S)
KEYWORDS = frozenset("if else elif for while do return def fn func function class struct enum match case switch "
                     "break continue try except catch raise throw import from let var const static in not and or "
                     "new delete void lambda yield with".split())
_P, _B = (1 << 61) - 1, 1_000_003    # Karp-Rabin: polynomial hash of the k-gram, modulo a prime


@dataclass
class Prints:
    """One submission's fingerprints: hash -> [(file, first token, first line, last line)]."""
    files: list[str] = field(default_factory=list)
    where: dict[int, list[tuple[int, int, int, int]]] = field(default_factory=lambda: defaultdict(list))
    skipped: int = 0                 # files not read: not regular, binary, too large, too deep


def tokens(text: str) -> tuple[list[int], list[int]]:
    """The normalised tokens of text (as hash codes) and the line of each."""
    codes: list[int] = []
    lines: list[int] = []
    line, at = 1, 0
    for m in TOKEN.finditer(text):
        kind = m.lastindex
        if kind != 1:
            line += text.count("\n", at, m.start())
            at = m.start()
            word = m.group()
            tok = "s" if kind == 2 else "n" if kind == 4 else word if kind == 5 or word in KEYWORDS else "i"
            codes.append(zlib.crc32(tok.encode("utf-8", "surrogatepass")))
            lines.append(line)
    return codes, lines


def winnow(codes: list[int]) -> list[tuple[int, int]]:
    """(hash, first token) of each fingerprint: the rightmost smallest k-gram hash of each window."""
    if len(codes) < K:
        return []
    top, h, hashes = pow(_B, K - 1, _P), 0, []
    for i, c in enumerate(codes):
        h = ((h - codes[i - K] * top) * _B + c) % _P if i >= K else (h * _B + c) % _P
        if i >= K - 1:
            hashes.append(h)
    picked: list[tuple[int, int]] = []
    low: deque[int] = deque()  # the window's candidates, hashes increasing: the front is its rightmost minimum
    for i, v in enumerate(hashes):
        while low and hashes[low[-1]] >= v:
            low.pop()
        low.append(i)
        if low[0] <= i - W:
            low.popleft()
        if (i >= W - 1 or i == len(hashes) - 1) and (not picked or picked[-1][1] != low[0]):
            picked.append((hashes[low[0]], low[0]))
    return picked


def fingerprint(root: Path) -> Prints:
    """The fingerprints of the text files under root, read without following any symlink."""
    p, budget, seen = Prints(), TOTAL_CAP, 0
    try:
        top = os.lstat(root)
    except OSError:
        return p
    stack = [(root, 0)] if stat.S_ISDIR(top.st_mode) else []
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:  # never more than the cap's entries held at once
                entries = sorted(itertools.islice(it, max(ENTRY_CAP - seen, 0)), key=lambda e: e.name)
        except OSError:
            continue
        seen += len(entries)
        for e in entries:
            try:
                is_dir, is_file = e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)
            except OSError:  # gone, or unreadable: skipped below
                is_dir = is_file = False
            if is_dir:
                if depth < DEPTH_CAP and e.name != ".git":
                    stack.append((Path(e.path), depth + 1))
                else:
                    p.skipped += e.name != ".git"
                continue
            data = _read(e.path, min(FILE_CAP, budget)) if is_file else None
            if data is None or b"\0" in data:
                p.skipped += 1
                continue
            budget -= len(data)
            codes, lines = tokens(data.decode("utf-8", "replace"))
            name = os.fsencode(os.path.relpath(e.path, root)).decode("utf-8", "replace")
            n = len(p.files)
            p.files.append(name)
            for h, j in winnow(codes):
                if len(p.where[h]) < POSITIONS:
                    p.where[h].append((n, j, lines[j], lines[j + K - 1]))
    return p


def _read(path: str, cap: int) -> bytes | None:
    """A regular file's bytes if it has at most cap; never a symlink, never blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, cap + 1)
        return data if len(data) <= cap else None
    except OSError:
        return None
    finally:
        os.close(fd)


def regions(a: Prints, b: Prints, shared: set[int]) -> list[dict[str, Any]]:
    """Runs of shared fingerprints in order on both sides, largest first, as file and line ranges."""
    pairs = sorted((fa, fb, ta, tb, la, ea, lb, eb) for h in shared
                   for fa, ta, la, ea in a.where[h] for fb, tb, lb, eb in b.where[h])
    runs: list[list[Any]] = []
    live: list[list[Any]] = []       # runs a later match may extend: same files, within 3 windows on both sides
    for fa, fb, ta, tb, la, ea, lb, eb in pairs:
        live = [r for r in live if r[0] == fa and r[1] == fb and ta - r[2] <= 3 * W]
        r = min((r for r in live if ta > r[2] and 0 < tb - r[3] <= 3 * W),
                key=lambda r: abs(tb - r[3] - ta + r[2]), default=None)  # the closest to its diagonal
        if r is None:
            live.append([fa, fb, ta, tb, la, ea, lb, eb, 1])
            runs.append(live[-1])
        else:
            r[2:] = [ta, tb, r[4], max(r[5], ea), min(r[6], lb), max(r[7], eb), r[8] + 1]
    runs.sort(key=lambda r: -r[8])
    return [{"a_file": a.files[r[0]], "a_lines": [r[4], r[5]], "b_file": b.files[r[1]], "b_lines": [r[6], r[7]],
             "fingerprints": r[8]} for r in runs[:10]]


def report(folders: dict[str, Path], ember: Path, threshold: float, base: Path | None = None) -> dict[str, Any]:
    """grade.json's "similarity": pairs of submissions (and each against Ember, named "reference")
    sharing at least threshold of the smaller one's fingerprints, with their matching regions."""
    subs = {name: fingerprint(f) for name, f in folders.items()}
    starter = set(fingerprint(base).where) if base else set()
    counts = Counter(h for p in subs.values() for h in p.where)
    common = {h for h, c in counts.items() if c > max(2, len(subs) // 2)} | starter  # boilerplate, as MOSS's -m
    own = {n: set(p.where) - common for n, p in subs.items()}
    ref = fingerprint(ember)
    candidates = [(a, b, own[a], own[b]) for a, b in itertools.combinations(sorted(subs), 2)]
    candidates += [(a, "reference", set(p.where) - starter, set(ref.where) - starter) for a, p in sorted(subs.items())]
    pairs = []
    for a, b, fa, fb in candidates:
        shared = fa & fb
        score = len(shared) / min(len(fa), len(fb)) if shared else 0.0
        if score >= threshold and len(shared) >= MIN_SHARED:
            pb = ref if b == "reference" else subs[b]
            pairs.append({"a": a, "b": b, "similarity": round(score, 4), "shared": len(shared),
                          "regions": regions(subs[a], pb, shared)})
    pairs.sort(key=lambda p: (-p["similarity"], p["a"], p["b"]))
    return {"threshold": threshold, "k": K, "w": W, "boilerplate": len(common), "pairs": pairs,
            "submissions": {n: {"files": len(p.files), "fingerprints": len(own[n]), "skipped": p.skipped}
                            for n, p in sorted(subs.items())}}


def markdown(sim: dict[str, Any]) -> list[str]:
    """summary.md's section: each pair above the threshold and its largest matching regions."""
    md = ["", f"## Similar code (similarity >= {sim['threshold']:g}; docs/grading.md says how to read it)", "",
          "| a | b | similarity | matching regions (a ~ b) |", "|---|---|---|---|"]
    for p in sim["pairs"]:
        where = "; ".join(f"{r['a_file']}:{r['a_lines'][0]}-{r['a_lines'][1]} ~ "
                          f"{r['b_file']}:{r['b_lines'][0]}-{r['b_lines'][1]}" for r in p["regions"][:5])
        md.append(f"| {_cell(p['a'])} | {_cell(p['b'])} | {100 * p['similarity']:.0f}% | {_cell(where)} |")
    return md
