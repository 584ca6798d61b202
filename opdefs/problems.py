"""What goes wrong, said once for every layer.

`Problem` is one finding: which argument, what was found, what is allowed, and
(when it comes from a graph) which node.  `ValidationError` carries a list of
them.  They live here, at the bottom of the dependency graph, so that the
shape-inference functions and the kernels (which must not import the `dyndq`
face) raise the very class that `dyndq.ValidationError` names.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one argument (input or attribute) of one node."""

    argument: str | None
    found: str
    allowed: str
    op: str | None = None
    node: str | None = None
    node_index: int | None = None  # the node's index in an ONNX graph
    graph: str | None = None
    op_id: int | None = None  # the id of an op of a oneDNN graph (its JSON's "id"), which is no index

    def at(self, *, op: str, node: str, node_index: int, graph: str) -> "Problem":
        """The same problem, located at a node of a graph."""
        return dataclasses.replace(self, op=op, node=node, node_index=node_index, graph=graph)

    def as_dict(self) -> dict:
        """The fields as a dict; op_id only when the problem is about a oneDNN op."""
        fields = dataclasses.asdict(self)
        if self.op_id is None:
            del fields["op_id"]
        return fields

    def __str__(self) -> str:
        where = []
        if self.graph is not None:
            where.append(f"graph {self.graph!r}")
        number = self.node_index if self.node_index is not None else self.op_id  # said alike: `node 3 'fc'`
        if number is not None:
            where.append(f"node {number} {self.node!r}" if self.node else f"node {number} (unnamed)")
        if self.op is not None:
            where.append(f"({self.op})")
        head = " ".join(where)
        arg = f"{self.argument}: " if self.argument else ""
        body = f"{arg}found {self.found}; allowed: {self.allowed}"
        return f"{head}: {body}" if head else body


class ValidationError(ValueError):
    """Raised with every problem found, never just the first."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]):
        self.problems = list(problems)
        super().__init__(self._message())

    def _message(self) -> str:
        if len(self.problems) == 1:
            return str(self.problems[0])
        lines = [f"{len(self.problems)} problems:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)
