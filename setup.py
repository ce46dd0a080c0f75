"""The one thing pyproject.toml cannot say stably: the optional C extension of the binning
kernels (quantbench/stats/_binning.c). Optional: where no C compiler is found the install goes
on, and binning falls back to numba (then numpy), with identical bins."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "quantbench.stats._binning_c", ["quantbench/stats/_binning.c"], optional=True
        )
    ]
)
