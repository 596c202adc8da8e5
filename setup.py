"""Only the compiled part of memfs; everything else is declared in pyproject.toml.

memfs._contract is the event contract's per-line work (memfs/events.py says why it is C);
memfs.store._append is SessionHandle.append (memfs/store/_append.c says why).
`pip install` builds them, which needs a C compiler and the Python headers, as pyfuse3 does.
"""
from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall"]
setup(ext_modules=[Extension("memfs._contract", ["memfs/_contract.c"], extra_compile_args=FLAGS),
                   Extension("memfs.store._append", ["memfs/store/_append.c"], extra_compile_args=FLAGS)])
