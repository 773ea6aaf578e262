"""Which matching engine this process runs: the compiled core when it is built and current, else
the pure-Python reference (`matching.engine.Engine`).

The compiled core (`matching._compiled`, built by `setup.py build_ext --inplace`, which
`scripts/bootstrap.sh` runs) is the same source compiled with Cython, plus static declarations
(`matching/_compiled/<module>.pxd`: the engine, book and order as extension types, the hot methods
C-callable with typed orders) that change no behaviour; both engines emit the same events and reach
the same state hash (`tests/unit/test_matching_compiled.py` replays seeded random streams through
both in lockstep). It is used only when every compiled module carries the sha256 of the source and
declarations it was built from (`source_sha256`) and the files on disk still have it: an engine
edited since the last build is never run compiled (bootstrap rebuilds it).

The compiled engine is an extension type: it (and its orders) take no attributes beyond their
declared fields, and a subclass of the pure `Engine` is not one of it.

`MATCHING_ENGINE` (environment) chooses:
- `auto` (default): compiled when importable and current, else pure;
- `pure`: always the reference engine;
- `compiled`: the compiled engine or an error (`CompiledEngineUnavailable`) saying why not.

The choice is made once per process and logged at INFO on the `matching` logger
("matching engine: compiled" / "matching engine: pure (<why>)").
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import os
from functools import lru_cache
from pathlib import Path

from matching.engine import Engine

log = logging.getLogger("matching")

MODULES = ("order", "engine", "book", "matcher", "stops", "holds", "validation")  # as in setup.py
_SOURCE_DIR = Path(__file__).resolve().parent
ENV = "MATCHING_ENGINE"
CHOICES = ("auto", "pure", "compiled")


class CompiledEngineUnavailable(RuntimeError):
    """`MATCHING_ENGINE=compiled` but the compiled core is not built, or built from other sources."""


def source_sha256(name: str) -> str:
    """sha256 of what module `name` is compiled from: `matching/<name>.py` followed by its static
    declarations `matching/_compiled/<name>.pxd` if it has any (as `setup.py` computes it)."""
    source = (_SOURCE_DIR / f"{name}.py").read_bytes()
    declarations = _SOURCE_DIR / "_compiled" / f"{name}.pxd"
    return hashlib.sha256(source + (declarations.read_bytes() if declarations.exists() else b""))\
        .hexdigest()


def compiled_engine() -> tuple[type[Engine] | None, str]:
    """(the compiled Engine class, "") when built from the current sources, else (None, why)."""
    for name in MODULES:
        try:
            module = importlib.import_module(f"matching._compiled.{name}")
        except ImportError as exc:
            return None, f"not built ({exc})"
        if not getattr(module, "__file__", "").endswith((".so", ".pyd")):
            return None, f"matching._compiled.{name} is not an extension module"
        if getattr(module, "SOURCE_SHA256", None) != source_sha256(name):
            return None, f"stale build: matching/{name}.py changed since it was compiled"
    return importlib.import_module("matching._compiled.engine").Engine, ""


def select(choice: str) -> tuple[type[Engine], str]:
    """(engine class, label) for a `MATCHING_ENGINE` value; raises on a bad value or on
    `compiled` when it is unavailable."""
    if choice not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "pure":
        return Engine, f"pure ({ENV}=pure)"
    cls, why = compiled_engine()
    if cls is not None:
        return cls, "compiled"
    if choice == "compiled":
        raise CompiledEngineUnavailable(f"{ENV}=compiled but the compiled engine is {why}")
    return Engine, f"pure (compiled engine {why})"


@lru_cache(maxsize=1)
def engine_class() -> type[Engine]:
    """The engine class this process uses (chosen once, from `MATCHING_ENGINE`, and logged)."""
    cls, label = select(os.environ.get(ENV, "auto").strip().lower() or "auto")
    log.info("matching engine: %s", label)
    return cls
