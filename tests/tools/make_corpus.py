"""Writes tests/eir/: the .eir test corpus, by op family.

Expected values come from computations independent of Ember: numpy in float64 (rounded to the
result dtype here where the spec says so), exact Python integers, values worked by hand, and a
pure-Python splitmix64. Nothing here imports `ember`. Run: python tests/tools/make_corpus.py
"""
from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1] / "eir"
M64 = (1 << 64) - 1


def v2s(v: object) -> str:
    if isinstance(v, (bool, np.bool_)):
        return str(int(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    f = float(v)  # type: ignore[arg-type]
    return "nan" if math.isnan(f) else repr(f)


def lst(values: object) -> str:
    if isinstance(values, (list, tuple)) and all(isinstance(v, int) for v in values):
        items = list(values)  # exact: big u64 values must not pass through a float array
    else:
        items = np.asarray(values).reshape(-1).tolist()
    return "[" + ", ".join(v2s(v) for v in items) + "]"


def write(family: str, name: str, body: str, inputs: dict, expects: dict, note: str = "") -> None:
    lines = ["ember 1"] + ([f"# {note}"] if note else []) + [ln.strip() for ln in body.strip().splitlines()]
    for k, v in inputs.items():
        lines.append(f"input {k} = {v if isinstance(v, str) else lst(v)}")
    for k, v in expects.items():
        extra = ""
        if isinstance(v, tuple):
            v, extra = v
        lines.append(f"expect {k} = {v if isinstance(v, str) else lst(v)}{' ' + extra if extra else ''}")
    path = ROOT / family / f"{name}.eir"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------ independent helpers

def splitmix(seed: int, i: int) -> int:
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rand_float(seed: int, n: int, p: float = 1.0) -> list[float]:
    return [((splitmix(seed, i) >> 40) - 2**23) * 2.0**-23 * p for i in range(n)]


def rand_int(seed: int, n: int, lo: int, hi: int) -> list[int]:
    return [lo + ((splitmix(seed, i) >> 32) % (hi - lo)) for i in range(n)]


def bf16(x: float) -> float:
    """Round an f64 to bf16 exactly (nearest, ties to even), via exact rational arithmetic."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    m, e = math.frexp(abs(x))             # x = m * 2^e, 0.5 <= m < 1
    e = max(e, -125)                      # subnormal range of bf16 (like f32)
    scale = 2.0 ** (8 - e)                # keep 8 significant bits
    q = abs(x) * scale
    r = math.floor(q)
    frac = q - r
    if frac > 0.5 or (frac == 0.5 and r % 2 == 1):
        r += 1
    out = r / scale
    if out >= 2.0**128 * (1 - 2.0**-9):
        out = math.inf
    return math.copysign(out, x)


def f32(x: float) -> float:
    return float(np.float32(x))


def f16(x: float) -> float:
    return float(np.float16(x))


def wrap(v: int, bits: int, signed: bool) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >> (bits - 1) else v


def cdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


# ------------------------------------------------------------------------------ families

def sources() -> None:
    F = "sources"
    write(F, "const_f32", "c = const 1.5 f32[2,2]\nreturn c", {}, {"c": [1.5] * 4})
    write(F, "const_int_truncates", "a = const 2.7 i32[3]\nb = const -2.7 i32[3]\nreturn a b", {},
          {"a": [2] * 3, "b": [-2] * 3}, "const converts as cast does: fractional values truncate toward zero")
    write(F, "const_bool", "t = const 5 bool[2]\nf = const 0 bool[2]\nr = const true bool[1]\nreturn t f r", {},
          {"t": [1, 1], "f": [0, 0], "r": [1]})
    write(F, "const_hex_float", "c = const 0x1.8p+1 f64[1]\nd = const -0x1p-3 f32[1]\nreturn c d", {},
          {"c": [3.0], "d": [-0.125]})
    write(F, "const_special", "a = const inf f32[2]\nb = const -inf f64[1]\nc = const nan f32[1]\n"
          "d = const 1e40 f32[1]\nreturn a b c d", {},
          {"a": "[inf, inf]", "b": "[-inf]", "c": "[nan]", "d": "[inf]"},
          "1e40 overflows f32 and rounds to inf")
    write(F, "const_f16_rounding", "a = const 65520 f16[1]\nb = const 65519 f16[1]\nc = const 0.1 f16[1]\n"
          "return a b c", {}, {"a": "[inf]", "b": [65504.0], "c": [f16(0.1)]},
          "65520 is the tie between 65504 and 65536: ties to even overflows to inf")
    write(F, "const_bf16_rounding", "a = const 0.1 bf16[1]\nb = const 1.00390625 bf16[1]\nc = const 1.01171875 bf16[1]\n"
          "return a b c", {}, {"a": ([bf16(0.1)], "atol=0 rtol=0"), "b": ([1.0], "atol=0 rtol=0"),
                                "c": ([1.015625], "atol=0 rtol=0")},
          "bf16 keeps 8 significant bits; the ties round to even")
    write(F, "iota_axes", "a = iota i32[2,3] axis=0\nb = iota i32[2,3] axis=1\nreturn a b", {},
          {"a": [0, 0, 0, 1, 1, 1], "b": [0, 1, 2, 0, 1, 2]})
    write(F, "iota_float_and_bool", "a = iota f16[4] axis=0\nb = iota bool[3] axis=0\nc = iota u8[300] axis=0\nreturn a b c",
          {}, {"a": [0.0, 1.0, 2.0, 3.0], "b": [0, 1, 1], "c": [i % 256 for i in range(300)]},
          "iota converts as cast: to bool is != 0; to u8 keeps the low bits")
    write(F, "iota_rank3", "a = iota i64[2,3,4] axis=2\nb = iota i64[2,3,4] axis=1\nreturn a b", {},
          {"a": np.indices((2, 3, 4))[2], "b": np.indices((2, 3, 4))[1]})
    write(F, "param_returned", "x = param i16[3]\nreturn x", {"x": [-32768, 0, 32767]}, {"x": [-32768, 0, 32767]})
    write(F, "scalar_rank0", "x = param f64[]\nc = const 2 f64[]\ny = mul x c\nreturn y", {"x": [1.25]}, {"y": [2.5]},
          "f64[] is a scalar with one element")
    write(F, "const_negative_zero", "a = const -0.0 f32[1]\nb = const 1 f32[1]\nc = div b a\nreturn c", {},
          {"c": "[-inf]"}, "1 / -0 is -inf: the const keeps the sign of zero")


def unary() -> None:
    F = "unary"
    x = np.array([-3.5, -1.0, -0.0, 0.25, 1.0, 2.0, 10.0, 100.0])
    write(F, "neg_f32", "x = param f32[8]\ny = neg x\nreturn y", {"x": x}, {"y": -x})
    write(F, "neg_int_wraps", "x = param i8[4]\ny = neg x\nreturn y", {"x": [-128, -1, 0, 127]},
          {"y": [-128, 1, 0, -127]}, "-(-128) wraps to -128 in i8")
    pos = np.array([0.25, 0.5, 1.0, 2.0, 3.0, 10.0, 1e-3, 1e3])
    write(F, "recip_f32", "x = param f32[8]\ny = recip x\nreturn y", {"x": pos}, {"y": 1 / pos})
    write(F, "recip_zero_signs", "x = param f32[2]\ny = recip x\nreturn y", {"x": [0.0, -0.0]}, {"y": "[inf, -inf]"})
    write(F, "sqrt_f64", "x = param f64[8]\ny = sqrt x\nreturn y", {"x": pos}, {"y": np.sqrt(pos)})
    write(F, "sqrt_special", "x = param f32[3]\ny = sqrt x\nreturn y", {"x": "[0, inf, -0.0]"}, {"y": "[0, inf, -0.0]"})
    e = np.array([-10.0, -1.0, 0.0, 0.5, 1.0, 3.0, 10.0, 20.0])
    write(F, "exp2_f32", "x = param f32[8]\ny = exp2 x\nreturn y", {"x": e}, {"y": np.exp2(e)})
    write(F, "exp2_limits", "x = param f32[3]\ny = exp2 x\nreturn y", {"x": "[-inf, inf, 200]"}, {"y": "[0, inf, inf]"})
    write(F, "log2_f32", "x = param f32[8]\ny = log2 x\nreturn y", {"x": pos}, {"y": np.log2(pos)})
    write(F, "log2_zero_inf", "x = param f64[2]\ny = log2 x\nreturn y", {"x": "[0, inf]"}, {"y": "[-inf, inf]"})
    s = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 1.5707963267948966, 3.0, 6.0])
    write(F, "sin_f32", "x = param f32[8]\ny = sin x\nreturn y", {"x": s}, {"y": np.sin(s)})
    t = [-2.7, -2.5, -0.5, -0.0, 0.5, 2.5, 2.7, 1e10]
    write(F, "trunc_f32", "x = param f32[8]\ny = trunc x\nreturn y", {"x": t}, {"y": np.trunc(np.float32(t))})
    write(F, "trunc_inf_nan", "x = param f64[3]\ny = trunc x\nreturn y", {"x": "[inf, -inf, nan]"}, {"y": "[inf, -inf, nan]"})
    h = np.array([0.5, 1.0, 2.0, 4.0])
    write(F, "f16_math", "x = param f16[4]\na = sqrt x\nb = recip x\nc = exp2 x\nreturn a b c", {"x": h},
          {"a": [f16(v) for v in np.sqrt(h)], "b": 1 / h, "c": np.exp2(h)})
    write(F, "bf16_math", "x = param bf16[4]\na = log2 x\nb = neg x\nreturn a b", {"x": h},
          {"a": np.log2(h), "b": -h})
    write(F, "nan_passes", "x = param f32[4]\na = sqrt x\nb = sin x\nc = neg x\nreturn a b c",
          {"x": "[nan, nan, nan, nan]"}, {"a": "[nan, nan, nan, nan]", "b": "[nan, nan, nan, nan]",
                                          "c": "[nan, nan, nan, nan]"})


def binary() -> None:
    F = "binary"
    a = np.array([1.5, -2.0, 3.25, 0.0, 1e10, -7.0])
    b = np.array([0.5, 4.0, -1.25, -0.0, 1e-10, 3.0])
    for op, fn in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide)):
        write(F, f"{op}_f32", f"x = param f32[6]\ny = param f32[6]\nz = {op} x y\nreturn z", {"x": a, "y": b},
              {"z": fn(a, b)})
    write(F, "add_i8_wraps", "x = param i8[4]\ny = param i8[4]\nz = add x y\nreturn z",
          {"x": [127, -128, 100, -1], "y": [1, -1, 100, -1]},
          {"z": [wrap(127 + 1, 8, True), wrap(-128 - 1, 8, True), wrap(200, 8, True), -2]})
    write(F, "mul_u8_wraps", "x = param u8[3]\ny = param u8[3]\nz = mul x y\nreturn z",
          {"x": [16, 255, 3], "y": [16, 255, 5]}, {"z": [0, 1, 15]})
    write(F, "sub_u32_wraps", "x = param u32[2]\ny = param u32[2]\nz = sub x y\nreturn z",
          {"x": [0, 5], "y": [1, 3]}, {"z": [4294967295, 2]})
    write(F, "mul_i64_wraps", "x = param i64[2]\ny = param i64[2]\nz = mul x y\nreturn z",
          {"x": [4611686018427387904, 3037000500], "y": [4, 3037000500]},
          {"z": [wrap(4611686018427387904 * 4, 64, True), wrap(3037000500**2, 64, True)]})
    pairs = [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 5), (5, 7), (-5, 7), (100, -7)]
    xs, ys = zip(*pairs)
    write(F, "idiv_mod_i32", "x = param i32[8]\ny = param i32[8]\nq = idiv x y\nr = mod x y\nreturn q r",
          {"x": xs, "y": ys}, {"q": [cdiv(p, q) for p, q in pairs], "r": [p - cdiv(p, q) * q for p, q in pairs]},
          "C semantics: the quotient truncates toward zero, mod has the sign of x")
    write(F, "idiv_mod_u16", "x = param u16[3]\ny = param u16[3]\nq = idiv x y\nr = mod x y\nreturn q r",
          {"x": [65535, 7, 10], "y": [2, 7, 3]}, {"q": [32767, 1, 3], "r": [1, 0, 1]})
    write(F, "idiv_i8_edges", "x = param i8[3]\ny = param i8[3]\nq = idiv x y\nr = mod x y\nreturn q r",
          {"x": [-128, -128, 127], "y": [2, 127, -128]}, {"q": [-64, -1, 0], "r": [0, -1, 127]})
    write(F, "max_nan", "x = param f32[4]\ny = param f32[4]\nz = max x y\nw = max y x\nreturn z w",
          {"x": "[nan, 1, -inf, 2]", "y": "[1, nan, 3, 2]"}, {"z": "[nan, nan, 3, 2]", "w": "[nan, nan, 3, 2]"},
          "max is NaN when either operand is NaN, in either order")
    write(F, "max_ints", "x = param i64[3]\ny = param i64[3]\nz = max x y\nu = param u8[2]\nv = param u8[2]\nw = max u v\n"
          "return z w", {"x": [-5, 9223372036854775807, 0], "y": [-6, 0, -1], "u": [255, 0], "v": [1, 1]},
          {"z": [-5, 9223372036854775807, 0], "w": [255, 1]})
    write(F, "div_special", "x = param f64[4]\ny = param f64[4]\nz = div x y\nreturn z",
          {"x": "[1, -1, 0, inf]", "y": "[0, 0, 0, inf]"}, {"z": "[inf, -inf, nan, nan]"})
    write(F, "add_f16_rounds", "x = param f16[2]\ny = param f16[2]\nz = add x y\nreturn z",
          {"x": [2048.0, 65504.0], "y": [1.0, 65504.0]}, {"z": ("[2048, inf]", "atol=0 rtol=0")},
          "2048 + 1 is a tie in f16 and rounds to even (2048); 65504 + 65504 overflows")
    write(F, "mul_bf16", "x = param bf16[3]\ny = param bf16[3]\nz = mul x y\nreturn z",
          {"x": [1.5, 3.0, -0.5], "y": [1.5, 3.0, 256.0]}, {"z": [2.25, 9.0, -128.0]})


def compare_bitwise() -> None:
    F = "compare_bitwise"
    write(F, "cmp_f32", "x = param f32[5]\ny = param f32[5]\nlt = cmplt x y\neq = cmpeq x y\nne = cmpne x y\n"
          "return lt eq ne", {"x": "[1, 2, nan, -0.0, -inf]", "y": "[2, 2, nan, 0, 0]"},
          {"lt": [1, 0, 0, 0, 1], "eq": [0, 1, 0, 1, 0], "ne": [1, 0, 1, 0, 1]},
          "IEEE quiet comparisons: nan is unequal to everything, -0 == 0")
    write(F, "cmp_signed_unsigned", "a = param i8[2]\nb = param i8[2]\nc = cmplt a b\nu = param u8[2]\nv = param u8[2]\n"
          "w = cmplt u v\nreturn c w", {"a": [-1, 5], "b": [1, -5], "u": [255, 5], "v": [1, 250]},
          {"c": [1, 0], "w": [0, 1]})
    write(F, "cmpeq_bool", "a = param bool[4]\nb = param bool[4]\ne = cmpeq a b\nn = cmpne a b\nreturn e n",
          {"a": [0, 0, 1, 1], "b": [0, 1, 0, 1]}, {"e": [1, 0, 0, 1], "n": [0, 1, 1, 0]})
    write(F, "and_or_xor_bool", "a = param bool[4]\nb = param bool[4]\nx = and a b\ny = or a b\nz = xor a b\nreturn x y z",
          {"a": "[false, false, true, true]", "b": "[false, true, false, true]"},
          {"x": [0, 0, 0, 1], "y": [0, 1, 1, 1], "z": [0, 1, 1, 0]})
    write(F, "and_or_xor_i32", "a = param i32[3]\nb = param i32[3]\nx = and a b\ny = or a b\nz = xor a b\nreturn x y z",
          {"a": [12, -1, 0x7FFFFFFF], "b": [10, 255, -2147483648]},
          {"x": [8, 255, 0], "y": [14, -1, -1], "z": [6, -256, -1]})
    write(F, "bitwise_u64", "a = param u64[2]\nb = param u64[2]\nx = xor a b\nreturn x",
          {"a": [18446744073709551615, 1], "b": [1, 18446744073709551614]}, {"x": [18446744073709551614, 18446744073709551615]})
    write(F, "shl_wraps", "a = param i8[4]\nb = param i8[4]\nc = shl a b\nreturn c", {"a": [1, 1, -1, 3], "b": [6, 7, 7, 6]},
          {"c": [64, -128, -128, -64]})
    write(F, "shr_signed_arith", "a = param i16[4]\nb = param i16[4]\nc = shr a b\nreturn c",
          {"a": [-32768, -1, 100, -7], "b": [15, 3, 2, 1]}, {"c": [-1, -1, 25, -4]},
          "shr is arithmetic for signed dtypes")
    write(F, "shr_unsigned_logical", "a = param u16[3]\nb = param u16[3]\nc = shr a b\nd = shl a b\nreturn c d",
          {"a": [65535, 32768, 3], "b": [15, 15, 14]}, {"c": [1, 1, 0], "d": [32768, 0, 49152]})
    write(F, "shift_u32_i64", "a = param u32[2]\nb = param u32[2]\nc = shl a b\nx = param i64[2]\ny = param i64[2]\n"
          "z = shr x y\nreturn c z", {"a": [1, 4294967295], "b": [31, 4], "x": [-9223372036854775808, 1024], "y": [63, 10]},
          {"c": [2147483648, 4294967280], "z": [-1, 1]})
    write(F, "cmp_f16_inf", "x = param f16[3]\ny = param f16[3]\nz = cmplt x y\nreturn z", {"x": "[-inf, 1, inf]",
          "y": "[-65504, 1.0009765625, inf]"}, {"z": [1, 1, 0]})


def where() -> None:
    F = "where"
    write(F, "where_f32", "c = param bool[4]\nx = param f32[4]\ny = param f32[4]\nz = where c x y\nreturn z",
          {"c": [1, 0, 1, 0], "x": [1, 2, 3, 4], "y": [-1, -2, -3, -4]}, {"z": [1, -2, 3, -4]})
    write(F, "where_nan_branch", "c = param bool[2]\nx = param f32[2]\ny = param f32[2]\nz = where c x y\nreturn z",
          {"c": [0, 1], "x": "[nan, 1]", "y": "[2, nan]"}, {"z": [2, 1]}, "the branch not chosen does not leak nan")
    write(F, "where_from_compare", "x = param i32[5]\nz0 = const 0 i32[5]\nc = cmplt x z0\nn = neg x\ny = where c n x\nreturn y",
          {"x": [-3, 4, 0, -2147483647, 9]}, {"y": [3, 4, 0, 2147483647, 9]}, "absolute value")
    write(F, "where_bool_values", "c = param bool[3]\nx = param bool[3]\ny = param bool[3]\nz = where c x y\nreturn z",
          {"c": [1, 0, 1], "x": [0, 0, 1], "y": [1, 1, 0]}, {"z": [0, 1, 1]})
    write(F, "where_u64", "c = param bool[2]\nx = param u64[2]\ny = param u64[2]\nz = where c x y\nreturn z",
          {"c": [1, 0], "x": [18446744073709551615, 0], "y": [0, 9223372036854775808]},
          {"z": [18446744073709551615, 9223372036854775808]})
    write(F, "where_relu", "x = param f32[6]\nz0 = const 0 f32[6]\nc = cmplt z0 x\nr = where c x z0\nreturn r",
          {"x": [-2, -0.5, 0, 0.5, 3, -1e30]}, {"r": [0, 0, 0, 0.5, 3, 0]})
    write(F, "where_broadcast_cond", "c = param bool[2,1]\ncb = expand c shape=[2,3]\nx = iota f32[2,3] axis=1\n"
          "y = const -1 f32[2,3]\nz = where cb x y\nreturn z", {"c": [1, 0]}, {"z": [0, 1, 2, -1, -1, -1]})
    write(F, "where_f16", "c = param bool[3]\nx = param f16[3]\ny = param f16[3]\nz = where c x y\nreturn z",
          {"c": [1, 1, 0], "x": [0.5, 65504, 1], "y": [2, 3, -0.25]}, {"z": [0.5, 65504, -0.25]})
    write(F, "where_nested", "x = param i32[5]\nlo = const 0 i32[5]\nhi = const 10 i32[5]\nc1 = cmplt x lo\n"
          "c2 = cmplt hi x\na = where c2 hi x\nb = where c1 lo a\nreturn b", {"x": [-5, 0, 5, 10, 50]},
          {"b": [0, 0, 5, 10, 10]}, "clamp to [0, 10]")
    write(F, "where_same_branch", "c = param bool[2]\nx = param f64[2]\nz = where c x x\nreturn z",
          {"c": [1, 0], "x": [1.5, -2.5]}, {"z": [1.5, -2.5]})


def cast_bitcast() -> None:
    F = "cast_bitcast"
    write(F, "f32_to_int_truncates", "x = param f32[6]\na = cast x dtype=i32\nreturn a",
          {"x": [2.9, -2.9, 0.5, -0.5, 255.9, 100]}, {"a": [2, -2, 0, 0, 255, 100]},
          "float to int truncates toward zero")
    write(F, "f32_to_u8", "x = param f32[4]\nb = cast x dtype=u8\nreturn b", {"x": [2.9, 0.5, 255.9, 100]},
          {"b": [2, 0, 255, 100]})
    write(F, "int_to_int_low_bits", "x = param i32[4]\na = cast x dtype=i8\nb = cast x dtype=u16\nc = cast x dtype=i64\n"
          "return a b c", {"x": [300, -1, -129, 65536]}, {"a": [44, -1, 127, 0], "b": [300, 65535, 65407, 0],
                                                            "c": [300, -1, -129, 65536]})
    write(F, "unsigned_extends", "x = param u8[2]\na = cast x dtype=i32\ny = param i8[2]\nb = cast y dtype=u32\nreturn a b",
          {"x": [255, 128], "y": [-1, -128]}, {"a": [255, 128], "b": [4294967295, 4294967168]},
          "sign- or zero-extension follows the source dtype")
    write(F, "to_bool", "x = param f32[4]\na = cast x dtype=bool\ny = param i32[3]\nb = cast y dtype=bool\nreturn a b",
          {"x": "[0, -0.0, nan, 0.5]", "y": [0, -7, 256]}, {"a": [0, 0, 1, 1], "b": [0, 1, 1]})
    write(F, "from_bool", "x = param bool[2]\na = cast x dtype=f32\nb = cast x dtype=i8\nreturn a b",
          {"x": [1, 0]}, {"a": [1, 0], "b": [1, 0]})
    write(F, "int_to_float_rne", "x = param i32[3]\na = cast x dtype=f32\ny = param i32[2]\nb = cast y dtype=f16\nreturn a b",
          {"x": [16777217, 16777219, -16777217], "y": [2049, 2051]},
          {"a": ([16777216, 16777220, -16777216], "atol=0 rtol=0"), "b": ([2048, 2052], "atol=0 rtol=0")},
          "int to float rounds to nearest, ties to even")
    write(F, "f32_to_bf16_rne", "x = param f32[4]\na = cast x dtype=bf16\nreturn a",
          {"x": [1.00390625, 1.01171875, 3.0e38, -1.0e-40]},
          {"a": ([bf16(1.00390625), bf16(1.01171875), bf16(f32(3.0e38)), bf16(f32(-1.0e-40))], "atol=0 rtol=0")})
    write(F, "f64_to_f32_f16", "x = param f64[3]\na = cast x dtype=f32\nb = cast x dtype=f16\nreturn a b",
          {"x": [0.1, 1e300, 1.0009765625]}, {"a": ([f32(0.1), math.inf, 1.0009765625], "atol=0 rtol=0"), "b": ([f16(0.1), math.inf, 1.0009765625], "atol=0 rtol=0")})
    write(F, "bitcast_f32_i32", "x = param f32[3]\na = bitcast x dtype=i32\nb = bitcast a dtype=f32\nreturn a b",
          {"x": [1.0, -0.0, -2.5]}, {"a": [struct.unpack("<i", struct.pack("<f", v))[0] for v in (1.0, -0.0, -2.5)],
                                     "b": [1.0, -0.0, -2.5]})
    write(F, "bitcast_f16_bf16_u16", "x = param f16[2]\na = bitcast x dtype=u16\ny = param bf16[2]\nb = bitcast y dtype=i16\n"
          "return a b", {"x": [1.0, -2.0], "y": [1.0, -2.0]}, {"a": [0x3C00, 0xC000], "b": [0x3F80, wrap(0xC000, 16, True)]})
    write(F, "bitcast_u64_f64", "x = param u64[2]\na = bitcast x dtype=f64\nreturn a",
          {"x": [0x3FF0000000000000, 0x8000000000000000]}, {"a": ([1.0, -0.0], "atol=0 rtol=0")})
    write(F, "cast_f16_to_i8", "x = param f16[3]\na = cast x dtype=i8\nreturn a", {"x": [-100.5, 99.9, 0.75]},
          {"a": [-100, 99, 0]})


def movement() -> None:
    F = "movement"
    a = np.arange(24).reshape(2, 3, 4)
    write(F, "reshape", "x = param i32[2,3,4]\ny = reshape x shape=[4,6]\nz = reshape y shape=[24]\nreturn y z",
          {"x": a}, {"y": a.reshape(4, 6), "z": a.reshape(24)})
    write(F, "permute", "x = param i32[2,3,4]\ny = permute x order=[2,0,1]\nreturn y", {"x": a}, {"y": a.transpose(2, 0, 1)})
    write(F, "expand", "x = param f32[3,1]\ny = expand x shape=[3,4]\nreturn y", {"x": [1, 2, 3]},
          {"y": np.broadcast_to(np.array([1, 2, 3.0]).reshape(3, 1), (3, 4))})
    write(F, "pad", "x = param f32[2,2]\ny = pad x before=[1,0] after=[0,2] value=-1.5\nz = pad x before=[0,1] after=[1,0]\n"
          "return y z", {"x": [1, 2, 3, 4]},
          {"y": np.pad(np.array([[1, 2], [3, 4.0]]), ((1, 0), (0, 2)), constant_values=-1.5),
           "z": np.pad(np.array([[1, 2], [3, 4.0]]), ((0, 1), (1, 0)))})
    write(F, "shrink_odd", "x = param i32[2,3,4]\ny = shrink x start=[1,1,1] end=[2,3,4]\nreturn y", {"x": a},
          {"y": a[1:2, 1:3, 1:4]}, "a shrink starting at an odd offset")
    write(F, "flip", "x = param i32[2,3,4]\ny = flip x axes=[0,2]\nz = flip x axes=[]\nreturn y z", {"x": a},
          {"y": a[::-1, :, ::-1], "z": a})
    write(F, "transpose_then_reshape", "x = param f32[3,4]\nt = permute x order=[1,0]\nr = reshape t shape=[2,6]\nreturn r",
          {"x": np.arange(12.0)}, {"r": np.arange(12.0).reshape(3, 4).T.reshape(2, 6)},
          "reshape after permute reads the permuted order")
    b = np.arange(6).reshape(2, 3)
    write(F, "chain", "x = param i64[2,3]\np = pad x before=[1,1] after=[1,1]\ns = shrink p start=[0,1] end=[3,5]\n"
          "f = flip s axes=[1]\nq = permute f order=[1,0]\nreturn q", {"x": b},
          {"q": np.pad(b, 1)[0:3, 1:5][:, ::-1].T})
    write(F, "expand_reshape", "x = param f32[1,3]\ne = expand x shape=[2,3]\nr = reshape e shape=[3,2]\nreturn r",
          {"x": [1, 2, 3]}, {"r": np.broadcast_to(np.array([[1, 2, 3.0]]), (2, 3)).reshape(3, 2)})
    write(F, "pad_bool_u8", "x = param bool[2]\ny = pad x before=[1] after=[2] value=1\nu = param u8[1]\n"
          "v = pad u before=[2] after=[0] value=255\nreturn y v", {"x": [0, 1], "u": [7]},
          {"y": [1, 0, 1, 1, 1], "v": [255, 255, 7]})
    write(F, "size_one_dims", "x = param f32[1,7,1]\np = permute x order=[2,1,0]\nr = reshape p shape=[7]\n"
          "e = reshape r shape=[7,1]\nf = expand e shape=[7,13]\nreturn f", {"x": np.arange(7.0)},
          {"f": np.broadcast_to(np.arange(7.0).reshape(7, 1), (7, 13))})
    c = np.arange(60).reshape(3, 4, 5)
    write(F, "permute_shrink_pad_3d", "x = param i32[3,4,5]\np = permute x order=[1,2,0]\ns = shrink p start=[1,0,1] end=[3,5,3]\n"
          "q = pad s before=[0,2,0] after=[1,0,0] value=-9\nreturn q", {"x": c},
          {"q": np.pad(c.transpose(1, 2, 0)[1:3, 0:5, 1:3], ((0, 1), (2, 0), (0, 0)), constant_values=-9)})
    write(F, "reshape_split_merge", "x = param i32[6,4]\na = reshape x shape=[2,3,2,2]\nb = permute a order=[0,2,1,3]\n"
          "c = reshape b shape=[4,6]\nreturn c", {"x": np.arange(24)},
          {"c": np.arange(24).reshape(2, 3, 2, 2).transpose(0, 2, 1, 3).reshape(4, 6)})


def reductions() -> None:
    F = "reductions"
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4) - 11.5
    write(F, "sum_axes", "x = param f32[2,3,4]\na = sum x axes=[0]\nb = sum x axes=[2,1]\nc = sum x axes=[0,1,2]\nreturn a b c",
          {"x": x}, {"a": x.sum(0, keepdims=True), "b": x.sum((1, 2), keepdims=True), "c": x.sum(keepdims=True)})
    write(F, "max_axes", "x = param f32[2,3,4]\na = max x axes=[1]\nb = max x axes=[0,2]\nreturn a b",
          {"x": x}, {"a": x.max(1, keepdims=True), "b": x.max((0, 2), keepdims=True)})
    write(F, "max_nan", "x = param f32[2,3]\nm = max x axes=[1]\nreturn m", {"x": "[1, nan, 3, -inf, -inf, -inf]"},
          {"m": "[nan, -inf]"}, "a reduction max is NaN if any element is")
    write(F, "sum_int_wraps", "x = param i8[4]\ns = sum x axes=[0]\nu = param u32[3]\nt = sum u axes=[0]\nreturn s t",
          {"x": [100, 100, 100, -1], "u": [4294967295, 2, 3]}, {"s": [wrap(299, 8, True)], "t": [4]})
    write(F, "sum_empty_axes_identity", "x = param i32[2,2]\ns = sum x axes=[]\nreturn s", {"x": [1, 2, 3, 4]}, {"s": [1, 2, 3, 4]})
    big = np.array(rand_float(7, 50257))
    write(F, "sum_large_row", "x = param f32[1,50257]\ns = sum x axes=[1]\nm = max x axes=[1]\nreturn s m",
          {"x": "rand seed=7"}, {"s": ([big.sum()], "atol=1e-3"), "m": [big.max()]},
          "a row of 50257, the GPT-2 vocabulary")
    h = np.array(rand_float(3, 4096, 1.0))
    h16 = np.array([f16(v) for v in h])
    write(F, "sum_f16_accumulates", "x = param f16[4096]\ns = sum x axes=[0]\nreturn s", {"x": "rand seed=3"},
          {"s": [f16(h16.sum())]}, "f16 sums accumulate in at least f32")
    m = np.array(rand_int(11, 13 * 7, -50, 50)).reshape(13, 7)
    write(F, "noncontiguous_axis", "x = param i32[13,7]\ns = sum x axes=[0]\nm = max x axes=[0]\nreturn s m",
          {"x": "rand seed=11 lo=-50 hi=50"}, {"s": m.sum(0, keepdims=True), "m": m.max(0, keepdims=True)},
          "reductions over the non-contiguous axis")
    write(F, "max_ints_unsigned", "x = param u16[2,2]\nm = max x axes=[0,1]\ny = param i64[3]\nn = max y axes=[0]\nreturn m n",
          {"x": [1, 65535, 3, 4], "y": [-9223372036854775808, -5, -9]}, {"m": [65535], "n": [-5]})
    write(F, "sum_inf_nan", "x = param f64[2,2]\ns = sum x axes=[1]\nreturn s", {"x": "[inf, 1, inf, -inf]"}, {"s": "[inf, nan]"})
    write(F, "sum_then_expand", "x = param f32[4,5]\ns = sum x axes=[1]\ne = expand s shape=[4,5]\nd = sub x e\nreturn d",
          {"x": np.arange(20.0)}, {"d": np.arange(20.0).reshape(4, 5) - np.arange(20.0).reshape(4, 5).sum(1, keepdims=True)})
    write(F, "bf16_sum", "x = param bf16[8,3]\ns = sum x axes=[0]\nreturn s", {"x": np.arange(24.0) / 4},
          {"s": [bf16(v) for v in (np.arange(24.0) / 4).reshape(8, 3).sum(0)]})


def compositions() -> None:
    F = "compositions"
    A = np.array(rand_float(1, 4 * 5)).reshape(4, 5)
    B = np.array(rand_float(2, 5 * 3)).reshape(5, 3)
    write(F, "matmul_by_reshape",
          "a = param f32[4,5]\nb = param f32[5,3]\nar = reshape a shape=[4,5,1]\nae = expand ar shape=[4,5,3]\n"
          "br = reshape b shape=[1,5,3]\nbe = expand br shape=[4,5,3]\np = mul ae be\ns = sum p axes=[1]\n"
          "c = reshape s shape=[4,3]\nreturn c", {"a": "rand seed=1", "b": "rand seed=2"}, {"c": A @ B},
          "matmul as broadcast multiply then sum")
    At = np.array(rand_float(5, 33 * 17, 2.0)).reshape(33, 17)
    Bt = np.array(rand_float(6, 17 * 9, 2.0)).reshape(17, 9)
    write(F, "matmul_odd_sizes",
          "a = param f64[33,17]\nb = param f64[17,9]\nar = reshape a shape=[33,17,1]\nae = expand ar shape=[33,17,9]\n"
          "bt = permute b order=[0,1]\nbr = reshape bt shape=[1,17,9]\nbe = expand br shape=[33,17,9]\np = mul ae be\n"
          "s = sum p axes=[1]\nc = reshape s shape=[33,9]\nreturn c", {"a": "rand seed=5 scale=2", "b": "rand seed=6 scale=2"},
          {"c": At @ Bt})
    X = np.array(rand_float(9, 2 * 7, 4.0)).reshape(2, 7)

    def softmax_body(t: str, n: int, m: int) -> str:
        return (f"x = param {t}[{n},{m}]\nm = max x axes=[1]\nmb = expand m shape=[{n},{m}]\nd = sub x mb\n"
                f"l2e = const 1.4426950408889634 {t}[{n},{m}]\ne0 = mul d l2e\ne = exp2 e0\ns = sum e axes=[1]\n"
                f"sb = expand s shape=[{n},{m}]\np = div e sb\nreturn p")

    def softmax(v: np.ndarray) -> np.ndarray:
        e = np.exp(v - v.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    write(F, "softmax", softmax_body("f32", 2, 7), {"x": "rand seed=9 scale=4"}, {"p": softmax(X)})
    Y = np.array(rand_float(12, 3 * 129, 8.0)).reshape(3, 129)
    write(F, "softmax_129", softmax_body("f64", 3, 129), {"x": "rand seed=12 scale=8"}, {"p": softmax(Y)})
    write(F, "softmax_inf_row", softmax_body("f32", 2, 3), {"x": "[1, 2, -inf, -inf, 0, -inf]"},
          {"p": softmax(np.array([[1, 2, -np.inf], [-np.inf, 0, -np.inf]]))})
    Z = np.array(rand_float(13, 4 * 16, 2.0)).reshape(4, 16)

    def layernorm(v: np.ndarray) -> np.ndarray:
        mu = v.mean(1, keepdims=True)
        var = ((v - mu) ** 2).mean(1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-5)
    ln = ("x = param f32[4,16]\ns = sum x axes=[1]\nn = const 0.0625 f32[4,1]\nmu = mul s n\nmub = expand mu shape=[4,16]\n"
          "d = sub x mub\nd2 = mul d d\nv0 = sum d2 axes=[1]\nv = mul v0 n\neps = const 1e-5 f32[4,1]\nve = add v eps\n"
          "r = sqrt ve\nri = recip r\nrb = expand ri shape=[4,16]\ny = mul d rb\nreturn y")
    write(F, "layernorm", ln, {"x": "rand seed=13 scale=2"}, {"y": layernorm(Z)})
    write(F, "relu_mlp",
          "x = param f32[2,3]\nw = param f32[3,4]\nxr = reshape x shape=[2,3,1]\nxe = expand xr shape=[2,3,4]\n"
          "wr = reshape w shape=[1,3,4]\nwe = expand wr shape=[2,3,4]\np = mul xe we\nh0 = sum p axes=[1]\n"
          "h = reshape h0 shape=[2,4]\nz = const 0 f32[2,4]\nh1 = max h z\nreturn h1",
          {"x": [1, -2, 3, 0.5, 0.25, -1], "w": np.arange(12.0) / 6 - 1},
          {"h1": np.maximum(np.array([[1, -2, 3], [0.5, 0.25, -1]]) @ (np.arange(12.0) / 6 - 1).reshape(3, 4), 0)})
    V = np.array(rand_float(21, 5 * 6)).reshape(5, 6)
    write(F, "logsumexp", "x = param f64[5,6]\nm = max x axes=[1]\nmb = expand m shape=[5,6]\nd = sub x mb\n"
          "k = const 1.4426950408889634 f64[5,6]\nt = mul d k\ne = exp2 t\ns = sum e axes=[1]\nl = log2 s\n"
          "k2 = const 0.6931471805599453 f64[5,1]\nln = mul l k2\nr = add ln m\nreturn r",
          {"x": "rand seed=21"}, {"r": (np.log(np.exp(V).sum(1, keepdims=True)), "atol=1e-9")})
    write(F, "mean_var_columns", "x = param f64[6,3]\ns = sum x axes=[0]\nn = const 6 f64[1,3]\nr = div s n\n"
          "rb = expand r shape=[6,3]\nd = sub x rb\nq = mul d d\nv = sum q axes=[0]\nw = div v n\nreturn r w",
          {"x": np.arange(18.0) ** 1.5}, {"r": (np.arange(18.0) ** 1.5).reshape(6, 3).mean(0),
                                          "w": (np.arange(18.0) ** 1.5).reshape(6, 3).var(0)})
    P = np.array(rand_float(31, 3 * 4 * 8)).reshape(3, 4, 8)
    write(F, "batched_matmul_transposed",
          "q = param f32[3,4,8]\nk = param f32[3,4,8]\nkt = permute k order=[0,2,1]\nqr = reshape q shape=[3,4,8,1]\n"
          "qe = expand qr shape=[3,4,8,4]\nkr = reshape kt shape=[3,1,8,4]\nke = expand kr shape=[3,4,8,4]\n"
          "p = mul qe ke\ns = sum p axes=[2]\nc = reshape s shape=[3,4,4]\nreturn c",
          {"q": "rand seed=31", "k": "rand seed=31"}, {"c": P @ P.transpose(0, 2, 1)},
          "attention scores q @ k^T, k read through a permute")
    idx = np.array(rand_int(41, 12, 0, 10))
    write(F, "onehot_gather", "idx = param i32[12,1]\nie = expand idx shape=[12,10]\nr = iota i32[12,10] axis=1\n"
          "oh = cmpeq ie r\nf = cast oh dtype=f32\nw = iota f32[10,1] axis=0\nwr = reshape w shape=[1,10]\n"
          "we = expand wr shape=[12,10]\np = mul f we\ng = sum p axes=[1]\nreturn g", {"idx": "rand seed=41 lo=0 hi=10"},
          {"g": idx.reshape(12, 1).astype(float)}, "gather through a one-hot matmul")


def generator() -> None:
    F = "generator"
    for seed, t, p in ((0, "f32", 1.0), (1, "f64", 1.0), (42, "f32", 0.5), (123456789, "f64", 1024.0)):
        vals = rand_float(seed, 8, p)
        write(F, f"float_seed_{seed}", f"x = param {t}[8]\nreturn x", {"x": f"rand seed={seed}" + (f" scale={v2s(p)}" if p != 1 else "")},
              {"x": (vals, "atol=0 rtol=0")})
    write(F, "f16_rounds", "x = param f16[8]\nreturn x", {"x": "rand seed=5"},
          {"x": ([f16(v) for v in rand_float(5, 8)], "atol=0 rtol=0")})
    write(F, "bf16_rounds", "x = param bf16[8]\nreturn x", {"x": "rand seed=6 scale=4"},
          {"x": ([bf16(v) for v in rand_float(6, 8, 4.0)], "atol=0 rtol=0")})
    write(F, "int_range", "x = param i32[16]\nreturn x", {"x": "rand seed=7 lo=-5 hi=5"}, {"x": rand_int(7, 16, -5, 5)})
    write(F, "u8_full_range", "x = param u8[16]\nreturn x", {"x": "rand seed=8 lo=0 hi=256"}, {"x": rand_int(8, 16, 0, 256)})
    write(F, "i64_wide", "x = param i64[6]\nreturn x", {"x": "rand seed=9 lo=-9223372036854775808 hi=9223372036854775807"},
          {"x": rand_int(9, 6, -2**63, 2**63 - 1)})
    write(F, "bool", "x = param bool[16]\nreturn x", {"x": "rand seed=10"},
          {"x": [splitmix(10, i) >> 63 for i in range(16)]})
    write(F, "u64_large_seed", "x = param u64[4]\nreturn x", {"x": "rand seed=18446744073709551615 lo=0 hi=18446744073709551615"},
          {"x": rand_int(M64, 4, 0, M64)})
    write(F, "expect_rand", "x = param f32[2,5]\ny = add x x\nz = sub y x\nreturn z", {"x": "rand seed=77"},
          {"z": "rand seed=77 atol=0 rtol=0"}, "expect lines may use the generator too")
    rows = np.array(rand_float(3, 6)).reshape(2, 3)
    write(F, "row_major", "x = param f64[2,3]\nt = permute x order=[1,0]\nreturn t", {"x": "rand seed=3"},
          {"t": rows.T}, "element i of the generator is element i in row-major order")


def fd_grad(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central finite differences in f64 of sum(f(x)) with respect to x."""
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = h
        g.flat[i] = (np.sum(f(x + e)) - np.sum(f(x - e))) / (2 * h)
    return g


def grad() -> None:
    F = "grad"
    x = np.array([0.5, 1.25, 2.0, 3.5])

    def one(name: str, body: str, fn, xs: np.ndarray, t: str = "f64", note: str = "", extra: dict | None = None) -> None:
        shape = ",".join(map(str, xs.shape))
        text = f"x = param {t}[{shape}]\n{body}\ng = grad y x\nreturn g"
        write(F, name, text, {"x": xs, **(extra or {})}, {"g": (fd_grad(fn, xs), "atol=1e-6 rtol=1e-5" if t == "f64" else "")},
              note)
    one("neg", "y = neg x", lambda v: -v, x)
    one("recip", "y = recip x", lambda v: 1 / v, x)
    one("sqrt", "y = sqrt x", np.sqrt, x)
    one("exp2", "y = exp2 x", np.exp2, x)
    one("log2", "y = log2 x", np.log2, x)
    one("sin", "y = sin x", np.sin, x)
    one("mul_self", "y = mul x x", lambda v: v * v, x, note="both operands are x: contributions add")
    one("div_by_x", "c = const 3 f64[4]\ny = div c x", lambda v: 3 / v, x)
    one("sub_add_chain", "c = const 2 f64[4]\na = mul x c\nb = sub a x\ny = add b x", lambda v: 2 * v, x)
    one("max_ties_split", "c = const 1.25 f64[4]\ny = max x c", lambda v: np.maximum(v, 1.25), x,
        note="at the tie x == 1.25 the gradient is split equally: 1/2")
    one("where_branch", "c = const 1.5 f64[4]\nk = cmplt x c\nsq = mul x x\ny = where k sq x",
        lambda v: np.where(v < 1.5, v * v, v), x, note="where sends the gradient to the chosen branch only")
    one("cast_f32_back", "h = cast x dtype=f32\nh2 = mul h h\ny = cast h2 dtype=f64", lambda v: v * v, x)
    m = np.arange(6.0).reshape(2, 3) / 4 + 0.5
    one("reshape_permute", "r = reshape x shape=[3,2]\np = permute r order=[1,0]\nw = iota f64[2,3] axis=1\ny = mul p w",
        lambda v: v.reshape(3, 2).T * np.arange(3.0), m)
    one("expand_sum", "e = reshape x shape=[2,3,1]\nf = expand e shape=[2,3,4]\nw = iota f64[2,3,4] axis=2\ny = mul f w",
        lambda v: v.reshape(2, 3, 1) * np.arange(4.0), m, note="expand's gradient sums over the copies")
    one("pad_shrink_flip", "p = pad x before=[1,0] after=[0,2]\ns = shrink p start=[0,1] end=[3,5]\nf = flip s axes=[1]\n"
        "w = iota f64[3,4] axis=1\ny = mul f w",
        lambda v: np.pad(v, ((1, 0), (0, 2)))[0:3, 1:5][:, ::-1] * np.arange(4.0), m)
    one("sum_then_square", "s = sum x axes=[1]\ny = mul s s", lambda v: v.sum(1) ** 2, m)
    t = np.array([[1.0, 3.0, 3.0], [2.0, 0.5, 1.0]])
    one("reduce_max_ties", "y = max x axes=[1]", lambda v: v.max(1), t, note="two maxima share the gradient: 1/2 each")

    def softmax(v: np.ndarray) -> np.ndarray:
        e = np.exp2((v - v.max(1, keepdims=True)) * 1.4426950408889634)
        return e / e.sum(1, keepdims=True)
    w = np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]])
    one("softmax_weighted", "m = max x axes=[1]\nmb = expand m shape=[2,3]\nd = sub x mb\nk = const 1.4426950408889634 f64[2,3]\n"
        "t = mul d k\ne = exp2 t\ns = sum e axes=[1]\nsb = expand s shape=[2,3]\np = div e sb\nw = param f64[2,3]\ny = mul p w",
        lambda v: softmax(v) * w, m, extra={"w": w})
    labels = np.array([[0, 1, 0], [0, 0, 1]], dtype=np.float64)

    def xent(v: np.ndarray) -> np.ndarray:
        return -(labels * np.log2(softmax(v))).sum(1)
    one("cross_entropy", "m = max x axes=[1]\nmb = expand m shape=[2,3]\nd = sub x mb\nk = const 1.4426950408889634 f64[2,3]\n"
        "t = mul d k\ne = exp2 t\ns = sum e axes=[1]\nsb = expand s shape=[2,3]\np = div e sb\nl = log2 p\n"
        "oh = param f64[2,3]\nlo = mul l oh\nr = sum lo axes=[1]\ny = neg r", xent, m, extra={"oh": labels},
        note="cross-entropy (in bits) of a softmax against one-hot labels")

    def layernorm(v: np.ndarray) -> np.ndarray:
        mu = v.mean(1, keepdims=True)
        return (v - mu) / np.sqrt(((v - mu) ** 2).mean(1, keepdims=True) + 1e-5) * w
    one("layernorm_weighted", "s = sum x axes=[1]\nn = const 0.3333333333333333 f64[2,1]\nmu = mul s n\nmub = expand mu shape=[2,3]\n"
        "d = sub x mub\nd2 = mul d d\nv0 = sum d2 axes=[1]\nv = mul v0 n\neps = const 1e-5 f64[2,1]\nve = add v eps\n"
        "r = sqrt ve\nri = recip r\nrb = expand ri shape=[2,3]\nz = mul d rb\nw = param f64[2,3]\ny = mul z w",
        layernorm, m, extra={"w": w})
    b = np.array([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]])
    one("matmul_left", "ar = reshape x shape=[2,3,1]\nae = expand ar shape=[2,3,2]\nb = param f64[3,2]\nbr = reshape b shape=[1,3,2]\n"
        "be = expand br shape=[2,3,2]\np = mul ae be\ns = sum p axes=[1]\nc = mul s s\ny = reshape c shape=[2,2]",
        lambda v: (v @ b) ** 2, m, extra={"b": b})
    q = np.array([[0.1, 0.4], [-0.3, 0.2], [0.5, -0.1]])
    kv = np.array([[0.2, -0.1], [0.3, 0.4], [-0.2, 0.1]])

    def attention(v: np.ndarray) -> np.ndarray:
        s = v @ kv.T
        return softmax(s) @ kv
    one("attention", "kk = param f64[3,2]\nkt = permute kk order=[1,0]\nqr = reshape x shape=[3,2,1]\nqe = expand qr shape=[3,2,3]\n"
        "kr = reshape kt shape=[1,2,3]\nke = expand kr shape=[3,2,3]\nqk = mul qe ke\ns0 = sum qk axes=[1]\ns = reshape s0 shape=[3,3]\n"
        "m = max s axes=[1]\nmb = expand m shape=[3,3]\nd = sub s mb\nk2 = const 1.4426950408889634 f64[3,3]\nt = mul d k2\n"
        "e = exp2 t\nz = sum e axes=[1]\nzb = expand z shape=[3,3]\np = div e zb\npr = reshape p shape=[3,3,1]\n"
        "pe = expand pr shape=[3,3,2]\nvr = reshape kk shape=[1,3,2]\nve = expand vr shape=[3,3,2]\npv = mul pe ve\n"
        "o = sum pv axes=[1]\ny = reshape o shape=[3,2]", attention, q, extra={"kk": kv}, note="softmax(q k^T) v, gradient in q")
    one("second_derivative", "c = mul x x\ncube = mul c x\ng1 = grad cube x\ny = mul g1 x", lambda v: 3 * v ** 3, x,
        note="grad inside grad: d/dx of x * d(x^3)/dx")
    one("independent_is_zero", "c = param f64[4]\ny = mul c c", lambda v: 0 * v, x, extra={"c": x},
        note="y does not depend on x: the gradient is zeros")
    one("f32_chain", "a = mul x x\nb = exp2 a\ny = sin b", lambda v: np.sin(np.exp2(v * v)), np.array([0.1, 0.5, -0.7, 1.0]),
        t="f32")


def main() -> None:
    np.seterr(all="ignore")  # 0/0 and friends are meant here
    for fam in (sources, unary, binary, compare_bitwise, where, cast_bitcast, movement, reductions, compositions, generator,
                grad):
        fam()
    count = len(list(ROOT.rglob("*.eir")))
    print(f"wrote {count} tests under {ROOT}")


if __name__ == "__main__":
    main()
