"""Build the Cython kernels in ext/ into mpreplay._ext.*; metadata lives in setup.cfg."""
import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

_KERNELS = ["schema", "sumtree", "frames", "ring", "lock", "discount"]

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
        include_path=["."],  # .pxd headers live in mpreplay/_ext beside the modules they describe
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    )
)
