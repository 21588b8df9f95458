"""Build the Cython kernels in ext/ into mpreplay._ext.*; metadata lives in setup.cfg."""
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

_KERNELS = ["sumtree", "lock", "discount"]

extensions = [
    Extension(
        f"mpreplay._ext.{name}",
        [f"ext/{name}.pyx"],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
    for name in _KERNELS
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
