"""torch.utils.data's TensorDataset and DataLoader (as ember.utils.data): batches are new leaves
sliced from the datasets' computed values, so a training step's program does not depend on
which batch it gets (it compiles once)."""
from __future__ import annotations

import sys
import types
from typing import Any, Iterator

import numpy as np

from . import tensor as T


class TensorDataset:
    def __init__(self, *tensors: T.Tensor):
        if any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("TensorDataset: the tensors' first dims differ")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i: Any) -> tuple:
        return tuple(t[i] for t in self.tensors)


class DataLoader:
    """Batches of batch_size (the last shorter unless drop_last), in a random order each epoch
    with shuffle (reproducible under ember.manual_seed)."""

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False, **_: Any):
        self.dataset, self.batch_size, self.shuffle, self.drop_last = dataset, batch_size, shuffle, drop_last

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        n = len(self.dataset)
        order = np.arange(n)
        if self.shuffle:   # host-side order from ember's seed (randperm would sort on the device)
            T.context.draws += 1
            order = np.random.default_rng((T.context.seed, T.context.draws)).permutation(n)
        columns = [t.numpy() for t in self.dataset.tensors] if isinstance(self.dataset, TensorDataset) else None
        for b in range(len(self)):
            rows = order[b * self.batch_size:(b + 1) * self.batch_size]
            if columns is not None:
                yield tuple(T.Tensor(c[rows], t.dtype) for c, t in zip(columns, self.dataset.tensors))
                continue
            samples = [self.dataset[int(i)] for i in rows]
            first = samples[0]
            if isinstance(first, tuple):
                yield tuple(T.stack([s[k] for s in samples]) for k in range(len(first)))
            else:
                yield T.stack(samples)


data = types.ModuleType(f"{__name__}.data")
data.TensorDataset, data.DataLoader = TensorDataset, DataLoader  # type: ignore[attr-defined]
sys.modules[data.__name__] = data
