"""The deployed topology: three OS processes wired only by configuration.

| process | command | holds |
| --- | --- | --- |
| custody-signer | `python -m signer serve --config SIGNER_CONFIG` | the seed; the only process that signs |
| custody-worker | `python -m custody worker --config CUSTODY_CONFIG` | the scheduled jobs; a signer client |
| custody-api | `python -m custody api --config CUSTODY_CONFIG` | the HTTP API and console |

`PROCESS_COMMANDS` is the one list of those commands: the demo launcher and the e2e suite start
exactly these, and the test suite checks that docker-compose.yml runs the same ones.
"""
from __future__ import annotations

PROCESS_COMMANDS: dict[str, list[str]] = {
    "custody-signer": ["python", "-m", "signer", "serve", "--config", "{signer_config}"],
    "custody-worker": ["python", "-m", "custody", "worker", "--config", "{custody_config}"],
    "custody-api": ["python", "-m", "custody", "api", "--config", "{custody_config}"],
}


def command(name: str, *, python: str, signer_config: str = "", custody_config: str = "") -> list[str]:
    """The argv of process `name` with its config paths filled in and `python` as the interpreter."""
    argv = [a.format(signer_config=signer_config, custody_config=custody_config) for a in PROCESS_COMMANDS[name]]
    return [python, *argv[1:]]
