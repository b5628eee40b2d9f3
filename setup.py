"""Only the optional compiled parts: the tap's fused one-pass digest (weightcheck/_native/onepass.c) and the
per-name loops of header-only lint (weightcheck/_native/lintfast.c).

Everything else (metadata, packages, data) is in pyproject.toml. `optional=True`: where no C compiler is
found, the build warns and installs the pure-Python package, whose numpy and Python loops compute the same
results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "weightcheck._onepass",
            sources=["weightcheck/_native/onepass.c"],
            depends=["weightcheck/_native/xxhash.h"],
            include_dirs=["weightcheck/_native"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "weightcheck._lintfast",
            sources=["weightcheck/_native/lintfast.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
