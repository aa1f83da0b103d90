"""`ember train` and `ember sample`: a small byte-level GPT trained on real text.

By default the text is the Python standard library's own source files, which every machine
with Python has; `--data PATH` takes any text file or folder. Checkpoints (safetensors) hold
the weights, the optimizer state, the batch sampler's state and the loss history, so a run
resumes exactly where it stopped.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import distributed, nn, optim, target
from . import tensor as T
from .capture import jit
from .commands import Failure, HelpWithDefaults, Parser, bounded
from .compiler import schedule
from .compiler.schedule import Schedule
from .ir import Node
from .models.gpt import GPT, GPTConfig, build, kv_caches


def load_text(path: str | None, limit: int) -> tuple[bytes, str]:
    """The training text and where it came from; a folder contributes its files sorted by name."""
    root = Path(path) if path else Path(os.__file__).parent
    if not root.exists():
        raise Failure(f"--data {path}: no such file or folder", 3)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.py" if path is None else "*")
                                                  if p.is_file() and "site-packages" not in p.parts)
    chunks, total = [], 0
    for f in files:
        try:
            raw = f.read_bytes()
        except OSError:
            continue
        chunks.append(raw)
        total += len(raw)
        if total >= limit:
            break
    text = b"".join(chunks)[:limit]
    if len(text) < 10_000:
        raise Failure(f"only {len(text)} bytes of text in {root}; need at least 10000", 3)
    return text, f"{root} ({len(files)} files)" if root.is_dir() else str(root)


PRESETS = {  # the sizes each --model defaults to
    "byte": {"block": 64, "dim": 96, "layers": 2, "heads": 4},
    "gpt2": {"block": 1024, "dim": 768, "layers": 12, "heads": 12},
    "llama": {"block": 1024, "dim": 768, "layers": 12, "heads": 12},
}
BPE_TOKENS, BPE_VOCAB = 50257, 50304   # GPT-2's tokenizer size, and its embedding padded to 64


def model_config(args: argparse.Namespace, vocab: int) -> GPTConfig:
    return GPTConfig(vocab=vocab, block=args.block, dim=args.dim, n_layer=args.layers, n_head=args.heads,
                     arch="llama" if args.model == "llama" else "gpt", tied=args.model == "gpt2")


LIMITS = {"vocab": 1 << 20, "block": 1 << 16, "dim": 1 << 16, "n_layer": 1024, "n_head": 1024}   # stated maxima


def memory_needed(c: GPTConfig, batch: int, training: bool, cpu: bool = True) -> int:
    """A lower bound of the bytes a run holds: the weights; to train, also their gradients and
    AdamW's two moments, the activations (some 16 numbers a token a layer, the logits) and, on
    the CPU, one layer's attention scores (flash attention on a GPU keeps none)."""
    params = c.dim * (c.vocab * (1 if c.tied else 2) + c.block) + 12 * c.n_layer * c.dim * c.dim
    if not training:
        return 4 * params + 8 * c.n_layer * c.block * c.dim   # and the KV cache
    scores = batch * c.n_head * c.block * c.block if cpu else 0
    return 16 * params + 4 * batch * c.block * (16 * c.n_layer * c.dim + c.vocab) + 4 * scores


