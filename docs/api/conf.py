"""Sphinx configuration of tsm's API reference.

Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html docs/api /tmp/tsm-api

The pages document the installed packages ``tsm_core``, ``tsm_apps`` and
``tsm_datasets`` from their numpydoc docstrings (install the project first:
``pip install -e ".[docs]"``); no GPU is needed to build them.
"""

from __future__ import annotations

import os
import tempfile

from docutils import nodes
from docutils.parsers.rst import Directive

# Importing the packages must not read or write the user's cache.
os.environ.setdefault("TSM_CACHE_DIR", tempfile.mkdtemp(prefix="tsm-sphinx-"))

import tsm_core  # noqa: E402

# tsm_core loads most public names on first use; autodoc lists a module's members from
# its namespace, so bind every name of __all__ there first.
for _name in tsm_core.__all__:
    vars(tsm_core).setdefault(_name, getattr(tsm_core, _name))

project = "tsm"
author = "The tsm developers"
copyright = "the tsm developers; Apache-2.0"
release = version = tsm_core.__version__

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
]

# autodoc: a module's members are those of its __all__, in that order.
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_inherit_docstrings = False  # TSMKMeans would otherwise show scikit-learn's texts

# numpydoc: no member tables of classes (autodoc lists the documented methods), and no
# cross-reference checks on the free text of parameter types.
numpydoc_show_class_members = False
numpydoc_show_inherited_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set = set()

html_theme = "alabaster"
html_title = f"tsm {release} API reference"
html_static_path: list = []
exclude_patterns = ["_build"]
nitpicky = False


class SwitchTable(Directive):
    """``.. tsm-switches::``: the table of TSM_* switches, from ``tsm_core.runtime.config``."""

    has_content = False

    def run(self):
        from tsm_core.runtime.config import SWITCHES

        table = nodes.table()
        group = nodes.tgroup(cols=5)
        table += group
        for width in (22, 6, 10, 9, 53):
            group += nodes.colspec(colwidth=width)

        def row(cells, header=False):
            r = nodes.row()
            for c in cells:
                entry = nodes.entry()
                entry += nodes.literal(text=c) if (header is False and c is cells[0]) else nodes.paragraph(text=c)
                r += entry
            return r

        head = nodes.thead()
        head += row(["switch", "kind", "default", "read by", "what it does"], header=True)
        group += head
        body = nodes.tbody()
        for s in SWITCHES.values():
            if s.default is None:
                default = "(decided by the library)"
            elif s.kind == "flag":
                default = "on" if s.default else "off"
            else:
                default = str(s.default)
            body += row([s.name, s.kind, default, s.family, s.help])
        group += body
        return [table]


def _skip_foreign(app, what, name, obj, skip, options):
    # Methods a base class adds to ours (scikit-learn's set_fit_request and friends on
    # TSMKMeans) are documented by their own project.
    module = getattr(obj, "__module__", None) or ""
    if what == "class" and module and not module.startswith(("tsm_core", "tsm_apps", "tsm_datasets")):
        return True
    return None


def setup(app):
    app.add_directive("tsm-switches", SwitchTable)
    app.connect("autodoc-skip-member", _skip_foreign)
