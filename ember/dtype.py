"""The dtypes of the Ember IR (spec section 2) and what every layer needs to know about them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)   # one object a dtype (see __reduce__): equal is identical, hashed by id
class DType:
    name: str        # as written in .eir
    bits: int
    kind: str        # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float
    np_name: str     # numpy dtype that carries the bits (bf16 travels as uint16)
    c_name: str      # C storage type

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple:
        return _by_name, (self.name,)   # unpickled as the one object of its name: dtypes compare by `is`

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_signed(self) -> bool:
        return self.kind == "i"

    @property
    def is_numeric(self) -> bool:
        return self.kind in "iuf"

    @property
    def min(self) -> int:
        return -(1 << (self.bits - 1)) if self.kind == "i" else 0

    @property
    def max(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.kind == "i" else (1 << self.bits) - 1 if self.kind == "u" else 1


bool_ = DType("bool", 8, "b", "bool", "unsigned char")
i8 = DType("i8", 8, "i", "int8", "signed char")
i16 = DType("i16", 16, "i", "int16", "short")
i32 = DType("i32", 32, "i", "int32", "int")
i64 = DType("i64", 64, "i", "int64", "long long")
u8 = DType("u8", 8, "u", "uint8", "unsigned char")
u16 = DType("u16", 16, "u", "uint16", "unsigned short")
u32 = DType("u32", 32, "u", "uint32", "unsigned int")
u64 = DType("u64", 64, "u", "uint64", "unsigned long long")
f16 = DType("f16", 16, "f", "float16", "unsigned short")
bf16 = DType("bf16", 16, "f", "uint16", "unsigned short")
f32 = DType("f32", 32, "f", "float32", "float")
f64 = DType("f64", 64, "f", "float64", "double")

ALL = (bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64)
BY_NAME = {d.name: d for d in ALL}


def _by_name(name: str) -> DType:
    return BY_NAME[name]