def check_config(c: GPTConfig, batch: int, training: bool, cpu: bool = True, memory: bool = True) -> str | None:
    """What is wrong with a model config (from the options or a checkpoint), before anything is
    allocated: its fields' types and ranges, and (memory) whether the run fits in this machine's
    memory."""
    for f in dataclasses.fields(GPTConfig):
        value, kind = getattr(c, f.name), type(getattr(GPTConfig, f.name))
        if type(value) is not kind and not (kind is float and type(value) is int):
            return f"{f.name} is {value!r}, not a {kind.__name__}"
        if f.name in LIMITS and not 1 <= value <= LIMITS[f.name]:
            return f"{f.name} is {value}, outside 1..{LIMITS[f.name]}"
    if c.arch not in ("gpt", "llama") or not 0 <= c.dropout < 1:
        return f"arch {c.arch!r} and dropout {c.dropout} (gpt or llama, and 0 <= dropout < 1)"
    if c.dim % c.n_head or (c.arch == "llama" and c.dim // c.n_head % 2):
        return f"dim {c.dim} does not split into {c.n_head} heads" + (" of an even size" if c.arch == "llama" else "")
    need, have = memory_needed(c, batch, training, cpu), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if memory and need > have:
        return (f"{c.n_layer} layers of dim {c.dim}, vocab {c.vocab}, block {c.block}" + (f", batch {batch}" if training
                else "") + f" need at least {need / 2**30:.1f} GiB of memory; this machine has {have / 2**30:.1f} GiB")
    return None


def load_checkpoint(path: Path | str, batch: int = 1, training: bool = False) -> tuple[dict, dict, GPTConfig]:
    """A checkpoint's arrays, its run metadata and its model config, checked (one Failure line
    naming the file and the problem)."""
    if not Path(path).is_file():
        raise Failure(f"no checkpoint at {path} (run ember train first)", 3)
    try:
        arrays, meta = nn.load_safetensors(path)
        saved = json.loads(meta["ember"])
        config = GPTConfig(**saved["config"])
    except OSError as e:
        raise Failure(f"{path}: cannot read the checkpoint: {e.strerror}", 3)
    except (KeyError, TypeError, ValueError) as e:  # (json's errors are ValueErrors)
        why = str(e) if isinstance(e, ValueError) and str(e).startswith(str(path)) else None
        raise Failure(why or f"{path}: not a checkpoint of ember train (its metadata has no readable run config: "
                      f"{type(e).__name__}: {e})")
    problem = check_config(config, batch, training)
    if problem:
        raise Failure(f"{path}: its model config: {problem}")
    return arrays, saved, config


def load_weights(module: Any, arrays: dict, prefix: str, path: Path | str) -> None:
    """The arrays named prefix + a name into a model (each of its parameter's shape and dtype)
    or an optimizer."""
    state = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    for name, p in module.state_dict().items() if isinstance(module, nn.Module) else ():
        if name in state and state[name].dtype != np.dtype(p.dtype.np_name):
            raise Failure(f"{path}: {prefix}{name} is {state[name].dtype}, the model's is {p.dtype}")
    try:
        module.load_state_dict(state)
    except (KeyError, ValueError) as e:
        raise Failure(f"{path}: {e.args[0] if e.args else e}")


def tokenize(text: bytes, model: str, out: Path | None) -> tuple[np.ndarray, int]:
    """The text as token ids, and the vocabulary size. Bytes for the byte model; else a
    byte-level BPE trained on this text with the `tokenizers` library, cached on disk by the
    text's hash (training it takes a while) and copied to the run folder (out) for ember sample."""
    if model == "byte":
        return np.frombuffer(text, dtype=np.uint8), 256
    import hashlib
    import shutil

    from .cache import cache_dir
    try:
        from tokenizers import ByteLevelBPETokenizer
    except ImportError:
        raise Failure(f"--model {model} needs the tokenizers package (pip install tokenizers)", 3)
    key = f"{hashlib.sha256(text).hexdigest()[:16]}-{BPE_TOKENS}"
    folder = cache_dir("tokenizers")
    path, ids_path = folder / f"{key}.json", folder / f"{key}.npy"
    if path.exists() and ids_path.exists():
        ids = np.load(ids_path)
    else:
        print(f"ember train: training a byte-level BPE of {BPE_TOKENS} tokens on the text (cached in {folder})",
              file=sys.stderr)
        words = text.decode("utf-8", errors="replace")
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator([words], vocab_size=BPE_TOKENS, min_frequency=2, special_tokens=["<|endoftext|>"],
                                show_progress=False)
        ids = np.array(tok.encode(words).ids, dtype=np.int32)
        # written under other names, then renamed: ranks may tokenize at once
        tmp_tok, tmp_ids = (p.with_name(f"{p.name}.{os.getpid()}.tmp") for p in (path, ids_path))
        tok.save(str(tmp_tok))
        with open(tmp_ids, "wb") as f:
            np.save(f, ids)
        os.replace(tmp_tok, path)
        os.replace(tmp_ids, ids_path)
    if out is not None:
        shutil.copyfile(path, out / "tokenizer.json")
    return ids, BPE_VOCAB


def split_data(tokens: np.ndarray, chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """Every tenth chunk of 64 KiB is held out for validation: spread over the whole text, so
    it is the same kind of text as the training part (not, say, the last files by name)."""
    chunks = [tokens[i:i + chunk] for i in range(0, len(tokens), chunk)]
    val = [c for i, c in enumerate(chunks) if i % 10 == 9] or [tokens[-len(tokens) // 10:]]
    train = [c for i, c in enumerate(chunks) if i % 10 != 9]
    return np.concatenate(train), np.concatenate(val)


def batch(data: np.ndarray, rng: random.Random, b: int, t: int) -> tuple[T.Tensor, T.Tensor]:
    """b sequences of t tokens and their next tokens; with data parallelism, this rank's share
    of them (every rank draws the same b starts, so the checkpointed generator stays one)."""
    starts = [rng.randrange(len(data) - t - 1) for _ in range(b)]
    starts = starts[distributed.shard(b, distributed.rank(), distributed.world_size())]
    x = np.stack([data[s:s + t] for s in starts]).astype(np.int32)
    y = np.stack([data[s + 1:s + t + 1] for s in starts]).astype(np.int32)
    return T.Tensor(x), T.Tensor(y)


def evaluate(model: GPT, val: np.ndarray, b: int, t: int, batches: int = 4) -> float:
    model.eval()
    rng = random.Random(1234)  # the same held-out batches every time
    losses = [distributed.average(model.loss(*batch(val, rng, b, t))).item() for _ in range(batches)]
    model.train()
    return float(sum(losses) / len(losses))


def save(path: Path, model: GPT, opt: optim.AdamW, meta: dict) -> None:
    tensors: dict = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors.update({f"opt.{k}": v for k, v in opt.state_dict().items()})
    nn.save_safetensors(tensors, path, {"ember": json.dumps(meta)})


def plot(history: dict, path: Path, model: str = "byte") -> str:
    """The run's train and validation losses in a PNG at path (its path, or why there is none)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(matplotlib is not installed: no plot)"
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*history["train"]), label="train", alpha=0.6)
    if history["val"]:
        ax.plot(*zip(*history["val"]), label="validation", marker="o")
    ax.set_xlabel("step")
    ax.set_ylabel(f"cross-entropy (nats per {'byte' if model == 'byte' else 'token'})")
    ax.set_title({"byte": "Ember: byte-level GPT", "gpt2": "Ember: GPT-2 (BPE)", "llama": "Ember: LLaMA (BPE)"}[model])
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def train(argv: list[str] | None = None) -> int:
    count, whole, number = bounded(int, 1), bounded(int, 0), bounded(float, 0)
    ap = Parser(prog="ember train", description="Train a small byte-level GPT on real text.",
                formatter_class=HelpWithDefaults)
    ap.add_argument("--data", help="a text file or folder (default: the Python standard library's sources)")
    ap.add_argument("--out", default="runs/gpt", help="run folder: checkpoint, loss plot, summary.json (and a BPE "
                    "model's tokenizer.json)")
    ap.add_argument("--steps", type=whole, default=300, help="optimizer steps")
    ap.add_argument("--model", choices=list(PRESETS), default="byte",
                    help="byte: a small byte-level GPT; gpt2: GPT-2 124M's shape with a byte-level BPE of 50257 "
                         "tokens trained on the data (vocab 50304); llama: the same size with RMSNorm, RoPE, SwiGLU "
                         "and no biases")
    ap.add_argument("--batch", type=count, default=16, help="sequences per step (over all GPUs)")
    ap.add_argument("--gpus", type=count, default=1,
                    help="data-parallel processes, one per GPU of this host (RANK/WORLD_SIZE from a launcher also "
                         "work)")
    ap.add_argument("--block", type=bounded(int, 1, LIMITS["block"]),
                    help="context length in tokens (default: the model's, 64 or 1024)")
    ap.add_argument("--dim", type=bounded(int, 1, LIMITS["dim"]),
                    help="model width (default: the model's, 96 or 768)")
    ap.add_argument("--layers", type=bounded(int, 1, LIMITS["n_layer"]),
                    help="transformer blocks (default: the model's, 2 or 12)")
    ap.add_argument("--heads", type=bounded(int, 1, LIMITS["n_head"]),
                    help="attention heads (default: the model's, 4 or 12)")
    ap.add_argument("--lr", type=number, default=3e-3, help="AdamW peak learning rate")
    ap.add_argument("--warmup", type=whole, default=0, help="steps of linear warmup to the peak learning rate")
    ap.add_argument("--cosine", action="store_true",
                    help="after the warmup, decay along a cosine to a tenth of the peak at --steps (a run extended "
                         "to more steps then follows another schedule)")
    ap.add_argument("--accum", type=count, default=1, help="micro-batches of --batch sequences per optimizer step")
    ap.add_argument("--seed", type=whole, default=0, help="seed of the initialization and the batches")
    ap.add_argument("--eval-every", type=count, default=50, help="steps between validation losses")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda with a GPU, else cpu")
    ap.add_argument("--max-bytes", type=bounded(int, 10_000), default=4_000_000,
                    help="use at most this many bytes of text")
    ap.add_argument("--fresh", action="store_true", help="start over even if the run folder has a checkpoint")
    ap.add_argument("--autocast", choices=["none", "bf16", "f16"], default="none",
                    help="mixed precision: matmuls on bf16/f16 inputs (tensor cores), weights and the rest f32")
    ap.add_argument("--clip", type=number, default=0.0, help="clip gradients to this global norm (0: off)")
    ap.add_argument("--no-jit", dest="jit", action="store_false",
                    help="build the step's graph in Python every step (default: ember.jit replays it)")
    ap.add_argument("--dry-run", action="store_true",
                    help="build and compile one step for the device, print each phase's time, the kernel "
                         "count and the step's peak memory, train nothing (CUDA source is generated without a GPU, "
                         "compiled where NVRTC is)")
    ap.add_argument("--arch", choices=list(target.ARCHS),
                    help="--dry-run --device cuda: the GPU architecture to schedule for (default: this GPU's, else "
                         f"{target.DEFAULT_ARCH})")
    args = ap.parse_args(argv)
    for name, value in PRESETS[args.model].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    sizes = model_config(args, 256 if args.model == "byte" else BPE_VOCAB)
    # a dry run allocates no activations: it may plan a step bigger than this machine
    problem = check_config(sizes, args.batch * args.accum, True, args.device != "cuda", memory=not args.dry_run)
    if problem:
        raise Failure(f"--batch {args.batch} --block {args.block} --dim {args.dim} --layers {args.layers} "
                      f"--heads {args.heads}: {problem}")
    if args.dry_run:
        return dry_run(args)
    if args.gpus > 1 and args.device == "cpu":
        print("ember train: --gpus runs one process per GPU; it does not go with --device cpu", file=sys.stderr)
        return 2
    try:
        launch = distributed.from_env()
        if args.gpus > 1 and launch.world == 1:   # the launcher: one process per GPU runs this again
            return launch_ranks(args, argv)
        distributed.shard(args.batch, 0, launch.world)   # the batch must split evenly
        if distributed.init(launch) is not None:
            args.device = "cuda"
    except distributed.DistributedError as e:
        print(f"ember train: {e}", file=sys.stderr)
        return 3
    main = distributed.rank() == 0
    if args.device == "cuda":
        from . import runners
        if "cuda" not in runners.available():
            print(f"ember train: --device cuda: {runners.BACKENDS['cuda'].why_unavailable()}", file=sys.stderr)
            return 3
    if args.device:
        T.Tensor(np.zeros(1)).to(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "ckpt.safetensors"
    text, source = load_text(args.data, args.max_bytes)
    tokens, vocab = tokenize(text, args.model, out if main else None)
    train_data, val_data = split_data(tokens)
    if len(val_data) < args.block + 2:
        unit = "bytes" if args.model == "byte" else "tokens"
        raise Failure(f"--block {args.block}: the held-out text has only {len(val_data)} {unit}; use a shorter "
                      "block or more text (--data, --max-bytes)")

    config = model_config(args, vocab)
    T.manual_seed(args.seed)
    model = build(config)
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = random.Random(args.seed)
    if distributed.world_size() > 1:   # rank 0's weights everywhere; gradients averaged at backward()
        distributed.DataParallel(model)
    run = Run(args, model, opt, rng, train_data, val_data, config, ckpt, out, 0)
    if ckpt.exists() and not args.fresh:
        arrays, saved, saved_config = load_checkpoint(ckpt, args.batch * args.accum, True)
        if saved_config != config:
            raise Failure(f"{ckpt} was trained with {saved['config']}; use --fresh or the same sizes")
        load_weights(model, arrays, "model.", ckpt)
        load_weights(opt, arrays, "opt.", ckpt)
        try:
            rng.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in saved["rng"]))
            run.history, run.start = {"train": saved["history"]["train"], "val": saved["history"]["val"]}, saved["step"]
        except (KeyError, TypeError, ValueError) as e:
            raise Failure(f"{ckpt}: its run state (rng, history, step) is unreadable: {type(e).__name__}: {e}")
        if main:
            print(f"resuming {ckpt} at step {run.start}", file=sys.stderr)
    params = sum(p.numel() for p in model.parameters())
    unit = "bytes" if args.model == "byte" else "tokens"
    gpus = f" x {distributed.world_size()} GPUs" if distributed.world_size() > 1 else ""
    if main:
        print(f"ember train: {params:,} parameters, {len(tokens):,} {unit} from {source}, "
              f"device {T.default_device()}{gpus}", file=sys.stderr)

    from tqdm import tqdm
    bar = tqdm(total=args.steps, initial=run.start, unit="step", file=sys.stderr, dynamic_ncols=True, disable=not main)
    try:
        with ctrl_c_between_steps(distributed.world_size() == 1) as asked:
            for step in range(run.start, args.steps):
                run.step(step, bar)
                if asked():
                    raise KeyboardInterrupt
    except KeyboardInterrupt:  # keep what was learned: a checkpoint that resumes here, then one line
        bar.close()
        if main:
            done = run.history["train"][-1][0] if run.history["train"] else run.start
            run.save(done)
            print(f"ember train: interrupted after step {done}; checkpoint {ckpt} (run again to resume)",
                  file=sys.stderr)
        return 130
    bar.close()
    if not main:   # rank 0 writes the files and the summary
        return 0
    steps_run = args.steps - run.start
    history = run.history
    summary = {"steps": args.steps, "final_train_loss": history["train"][-1][1] if history["train"] else None,
               "final_val_loss": history["val"][-1][1] if history["val"] else None,
               "first_step_s": round(run.t_first, 2),
               "tokens_per_s": round(args.batch * args.accum * args.block * (steps_run - 1) / run.t_rest, 1)
               if run.t_rest else None,
               "python_overhead_ms_per_step": round(1e3 * T.context.python_s / max(T.context.runs, 1), 2),
               "device": T.default_device(),
               "files": [str(p) for p in (ckpt, out / "loss.png", out / "tokenizer.json") if p.exists()]}  # written
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


def launch_ranks(args: argparse.Namespace, argv: list[str] | None) -> int:
    """--gpus N: the text tokenized once here (the cache the ranks then read), then one process
    per GPU, each running `ember train` with the same arguments as one rank."""
    if args.model != "byte":   # rank 0 copies the tokenizer to the run folder
        tokenize(load_text(args.data, args.max_bytes)[0], args.model, None)
    codes = distributed.spawn(train, args.gpus, sys.argv[1:] if argv is None else argv)   # as parse_args read them
    return max(codes)


def precision(args: argparse.Namespace) -> T.autocast:
    """The autocast context --autocast asks for (off for "none")."""
    return T.autocast({"f16": "float16"}.get(args.autocast, "bfloat16"), enabled=args.autocast != "none")


@contextmanager
def ctrl_c_between_steps(enabled: bool = True) -> Iterator[Callable[[], bool]]:
    """Ctrl-C as a request that the training loop honours after the step under way (a second
    Ctrl-C raises at once). Raised where it lands, a KeyboardInterrupt inside one of the weakref
    callbacks that Ember's graphs run all the time (ir.Node's hash-consing table) is printed and
    dropped by Python, and the run went on. Off (Ctrl-C raises where it lands) where the process
    ignores SIGINT, off the main thread, and with several ranks, whose steps must stop together."""
    asked: list[bool] = []

    def handler(signum: int, frame: object) -> None:
        if asked:
            raise KeyboardInterrupt
        asked.append(True)
        print("\nember train: stopping after this step (Ctrl-C again to stop now)", file=sys.stderr)
    if not (enabled and signal.getsignal(signal.SIGINT) is signal.default_int_handler
            and threading.current_thread() is threading.main_thread()):
        yield lambda: False
        return
    old = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(asked)
    finally:
        signal.signal(signal.SIGINT, old)


def learning_rate(step: int, steps: int, peak: float, warmup: int, cosine: bool = True) -> float:
    """Linear warmup over `warmup` steps, then the peak, or with cosine a decay from the peak
    down to a tenth of it at the last step. A function of the step: a resumed run continues the
    same schedule."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if not cosine or steps <= 1:
        return peak
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def step_program(model: GPT, opt: optim.AdamW, batch: int, block: int, autocast: T.autocast,
                 clip: float = 0.0) -> tuple[list[Node], dict[Node, str], list[tuple[int, Node]]]:
    """One training step's program (forward, backward, clipping, AdamW) as a replay runs it: the
    loss, then each update; what each of its inputs is; and the (output, input) pairs of the
    updates, which the GPU writes over the values they replace (Tensor.assign's donation)."""
    x, y = (T.Tensor(np.zeros((batch, block), np.int32)) for _ in range(2))
    opt.zero_grad()
    with autocast:
        loss = model.loss(x, y)
    loss.backward()
    if clip:
        nn.clip_grad_norm_(model.parameters(), clip)
    opt.steps += 1
    pairs = opt.updates()
    outputs, slots = T.canonical_program([loss.node] + [new.node for _, new in pairs])
    role = {t.node: "AdamW moments" for g in opt.param_groups for s in g["state"] for t in s}
    role.update({p.node: "parameters" for p in model.parameters()})
    roles = {slot: role.get(p, "batch and scalars") for p, slot in slots.items()}
    return outputs, roles, [(i + 1, slots[target.node]) for i, (target, _) in enumerate(pairs)]


def step_memory(sched: Schedule, roles: dict[Node, str], donate: list[tuple[int, Node]]) -> dict[str, int]:
    """The bytes a step's program holds at once, by what holds them (schedule.footprint); on the
    GPU the updates that schedule.donatable allows are written over what they replace."""
    gpu = sched.target is not None and sched.target.kind == "cuda"
    allowed = schedule.donatable(sched, [(sched.outputs[i], sched.inputs[n]) for i, n in donate]) if gpu else []
    return schedule.footprint(sched, roles, {sched.outputs[i].id for (i, _), ok in zip(donate, allowed) if ok})


def memory_line(parts: dict[str, int]) -> str:
    """`peak device memory X GiB (what holds it)`, what ember train --dry-run and the bench print."""
    held = ", ".join(f"{what} {n / 2**30:.3g}" for what, n in sorted(parts.items(), key=lambda kv: -kv[1]) if n)
    return f"peak device memory {sum(parts.values()) / 2**30:.3g} GiB ({held})"


def dry_run(args: argparse.Namespace) -> int:
    """Build one training step (forward, backward, AdamW) and compile it for the device, timing
    each phase, and print the memory it holds at its peak; nothing is trained or written."""
    import time as clock
    from concurrent.futures import ThreadPoolExecutor

    from .backend import c as cbackend
    from .backend import cuda
    device = args.device or ("cuda" if cuda.available() else "cpu")
    times: dict[str, float] = {}
    t = clock.perf_counter()
    T.manual_seed(args.seed)
    model = build(model_config(args, 256 if args.model == "byte" else BPE_VOCAB))
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    times["init"] = clock.perf_counter() - t
    t = clock.perf_counter()
    outputs, roles, donate = step_program(model, opt, args.batch, args.block, precision(args), args.clip)
    times["graph"] = clock.perf_counter() - t
    t = clock.perf_counter()
    if device == "cuda":   # without a GPU, for --arch (default: the table's DEFAULT_ARCH)
        gpu = target.gpu(args.arch) if args.arch else cuda.device_target()
        arch = gpu.arch
        sched = cuda.prepare(outputs, arch)
        times["schedule"] = clock.perf_counter() - t
        t = clock.perf_counter()
        units = cuda.render_units(sched.kernels, gpu)
        times["codegen"] = clock.perf_counter() - t
        t = clock.perf_counter()
        try:
            with ThreadPoolExecutor(len(units)) as pool:
                list(pool.map(lambda u: cuda.compile_cubin(u[0], arch), units))
            kinds = len({f for _, runs in units for f in runs.values()})
            times[f"nvrtc ({kinds} kinds, {len(units)} units, {arch})"] = clock.perf_counter() - t
        except ImportError:
            print("ember train --dry-run: cuda-python (NVRTC) is not installed: CUDA source generated, not compiled",
                  file=sys.stderr)
    else:
        sched = cbackend.prepare(outputs)  # the same schedule a CPU run compiles
        times["schedule"] = clock.perf_counter() - t
        t = clock.perf_counter()
        source = cbackend.render(sched)
        times["codegen"] = clock.perf_counter() - t
        t = clock.perf_counter()
        cbackend.build(source)
        times[f"cc ({os.cpu_count()} cores)"] = clock.perf_counter() - t
    contractions = sum(k.kind == "contraction" for k in sched.kernels)
    flash = sum(k.kind == "attention" for k in sched.kernels)
    where = f"{sched.target.arch} schedule" if device == "cuda" and sched.target else "C schedule, host memory"
    print(f"ember train --dry-run: device {device}, {len(sched.kernels)} kernels ({contractions} contractions, "
          f"{flash} flash attention), {sum(p.numel() for p in model.parameters()):,} parameters")
    print(f"{memory_line(step_memory(sched, roles, donate))}, {where}, batch {args.batch}")
    for phase, seconds in times.items():
        print(f"  {phase:28s} {seconds:8.2f} s")
    return 0


@dataclass
class Run:
    """One training run's state: what a step changes, and what a checkpoint saves."""
    args: argparse.Namespace
    model: GPT
    opt: optim.AdamW
    rng: random.Random
    train_data: np.ndarray
    val_data: np.ndarray
    config: GPTConfig
    ckpt: Path
    out: Path
    start: int
    history: dict = field(default_factory=lambda: {"train": [], "val": []})
    t_first: float = 0.0          # the first step (it compiles)
    t_rest: float = 0.0           # the other steps together
    replay: Any = None            # graph_step through ember.jit (--no-jit: as written)

    def step(self, step: int, bar: Any) -> None:
        """One optimizer step, the progress bar, and at evaluation steps the validation loss,
        the checkpoint and the plot."""
        a = self.args
        t = time.perf_counter()
        self.opt.lr = learning_rate(step, a.steps, a.lr, a.warmup, a.cosine)
        if self.replay is None:  # from the third step on, the step's programs run without its Python
            self.replay = jit(self.graph_step) if a.jit else self.graph_step
        xy = [v for _ in range(a.accum) for v in batch(self.train_data, self.rng, a.batch, a.block)]
        value = self.replay(*xy).item()
        if step == self.start:
            self.t_first = time.perf_counter() - t
        else:
            self.t_rest += time.perf_counter() - t
        self.history["train"].append((step + 1, value))
        tps = a.batch * a.accum * a.block * max(step - self.start, 1) / self.t_rest if self.t_rest else 0.0
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            self.history["val"].append((step + 1, evaluate(self.model, self.val_data, a.batch, a.block)))
            if distributed.rank() == 0:
                self.save(step + 1)
                plot(self.history, self.out / "loss.png", a.model)
        val = f"{self.history['val'][-1][1]:.3f}" if self.history["val"] else "-"
        bar.set_postfix_str(f"loss {value:.3f}, val {val}, {tps / 1000:.1f}k tok/s", refresh=False)
        bar.update(1)

    def graph_step(self, *xy: T.Tensor) -> T.Tensor:
        """The step's graph: the micro-batches' losses and gradients (they add up lazily: all
        run as one program), clipping, the optimizer's update; returns the mean loss."""
        a = self.args
        self.opt.zero_grad()
        total = None
        for x, y in zip(xy[::2], xy[1::2]):
            with precision(a):
                loss = self.model.loss(x, y) * (1.0 / a.accum)
            loss.backward()
            if distributed.world_size() > 1:   # computed (and averaged) by backward(): its value, not its graph
                loss = loss.detach()
            total = loss if total is None else total + loss
        assert total is not None
        T.context.pending_loss = total  # the step's program computes the mean loss of all micro-batches
        if a.clip:
            nn.clip_grad_norm_(self.model.parameters(), a.clip)
        self.opt.step()
        return total

    def save(self, step: int) -> None:
        meta = {"config": self.config.to_dict(), "step": step, "rng": self.rng.getstate(), "history": self.history}
        save(self.ckpt, self.model, self.opt, meta)


def sample(argv: list[str] | None = None) -> int:
    ap = Parser(prog="ember sample", description="Generate text from a checkpoint of ember train.",
                formatter_class=HelpWithDefaults)
    ap.add_argument("--ckpt", default="runs/gpt/ckpt.safetensors", help="the checkpoint to load")
    ap.add_argument("--prompt", default="def ", help="text to continue")
    ap.add_argument("--tokens", type=bounded(int, 0), default=200, help="tokens to generate (bytes for the byte model)")
    ap.add_argument("--temperature", type=bounded(float, 0), default=0.8,
                    help="sampling temperature (0: greedy, the likeliest token every time)")
    ap.add_argument("--seed", type=bounded(int, 0), default=0, help="sampling seed")
    args = ap.parse_args(argv)
    arrays, _, config = load_checkpoint(args.ckpt)
    bpe = Path(args.ckpt).parent / "tokenizer.json"
    if config.vocab != 256:  # a BPE model: its tokenizer was saved beside the checkpoint
        if not bpe.exists():
            raise Failure(f"{bpe} is missing (ember train saves it with a BPE model's checkpoint)", 3)
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(bpe))
    out = tokenizer.encode(args.prompt).ids if config.vocab != 256 else list(args.prompt.encode())
    if not out:
        raise Failure("the prompt is empty")
    model = build(config)
    load_weights(model, arrays, "model.", args.ckpt)
    model.eval()
    rng = random.Random(args.seed)
    # one token at a time through a KV cache: the position is data, so every position runs one
    # compiled program, and ember.jit replays it without building the graph again
    caches = kv_caches(model, 1)
    greedy, inv_t = args.temperature == 0, 1 / max(args.temperature, 1e-6)
    step = jit(lambda token: model.decode(token, caches).argmax(-1) if greedy
               else (model.decode(token, caches) * inv_t).softmax(-1))
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids) if config.vocab != 256 else bytes(ids).decode("utf-8", errors="replace")
    shown = decode(out)
    sys.stdout.write(shown)
    sys.stdout.flush()
    base, fed, t0 = 0, 0, time.perf_counter()   # out[base:base + fed] are in the cache
    for i in range(args.tokens):
        if len(out) - base > config.block:  # the cache is full: again from the last half of the text
            base, fed = len(out) - config.block // 2, 0   # (what it held past fed is masked out)
        while base + fed < len(out):
            caches[0].pos.assign(T.Tensor(np.array([fed], np.int64)))
            result = step(T.Tensor(np.array([[out[base + fed]]], np.int64)))
            fed += 1
        out.append(int(result.item()) if greedy else rng.choices(range(config.vocab),
                                                                 weights=result.numpy()[0].tolist())[0])
        text = decode(out)   # streamed as it comes, once a character is whole (a token may end inside one)
        if text.startswith(shown) and (not text.endswith("\ufffd") or i == args.tokens - 1):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    seconds = time.perf_counter() - t0
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(f"ember sample: {args.tokens} tokens in {seconds:.2f} s, {args.tokens / seconds:.1f} tokens/s "
          "(the first few compile)", file=sys.stderr)
    return 0
