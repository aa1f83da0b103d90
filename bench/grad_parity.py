"""Gradient parity with PyTorch: one batch through the same GPT (the same weights), each
parameter's gradient from Ember (autocast bf16, as `ember train` runs) and from PyTorch
autocast bf16 with SDPA, both set against PyTorch in f32 on the same device (the truth here).
A parameter whose Ember error is well above PyTorch's own bf16 error is computed wrongly, not
roundly: a loss curve that drifts from PyTorch's after its plateau (docs/performance.md) starts
here. Then attention alone at the model's head shape (q, k, v split from one projection, causal):
o, dq, dk, dv the same way.

    PYTHONPATH=. python3 bench/grad_parity.py [--ckpt runs/x/ckpt.safetensors] [--batch 16] [--sharpen 1]
    PYTHONPATH=. python3 bench/grad_parity.py --device cpu --dim 64 --layers 2 --heads 2 --block 128 --batch 2

--ckpt: a checkpoint of `ember train --model gpt2` (bench/loss_curve.py's settings); the batch is
the one its next step draws, and a column more gives the gradient that step itself used, read
back from AdamW's first moment (m' = 0.9 m + 0.1 g): the replayed step with its memory plan and
chains, not the Tensor API's. Without one, the initial weights of `ember train --model gpt2` at
the sizes given. --sharpen S: the q and k weights times S, so the attention is peaked as a
trained model's is (at init it is near uniform).

--variants base,f32,nofuse,...: a column of Ember's error for each way of compiling the same
gradients (VARIANTS; each in a fresh compile cache), to find which pass or kernel puts the error in.
--batches N: the errors of the gradients summed over N batches, where a bias (an error of one
sign step after step, which AdamW's moments add up) stays and rounding noise falls as 1/sqrt(N).
--attention-only: attention alone, at the model's head shape.
--trace [--variants V]: each block's values (residual, norm, projections, attention output) and the loss's
gradient at the residual and at each branch's output, against PyTorch's: the first point where
Ember's error leaves PyTorch bf16's is where it enters.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loss_parity import torch_name  # noqa: E402
from train_gpu import TorchGPT  # noqa: E402

from ember import functional as EF  # noqa: E402
from ember import nn, train  # noqa: E402
from ember import tensor as T  # noqa: E402
from ember.compiler import pipeline  # noqa: E402
from ember.models import gpt  # noqa: E402
from ember.models.gpt import GPTConfig  # noqa: E402

FLAG = 3.0   # an Ember error this many times PyTorch's bf16 error (and over 1%) is flagged


def rel(a: np.ndarray, truth: np.ndarray) -> float:
    a, truth = np.asarray(a, np.float64), np.asarray(truth, np.float64)
    return float(np.linalg.norm(a - truth) / max(np.linalg.norm(truth), 1e-30))


def weights_and_data(args: argparse.Namespace) -> tuple[GPTConfig, dict[str, np.ndarray], np.ndarray, random.Random]:
    """The model's config, its weights by Ember's names, the token ids to draw batches from, and
    the generator that draws them (a checkpoint's, where its run stopped)."""
    rng = random.Random(args.seed)
    if args.ckpt:
        arrays, saved, config = train.load_checkpoint(args.ckpt)
        weights = {k[len("model."):]: v for k, v in arrays.items() if k.startswith("model.")}
        rng.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in saved["rng"]))
    else:
        config = GPTConfig(vocab=args.vocab, block=args.block, dim=args.dim, n_layer=args.layers,
                           n_head=args.heads, tied=True)
        T.set_default_device("cpu")
        T.manual_seed(0)
        weights = {n: p.numpy() for n, p in train.build(config).named_parameters()}
    text, _ = train.load_text(None, args.max_bytes)
    tokens, vocab = train.tokenize(text, "gpt2" if config.vocab != 256 else "byte", None)
    if vocab > config.vocab:
        raise SystemExit(f"the tokenizer's {vocab} ids do not fit the model's vocabulary of {config.vocab}")
    for name, w in weights.items():   # sharpen: q and k, the first two thirds of the projection's rows
        if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
            w = w.copy()
            w[: 2 * config.dim] *= args.sharpen
            weights[name] = w
    return config, weights, train.split_data(tokens)[0], rng


