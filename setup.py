"""Only the compiled part of memfs; everything else is declared in pyproject.toml.

memfs._contract is the event contract's per-line work (memfs/events.py says why it is C);
memfs.store._writer is the compiled twin of the one commit (memfs/store/writer.py says how the
twin is chosen; MEMFS_IMPL=py runs the Python one); memfs.fs._syncer runs a mount's fdatasyncs
on threads that never take the interpreter lock (twin: memfs.fs.syncer.PySyncer);
memfs.fs._intake reads a mount's FUSE requests on threads of its own (memfs/fs/intake.py; it
needs libfuse3's headers, which pyfuse3's build needs too).
`pip install` builds it, which needs a C compiler and the Python headers, as pyfuse3 does.
"""
from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall"]
setup(ext_modules=[
    Extension("memfs._contract", ["memfs/_contract.c"], extra_compile_args=FLAGS),
    Extension("memfs.store._writer", ["memfs/store/_writer.c"], extra_compile_args=FLAGS),
    Extension("memfs.fs._syncer", ["memfs/fs/_syncer.c"], extra_compile_args=FLAGS),
    Extension("memfs.fs._intake", ["memfs/fs/_intake.c"], extra_compile_args=FLAGS),
])
