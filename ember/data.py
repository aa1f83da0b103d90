"""Values: literals (spec 1, 7), the data generator (7), rounding to a dtype (5), printing
values (9) and checking results (8).

Arrays at Ember's boundary are numpy arrays of the dtype's storage type (`DType.np_name`:
bf16 travels as its uint16 bits). numpy only carries data here; the one place it computes is
the reference evaluator and the oracle helpers below, never a compiled program's result.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from . import dtype as dt
from .dtype import DType

_INT = re.compile(r"-?[0-9]+\Z")
_DEC = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\Z")
_HEX = re.compile(r"-?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][-+]?[0-9]+\Z")
_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "true": 1, "false": 0}


def parse_number(tok: str) -> int | float | None:
    """An integer (exact Python int), a float, or None when tok is not a number literal."""
    if tok in _SPECIAL:
        return _SPECIAL[tok]
    if _INT.match(tok):
        return int(tok)
    if _DEC.match(tok):
        return float(tok)
    if _HEX.match(tok):
        return float.fromhex(tok)
    return None


class ValueError_(Exception):
    """A literal that cannot be converted to its dtype; the parser adds file and line."""


def literal_value(v: int | float, dtype: DType, truncate: bool) -> int | float:
    """Convert a literal as a cast from f64 (or from an exact integer) would (spec 7).

    truncate=True is `const`/`pad value=` (fractional values truncate, as cast does);
    truncate=False is a data list, where a fractional value for an int dtype is an error.
    """
    if dtype.is_float:
        try:
            f = float(v)
        except OverflowError:
            f = math.inf if v > 0 else -math.inf
        return float(round_float(np.array([f]), dtype)[0])
    if dtype is dt.bool_ and truncate:
        return int(v != 0)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError_(f"{v} is not a value of {dtype}")
        if v != int(v) and not truncate:
            raise ValueError_(f"{v} is not an integer, and {dtype} holds integers")
        v = int(v)
    if not dtype.min <= v <= dtype.max:
        raise ValueError_(f"{v} is outside the range of {dtype} [{dtype.min}, {dtype.max}]")
    return v


# ---------------------------------------------------------------------------------- rounding

def _f64_to_f32_odd(x: np.ndarray) -> np.ndarray:
    """f64 -> f32 with round-to-odd, so a second rounding to bf16 is correctly rounded."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(np.float32)
        inexact = (r.astype(np.float64) != x) & np.isfinite(x) & np.isfinite(r)
        toward_zero = np.where(np.abs(r.astype(np.float64)) > np.abs(x), np.nextafter(r, np.float32(0)), r)
        bits = toward_zero.view(np.uint32) | np.uint32(1)
    return np.where(inexact, bits.view(np.float32), r)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round f32 values to bf16 (nearest, ties to even) and return the uint16 bits."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, np.float32))
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_float(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Round float values (any float array) to dtype; returns f64 for f64, else f32 values."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype is dt.f64:
            return np.asarray(x, np.float64)
        if dtype is dt.f32:
            return np.asarray(x).astype(np.float32)
        if dtype is dt.f16:
            return np.asarray(x).astype(np.float16).astype(np.float32)
        src = np.asarray(x)
        f32 = _f64_to_f32_odd(src) if src.dtype == np.float64 else src.astype(np.float32)
        return bf16_bits_to_f32(f32_to_bf16_bits(f32))


def to_storage(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Values (as the reference evaluator holds them) -> the storage array of dtype."""
    if dtype is dt.bf16:
        return f32_to_bf16_bits(round_float(values, dt.bf16))
    return np.asarray(values).astype(dtype.np_name)


def from_storage(arr: np.ndarray, dtype: DType) -> np.ndarray:
    """Storage array -> values: f16/bf16 as f32, others as their own numpy type."""
    if dtype is dt.bf16:
        return bf16_bits_to_f32(arr)
    if dtype is dt.f16:
        return np.asarray(arr, np.float16).astype(np.float32)
    return np.asarray(arr, dtype.np_name)


def value_dtype(dtype: DType) -> np.dtype:
    """The numpy type the reference evaluator holds dtype's values in."""
    return np.dtype(np.float32) if dtype in (dt.f16, dt.bf16) else np.dtype(dtype.np_name)


# --------------------------------------------------------------------------------- generator

_M64 = (1 << 64) - 1


def splitmix64(seed: int, n: int) -> np.ndarray:
    """The first n outputs of splitmix64 seeded with seed (spec 7), as uint64."""
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(seed & _M64) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class Rand:
    seed: int
    scale: float | None = None
    lo: int | None = None
    hi: int | None = None


def check_rand(r: Rand, dtype: DType) -> None:
    """Raise ValueError_ if the generator's attributes do not fit dtype."""
    if dtype.is_float:
        if r.lo is not None or r.hi is not None:
            raise ValueError_(f"rand for {dtype} takes scale=, not lo=/hi=")
        p = 1.0 if r.scale is None else r.scale
        if not (isinstance(p, (int, float)) and p > 0 and math.isfinite(p) and math.frexp(p)[0] == 0.5):
            raise ValueError_(f"rand scale must be a power of two, found {p}")
    elif dtype.is_int:
        if r.scale is not None:
            raise ValueError_(f"rand for {dtype} takes lo= and hi=, not scale=")
        if r.lo is None or r.hi is None:
            raise ValueError_(f"rand for {dtype} needs lo= and hi=")
        if not (dtype.min <= r.lo < r.hi <= dtype.max + 1):
            raise ValueError_(f"rand for {dtype} needs {dtype.min} <= lo < hi <= {dtype.max + 1}, "
                              f"found lo={r.lo} hi={r.hi}")
    elif r.scale is not None or r.lo is not None or r.hi is not None:
        raise ValueError_("rand for bool takes no scale=, lo= or hi=")


def generate(r: Rand, dtype: DType, n: int) -> np.ndarray:
    """n values of the generator as the reference evaluator holds them (see value_dtype)."""
    z = splitmix64(r.seed, n)
    if dtype.is_float:
        p = 1.0 if r.scale is None else float(r.scale)
        v = ((z >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float64) * (2.0**-23 * p)
        return round_float(v, dtype).astype(value_dtype(dtype))
    if dtype.is_int:
        assert r.lo is not None and r.hi is not None
        width = r.hi - r.lo
        hi32 = z >> np.uint64(32)
        off = hi32 % np.uint64(width) if width < (1 << 64) else hi32
        # lo + off fits in dtype because hi <= max + 1; do it in Python ints only when needed
        if dtype is dt.u64:
            return (np.uint64(r.lo) + off).astype(np.uint64)
        return (np.int64(r.lo) + off.astype(np.int64)).astype(dtype.np_name)
    return (z >> np.uint64(63)).astype(np.bool_)


def list_values(values: list[int | float], dtype: DType) -> np.ndarray:
    """A data list (already converted with literal_value) as the evaluator's values."""
    if dtype is dt.u64:
        return np.array(values, dtype=np.uint64)
    return np.array(values, dtype=np.float64 if dtype.is_float else np.int64).astype(value_dtype(dtype))


# ---------------------------------------------------------------------------- print and check

def format_values(values: np.ndarray, dtype: DType) -> str:
    """`[v0, v1, ...]` in a form that reads back exactly (spec 9)."""
    flat = np.asarray(values).reshape(-1)
    if dtype.is_float:
        spec = "%.17g" if dtype is dt.f64 else "%.9g"
        items = [spec % float(v) for v in flat]
    else:
        items = [str(int(v)) for v in flat]
    return "[" + ", ".join(items) + "]"


def read_back(tok: str, dtype: DType) -> int | float | None:
    """A printed value read back into dtype (spec 9): decimal to the nearest value of the dtype,
    ties to even; ints exactly. None when tok is not a value of dtype."""
    v = parse_number(tok)
    if v is None:
        return None
    if not dtype.is_float:
        if isinstance(v, float):
            if not math.isfinite(v) or v != int(v):
                return None
            v = int(v)
        return v if dtype.min <= v <= dtype.max else None
    if v == 0 and tok.startswith("-"):
        v = -0.0  # a printed -0 is -0.0, as a float list reads it (spec 7)
    x = float(v) if not isinstance(v, int) or abs(v) < 1 << 1000 else math.copysign(math.inf, v)
    y = float(round_float(np.array([x]), dtype)[0])
    if dtype is dt.f64 or x == y or not math.isfinite(x) or not math.isfinite(y):
        return y
    # x is f64, already rounded once: a second rounding errs only when x landed exactly on a
    # midpoint between two values of dtype. Then compare the exact decimal with that midpoint.
    z = float(_next_toward(np.array([y]), np.array([x]), dtype)[0])
    if math.isfinite(z):
        mid = (y + z) / 2
    else:
        mid = y + (y - float(_next_toward(np.array([y]), np.array([0.0]), dtype)[0])) / 2
    if x != mid:
        return y
    exact = Fraction(tok) if isinstance(v, float) and "x" not in tok.lower() else Fraction(v)
    return y if abs(exact - Fraction(y)) <= abs(exact - Fraction(z)) else z  # a true tie keeps y, the even one


def _next_toward(y: np.ndarray, x: np.ndarray, dtype: DType) -> np.ndarray:
    """The values of dtype next to y (values of dtype, as f64) in the direction of x, as f64."""
    with np.errstate(over="ignore"):
        if dtype is dt.bf16:  # bf16 values are the f32s whose low 16 bits are 0: step the high half
            bits = y.astype(np.float32).view(np.uint32).astype(np.int64)
            away = np.where(np.abs(x) > np.abs(y), bits + 0x10000, bits - 0x10000)  # sign-magnitude
            out = np.where(y == 0, 0x10000 | np.where(x < 0, 0x80000000, 0), away)  # the smallest subnormal
            return out.astype(np.uint32).view(np.float32).astype(np.float64)
        t = np.float16 if dtype is dt.f16 else np.float32
        return np.nextafter(y.astype(t), np.where(x > y, np.inf, -np.inf).astype(t)).astype(np.float64)


MAX_ITEM = 100  # characters of one printed value: 9 or 17 digits is what spec 9 asks for
_FLOAT_CHARS = re.compile(r"[-0-9.eE+, \tinfa]*+")  # with the checks below, what numpy reads is a decimal of spec 1
_INTS = re.compile(r"[ \t]*-?[0-9]{1,18}[ \t]*(?:,[ \t]*-?[0-9]{1,18}[ \t]*)*+")  # all within int64


def bulk_floats(inner: str, n: int) -> np.ndarray | None:
    """numpy's reading of n decimals (exact, as float() is), or None where it might differ from
    parse_number: numpy also reads `+1` and `-nan`, and stops at the first item it cannot read."""
    if not _FLOAT_CHARS.fullmatch(inner):
        return None
    b = np.frombuffer(inner.encode(), np.uint8)
    plus, minus = np.flatnonzero(b == ord("+")), np.flatnonzero(b[:-1] == ord("-"))
    if not np.isin(b[plus - 1], np.frombuffer(b"eE", np.uint8)).all() or (b[minus + 1] == ord("n")).any():
        return None
    try:
        x = np.fromstring(inner, np.float64, sep=",")
    except ValueError:
        return None
    return x if x.size == n else None


def read_values(inner: str, dtype: DType, n: int) -> np.ndarray:
    """A printed list's n values (`v0, v1, ...` without its brackets) read back into dtype as
    read_back does, in bulk: floats as f64 holding the dtype's values, ints in the dtype's
    storage type. numpy converts the decimals (exactly, as float() does); only hex floats,
    true/false, ints past int64, bad items and the rare ties of a second rounding go through
    read_back one at a time. Raises ValueError_ with what is wrong."""
    ends = np.flatnonzero(np.frombuffer(inner.encode("ascii", errors="replace"), np.uint8) == ord(","))
    count = ends.size + 1 if ends.size or inner.strip() else 0
    if count != n:
        raise ValueError_(f"{count} values, expected {n}")
    bounds = np.concatenate([[-1], ends, [len(inner)]])
    item = lambda i: inner[bounds[i] + 1:bounds[i + 1]].strip()  # noqa: E731
    long = np.flatnonzero(np.diff(bounds) > MAX_ITEM + 1)
    if long.size:
        raise ValueError_(f"'{item(long[0])[:40]}...' is longer than {MAX_ITEM} characters")
    x = bulk_floats(inner, n) if dtype.is_float else None
    if x is not None:
        y = round_float(x, dtype).astype(np.float64)
        with np.errstate(invalid="ignore"):
            near = np.flatnonzero((x != y) & np.isfinite(x) & np.isfinite(y))
        z = _next_toward(y[near], x[near], dtype)
        for i in near[(x[near] == (y[near] + z) / 2) | ~np.isfinite(z)]:  # on a midpoint: the exact decimal decides
            y[i] = read_back(item(i), dtype)
        return y
    if not dtype.is_float and _INTS.fullmatch(inner):
        x = np.fromstring(inner, np.int64, sep=",")
        bad = np.flatnonzero((x < dtype.min) | (x > min(dtype.max, 2**63 - 1)))
        if bad.size:
            raise ValueError_(f"'{item(bad[0])[:40]}' is not a value of {dtype}")
        return x.astype(dtype.np_name)
    values = [read_back(s.strip(), dtype) for s in inner.split(",")] if n else []
    bad_at = next((i for i, v in enumerate(values) if v is None), None)
    if bad_at is not None:
        raise ValueError_(f"'{item(bad_at)[:40]}' is not a value of {dtype}")
    return np.array(values, np.float64 if dtype.is_float else dtype.np_name)


DEFAULT_TOL = {dt.f64: (1e-12, 1e-9), dt.f32: (1e-5, 1e-4), dt.f16: (1e-3, 1e-2), dt.bf16: (1e-2, 2e-2)}


def first_mismatch(actual: np.ndarray, expected: np.ndarray, dtype: DType,
                   atol: float | None = None, rtol: float | None = None) -> int | None:
    """Index of the first element of actual that does not match expected (spec 8), or None."""
    a = np.asarray(actual).reshape(-1)
    e = np.asarray(expected).reshape(-1)
    if dtype.is_float:
        d_atol, d_rtol = DEFAULT_TOL[dtype]
        atol = d_atol if atol is None else atol
        rtol = d_rtol if rtol is None else rtol
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ok = (np.isnan(a64) & np.isnan(e64)) | (a64 == e64) | (
                np.isfinite(a64) & np.isfinite(e64) & (np.abs(a64 - e64) <= atol + rtol * np.abs(e64)))
    else:
        # exact, whatever the array types (text read back, u64 beyond int64)
        ok = np.asarray(a.astype(object) == e.astype(object), dtype=bool)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else None