# what each variant changes: (module, attribute, stand-in); "f32" runs without autocast
VARIANTS = {
    "base": [],
    "f32": [],
    "nofuse": [(pipeline.attention, "fuse", lambda outputs: outputs)],   # attention unfused
    "nosplit": [(pipeline, "split_large_reductions", lambda graph, target: graph)],   # no two-stage sums, no split K
    "noacc": [(pipeline, "accumulate_parts", lambda sched: None)],   # split K's parts summed by a kernel
    "nomerge": [(pipeline, "merge_chains", lambda sched: None), (pipeline, "merge_small", lambda sched: None)],
    "onechunk": [(gpt, "LOGITS_CHUNK", 1 << 40)],   # the head's logits in one piece
}


@contextlib.contextmanager
def variant(name: str):  # noqa: ANN201
    """The compiler changed as VARIANTS says, with a fresh compile cache and no program compiled
    before in this process (both are keyed by the graph, which the change does not alter)."""
    from ember.backend import c, cuda
    saved = [(m, a, getattr(m, a)) for m, a, _ in VARIANTS[name]]
    old_cache = os.environ.get("EMBER_CACHE")
    with tempfile.TemporaryDirectory() as folder:
        for m, a, v in VARIANTS[name]:
            setattr(m, a, v)
        os.environ["EMBER_CACHE"] = folder
        for prog in cuda.program.programs.values():
            prog.free()
        cuda.program.programs.clear()
        c.program.programs.clear()
        try:
            yield
        finally:
            for m, a, v in saved:
                setattr(m, a, v)
            if old_cache is None:
                os.environ.pop("EMBER_CACHE", None)
            else:
                os.environ["EMBER_CACHE"] = old_cache


def ember_grads(config: GPTConfig, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                device: str, low: bool = True) -> tuple[float, dict[str, np.ndarray]]:
    T.set_default_device(device)
    model = train.build(config)
    model.load_state_dict(weights)
    with T.autocast("bfloat16", enabled=low):
        loss = model.loss(T.Tensor(x), T.Tensor(y))
    loss.backward()
    params = list(model.named_parameters())
    T.realize(loss, *(p.grad for _, p in params))   # one program: each grad alone would be a program
    return loss.item(), {n: p.grad.numpy() for n, p in params}   # (and an arena) of the whole step


