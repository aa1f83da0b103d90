"""Writes the fixed benchmark suite of `ember bench` (docs/grading.md): python bench/suite/make_suite.py

Sized for a GPU with 10 GB: every param is at most 256 MiB, and every returned value is small
(a reduction of the result), so that printing it costs little beside the work timed. Large
matmuls are written as expand-mul-sum, whose [M,K,N] product (spec 2) no good compiler stores.
"""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
L2E = "1.4426950408889634"


def matmul(name: str, dt: str, m: int, k: int, n: int, batch: int = 0, tol: str = "") -> str:
    b = [batch] if batch else []
    sh = lambda *d: ",".join(map(str, b + list(d)))  # noqa: E731
    ax = len(b)
    return f"""ember 1
# {name}: {dt} matmul{f' batched x{batch}' if batch else ''} [{m},{k}] x [{k},{n}], expand-mul-sum; returns column sums
{tol}a = param {dt}[{sh(m, k)}]
b = param {dt}[{sh(k, n)}]
a3 = reshape a shape=[{sh(m, k, 1)}]
ae = expand a3 shape=[{sh(m, k, n)}]
b3 = reshape b shape=[{sh(1, k, n)}]
be = expand b3 shape=[{sh(m, k, n)}]
p = mul ae be
c = sum p axes=[{ax + 1}]
cf = cast c dtype=f32
s = sum cf axes=[{ax}]
return s
input a = rand seed=1 scale=1
input b = rand seed=2 scale=1
"""


def softmax_rows(dt: str, r: int, c: int) -> str:
    return f"""ember 1
# softmax {dt} [{r},{c}] over rows; returns each row's largest probability
x = param {dt}[{r},{c}]
m = max x axes=[1]
mb = expand m shape=[{r},{c}]
d = sub x mb
k = const {L2E} {dt}[{r},{c}]
t = mul d k
e = exp2 t
s = sum e axes=[1]
sb = expand s shape=[{r},{c}]
p = div e sb
pm = max p axes=[1]
return pm
input x = rand seed=3 scale=8
"""


PROGRAMS = {
    "chain8_f32.eir": """ember 1
# eight elementwise ops over 2^26 f32 values, then row sums
# tolerance: atol=1e-3 rtol=1e-3
x = param f32[8192,8192]
c1 = const 0.5 f32[8192,8192]
a = mul x c1
b = add a x
n = neg b
m = max n x
q = mul m m
r = sqrt q
t = sub r a
u = mul t c1
s = sum u axes=[1]
return s
input x = rand seed=4
""",
    "rowsum_f32.eir": """ember 1
# tolerance: atol=1e-3 rtol=1e-3
x = param f32[8192,8192]
s = sum x axes=[1]
return s
input x = rand seed=5
""",
    "colsum_f32.eir": """ember 1
# tolerance: atol=1e-3 rtol=1e-3
x = param f32[8192,8192]
s = sum x axes=[0]
return s
input x = rand seed=6
""",
    "fullsum_1d_f32.eir": """ember 1
# tolerance: atol=1e-1 rtol=1e-3
x = param f32[67108864]
s = sum x axes=[0]
return s
input x = rand seed=7
""",
    "rowmax_bf16.eir": """ember 1
x = param bf16[16384,8192]
s = max x axes=[1]
return s
input x = rand seed=8
""",
    "softmax_f32.eir": softmax_rows("f32", 8192, 8192),
    "softmax_bf16.eir": softmax_rows("bf16", 16384, 8192),
    "layernorm_f32.eir": """ember 1
# layernorm f32 [8192,8192] (no affine); returns the column sums of the result
# tolerance: atol=1e-2 rtol=1e-3
x = param f32[8192,8192]
s = sum x axes=[1]
inv = const 0.0001220703125 f32[8192,1]
mu = mul s inv
mb = expand mu shape=[8192,8192]
d = sub x mb
d2 = mul d d
v = sum d2 axes=[1]
var = mul v inv
eps = const 1e-5 f32[8192,1]
ve = add var eps
sd = sqrt ve
r = recip sd
rb = expand r shape=[8192,8192]
y = mul d rb
c = sum y axes=[0]
return c
input x = rand seed=9 scale=4
""",
    "transpose_f32.eir": """ember 1
# transpose f32 [8192,8192] then row sums of the transposed (the column sums, read through a permute)
# tolerance: atol=1e-3 rtol=1e-3
x = param f32[8192,8192]
t = permute x order=[1,0]
e = exp2 t
s = sum e axes=[1]
return s
input x = rand seed=10
""",
    "matmul_f32_2048.eir": matmul("matmul_f32_2048", "f32", 2048, 2048, 2048, tol="# tolerance: atol=1e-1 rtol=1e-3\n"),
    "matmul_bf16_4096.eir": matmul("matmul_bf16_4096", "bf16", 4096, 4096, 4096, tol="# tolerance: atol=4 rtol=2e-2\n"),
    "matmul_f16_gpt2_qkv.eir": matmul("matmul_f16_gpt2_qkv", "f16", 8192, 768, 2304,
                                      tol="# tolerance: atol=4 rtol=2e-2\n"),
    "bmm_bf16_attention.eir": matmul("bmm_bf16_attention", "bf16", 1024, 64, 1024, batch=64,
                                     tol="# tolerance: atol=4 rtol=2e-2\n"),
}


