"""Review of issue 12 (R2): docker-compose.yml's custody-api cannot start.

deploy/compose/custody.toml, which custody-api mounts, names `signer.auth_key_file =
/run/secrets/signer_auth_key` and the signer's socket in the `signer-socket` volume. custody-worker
gets both; custody-api gets neither. `DeploymentConfig.load` checks the auth key file
(`signer.auth_key_file: ... cannot read it`) and `build_services` builds a signer client for the
API too (custody.roots.api: reserves, rebalances/run), so `custody api` exits 2 at every start and
compose restarts it forever; the Compose schema check passes all the same.

(Fixed by giving each process its own signer client key: the file names the api's, and
CUSTODY_WORKER_SIGNER_AUTH_KEY_FILE the worker's; this test reads that override.)

Fix: either give custody-api the `signer_auth_key` secret and the `signer-socket` volume (what the
code needs today), or (better for least privilege) let the API run without a signer client
(those routes answer 503 or queue work for the worker) and give it a config without [signer].
"""
from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def _mounted_config(service: dict) -> dict:
    for v in service.get("volumes", []):
        if isinstance(v, str) and v.split(":")[1] == "/etc/custody/custody.toml":
            return tomllib.loads((ROOT / v.split(":")[0]).read_text())
    raise AssertionError("no custody.toml mounted")


def _files_missing(service: dict) -> list[str]:
    """Paths the service's custody.toml names that nothing in the service provides."""
    config = _mounted_config(service)
    secrets = {f"/run/secrets/{s if isinstance(s, str) else s.get('target', s['source'])}" for s in service.get("secrets", [])}
    mounts = {PurePosixPath(v.split(":")[1]) for v in service.get("volumes", []) if isinstance(v, str)}
    missing: list[str] = []
    if "signer" not in config:  # an API built without a signer client
        return missing
    process = "WORKER" if "worker" in " ".join(service.get("command", [])) else "API"
    key = (service.get("environment") or {}).get(f"CUSTODY_{process}_SIGNER_AUTH_KEY_FILE",  # the per-process override
                                                 config["signer"]["auth_key_file"])
    if key not in secrets:
        missing.append(f"signer.auth_key_file {key}")
    kind, _, where = config["signer"]["endpoint"].partition(":")
    if kind == "unix" and PurePosixPath(where).parent not in mounts:
        missing.append(f"signer.endpoint {where}")
    return missing


def test_each_custody_service_gets_the_files_its_config_names():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    problems = {name: _files_missing(services[name]) for name in ("custody-worker", "custody-api")}
    assert problems == {"custody-worker": [], "custody-api": []}, problems
