"""The regtest harness as a pytest plugin for other teams' end-to-end suites.

Opt in with `pytest -p custody_regtest` or, in a suite's root conftest.py,
`pytest_plugins = ["custody_regtest"]`. When the package is installed, pytest also loads it through
its `pytest11` entry point; every fixture it defines is named `custody_*` and nothing runs until a
test asks for one, so a suite that does not use them (ours included) behaves exactly as before.
The fixtures are in `custody_regtest.plugin` (its docstring lists them).
"""
pytest_plugins = ["custody_regtest.plugin"]
