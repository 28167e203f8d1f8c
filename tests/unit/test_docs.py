"""The documentation stays true to the code.

Every trait of every configurable class has a help text (the reference is generated from them),
and every example in the docs is checked against the real thing: ``jupyter gpushare`` command
lines against the CLI's parser, ``%gpu`` lines against the magic's parser, YAML blocks as YAML
(Kubernetes manifests against the official schemas), Python config blocks through traitlets'
config loader with every trait name checked, JSON blocks as JSON, and the doctor's output lines
against the checks the doctor can produce. The Sphinx build itself (``make docs``, part of
``make test``) checks links and generated references.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from markdown_it import MarkdownIt
from traitlets.config import Config, Configurable
from traitlets.config.loader import PyFileConfigLoader

from jupyter_gpushare import doctor
from jupyter_gpushare.backends.registry import installed_kinds
from jupyter_gpushare.cli import build_parser
from jupyter_gpushare.config import GPUShare
from jupyter_gpushare.core import findings
from jupyter_gpushare.core.sizes import parse_size
from jupyter_gpushare.kernel.magics import _parser as magic_parser
from jupyter_gpushare.kernel.magics import _sizes_last

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from gpushare_reference import configurable_classes, documented_traits  # noqa: E402

PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md", *(ROOT / "examples").rglob("*.md")])
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", "text", ""}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    text: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.language or 'plain'})"


def blocks() -> Iterator[Block]:
    parser = MarkdownIt("commonmark")
    for page in PAGES:
        for token in parser.parse(page.read_text(encoding="utf-8")):
            if token.type == "fence" and not token.info.startswith("{"):
                line = token.map[0] + 1 if token.map else 0
                yield Block(page, line, token.info.split()[0] if token.info else "", token.content)


def inline_code() -> Iterator[tuple[Path, str]]:
    parser = MarkdownIt("commonmark")
    for page in PAGES:
        for token in parser.parse(page.read_text(encoding="utf-8")):
            for child in token.children or []:
                if child.type == "code_inline":
                    yield page, child.content


def blocks_in(*languages: str) -> list[Block]:
    return [block for block in blocks() if block.language in languages]


# ---- help texts --------------------------------------------------------------------------------


def test_the_reference_discovers_the_configurable_classes() -> None:
    names = {cls.__name__ for cls in configurable_classes()}
    assert {"GPUShare", "KubernetesProvisioner", "LocalGPUShareProvisioner"} <= names


def traits_without_help(classes: list[type[Configurable]]) -> list[str]:
    return [
        f"{cls.__module__}.{cls.__name__}.{name}"
        for cls in classes
        for name, trait in documented_traits(cls).items()
        if not (trait.help or "").strip()
    ]


def test_every_trait_of_every_configurable_class_has_help() -> None:
    missing = traits_without_help(configurable_classes())
    assert not missing, f"traits without help text (the docs are generated from it): {missing}"


def test_a_trait_without_help_is_caught() -> None:
    from traitlets import Unicode

    class Undocumented(GPUShare):
        quiet = Unicode("", config=True)

    assert traits_without_help([Undocumented]) == [f"{__name__}.Undocumented.quiet"]


def test_the_reference_documents_every_function_of_the_kernel_api() -> None:
    import jupyter_gpushare.kernel as kernel

    page = (ROOT / "docs" / "reference" / "magics.md").read_text(encoding="utf-8")
    public = set(kernel.__all__) - {"load_ipython_extension"}
    missing = [name for name in sorted(public) if f"jupyter_gpushare.kernel.api.{name}\n" not in page]
    assert not missing, f"docs/reference/magics.md does not document {missing}"


# ---- command lines -----------------------------------------------------------------------------


def shell_commands(text: str, console: bool = False) -> Iterator[str]:
    """The command lines of a shell block: prompts dropped (in a ``console`` block, ``# `` is
    root's prompt, not a comment), continuations joined."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip().removeprefix("$ ")
        if console:
            line = line.removeprefix("# ")
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""


def gpushare_argv(command: str) -> list[str] | None:
    words = shlex.split(command, comments=True)
    if "|" in words:  # a pipeline: the first command is ours (`profiles ... | kubectl apply -f -`)
        words = words[: words.index("|")]
    for prefix in (["jupyter", "gpushare"], [".venv/bin/jupyter", "gpushare"], ["jupyter-gpushare"]):
        if words[: len(prefix)] == prefix:
            return words[len(prefix) :]
    if len(words) >= 2 and words[0].endswith("/bin/jupyter") and words[1] == "gpushare":
        return words[2:]  # an installation's own, e.g. /opt/jupyter/bin/jupyter gpushare
    return None


GPUSHARE_COMMAND = re.compile(
    r"^(jupyter gpushare|\.venv/bin/jupyter gpushare|jupyter-gpushare|\S*/bin/jupyter gpushare)(?=\s|$)"
)


def gpushare_command_lines() -> list[tuple[str, str]]:
    found = []
    for block in blocks_in(*SHELL_LANGUAGES):
        for command in shell_commands(block.text, console=block.language == "console"):
            if GPUSHARE_COMMAND.match(command):
                found.append((str(block), command))
    for page, code in inline_code():
        if code.startswith(("jupyter gpushare ", ".venv/bin/jupyter gpushare ")):
            found.append((str(page.relative_to(ROOT)), code))
    return found


def test_the_docs_show_gpushare_commands() -> None:
    assert len(gpushare_command_lines()) >= 20


@pytest.mark.parametrize(("where", "command"), gpushare_command_lines())
def test_every_gpushare_command_in_the_docs_parses(where: str, command: str) -> None:
    argv = gpushare_argv(command)
    assert argv is not None
    try:
        arguments = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `{command}` is not a valid jupyter gpushare command")
    for option in ("memory", "sizes"):
        for size in (getattr(arguments, option, None) or "").split(","):
            if size:
                parse_size(size)


# ---- %gpu lines --------------------------------------------------------------------------------


def magic_lines() -> list[tuple[str, str]]:
    found = []
    for block in blocks_in("ipython", "python"):
        for line in block.text.splitlines():
            if line.startswith("%"):
                found.append((str(block), line))
    return found


@pytest.mark.parametrize(("where", "line"), magic_lines())
def test_every_magic_line_in_the_docs_parses(where: str, line: str) -> None:
    if line.startswith("%load_ext "):
        module = __import__(line.split()[1], fromlist=["load_ipython_extension"])
        assert callable(module.load_ipython_extension), where
        return
    assert line.startswith("%gpu"), f"{where}: unknown magic {line!r}"
    arguments = magic_parser().parse_args(_sizes_last(shlex.split(line[len("%gpu") :], comments=True)))
    if getattr(arguments, "size", None):
        parse_size(arguments.size)


# ---- YAML --------------------------------------------------------------------------------------


# API groups of custom resources, which Kubernetes' own schemas do not know, and the test that
# holds the docs' objects of each group to the real thing instead.
CHECKED_ELSEWHERE = {
    "kueue.x-k8s.io": "tests/integration/test_kueue.py (applied to the API server with Kueue's CRDs)",
    "config.kueue.x-k8s.io": "tests/integration/test_kueue.py (against the configuration Kueue runs with)",
}


@pytest.mark.parametrize("block", blocks_in("yaml", "yml"), ids=str)
def test_every_yaml_block_is_valid(block: Block) -> None:
    documents = [doc for doc in yaml.safe_load_all(block.text) if doc is not None]
    assert documents, f"{block}: empty YAML"
    for document in documents:
        if isinstance(document, dict) and "apiVersion" in document and "kind" in document:
            if str(document["apiVersion"]).split("/")[0] in CHECKED_ELSEWHERE:
                continue
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(document, version, strict=True)


def test_the_docs_validate_at_least_one_kubernetes_manifest() -> None:
    manifests = [
        doc
        for block in blocks_in("yaml", "yml")
        for doc in yaml.safe_load_all(block.text)
        if isinstance(doc, dict) and "kind" in doc
    ]
    assert manifests


# ---- Python configuration ----------------------------------------------------------------------


def external_configurables() -> dict[str, type[Configurable]]:
    """Config sections of other projects that the docs configure (JupyterHub's, jupyter_server's)."""
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager
    from jupyterhub.app import JupyterHub
    from jupyterhub.spawner import Spawner
    from kubespawner import KubeSpawner

    return {
        "JupyterHub": JupyterHub,
        "Spawner": Spawner,
        "KubeSpawner": KubeSpawner,
        "MappingKernelManager": MappingKernelManager,
    }


def load_config_block(block: Block, tmp_path: Path) -> Config:
    path = tmp_path / "snippet_config.py"
    path.write_text(block.text, encoding="utf-8")
    return PyFileConfigLoader(path.name, path=str(tmp_path)).load_config()


CONFIG_LINE = re.compile(r"^c\.\w+\.\w+\s*=", re.MULTILINE)


@pytest.mark.parametrize("block", blocks_in("python", "py"), ids=str)
def test_every_python_block_compiles_and_config_blocks_load(block: Block, tmp_path: Path) -> None:
    ast.parse(block.text, filename=str(block))
    if not CONFIG_LINE.search(block.text):
        return
    config = load_config_block(block, tmp_path)
    classes: dict[str, type[Configurable]] = {cls.__name__: cls for cls in configurable_classes()}
    classes.update(external_configurables())
    for section, values in config.items():
        assert section in classes, f"{block}: c.{section} is not a known configurable class"
        traits = classes[section].class_traits(config=True)
        unknown = sorted(set(values) - set(traits))
        assert not unknown, f"{block}: c.{section} has no trait {unknown}"
    if "GPUShare" in config:
        GPUShare(config=config)  # every value validated as a server would


def test_the_docs_have_python_config_blocks() -> None:
    assert sum(bool(CONFIG_LINE.search(b.text)) for b in blocks_in("python", "py")) >= 5


# ---- JSON --------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", blocks_in("json"), ids=str)
def test_every_json_block_parses(block: Block) -> None:
    json.loads(block.text)


# ---- the doctor's output -----------------------------------------------------------------------


def _pattern(node: ast.expr | None) -> str:
    """A regex for what an argument of ``Check(...)`` can print."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_pattern(part) if isinstance(part, ast.Constant) else ".+" for part in node.values)
    return ".*" if node is None else ".+"


def doctor_modules() -> list[Path]:
    """The doctor's own modules, the GPUs line's, and every installed kind's checks."""
    kinds = {
        kind.doctor_checks.partition(":")[0] for kind in installed_kinds().values() if kind.doctor_checks
    }
    paths = {*Path(doctor.__file__).parent.glob("*.py"), Path(str(findings.__file__))}
    paths |= {Path(str(importlib.import_module(module).__file__)) for module in kinds}
    return sorted(paths)


def doctor_checks() -> list[tuple[str, str, str, str]]:
    """(name, status, detail, fix) patterns of every ``Check(...)`` the doctor can print."""
    checks = []
    for module in doctor_modules():
        checks.extend(_checks_in(ast.parse(module.read_text(encoding="utf-8"))))
    return checks


def _checks_in(tree: ast.Module) -> list[tuple[str, str, str, str]]:
    checks = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Check":
            arguments: list[ast.expr | None] = [*node.args, *([None] * (4 - len(node.args)))]
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            if "fix" in keywords:
                arguments[3] = keywords["fix"]
            checks.append(tuple(_pattern(argument) for argument in arguments[:4]))  # type: ignore[arg-type]
    return checks


DOCTOR_LINE = re.compile(r"^(OK|WARN|FAIL) +([^:]+): (.*)$")


def doctor_lines() -> list[tuple[str, str, str | None]]:
    found = []
    for block in blocks_in("text", ""):
        lines = block.text.splitlines()
        for index, line in enumerate(lines):
            if DOCTOR_LINE.match(line):
                following = lines[index + 1].strip() if index + 1 < len(lines) else ""
                fix = following.removeprefix("fix: ") if following.startswith("fix: ") else None
                found.append((str(block), line, fix))
    for page, code in inline_code():
        if DOCTOR_LINE.match(code):
            found.append((str(page.relative_to(ROOT)), code, None))
    return found


def test_the_docs_quote_the_doctor() -> None:
    assert len(doctor_lines()) >= 10


@pytest.mark.parametrize(("where", "line", "fix"), doctor_lines())
def test_every_doctor_line_in_the_docs_is_one_doctor_can_print(
    where: str, line: str, fix: str | None
) -> None:
    match = DOCTOR_LINE.match(line)
    assert match is not None
    status, name, detail = match.groups()
    for name_pattern, status_pattern, detail_pattern, fix_pattern in doctor_checks():
        if not (re.fullmatch(name_pattern, name) and re.fullmatch(status_pattern, status)):
            continue
        if not re.fullmatch(detail_pattern, detail):
            continue
        if fix is None or re.fullmatch(fix_pattern, fix):
            return
    pytest.fail(f"{where}: doctor prints no such line: {line!r} (fix: {fix!r})")


def test_the_doctor_line_check_can_fail() -> None:
    with pytest.raises(pytest.fail.Exception):
        test_every_doctor_line_in_the_docs_is_one_doctor_can_print(
            "here", "FAIL  GPUs: no GPU found", "buy a GPU"
        )


# ---- anchors -----------------------------------------------------------------------------------

HEADING = re.compile(r"^#{1,6} +(?P<title>.+?) *$")
LABEL = re.compile(r"^\((?P<label>[\w-]+)\)=$")


def slug(title: str) -> str:
    """The anchor GitHub (and MyST's heading anchors) make of a heading: lower case, punctuation
    dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def misplaced_labels(text: str) -> list[str]:
    """Labels named after one heading of the page but standing before another: a link to the
    label (the docs site) and one to the heading's anchor (GitHub, the README) land apart."""
    lines = text.splitlines()
    slugs = {slug(match["title"]) for line in lines if (match := HEADING.match(line))}
    found = []
    for index, line in enumerate(lines[:-1]):
        label, heading = LABEL.match(line), HEADING.match(lines[index + 1])
        if label and heading and label["label"] in slugs and slug(heading["title"]) != label["label"]:
            found.append(f"({label['label']})= stands before '{heading['title']}'")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_a_label_named_after_a_heading_stands_before_it(page: Path) -> None:
    assert misplaced_labels(page.read_text(encoding="utf-8")) == []


def test_a_label_before_the_wrong_heading_is_found() -> None:
    page = (
        "(replay-what-idle-notebooks-cost)=\n## The broker at cluster scale\n\n"
        "## Replay: what idle notebooks cost\n"
    )
    assert misplaced_labels(page) == [
        "(replay-what-idle-notebooks-cost)= stands before 'The broker at cluster scale'"
    ]
