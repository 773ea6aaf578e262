"""Build of the compiled matching core (the rest of the project is configured in pyproject.toml).

The matching engine's hot modules (`COMPILED`) are compiled with Cython, from the very same source
files that are the pure-Python reference, into the package `matching._compiled`: each source is
copied to `build/compiled-src/` as `matching/_compiled/<name>.py`, with the sha256 of the original
and of its static declarations (`matching/_compiled/<name>.pxd`, copied beside it: extension types
and typed hot methods, no change of behaviour) appended as `SOURCE_SHA256`, and compiled there. The modules of that set import each other
relatively (`from .book import Book`), so the compiled engine uses the compiled book and matcher,
and everything else (model, events, errors, states, fees, stp) is shared with the pure engine:
the two engines take the same commands and emit the same event objects. `matching.compiled`
picks the compiled engine only when every `SOURCE_SHA256` matches the source on disk, so a stale
build is never used.

    .venv/bin/python setup.py build_ext --inplace     # what scripts/bootstrap.sh runs
    pip install -e .  /  pip install .                 # also build it (optional: see below)

The extensions are `optional`: a machine without a C compiler still installs the project, and the
service then runs the pure engine (it logs which one it uses). `scripts/bootstrap.sh` builds them
itself and fails if the compiled engine is not importable afterwards.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
COMPILED = ("order", "engine", "book", "matcher", "stops", "holds", "validation")
SOURCE_DIR = ROOT / "matching"
GENERATED = ROOT / "build" / "compiled-src" / "matching" / "_compiled"


def _generate() -> list[Extension]:
    """Copy each hot module beside a marker of its source's hash; one Extension per module."""
    GENERATED.mkdir(parents=True, exist_ok=True)
    for package in (GENERATED.parent, GENERATED):  # packages, so `cimport matching._compiled.x` works
        (package / "__init__.py").touch()
    extensions = []
    for name in COMPILED:
        source = (SOURCE_DIR / f"{name}.py").read_bytes()
        declarations = SOURCE_DIR / "_compiled" / f"{name}.pxd"
        typed = declarations.read_bytes() if declarations.exists() else b""
        digest = hashlib.sha256(source + typed).hexdigest()  # as matching.compiled checks it
        target = GENERATED / f"{name}.py"
        text = source + f"\n\nSOURCE_SHA256 = {digest!r}  # added by setup.py\n".encode()
        if not target.exists() or target.read_bytes() != text:  # keep mtimes: no needless rebuild
            target.write_bytes(text)
        if typed:  # static types for the compiled build (augmenting .pxd)
            pxd = GENERATED / f"{name}.pxd"
            if not pxd.exists() or pxd.read_bytes() != typed:
                pxd.write_bytes(typed)
        extensions.append(Extension(f"matching._compiled.{name}",
                                    [str(target.relative_to(ROOT))], optional=True))
    return extensions


def _ext_modules() -> list:
    extensions = _generate()
    try:
        from Cython.Build import cythonize
    except ImportError:  # no Cython (an install without the build requirements): pure engine only
        return []
    # annotation_typing off: annotations stay documentation, as in the pure modules (`seq: int`
    # must not become a C int nor a runtime type check); nonecheck on: a typed order that is None
    # raises AttributeError as in Python instead of crashing the process.
    return cythonize(extensions, language_level=3, quiet=True,
                     include_path=[str(GENERATED.parents[1])],
                     compiler_directives={"binding": False, "annotation_typing": False,
                                          "nonecheck": True})


class BuildExt(build_ext):
    """`--inplace` replaces each extension file (a new file under the old name) instead of writing
    over it: a running process that mapped the old one keeps it intact (overwriting a mapped
    shared object can crash that process, e.g. a service while bootstrap rebuilds)."""

    def copy_extensions_to_source(self) -> None:
        for ext in self.extensions:
            name = self.get_ext_filename(ext.name)
            built, installed = Path(self.build_lib) / name, ROOT / name
            if built.exists() and installed.exists():
                installed.unlink()
        super().copy_extensions_to_source()


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": BuildExt})
