"""Only the native extension lives here; everything else is in pyproject.toml.

``hwbackends.serve._shmloop`` is the shared-memory endpoint's request loop (a plain C
extension: it builds with the compiler ``pip install -e .`` already uses, no binding
generator or extra build dependency; see docs/serving.md)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "hwbackends.serve._shmloop",
    sources=["hwbackends/serve/_shmloop.c"],
    depends=["hwbackends/serve/include/hwb_shm.h", "hwbackends/serve/include/hwb_native.h"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-missing-field-initializers"],
)])
