"""Where the grader's runs happen: this process's threads (the default), or a Dask cluster
(`--workers N`: a local cluster of N worker processes; `--scheduler ADDRESS`: a course's machines).

A task is one compiler on one test (`ember grade`) or on one program in one round (`ember bench`):
a module-level function `fn(sandbox, submissions, *args)` whose args carry everything it needs
(the seeds the grader chose included), so it gives the same answer wherever and however often it
runs. Dask runs again, elsewhere, the tasks of a worker that is lost, so a lost worker loses no
result. Results are gathered in task order, so a cluster's report equals a local run's.

Each worker process copies and builds the submissions itself, on first use, in a sandbox of its
own: every machine must see the submissions (and tests, suite) at the same paths, with the same
toolchain. Benchmark tasks each hold the resource `GPU=1`, which every worker has once: a worker is
one GPU (its CUDA_VISIBLE_DEVICES), and timings never share one.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from .course import Source
from .sandbox import Limits, Sandbox
from .submissions import REFERENCE, Submission, load_submissions


@dataclass(frozen=True)
class Context:
    """What a process needs to make its own copies of the submissions (sent to each worker)."""
    sources: tuple[Source, ...]
    ref: str | None
    build_timeout: float
    hide: tuple[str, ...]
    wall: float
    jobs: int = 1
    allow_ember: bool = False

    def load(self, progress: Callable[[str], None]) -> tuple[Sandbox, dict[str, Submission]]:
        sandbox = Sandbox([Path(p) for p in self.hide], self.jobs, Limits(wall=self.wall), allow_ember=self.allow_ember)
        try:
            subs = load_submissions(list(self.sources), sandbox, self.ref, self.build_timeout, progress)
        except BaseException:
            sandbox.close()
            raise
        return sandbox, {s.name: s for s in subs}

    def names(self) -> list[str]:
        """The names load_submissions gives, without copying anything (the reference first)."""
        if any(s.name == REFERENCE for s in self.sources):
            raise ValueError(f"the name '{REFERENCE}' is kept for Ember itself")
        return [REFERENCE] + [s.name for s in self.sources]


_STATES: dict[Context, tuple[Sandbox, dict[str, Submission]]] = {}  # a worker's sandbox and submissions
_LOCK = threading.Lock()


def _remote(ctx: Context, fn: Callable[..., Any], args: tuple) -> Any:
    with _LOCK:
        if ctx not in _STATES:
            _STATES[ctx] = ctx.load(lambda m: None)
    sandbox, subs = _STATES[ctx]
    return fn(sandbox, subs, *args)


def _close_states() -> None:
    with _LOCK:
        for sandbox, _ in _STATES.values():
            sandbox.close()
        _STATES.clear()


class Runner:
    """Runs tasks on the submissions of ctx. threads: tasks at once without a cluster.
    gpu: each task holds one GPU of a cluster worker."""

    def __init__(self, ctx: Context, threads: int, scheduler: str | None = None, workers: int = 0,
                 gpu: bool = False, progress: Callable[[str], None] = lambda m: None):
        self.ctx, self.threads, self.gpu = ctx, threads, gpu
        self.client: Any = None
        self.cluster: Any = None
        self.local: tuple[Sandbox, dict[str, Submission]] | None = None
        if scheduler is None and workers <= 0:
            self.local = ctx.load(progress)
            self.names = list(self.local[1])
            return
        self.names = ctx.names()
        try:
            from dask.distributed import Client
        except ImportError:
            raise ValueError("--scheduler and --workers need Dask: pip install 'ember[cluster]'") from None
        if scheduler is None:
            self.cluster = _local_cluster(workers)
            self.client = Client(self.cluster)
        else:
            try:
                self.client = Client(scheduler, timeout=30)
                self.client.wait_for_workers(1, timeout=60)
            except (OSError, TimeoutError) as e:
                raise ValueError(f"--scheduler {scheduler}: cannot reach it, or it has no worker: {e}") from None
            workers = self.client.scheduler_info()["workers"].values()
            if gpu and not any(w.get("resources", {}).get("GPU") for w in workers):
                self.client.close()
                raise ValueError(f"--scheduler {scheduler}: no worker has the resource GPU=1, which each benchmark "
                                 "holds (dask worker ... --nthreads 1 --resources GPU=1)")

    def map(self, fn: Callable[..., Any], tasks: list[tuple]) -> Iterator[tuple[int, Any]]:
        """(index, fn's result) for each task, as they finish."""
        if self.local is not None:
            sandbox, subs = self.local
            with ThreadPoolExecutor(max_workers=self.threads) as pool:
                futures = {pool.submit(fn, sandbox, subs, *t): i for i, t in enumerate(tasks)}
                for f in as_completed(futures):
                    yield futures[f], f.result()
            return
        from dask.distributed import as_completed as dask_completed
        res = {"GPU": 1} if self.gpu else None
        futures = [self.client.submit(_remote, self.ctx, fn, t, pure=False, resources=res) for t in tasks]
        index = {f.key: i for i, f in enumerate(futures)}
        for f in dask_completed(futures):
            yield index[f.key], f.result()

    def close(self) -> None:
        if self.local is not None:
            self.local[0].close()
        if self.client is not None:
            try:
                self.client.run(_close_states)
            finally:
                self.client.close()
                if self.cluster is not None:
                    self.cluster.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _local_cluster(workers: int) -> Any:
    """N worker processes of one thread on this machine, worker i on GPU i (of CUDA_VISIBLE_DEVICES)."""
    import logging

    from dask.distributed import Nanny, Scheduler, SpecCluster
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g] or [str(i) for i in range(workers)]
    spec = {i: {"cls": Nanny, "options": {"nthreads": 1, "resources": {"GPU": 1}, "dashboard": False,
                                          "silence_logs": logging.ERROR,
                                          "env": {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}}}
            for i in range(workers)}
    sched = {"cls": Scheduler, "options": {"dashboard": False}}
    return SpecCluster(workers=spec, scheduler=sched, silence_logs=logging.ERROR)
