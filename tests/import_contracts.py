"""Import contracts of our own for ``lint-imports`` (pyproject.toml, ``contract_types``).

``acyclic_modules``: no import cycle among the modules under ``root``, wherever the modules sit.
import-linter's own ``acyclic_siblings`` compares the children of each package with one another,
so a package that imports its submodule which imports the package back (``provisioners`` and
``provisioners/base.py``, which picked a subclass in ``__new__``) or a loop across packages
slips through it. Here every module is a node, a package's ``__init__`` included, and imports
inside functions and under ``TYPE_CHECKING`` count like any other.
"""

from __future__ import annotations

from collections.abc import Iterator

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def strongly_connected(graph: grimp.ImportGraph, modules: set[str]) -> Iterator[list[str]]:
    """Tarjan's algorithm, without recursion: each group of modules that import one another."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append(
                        (other, iter(sorted(graph.find_modules_directly_imported_by(other) & modules)))
                    )
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        yield sorted(group)


def a_cycle(graph: grimp.ImportGraph, group: list[str]) -> list[str]:
    """One cycle through the first module of ``group``, as the chain of imports that closes it."""
    first = group[0]
    best: list[str] | None = None
    for imported in sorted(graph.find_modules_directly_imported_by(first) & set(group)):
        back = graph.find_shortest_chain(importer=imported, imported=first)
        if back is not None and (best is None or len(back) + 1 < len(best)):
            best = [first, *back]
    return best or group


class AcyclicModulesContract(Contract):
    type_name = "acyclic_modules"

    root = fields.StringField()

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        root = str(self.root)
        modules = {module for module in graph.modules if module == root or module.startswith(f"{root}.")}
        cycles = [a_cycle(graph, group) for group in strongly_connected(graph, modules)]
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(" -> ".join(cycle), bold=False)
            output.new_line()


__all__ = ["AcyclicModulesContract", "a_cycle", "strongly_connected"]
