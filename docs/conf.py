"""Sphinx configuration of mpreplay's documentation site.

Build (from the repository's root, with the ``docs`` extra installed)::

    python -m sphinx -W --keep-going -n -b html docs build/docs

Warnings are errors and every cross-reference must resolve (``-n``): a
Markdown link to a page, heading or image that does not exist fails the build.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types

from sphinx.pycode import ModuleAnalyzer

import mpreplay

project = "mpreplay"
author = "the mpreplay authors"
copyright = "the mpreplay authors"
release = mpreplay.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "api/generated/*.rst~"]

# Markdown: GitHub's heading anchors (level 1-4), so a link such as
# ``files.md#file-format`` works on the repository host and here alike; a link to a
# page, an anchor or an image that does not exist is a warning, hence an error.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# The API pages: one stub per name of a module's __all__ (api/generated/, written
# at build time), so a new public name needs no line in these sources.
autosummary_generate = True
autosummary_ignore_module_all = False
autosummary_imported_members = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = (
    "fully-qualified"  # a short name can be ambiguous: the compat layer mirrors the native classes
)
autodoc_default_options = {"members": True}
# The aliases of the buffers' signatures render as their names, linked to their entries, not
# expanded (``collections.abc.Mapping[str, object]``, numpy's long ``ArrayLike`` union).
autodoc_type_aliases = {
    "EnvDict": "mpreplay.EnvDict",
    "Batch": "mpreplay.Batch",
    "Array": "mpreplay.Array",
    "TensorBatch": "mpreplay.TensorBatch",
}

# The docstrings' "Parameters" / "Attributes" sections are numpydoc's; their types are
# prose ("int, optional", "function"), shown as written rather than linked.
napoleon_google_docstring = False
napoleon_use_param = False
napoleon_use_rtype = False
napoleon_use_ivar = False
napoleon_preprocess_types = False

nitpicky = True
# Signatures show the short names they were written with (``SelectorSpec``); where a class is
# documented twice, as ``mpreplay.X`` and in its own module, the link goes to the first, and that
# is no error ("more than one target found", the only warning of this type).  Missing targets
# (ref.class, ref.obj, ...) still are.
suppress_warnings = ["ref.python"]
# Names of other projects (numpy, the standard library, torch, gymnasium, Ray) are not linked:
# the build reads no inventory over the network.  Every reference to a name of mpreplay must
# resolve to a documented object.
_OTHER_PROJECTS = "numpy|np|collections|typing|os|logging|zipfile|pathlib|multiprocessing|threading|torch|gymnasium|ray"
nitpick_ignore_regex = [(r"py:.*", rf"({_OTHER_PROJECTS})\..*")]
# Internal types that appear in public signatures (the state an NstepBuffer preview returns, a
# parsed env_dict): not public names, so not documented.
nitpick_ignore = [
    ("py:class", "mpreplay.nstep.Folding"),
    ("py:class", "mpreplay.spec.FieldSpec"),
    ("py:class", "mpreplay.compression.Compression"),
    ("py:class", "mpreplay.compat.cpprb.fields.Fields"),
    # a file argument (a path or a binary file object) and a field's spec, by their alias names
    ("py:class", "File"),
    ("py:class", "FieldSpec"),
    # modules the reference names but does not render (the archives, cpprb's pickles)
    ("py:mod", "mpreplay.npz_archive"),
    ("py:mod", "mpreplay.compat.cpprb_pickles"),
]
# Type aliases of typed signatures, shown by name: numpy's ArrayLike, the returns functions'
# dones (an array, a tensor or None), the type of a ParameterStore.read out= mapping.
nitpick_ignore += [
    ("py:class", "ArrayLike"),
    ("py:class", "DTypeLike"),
    ("py:class", "_Dones"),
    ("py:class", "mpreplay.params._Out"),
]
# The type of a Table's own handles (an episode writer, a context manager's value): the class itself.
nitpick_ignore += [("py:class", "mpreplay.table._Table")]
# What a Prefetcher yields: a Batch or a TensorBatch, a type variable of the generic class.
nitpick_ignore += [("py:class", "mpreplay.prefetch._B")]

html_theme = "furo"
html_title = f"mpreplay {release}"


def _dataclass_factories(app, what, name, obj, options, signature, return_annotation):
    """A dataclass field's default factory as ``name()``: its default shows as ``<factory>``,
    which is not Python, and Sphinx then misreads the whole signature."""
    if signature and "<factory>" in signature and dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.default_factory is not dataclasses.MISSING:
                factory = getattr(f.default_factory, "__name__", "factory")
                signature = re.sub(rf"(\b{f.name}: [^=]*?)( ?= ?)<factory>", rf"\1\2{factory}()", signature)
    return signature, return_annotation


def _no_builtin_docstrings(app, what, name, obj, options, lines):
    """A constant (``__version__``, ``NEXT_STEP``) shows its value, not the docstring of ``str``."""
    builtin_doc = type(obj).__doc__ if type(obj).__module__ == "builtins" else None
    if what in ("data", "attribute") and builtin_doc and "\n".join(lines).strip() == inspect.cleandoc(builtin_doc):
        lines.clear()


# The type aliases' documentation: their ``#:`` comments in mpreplay/spec.py.
_ALIAS_DOCS = {
    name: list(lines) for (_, name), lines in ModuleAnalyzer.for_module("mpreplay.spec").find_attr_docs().items()
}


def _type_alias_docstrings(app, what, name, obj, options, lines):
    """A type alias (``mpreplay.Batch``) shows its own comment, not the docstring of the class it
    names (``dict``'s); autodoc adds "alias of ..." after it."""
    alias = name.rpartition(".")[2]
    # A generic (Batch), a union (EnvDict) or, for a type of an optional library, a string (TensorBatch).
    if isinstance(obj, (types.GenericAlias, types.UnionType, str)) and alias in _ALIAS_DOCS:
        lines[:] = _ALIAS_DOCS[alias]


def _aliases_as_arguments(app, what, name, obj, options, signature, return_annotation):
    """An alias given as a type argument (``Prefetcher[Batch]``) by its name: Sphinx writes it
    as ``TypeAliasForwardRef('mpreplay.Batch')`` there, which is not a name it can link."""

    def named(text):
        return text and re.sub(r"TypeAliasForwardRef\('([\w.]+)'\)", r"\1", text)

    return named(signature), named(return_annotation)


def _signature(app, what, name, obj, options, signature, return_annotation):
    """Both rewrites of a signature (Sphinx takes the first handler's result only)."""
    signature, return_annotation = _dataclass_factories(app, what, name, obj, options, signature, return_annotation)
    return _aliases_as_arguments(app, what, name, obj, options, signature, return_annotation)


def setup(app):
    app.connect("autodoc-process-signature", _signature)
    app.connect("autodoc-process-docstring", _no_builtin_docstrings)
    app.connect("autodoc-process-docstring", _type_alias_docstrings)
