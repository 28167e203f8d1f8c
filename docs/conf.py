"""Sphinx configuration of the jupyter-gpushare documentation (``make docs``).

The reference pages are generated from the code: traits by autodoc-traits (every configurable
class of the package, found by ``_ext/gpushare_reference.py``), the REST API from
``jupyter_gpushare/openapi.yaml``, the CLI from its argparse parser, the ``%gpu`` magics and the
Prometheus metrics by the small directives in ``_ext``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))

import jupyter_gpushare  # noqa: E402

project = "jupyter-gpushare"
author = "jupyter-gpushare contributors"
copyright = "jupyter-gpushare contributors"
version = release = jupyter_gpushare.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "autodoc_traits",
    "sphinxarg.ext",
    "sphinxcontrib.openapi",
    "gpushare_reference",
]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Nitpicky (-n): every cross-reference must resolve. Type hints in signatures would name
# internal types the reference does not document, so signatures carry none.
autodoc_typehints = "none"
autodoc_member_order = "bysource"

html_theme = "pydata_sphinx_theme"
html_title = "jupyter-gpushare"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_static_path: list[str] = []

# sphinxcontrib-openapi's newer renderer: request and response fields with their descriptions.
openapi_default_renderer = "httpdomain"
