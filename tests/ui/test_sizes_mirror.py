"""The picker's size check (``labextension/src/sizes.ts``) agrees with the server's parser.

The compiled module runs in Node on the same inputs as :func:`jupyter_gpushare.core.sizes.parse_size`:
the documented examples, the edge cases, and a few thousand random strings. Both must accept
or refuse each one alike, agree on the bytes or the percentage, and give the same reason.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpushare.core.sizes import SizeError, parse_size

REPO = Path(__file__).resolve().parents[2]
COMPILED = REPO / "labextension" / "lib" / "sizes.js"

# fmt: off
EXAMPLES = [
    # accepted (docs/users/sizes.md)
    "4G", "4g", "4GB", "4gb", "4GiB", "4gib", "0.5G", ".5G", "1.25G", "512M", "512m", "512MB", "512MiB",
    "4096", "1", " 8G ", "\t8G\n", "25%", "0.01%", "100%", "12.5%", "whole", "WHOLE", " Whole ",
    "4096.0", "0.0009765625M", "1.0000000000000000001G", "80G", "81920", "0.3G", "0.0000001G",
    # refused
    "", " ", "abc", "-1G", "-abc", "0", "0G", "0.0G", "0%", "0.001%", "100.5%", "101%", "%", "G", "4T",
    "4 GB B", "10T", "4.G", "4..5G", "+4G", "1e3G", "4096.5", "0.0000001M", "4Gi", "4 g i b",
    "whole card", "٣G", "٤G", "４G", "4G%", "25%%", "'4G'", "4\x1cG", "8 G", "8\tG", "25 %", "  4 G ",
    "\xa04G\u3000", "4\u2003G", "²G",
]
# fmt: on


def random_inputs(count: int, seed: int = 20240601) -> list[str]:
    pieces = [*"0123456789", *". \t\n\xa0-+%e٤", ".", *"gGmMbBiIkKtT", "whole", "GiB", "MB", "0.", "4G"]
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))) for _ in range(count)]


def python_verdict(text: str) -> dict[str, Any]:
    try:
        size = parse_size(text)
    except SizeError as error:
        return {"ok": False, "problem": error.problem}
    if size.form == "bytes":
        return {"ok": True, "form": "bytes", "bytes": size.resolve(0)}
    if size.form == "percent":
        return {"ok": True, "form": "percent", "percent": float(size.amount)}
    return {"ok": True, "form": "whole"}


def node_verdicts(inputs: list[str]) -> list[dict[str, Any]]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("these tests need Node.js (`node` on PATH), as the extension's build does", pytrace=False)
    sys.path.insert(0, str(REPO / "labextension"))
    try:
        import build_hook
    finally:
        sys.path.pop(0)
    if not COMPILED.is_file() or not build_hook.up_to_date():
        pytest.fail(
            "labextension/lib/sizes.js is missing or older than its source: run `pip install -e .`",
            pytrace=False,
        )
    # lib/ is an ES module without "type": "module" around it: load it as .mjs.
    module = COMPILED.with_name(".sizes-test.mjs")
    module.write_text(COMPILED.read_text())
    script = (
        f"import {{ parseSize }} from {json.dumps(module.as_uri())};\n"
        "let input = '';\n"
        "process.stdin.on('data', chunk => (input += chunk));\n"
        "process.stdin.on('end', () => {\n"
        "  const out = JSON.parse(input).map(text => {\n"
        "    const r = parseSize(text);\n"
        "    if (!r.ok) return { ok: false, problem: r.problem };\n"
        "    if (r.form === 'bytes') return { ok: true, form: 'bytes', bytes: r.bytes };\n"
        "    if (r.form === 'percent') return { ok: true, form: 'percent', percent: r.percent };\n"
        "    return { ok: true, form: 'whole' };\n"
        "  });\n"
        "  process.stdout.write(JSON.stringify(out));\n"
        "});\n"
    )
    try:
        result = subprocess.run(
            [node, "--input-type=module", "-e", script],
            input=json.dumps(inputs),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        module.unlink()
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_the_typescript_parser_agrees_with_the_python_parser() -> None:
    inputs = EXAMPLES + random_inputs(3000)
    disagreements = []
    for text, mirrored in zip(inputs, node_verdicts(inputs), strict=True):
        expected = python_verdict(text)
        if "bytes" in expected and expected["bytes"] > 2**53:
            # Beyond JavaScript's exact integers; no device is that large.
            continue
        if mirrored != expected:
            disagreements.append((text, expected, mirrored))
    assert not disagreements, "\n".join(
        f"{t!r}: python {e} / typescript {m}" for t, e, m in disagreements[:20]
    )


def test_the_documented_examples_are_decided_as_the_readme_says() -> None:
    verdicts = dict(zip(EXAMPLES, node_verdicts(EXAMPLES), strict=True))
    for text in ("4G", "512MiB", "4096", "25%", "whole", "0.5G"):
        assert verdicts[text]["ok"], text
    for text in ("abc", "-1G", "0", "10T", "%", ""):
        assert not verdicts[text]["ok"], text
    assert verdicts["abc"]["problem"] == "cannot read GPU size 'abc'"
    assert verdicts["0.5G"]["bytes"] == 2**29
    # Exact, not floating point, and rounded up to whole MiB as the server stores it.
    assert verdicts["1.0000000000000000001G"]["bytes"] == 2**30 + 2**20
    for text in ("٣G", "４G", "  4 G ", "\xa04G\u3000"):  # ASCII digits only, no space inside
        assert not verdicts[text]["ok"] and not python_verdict(text)["ok"], text
    assert Decimal(str(verdicts["12.5%"]["percent"])) == Decimal("12.5")
