"""The one rewrite engine: patterns, rule sets, and rewriting a graph bottom-up to a fixed point.

A rule is `(pattern, fn)`. A pattern matches a node by op, dtype, arg and source patterns and
binds names to nodes; `fn(**bindings)` returns the replacement node, or None to decline.
`rewrite(roots, rules)` visits every node after its sources (iteratively: no recursion limit),
applies rules until none fires, and rewrites what a rule returns as well.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..ir import Node, Op

COMMUTATIVE = {Op.ADD, Op.MUL, Op.MAX, Op.AND, Op.OR, Op.XOR, Op.CMPEQ, Op.CMPNE}
ANY = object()


@dataclass(frozen=True)
class Pat:
    """Matches a node. `op` is an Op, a set of Ops or None (any); `srcs` None matches any sources;
    `name` binds the node; `arg` must equal the node's arg unless ANY; `pred` tests the node."""
    op: Op | frozenset[Op] | None = None
    srcs: tuple["Pat", ...] | None = None
    name: str | None = None
    arg: Any = ANY
    pred: Callable[[Node], bool] | None = None

    def ops(self) -> Iterable[Op] | None:
        if self.op is None:
            return None
        return (self.op,) if isinstance(self.op, Op) else self.op

    def match(self, node: Node, binds: dict[str, Node]) -> bool:
        ops = self.ops()
        if ops is not None and node.op not in ops:
            return False
        if self.arg is not ANY and node.arg != self.arg:
            return False
        if self.pred is not None and not self.pred(node):
            return False
        if self.name is not None:
            if self.name in binds and binds[self.name] is not node:
                return False
            binds[self.name] = node
        if self.srcs is None:
            return True
        if len(self.srcs) != len(node.srcs):
            return False
        orders = [node.srcs]
        if node.op in COMMUTATIVE and len(node.srcs) == 2:
            orders.append(node.srcs[::-1])
        for srcs in orders:
            trial = dict(binds)
            if all(p.match(s, trial) for p, s in zip(self.srcs, srcs)):
                binds.clear()
                binds.update(trial)
                return True
        return False


def P(op: Op | Iterable[Op] | None = None, *srcs: Pat, name: str | None = None, arg: Any = ANY,
      pred: Callable[[Node], bool] | None = None) -> Pat:
    """Shorthand: P(Op.ADD, P(name="x"), P(Op.CONST, arg=0)). Without srcs, any sources match."""
    op_val = op if op is None or isinstance(op, Op) else frozenset(op)
    return Pat(op_val, tuple(srcs) if srcs else None, name, arg, pred)


Rule = tuple[Pat, Callable[..., "Node | None"]]


class RuleSet:
    """Rules indexed by op, so a node only tries the rules that can match it. A rule's function
    gets the pattern's bindings as keyword arguments (name the root to get the node itself)."""

    def __init__(self, rules: Iterable[Rule]):
        self.by_op: dict[Op, list[Rule]] = {}
        self.generic: list[Rule] = []
        for rule in rules:
            ops = rule[0].ops()
            if ops is None:
                self.generic.append(rule)
            else:
                for op in ops:
                    self.by_op.setdefault(op, []).append(rule)
        self.by_op = {op: found + self.generic for op, found in self.by_op.items()}   # in the rules' order

    def apply(self, node: Node) -> Node | None:
        """The first rule's replacement for node, or None when no rule fires."""
        for pat, fn in self.by_op.get(node.op, self.generic):
            binds: dict[str, Node] = {}
            if pat.match(node, binds):
                out = fn(**binds)
                if out is not None and out is not node:
                    return out
        return None


def rewrite(roots: list[Node], rules: RuleSet, max_steps: int = 1_000_000,
            done: dict[Node, Node] | None = None) -> list[Node]:
    """Rewrite the graph of roots bottom-up with rules until no rule fires anywhere. done: the
    normal forms of nodes rewritten before with the same rules, added to as this call finds more."""
    done = {} if done is None else done
    redirect: dict[Node, Node] = {}
    steps = 0
    stack = list(roots)
    while stack:
        node = stack[-1]
        if node in done:
            stack.pop()
            continue
        if node in redirect:  # a rule replaced it: wait for the replacement's normal form
            target = redirect[node]
            if target in done:
                done[node] = done[target]
                stack.pop()
            else:
                stack.append(target)
            continue
        pending = [s for s in node.srcs if s not in done]
        if pending:
            stack.extend(pending)
            continue
        srcs = tuple(done[s] for s in node.srcs)
        current = node if all(a is b for a, b in zip(srcs, node.srcs)) else \
            Node(node.op, node.dtype, srcs, node.arg, node.shape)
        out = rules.apply(current)
        steps += 1
        if steps > max_steps:
            raise RuntimeError("rewrite did not reach a fixed point (rules that undo each other?)")
        if out is None:
            done[node] = current
            done.setdefault(current, current)
            stack.pop()
        else:
            redirect[node] = out
    return [done[r] for r in roots]


def substitute(roots: list[Node], mapping: dict[Node, Node]) -> list[Node]:
    """Replace nodes by others everywhere in the graph of roots (a rewrite with one rule)."""
    return rewrite(roots, RuleSet([(Pat(pred=lambda n: n in mapping, name="n"), lambda n: mapping[n])]))
