"""Which actions the JupyterLab extension offers on a kernel: the panel's buttons and the
commands' ``isEnabled`` both follow ``offered()`` (labextension/src/actions.ts), which reads the
kernel's state and the ``capabilities`` its server sends — never whether it is a pod.

``offered()`` is run as it is written, transpiled by the extension's own TypeScript compiler and
run by Node, against the capabilities the package's backends send (``Capabilities.payload()``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.core.capabilities import LOCAL_BROKER, NODE_LEDGER, pod_capabilities

REPO = Path(__file__).resolve().parents[3]
EXTENSION = REPO / "labextension"
SOURCES = EXTENSION / "src"
ACTIONS = ("resize", "release", "request", "suspend", "resume", "shutdown")
STATES = ("queued", "running", "released", "suspended")

# Node evaluates offered() for every (capabilities, state, action) it is given on stdin.
RUN_OFFERED = """
const ts = require('typescript');
const fs = require('fs');
const source = fs.readFileSync(process.argv[1], 'utf8');
const js = ts.transpileModule(source, { compilerOptions: { module: ts.ModuleKind.CommonJS } }).outputText;
const module_ = { exports: {} };
new Function('module', 'exports', 'require', js)(module_, module_.exports, require);
const cases = JSON.parse(fs.readFileSync(0, 'utf8'));
const answers = cases.map(([capabilities, state, action]) =>
  module_.exports.offered({ state, capabilities: capabilities ?? undefined }, action));
process.stdout.write(JSON.stringify(answers));
"""


def offered_by_the_extension(cases: list[tuple[Any, str, str]]) -> list[bool]:
    node = shutil.which("node")
    if node is None or not (EXTENSION / "node_modules" / "typescript").is_dir():
        pytest.fail("node and labextension/node_modules are needed: run make labextension/node_modules")
    answer = subprocess.run(
        [node, "-e", RUN_OFFERED, str(SOURCES / "actions.ts")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=EXTENSION,
        timeout=120,
        check=True,
    )
    return list(json.loads(answer.stdout))


def expected(capabilities: dict[str, bool], state: str, action: str) -> bool:
    """The rule written out by hand from docs/users/panel.md and the panel's documentation."""
    return {
        "resize": state == "running",
        "release": state == "queued" or (state == "running" and capabilities["can_release"]),
        "request": state == "released" and capabilities["can_request"],
        "suspend": state == "running" and capabilities["can_suspend"],
        "resume": state == "suspended",
        "shutdown": state != "queued",
    }[action]


BACKENDS = {
    "node ledger": NODE_LEDGER.payload(),
    "GPU broker": LOCAL_BROKER.payload(),
    "kernel pods": pod_capabilities("held for life").payload(),
}


def test_the_extension_offers_what_the_backends_capabilities_allow_in_each_state() -> None:
    cases = [
        (capabilities, state, action)
        for capabilities in BACKENDS.values()
        for state in STATES
        for action in ACTIONS
    ]
    answers = offered_by_the_extension(cases)
    wrong = [
        f"{name}, {state}: {action} offered={answer}"
        for (capabilities, state, action), answer in zip(cases, answers, strict=True)
        for name in [next(name for name, caps in BACKENDS.items() if caps is capabilities)]
        if answer != expected(capabilities, state, action)
    ]
    assert wrong == []


def test_a_kernel_pod_offers_no_release_request_or_suspend_while_a_local_kernel_does() -> None:
    pod, local = BACKENDS["kernel pods"], BACKENDS["node ledger"]
    cases = [(pod, "running", "release"), (pod, "running", "suspend"), (pod, "released", "request")]
    cases += [(local, state, action) for _, state, action in cases]
    assert offered_by_the_extension(cases) == [False, False, False, True, True, True]


def test_without_capabilities_only_what_needs_none_is_offered() -> None:
    """Every kernel the server lists carries its capabilities (server and extension ship in one
    wheel); one without them is offered nothing a capability decides, and what the state alone
    decides as before."""
    cases = [(None, "running", "suspend"), (None, "running", "release"), (None, "queued", "release")]
    cases += [(None, "running", "resize"), (None, "running", "shutdown")]
    assert offered_by_the_extension(cases) == [False, False, True, True, True]


def test_the_panel_and_the_commands_ask_offered_and_nothing_asks_for_a_pod() -> None:
    """The two places that enable kernel actions take them from offered(); no branch on
    ``kernel.pod`` remains."""
    panel = (SOURCES / "panel" / "kernel.ts").read_text()
    commands = (SOURCES / "commands.ts").read_text()
    for action in ("resize", "release", "request", "suspend", "resume", "shutdown"):
        assert f"isEnabled: enabledFor('{action}')" in commands
    assert "isEnabled: hasKernel" not in commands
    for button, actions in {
        "_resize": ["resize"],
        "_release": ["release", "request"],
        "_suspend": ["suspend", "resume"],
        "_shutdown": ["shutdown"],
    }.items():
        assignment = re.search(rf"this\.{button}\.disabled = (.*?);", panel, re.DOTALL)
        assert assignment is not None, button
        assert sorted(re.findall(r"offered\(kernel, '(\w+)'\)", assignment.group(1))) == sorted(actions)
    for path in SOURCES.rglob("*.ts"):
        assert not re.search(r"\.pod\b", path.read_text()), path