def attention(s: int, d: int, bh: int) -> str:
    sc = f"{d ** -0.5:.17g}"
    return f"""ember 1
# attention f32, {bh} heads, S={s}, D={d}, causal: softmax(q k^T / sqrt(D) + mask) v; returns row sums of the output
# tolerance: atol=1e-3 rtol=1e-3
q = param f32[{bh},{s},{d}]
k = param f32[{bh},{s},{d}]
v = param f32[{bh},{s},{d}]
qr = reshape q shape=[{bh},{s},1,{d}]
qe = expand qr shape=[{bh},{s},{s},{d}]
kr = reshape k shape=[{bh},1,{s},{d}]
ke = expand kr shape=[{bh},{s},{s},{d}]
qk = mul qe ke
sc0 = sum qk axes=[3]
sc1 = reshape sc0 shape=[{bh},{s},{s}]
scale = const {sc} f32[{bh},{s},{s}]
sc2 = mul sc1 scale
i = iota i32[{bh},{s},{s}] axis=1
j = iota i32[{bh},{s},{s}] axis=2
future = cmplt i j
ninf = const -inf f32[{bh},{s},{s}]
sm = where future ninf sc2
m = max sm axes=[2]
mb = expand m shape=[{bh},{s},{s}]
dd = sub sm mb
l2e = const {L2E} f32[{bh},{s},{s}]
t = mul dd l2e
e = exp2 t
z = sum e axes=[2]
zb = expand z shape=[{bh},{s},{s}]
p = div e zb
pr = reshape p shape=[{bh},{s},{s},1]
pe = expand pr shape=[{bh},{s},{s},{d}]
vr = reshape v shape=[{bh},1,{s},{d}]
ve = expand vr shape=[{bh},{s},{s},{d}]
pv = mul pe ve
o = sum pv axes=[2]
r = sum o axes=[3]
return r
input q = rand seed=11
input k = rand seed=12
input v = rand seed=13
"""


PROGRAMS["attention_f32_causal.eir"] = attention(1024, 64, 16)
PROGRAMS["train_step_mlp_f32.eir"] = """ember 1
# a training step's kernels: gradient of a 2-layer MLP's squared loss in its first weight
# tolerance: atol=1e-2 rtol=1e-3
x = param f32[4096,512]
w = param f32[512,1024]
xr = reshape x shape=[4096,512,1]
xe = expand xr shape=[4096,512,1024]
wr = reshape w shape=[1,512,1024]
we = expand wr shape=[4096,512,1024]
xw = mul xe we
h0 = sum xw axes=[1]
h = reshape h0 shape=[4096,1024]
zero = const 0 f32[4096,1024]
a = max h zero
sq = mul a a
loss = sum sq axes=[0,1]
g = grad loss w
gs = sum g axes=[0]
return gs
input x = rand seed=14 scale=0.0625
input w = rand seed=15 scale=0.0625
"""

if __name__ == "__main__":
    for name, text in PROGRAMS.items():
        (HERE / name).write_text(text)
    print(f"wrote {len(PROGRAMS)} programs to {HERE}")
