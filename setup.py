"""Build the Cython kernels in ext/ into mpreplay._ext.*; metadata lives in setup.cfg.

Every build also leaves the compiled kernels in the checkout's mpreplay/_ext/
(see README, "Development"): a user who installs from a clone and runs from
its root -- where Python puts the checkout's mpreplay/ first on sys.path, in
launched child processes and Ray workers too -- imports working kernels.
"""
import ast
import warnings

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _kernels() -> list[str]:
    """The one list of kernels, kept by the package: mpreplay/_ext/__init__.py checks them at import."""
    with open("mpreplay/_ext/__init__.py") as f:
        module = ast.parse(f.read())
    return next(list(ast.literal_eval(node.value)) for node in module.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "KERNELS")


class BuildKernels(build_ext):
    """build_ext that also copies the kernels beside their package in the source tree."""

    def run(self):
        super().run()
        if not self.inplace:
            try:
                self.copy_extensions_to_source()
            except OSError as exc:  # a read-only source tree: the installed copy still works
                warnings.warn(f"could not copy the compiled kernels into the source tree: {exc}", stacklevel=1)


extensions = [
    Extension(
        f"mpreplay._ext.{name}",
        [f"ext/{name}.pyx"],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
    for name in _kernels()
]

setup(
    cmdclass={"build_ext": BuildKernels},
    ext_modules=cythonize(
        extensions,
        language_level=3,
        include_path=["."],  # .pxd headers live in mpreplay/_ext beside the modules they describe
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
)
