"""backend_example: examples/backend_suite (a downstream team's suite: the custody_regtest plugin and
the API only) runs with one pytest command in a fresh process and passes; it imports nothing from
our tests/ and its test body stays under 40 lines."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "backend_suite"


def test_example_imports_nothing_from_our_tests():
    for source in EXAMPLE.glob("*.py"):
        tree = ast.parse(source.read_text())
        modules = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in modules if m == "tests" or m.startswith("tests.")}, (source, modules)
        test = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))
        assert test.end_lineno - test.lineno + 1 < 40, f"{source.name}: {test.name} is {test.end_lineno - test.lineno + 1} lines"


def test_example_suite_passes():
    from regtest.install import find_tools

    find_tools()  # the nodes are installed (else InstallError says how)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = subprocess.run([sys.executable, "-m", "pytest", "examples/backend_suite", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout, run.stdout[-2000:]
