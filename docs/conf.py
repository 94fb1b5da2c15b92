"""Sphinx configuration of composer's docs: `sphinx-build -W --keep-going -b html docs build/docs`
(scripts/test runs it, so a warning fails CI). Pages are Markdown (MyST); the API pages are
autodoc of the docstrings."""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

# autodoc imports this checkout's composer, not another install of it in the environment.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

project = "composer"
author = "composer's authors"
copyright = "composer's authors"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
# No sphinx.ext.intersphinx: it fetches objects.inv from pytorch.org and executorch's site
# while building, and neither this machine nor CI reaches anything beyond the package
# registries. torch and ExecuTorch are linked by plain URLs in the pages instead.

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Links to headings (`page.md#a-heading`), as GitHub makes them, work on the site too.
myst_heading_anchors = 3

# Autodoc directives go in ```{eval-rst} blocks: in a MyST directive the docstrings, which are
# reST, would be read as Markdown, with no warning.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"undoc-members": False}

html_theme = "furo"
html_title = "composer"
html_static_path: list[str] = []


# bench/RESULTS.md links the files beside it (`results/HISTORY.md`, `et_runtime/README.md`),
# which are in the repository but not on this site: on the results page such a link is the
# file's path from the repository root, as text. Links to web pages and anchors stay links.
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _repository_paths(app, path, docname, content):
    if Path(path).name != "RESULTS.md":
        return
    folder = posixpath.dirname(Path(path).as_posix()).removeprefix("../")

    def text(match: re.Match) -> str:
        label, target = match.groups()
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        where = posixpath.normpath(posixpath.join(folder, target)) + (
            "/" if target.endswith("/") else ""
        )
        return f"`{where}`" if label.strip("`") == target else f"{label} (`{where}`)"

    content[0] = _LINK.sub(text, content[0])


# attrs writes a default made by a factory (`attrs.field(factory=dict)`) into __init__'s
# signature as its sentinel, which autodoc shows as "= NOTHING": the factory's value instead
# (`= {}`), or `= factory()` where it is no empty builtin.
_EMPTY = (dict, list, tuple, set, frozenset)


def _top_level_parameters(parameters: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(parameters):
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(parameters[start:index])
            start = index + 1
    return [*parts, parameters[start:]]


def _attrs_factory_defaults(app, what, name, obj, options, signature, return_annotation):
    import attrs

    if not signature or "NOTHING" not in signature or not attrs.has(obj):
        return None
    factories = {
        field.alias or field.name: field.default.factory
        for field in attrs.fields(obj)
        if isinstance(field.default, attrs.Factory)
    }

    def readable(parameter: str) -> str:
        head, sep, default = parameter.rpartition("=")
        parameter_name = head.split(":")[0].strip().lstrip("*")
        if not sep or default.strip() != "NOTHING" or parameter_name not in factories:
            return parameter
        factory = factories[parameter_name]
        shown = repr(factory()) if factory in _EMPTY else f"{factory.__name__}()"
        return f"{head}= {shown}"

    parameters = ",".join(readable(p) for p in _top_level_parameters(signature[1:-1]))
    return f"({parameters})", return_annotation


def setup(app):
    app.connect("include-read", _repository_paths)
    app.connect("autodoc-process-signature", _attrs_factory_defaults)
