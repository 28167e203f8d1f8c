"""Sphinx directives that generate the reference pages from the code of jupyter_gpushare.

Nothing here repeats a name, a default or a help text: each directive imports what it documents.
Moving a module means changing an import path in a page, never rewriting its text.

* ``gpushare-configurables`` — every configurable class of the package (found by walking its
  modules, so a new one appears by itself), each with its traits through autodoc-traits.
* ``gpushare-metrics [MODULE:NAME]`` — the Prometheus series the collector declares (its gauges,
  or the definitions named, e.g. its counters).
* ``gpushare-presets`` — the resource names of every Kubernetes preset.
* ``gpushare-settings-layers`` — where ``GPUShare`` settings come from, in precedence order, and
  the settings an administrator's file decides for every user.
* ``gpushare-literal MODULE:NAME`` — a string constant shown as a literal block (the ``%gpu``
  usage text, the accepted size forms).
* ``gpushare-command jupyter gpushare ...`` — what a (pure) CLI command prints, run at build time.
* ``gpushare-openapi-info PATH`` — the description of an OpenAPI document, as Markdown.

:func:`configurable_classes` and :func:`documented_traits` are also what the tests use to
require a help text on every trait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import os
import pkgutil
import shlex
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import yaml
from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles
from traitlets import TraitType
from traitlets.config import Configurable

PACKAGE = "jupyter_gpushare"


def configurable_classes(package: str = PACKAGE) -> list[type[Configurable]]:
    """Every traitlets ``Configurable`` defined in the package that has a trait to document.

    Walking the modules (rather than listing classes) means a new configurable class — a broker,
    a backend — is in the reference, and under the help-text test, the day it is written.
    """
    root = importlib.import_module(package)
    found: list[type[Configurable]] = []
    for info in sorted(pkgutil.walk_packages(root.__path__, f"{package}."), key=lambda i: i.name):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Configurable) and obj.__module__ == module.__name__ and documented_traits(obj):
                found.append(obj)
    return found


def documented_traits(cls: type[Configurable]) -> dict[str, TraitType[Any, Any]]:
    """The traits a reader can set: every ``config=True`` trait, wherever it is defined, and
    every trait the package itself defines (a provisioner's ``gpu_memory`` comes from the
    kernelspec's ``kernel_provisioner.config``, not from ``c.``)."""
    return {
        name: trait
        for name, trait in cls.class_traits().items()
        if trait.metadata.get("config") or trait.this_class.__module__.startswith(f"{PACKAGE}.")
    }


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    value: Any = importlib.import_module(module)
    for part in name.split(".") if name else []:
        value = getattr(value, part)
    return value


class ConfigurablesDirective(SphinxDirective):
    """``gpushare-configurables``: a section per configurable class, its traits by autodoc-traits."""

    def run(self) -> list[nodes.Node]:
        lines: list[str] = []
        for cls in configurable_classes():
            path = f"{cls.__module__}.{cls.__qualname__}"
            title = cls.__qualname__
            lines += [title, "-" * len(title), ""]
            lines += [f".. autoconfigurable:: {path}"]
            lines += [f"   :members: {', '.join(documented_traits(cls))}", ""]
        content = StringList(lines, source="gpushare-configurables")
        container = nodes.container()
        nested_parse_with_titles(self.state, content, container)
        return list(container.children)


class MetricsDirective(SphinxDirective):
    """``gpushare-metrics``: a table of the series in ``jupyter_gpushare.server.metrics.METRICS``."""

    optional_arguments = 1  # the import path of the definitions

    def run(self) -> list[nodes.Node]:
        metrics = _import(self.arguments[0] if self.arguments else f"{PACKAGE}.server.metrics:METRICS")
        rows = [
            [nodes.literal(text=m.name), nodes.Text(m.documentation), _literals(m.labels)] for m in metrics
        ]
        types = sorted({getattr(m, "metric_type", "gauge") for m in metrics})
        return [_table([f"series ({', '.join(types)})", "meaning", "labels"], rows)]


class PresetsDirective(SphinxDirective):
    """``gpushare-presets``: the names each device-plugin preset gives, one row per field of
    ``ResourcePreset`` (the keys ``c.GPUShare.resource_names`` overrides). The DRA presets name
    a driver and device classes instead (``ResourcePreset.dra``); docs/dra.md tables those."""

    optional_arguments = 1  # the import path of the presets

    def run(self) -> list[nodes.Node]:
        presets = _import(
            self.arguments[0] if self.arguments else f"{PACKAGE}.backends.kubernetes.objects.presets:PRESETS"
        )
        names = [name for name, preset in presets.items() if getattr(preset, "dra", None) is None]
        fields = [field.name for field in dataclasses.fields(presets[names[0]])]
        rows = [
            [nodes.literal(text=field)] + [_value(getattr(presets[name], field)) for name in names]
            for field in fields
            if field not in ("name", "dra")
        ]
        return [_table(["resource_names key", *names], rows)]


def _value(value: object) -> nodes.Node:
    return nodes.Text("—") if value is None else nodes.literal(text=str(value))


class SettingsLayersDirective(SphinxDirective):
    """``gpushare-settings-layers``: where ``GPUShare`` settings come from, lowest precedence
    first (``jupyter_gpushare.config.layers``), and the administered settings."""

    def run(self) -> list[nodes.Node]:
        from jupyter_gpushare.config.layers import SOURCES, WHERE
        from jupyter_gpushare.config.loading import administered_traits

        # Only an administrator's file (one the user cannot change) may set what another one set
        # of the administered settings; the rule is config.layers.settle's.
        rows = [
            [
                nodes.Text(str(rank)),
                nodes.Text(source),
                nodes.Text(WHERE[source]),
                nodes.Text("if it is an administrator's file too" if source.endswith("file") else "no"),
            ]
            for rank, source in enumerate(SOURCES, start=1)
        ]
        administered = nodes.paragraph()
        administered += nodes.Text(
            "Administered settings (an administrator's file decides them for every user): "
        )
        administered += _literals(tuple(sorted(administered_traits())))
        header = ["precedence", "source", "where", "overrides an administrator's administered setting"]
        return [_table(header, rows), administered]


class LiteralDirective(SphinxDirective):
    """``gpushare-literal module:NAME``: the text of a string constant, as a literal block."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        text = _import(self.arguments[0])
        if not isinstance(text, str):
            raise self.error(f"{self.arguments[0]} is not a string")
        return [nodes.literal_block(text, text)]


class CommandDirective(SphinxDirective):
    """``gpushare-command jupyter gpushare ...``: run the CLI in this process and show what it
    prints (``render-pod``, ``profiles``: pure, no cluster). The run ignores the builder's own
    Jupyter config and ``JUPYTER_GPUSHARE_*`` variables, so every machine builds the same page."""

    required_arguments = 1
    final_argument_whitespace = True
    option_spec: ClassVar[dict[str, Callable[[str], Any]]] = {"language": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        words = shlex.split(self.arguments[0])
        if words[:2] != ["jupyter", "gpushare"]:
            raise self.error(f"not a jupyter gpushare command: {self.arguments[0]}")
        from jupyter_gpushare.cli import main

        output = io.StringIO()
        with (
            tempfile.TemporaryDirectory() as config_dir,
            _environment(config_dir),
            contextlib.redirect_stdout(output),
        ):
            status = main(words[2:])
        if status != 0:
            raise self.error(f"{self.arguments[0]} exited with {status}")
        text = f"$ {self.arguments[0]}\n{output.getvalue()}"
        block = nodes.literal_block(text, text)
        block["language"] = self.options.get("language", "yaml")
        return [block]


@contextlib.contextmanager
def _environment(config_dir: str) -> Iterator[None]:
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("JUPYTER_GPUSHARE_") or name in ("JUPYTER_CONFIG_PATH", "KUBECONFIG"):
            del os.environ[name]
    os.environ.update(JUPYTER_CONFIG_DIR=config_dir, JUPYTER_GPUSHARE_OWNER="alice")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class OpenAPIInfoDirective(SphinxDirective):
    """``gpushare-openapi-info PATH``: ``info.description`` of an OpenAPI document, parsed as
    Markdown (in a MyST page) where the routes themselves come from sphinxcontrib-openapi."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        relative, absolute = self.env.relfn2path(self.arguments[0])
        self.env.note_dependency(relative)
        description = yaml.safe_load(Path(absolute).read_text(encoding="utf-8"))["info"]["description"]
        container = nodes.container()
        self.state.nested_parse(StringList(description.splitlines(), source=relative), 0, container)
        return list(container.children)


def _literals(names: tuple[str, ...]) -> nodes.Node:
    paragraph = nodes.paragraph()
    for index, name in enumerate(names):
        if index:
            paragraph += nodes.Text(", ")
        paragraph += nodes.literal(text=name)
    return paragraph


def _table(header: list[str], rows: list[list[nodes.Node]]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)

    def row(cells: list[nodes.Node]) -> nodes.row:
        line = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += cell if isinstance(cell, nodes.Element) else nodes.paragraph("", "", cell)
            line += entry
        return line

    head = nodes.thead()
    head += row([nodes.Text(text) for text in header])
    body = nodes.tbody()
    body.extend(row(cells) for cells in rows)
    group += head
    group += body
    return table


def _trait_annotation(documenter: Any) -> None:
    """Show a trait's default as traitlets writes it (``['2G', '4G', …]``, not ``List()``)."""
    trait = documenter.object
    default = trait.default_value_repr()
    prefix = f"c.{documenter.format_name()} = " if trait.metadata.get("config") else ""
    documenter.options.annotation = f"{prefix}{type(trait).__name__}({default})"


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("autodoc_traits")
    import autodoc_traits

    class TraitDocumenter(autodoc_traits.TraitDocumenter):  # type: ignore[misc]
        priority = autodoc_traits.TraitDocumenter.priority + 1

        def add_directive_header(self, sig: str) -> None:
            _trait_annotation(self)
            autodoc_traits.AttributeDocumenter.add_directive_header(self, sig)

    app.add_autodocumenter(TraitDocumenter, override=True)
    app.add_directive("gpushare-configurables", ConfigurablesDirective)
    app.add_directive("gpushare-metrics", MetricsDirective)
    app.add_directive("gpushare-presets", PresetsDirective)
    app.add_directive("gpushare-literal", LiteralDirective)
    app.add_directive("gpushare-settings-layers", SettingsLayersDirective)
    app.add_directive("gpushare-openapi-info", OpenAPIInfoDirective)
    app.add_directive("gpushare-command", CommandDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
