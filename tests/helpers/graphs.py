"""Loops in a directed graph, for the layer tests of the Python package and of the native core."""

from __future__ import annotations

from collections.abc import Mapping


def cycles(graph: Mapping[str, Mapping[str, object]], *, through_each: bool = False) -> list[list[str]]:
    """The loops of ``graph`` (node -> {target: what the edge is}), as node lists ``[a, b, ..., a]``
    starting at their smallest node: for each group of nodes that reach one another (Tarjan), the
    shortest loop through its smallest node, or with ``through_each`` the shortest loop through
    each of its nodes (a loop found twice is said once)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: set[str] = set()
            while not group or w != v:
                w = stack.pop()
                group.add(w)
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found: set[tuple[str, ...]] = set()
    for group in groups:
        for start in sorted(group) if through_each else [min(group)]:
            came: dict[str, str] = {}  # node -> the node that first reached it, breadth first
            frontier = [start]
            while start not in came:
                reached = []
                for v in frontier:
                    for w in sorted(graph[v]):
                        if w in group and w not in came:
                            came[w] = v
                            reached.append(w)
                frontier = reached
            loop, v = [start], came[start]
            while v != start:
                loop.append(v)
                v = came[v]
            loop.reverse()
            i = loop.index(min(loop))
            found.add(tuple(loop[i:] + loop[:i] + [loop[i]]))
    return [list(loop) for loop in sorted(found)]