def step_grads(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """The gradients of the checkpoint's next step as `ember train` ran it, from AdamW's first
    moments before and after that one step (resumed in a copy of the run folder). With
    --steps-after K > 1 it runs K steps, keeping each one's checkpoint, and sets each step's
    update (v and the weights) against AdamW's formula: from the third step on, the step is
    a replay (ember.jit, a CUDA graph)."""
    before, saved, c = train.load_checkpoint(args.ckpt)
    k = args.steps_after
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(args.ckpt, Path(folder) / "ckpt.safetensors")
        argv = ["--model", "gpt2", "--device", args.device, "--steps", str(saved["step"] + k), "--batch",
                str(args.batch), "--lr", "6e-4", "--warmup", "50", "--cosine", "--seed", str(args.seed),
                "--eval-every", "1", "--max-bytes", str(args.max_bytes), "--out", folder, "--autocast", "bf16",
                "--dim", str(c.dim), "--layers", str(c.n_layer), "--heads", str(c.n_head), "--block", str(c.block)]
        save = train.save

        def keep(path: Path, *rest: object) -> None:   # each step's checkpoint, beside the last
            save(path, *rest)
            shutil.copy(path, Path(folder) / f"step{rest[-1]['step']}.safetensors")  # type: ignore[index]
        train.save = keep
        try:
            if train.train(argv) != 0:
                raise SystemExit("ember train failed")
        finally:
            train.save = save
        states = [before] + [train.load_checkpoint(Path(folder) / f"step{saved['step'] + i}.safetensors")[0]
                             for i in range(1, k + 1)]
    T.set_default_device("cpu")
    names = [n for n, _ in train.build(c).named_parameters()]
    for i in range(1, k + 1) if k > 1 else ():
        ev, ep = update_errors(states[i - 1], states[i], names)
        print(f"step {saved['step'] + i}{' (replayed)' if i >= 3 else ''}: AdamW's update against its formula, "
              f"largest errors: v {ev[0]:.1e} ({ev[1]}), weights' change {ep[0]:.1e} ({ep[1]})")
    b1, after = 0.9, states[1]   # AdamW's state i is the i-th of the model's parameters()
    return {n: (after[f"opt.m.{i}"].astype(np.float64) - b1 * before[f"opt.m.{i}"]) / (1 - b1)
            for i, n in enumerate(names)}


def update_errors(before: dict[str, np.ndarray], after: dict[str, np.ndarray],
                  names: list[str]) -> tuple[tuple[float, str], tuple[float, str]]:
    """The largest relative errors, with their parameters, of a step's new second moments and of
    its weights' change against AdamW's formula in f64 (the gradient read from the first moments;
    betas 0.9 and 0.999). The weights' change is small beside the weights: f32 rounding of both
    puts about 1e-3 into it."""
    t, lr = int(after["opt.steps"]), float(after["opt.group.0.lr"])
    wd, eps = float(after["opt.group.0.weight_decay"]), float(after["opt.group.0.eps"])
    worst_v, worst_p = (0.0, ""), (0.0, "")
    for i, n in enumerate(names):
        m0, v0, p0, m1, v1, p1 = (np.asarray(d[key], np.float64) for d in (before, after)
                                  for key in (f"opt.m.{i}", f"opt.v.{i}", f"model.{n}"))
        g = (m1 - 0.9 * m0) / 0.1
        v = 0.999 * v0 + 0.001 * g * g
        p = p0 * (1 - lr * wd) - lr / (1 - 0.9 ** t) * m1 / (np.sqrt(v1 / (1 - 0.999 ** t)) + eps)
        worst_v = max(worst_v, (rel(v1, v), n))
        worst_p = max(worst_p, (rel(p1 - p0, p - p0), n))
    return worst_v, worst_p


def torch_gpt(config: GPTConfig, weights: dict[str, np.ndarray], dev: torch.device) -> TorchGPT:
    """TorchGPT on dev with Ember's weights (the head tied to the embedding as Ember's is)."""
    tm = TorchGPT(config).to(dev)
    state = {torch_name(n): torch.from_numpy(np.ascontiguousarray(w)) for n, w in weights.items()}
    if config.tied:
        tm.head.weight = tm.tok.weight
        state["head.weight"] = state["tok.weight"]
    tm.load_state_dict({k: v.to(dev) for k, v in state.items()})
    return tm


def torch_grads(config: GPTConfig, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                device: str, bf16: bool) -> tuple[float, dict[str, np.ndarray]]:
    dev = torch.device(device)
    tm = torch_gpt(config, weights, dev)
    xs, ys = (torch.from_numpy(a).long().to(dev) for a in (x, y))
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        logits = tm(xs, sdpa=True)
        loss = F.cross_entropy(logits.reshape(-1, config.vocab).float(), ys.reshape(-1))
    loss.backward()
    grads = dict(tm.named_parameters())
    return loss.item(), {n: grads[torch_name(n)].grad.float().cpu().numpy() for n in weights}


def attention_alone(config: GPTConfig, batch: int, sharpen: float, device: str) -> list[tuple[str, float, float]]:
    """(name, Ember's errors, PyTorch bf16's error) for o, dq, dk, dv of causal attention whose q,
    k, v are thirds of one [B, T, 3 dim] projection, as the model's are: Ember through
    F.scaled_dot_product_attention and through the model's own nn.causal_attention. The inputs
    are bf16 values already, so the errors are the kernels' own (not the inputs' rounding)."""
    b, t, h, d = batch, config.block, config.n_head, config.dim // config.n_head
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((b, t, 3 * h * d)).astype(np.float32)
    qkv[..., : 2 * h * d] *= sharpen
    do = rng.standard_normal((b, h, t, d)).astype(np.float32)
    qkv, do = (torch.from_numpy(a).bfloat16().float().numpy() for a in (qkv, do))

    def heads(z: T.Tensor | torch.Tensor, i: int):  # noqa: ANN202 (either library's tensor)
        part = z[..., i * h * d:(i + 1) * h * d]
        return part.reshape(b, t, h, d).permute(0, 2, 1, 3)

    def run_torch(low: bool) -> list[np.ndarray]:
        z = torch.tensor(qkv, device=device, requires_grad=True)
        src = z.bfloat16() if low else z
        o = F.scaled_dot_product_attention(heads(src, 0), heads(src, 1), heads(src, 2), is_causal=True)
        (o.float() * torch.tensor(do, device=device)).sum().backward()
        g = z.grad.cpu().numpy()
        return [o.float().detach().cpu().numpy(), *(g[..., i * h * d:(i + 1) * h * d] for i in range(3))]

    def run_ember(model_form: bool) -> list[np.ndarray]:
        T.set_default_device(device)
        z = T.Tensor(qkv, requires_grad=True)
        zb = z.cast("bfloat16")
        if model_form:   # as CausalSelfAttention calls it under autocast
            o = nn.causal_attention(heads(zb, 0), heads(zb, 1), heads(zb, 2))
        else:
            o = EF.scaled_dot_product_attention(heads(zb, 0), heads(zb, 1), heads(zb, 2), is_causal=True)
        (o.cast("float32") * T.Tensor(do)).sum().backward()
        T.realize(o, z.grad)
        g = z.grad.numpy()
        return [o.numpy(), *(g[..., i * h * d:(i + 1) * h * d] for i in range(3))]
    truth, peer = run_torch(False), run_torch(True)
    sdpa, model = run_ember(False), run_ember(True)
    return [(n, {"Ember sdpa": rel(a, c), "Ember model": rel(m, c)}, rel(p, c))
            for n, a, m, p, c in zip(("o", "dq", "dk", "dv"), sdpa, model, peer, truth)]


def ember_trace(config: GPTConfig, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                device: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each block's values (its input, ln1, qkv, the attention's output y, the two branches'
    outputs, fc) and the loss's gradient at the input, y and the branches' outputs, as Ember
    computes them under autocast bf16 (the attention written out as CausalSelfAttention.forward
    has it, to reach y): a zero f32 probe added at a point has that point's gradient (the
    values, and so the rest of the graph, are the same). Also the parameters' gradients, to show
    the probed graph still has the error being traced. Returns (values, gradients, params')."""
    T.set_default_device(device)
    model = train.build(config)
    model.load_state_dict(weights)
    values, probes = {}, {}
    b, t, c, nh = x.shape[0], x.shape[1], config.dim, config.n_head

    def keep(name: str, v: T.Tensor, probed: bool = False) -> T.Tensor:
        if probed:
            z = T.Tensor(np.zeros(v.shape, np.float32), requires_grad=True)
            probes[name], v = z, v + z
        values[name] = v
        return v

    def hidden(idx: T.Tensor) -> T.Tensor:
        h = model.tok(idx) + model.pos.weight[:t]
        for i, blk in enumerate(model.blocks):
            h = keep(f"{i}.in", h, True)
            a = blk.attn
            qkv, wide, low = a.qkv(keep(f"{i}.ln1", blk.ln1(h))), None, T.context.autocast
            if low is not None and qkv.dtype.bits > low.bits:   # as CausalSelfAttention.forward
                wide, qkv = qkv.dtype, qkv.cast(low)
            q, k, v = (z.reshape(b, t, nh, c // nh).transpose(1, 2) for z in T.split(keep(f"{i}.qkv", qkv), c, -1))
            o = nn.causal_attention(q, k, v)
            o = (o.cast(wide) if wide is not None else o).transpose(1, 2).reshape(b, t, c)
            h = h + keep(f"{i}.attn", a.proj(keep(f"{i}.y", o, True)), True)
            f = keep(f"{i}.fc", blk.fc(blk.ln2(h)))
            h = h + keep(f"{i}.mlp", blk.proj(f.gelu(approximate="tanh")), True)
        return model.ln(keep("final", h, True))
    model.hidden = hidden
    with T.autocast("bfloat16"):
        loss = model.loss(T.Tensor(x), T.Tensor(y))
    loss.backward()
    params = list(model.named_parameters())
    T.realize(loss, *values.values(), *(z.grad for z in probes.values()), *(p.grad for _, p in params))
    as32 = lambda v: v.cast("float32").numpy()  # noqa: E731
    return ({n: as32(v) for n, v in values.items()}, {n: z.grad.numpy() for n, z in probes.items()},
            {n: p.grad.numpy() for n, p in params})


def torch_trace(config: GPTConfig, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                device: str, bf16: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """ember_trace's values and gradients from TorchGPT's forward (retain_grad at the points)."""
    dev = torch.device(device)
    tm = torch_gpt(config, weights, dev)
    xs, ys = (torch.from_numpy(a).long().to(dev) for a in (x, y))
    b, t, c, nh = x.shape[0], x.shape[1], config.dim, config.n_head
    values, probed = {}, {}

    def keep(name: str, v: torch.Tensor, grad: bool = False) -> torch.Tensor:
        values[name] = v
        if grad:
            v.retain_grad()
            probed[name] = v
        return v
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        h = tm.tok(xs) + tm.pos(torch.arange(t, device=dev))
        for i, blk in enumerate(tm.blocks):
            h = keep(f"{i}.in", h * 1.0, True)
            qkv = keep(f"{i}.qkv", blk["qkv"](keep(f"{i}.ln1", blk["ln1"](h))))
            q, k, v = (z.view(b, t, nh, -1).transpose(1, 2) for z in qkv.split(c, -1))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            h = h + keep(f"{i}.attn", blk["proj"](keep(f"{i}.y", o, True)), True)
            f = keep(f"{i}.fc", blk["fc"](blk["ln2"](h)))
            h = h + keep(f"{i}.mlp", blk["out"](F.gelu(f, approximate="tanh")), True)
        logits = tm.head(tm.ln(keep("final", h * 1.0, True)))
        loss = F.cross_entropy(logits.reshape(-1, config.vocab).float(), ys.reshape(-1))
    loss.backward()
    as32 = lambda v: v.detach().float().cpu().numpy()  # noqa: E731
    return {n: as32(v) for n, v in values.items()}, {n: as32(v.grad) for n, v in probed.items()}


def trace(args: argparse.Namespace, how: str) -> None:
    """Where the error enters: each block's values and the loss's gradient at its points, Ember
    bf16 (compiled as the variant `how` says) and PyTorch bf16 against PyTorch f32 (one batch);
    then the parameters' table of the probed graph."""
    config, weights, data, rng = weights_and_data(args)
    T.set_default_device("cpu")
    x, y = (a.numpy() for a in train.batch(data, rng, args.batch, config.block))
    truth, truth_g = torch_trace(config, weights, x, y, args.device, False)
    peer, peer_g = torch_trace(config, weights, x, y, args.device, True)
    with variant(how):
        mine, mine_g, mine_p = ember_trace(config, weights, x, y, args.device)
    print(f"compiled as variant {how}")
    print(f"{'point':<10}{'value: Ember':>14}{'PyTorch bf16':>14}{'ratio':>7}{'gradient: Ember':>17}"
          f"{'PyTorch bf16':>14}{'ratio':>7}")
    for n in truth:
        ev, pv = rel(mine[n], truth[n]), rel(peer[n], truth[n])
        line = f"{n:<10}{ev:14.2e}{pv:14.2e}{ev / pv if pv else float('nan'):7.2f}"
        if n in truth_g:
            eg, pg = rel(mine_g[n], truth_g[n]), rel(peer_g[n], truth_g[n])
            line += f"{eg:17.2e}{pg:14.2e}{eg / max(pg, 1e-30):7.2f}"
            line += "   <--" if eg > FLAG * pg and eg > 0.01 else ""
        print(line, flush=True)
    _, peer_p = torch_grads(config, weights, x, y, args.device, True)
    _, true_p = torch_grads(config, weights, x, y, args.device, False)
    rows = [(n, {"probed graph": rel(mine_p[n], true_p[n])}, rel(peer_p[n], true_p[n])) for n in true_p]
    print(f"{table(rows, 'parameter: |g - g_f32| / |g_f32|')} flagged")


def add(total: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
    for n, g in grads.items():
        total[n] = total[n] + g if n in total else g.astype(np.float64)


def table(rows: list[tuple[str, dict[str, float], float]], what: str) -> int:
    """Prints rows (name, {Ember column: error}, PyTorch bf16's error) and returns how many
    errors are flagged."""
    cols = list(rows[0][1])
    print(f"{what:<34}" + "".join(f"{c:>12}" for c in cols) + f"{'PyTorch bf16':>13} {'ratio':>7}")
    flagged = 0
    for name, mine, peer in rows:
        bad = [c for c, e in mine.items() if e > FLAG * peer and e > 0.01]
        flagged += len(bad)
        ratio = max(mine.values()) / max(peer, 1e-30)
        print(f"{name:<34}" + "".join(f"{mine[c]:12.2e}" for c in cols) + f"{peer:13.2e} {ratio:7.2f}"
              + (f"   <-- flagged: {', '.join(bad)}" if bad else ""))
    return flagged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--ckpt", help="a trained ember train --model gpt2 checkpoint")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--sharpen", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-bytes", type=int, default=4_000_000)
    ap.add_argument("--variants", help=f"a comma list of {', '.join(VARIANTS)}: a column each (no ember train column)")
    ap.add_argument("--batches", type=int, default=1,
                    help="sum each gradient over this many batches (a bias stays, noise falls)")
    ap.add_argument("--steps-after", type=int, default=1,
                    help="with --ckpt: ember train's steps to run from it, each update set against AdamW's formula")
    ap.add_argument("--trace", action="store_true",
                    help="each block's values and gradients against PyTorch's: where the error enters")
    ap.add_argument("--attention-only", action="store_true", help="attention alone at the model's head shape")
    args = ap.parse_args()
    names = args.variants.split(",") if args.variants else []
    if set(names) - set(VARIANTS):
        raise SystemExit(f"grad_parity: unknown variants {sorted(set(names) - set(VARIANTS))}; "
                         f"known: {', '.join(VARIANTS)}")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.attention_only:
        config = GPTConfig(vocab=args.vocab, block=args.block, dim=args.dim, n_layer=args.layers, n_head=args.heads)
        flagged = table(attention_alone(config, min(args.batch, 4), args.sharpen, args.device),
                        f"attention alone, sharpen {args.sharpen:g}")
        print(f"{flagged} flagged (Ember's error over {FLAG:g} x PyTorch bf16's and over 1%)")
        return
    if args.trace:
        return trace(args, names[0] if names else "base")
    config, weights, data, rng = weights_and_data(args)
    stepped = step_grads(args) if args.ckpt and not names and args.batches == 1 else None
    mine, peer, truth = {}, {}, {}   # gradients summed over the batches (f64)
    for _ in range(args.batches):
        T.set_default_device("cpu")
        x, y = (a.numpy() for a in train.batch(data, rng, args.batch, config.block))
        if names:
            for name in names:
                with variant(name):
                    mine_loss, got = ember_grads(config, weights, x, y, args.device, name != "f32")
                add(mine.setdefault(name, {}), got)
                print(f"variant {name}: loss {mine_loss:.5f}", flush=True)
        else:
            mine_loss, got = ember_grads(config, weights, x, y, args.device)
            add(mine, got)
        peer_loss, got = torch_grads(config, weights, x, y, args.device, True)
        add(peer, got)
        true_loss, got = torch_grads(config, weights, x, y, args.device, False)
        add(truth, got)
    print(f"GPT {config.n_layer} layers, dim {config.dim}, heads {config.n_head}, context {config.block}, "
          f"batch {args.batch}, vocab {config.vocab}, {args.device}, sharpen {args.sharpen}"
          + (f", weights of {args.ckpt}" if args.ckpt else ", initial weights")
          + (f"; each gradient summed over {args.batches} batches" if args.batches > 1 else ""))
    print(f"loss: Ember bf16 {mine_loss:.5f}, PyTorch bf16 {peer_loss:.5f}, PyTorch f32 {true_loss:.5f}")
    rows = []
    for n in truth:   # the model's order; q, k and v apart too (v's gradient outweighs q's and k's)
        parts = {n: slice(None)}
        if ".attn.qkv." in n:
            parts |= {f"{n}[{w}]": slice(i * config.dim, (i + 1) * config.dim) for i, w in enumerate("qkv")
                      if not (w == "k" and n.endswith("bias"))}   # (softmax ignores k's bias: its gradient is 0)
        for label, rows_of in parts.items():
            err = lambda g: rel(g[n][rows_of], truth[n][rows_of])  # noqa: E731
            if names:
                cols = {v: err(mine[v]) for v in names}
            else:
                cols = {"Ember bf16": err(mine)} | ({"ember train": err(stepped)} if stepped else {})
            rows.append((label, cols, err(peer)))
    flagged = table(rows, "parameter: |g - g_f32| / |g_f32|")
    if not names:
        flagged += table(attention_alone(config, min(args.batch, 4), args.sharpen, args.device), "attention alone")
    print(f"{flagged} flagged (Ember's error over {FLAG:g} x PyTorch bf16's and over 1%)")


if __name__ == "__main__":
    main()
