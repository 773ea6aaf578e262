"""compose_file: docker-compose.yml and the Dockerfile agree with the topology the e2e suite runs.

Docker cannot run on the development machines, so the file is checked statically:

| check | problem it reports |
| --- | --- |
| the Compose Specification's JSON schema (as vendored by the check-jsonschema package, never copied here) | `schema: <path>: <message>` |
| each custody-* service runs custody/topology.py `command(...)` with the config paths it mounts, from the service image | `command: ...` / `image: ...` / `config: ...` |
| the seed secret is attached to custody-signer only, and no service bind-mounts deploy/secrets | `seed: ...` |
| every service has a health check, except one-shot jobs that others wait for to complete | `healthcheck: ...` |
| every depends_on waits for a condition, and service_healthy only on a service that has a check | `depends_on: ...` |
| the Dockerfile's last stage has no ENTRYPOINT and its CMD is the API's command | `dockerfile: ...` |
| anvil's image is the version regtest/install.py installs for the e2e suite | `anvil: ...` |

`compose_problems` and `dockerfile_problems` return every problem; the real files must have none,
and each mutated copy below must show the problem it plants (so a check that stopped checking fails).
"""
from __future__ import annotations

import copy
import functools
import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema
from jsonschema import Draft202012Validator

from custody.topology import PROCESS_COMMANDS, command
from regtest.install import NPM_PACKAGES
from regtest.util import assert_equal

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
CONFIG_FILES = {"custody-signer": "signer.toml", "custody-worker": "custody.toml", "custody-api": "custody.toml"}
SEED_FILE = "signer-seed.txt"


@functools.cache
def compose_schema_validator() -> Draft202012Validator:
    schema = get_builtin_schema("vendor.compose-spec")
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _binds(service: dict) -> dict[str, str]:
    """target -> source of the service's bind mounts (short `src:dst[:mode]` or long syntax)."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            if parts[0].startswith((".", "/")) and len(parts) >= 2:
                out[parts[1]] = parts[0]
        elif v.get("type") == "bind":
            out[v["target"]] = v["source"]
    return out


def _secret_names(service: dict) -> set[str]:
    return {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}


def _depends(service: dict) -> dict:
    dep = service.get("depends_on", {})
    return {name: None for name in dep} if isinstance(dep, list) else dep


def _is_service_image(service: dict) -> bool:
    build = service.get("build")
    context = build if isinstance(build, str) else (build or {}).get("context")
    dockerfile = "Dockerfile" if isinstance(build, str) else (build or {}).get("dockerfile", "Dockerfile")
    return context in (".", "./") and dockerfile == "Dockerfile"


def compose_problems(doc: dict, *, root: Path = ROOT) -> list[str]:
    problems = [f"schema: {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in compose_schema_validator().iter_errors(doc)]
    services: dict[str, dict] = doc.get("services") or {}

    for name, config_name in CONFIG_FILES.items():
        svc = services.get(name)
        if svc is None:
            problems.append(f"command: no service {name}")
            continue
        if not _is_service_image(svc):
            problems.append(f"image: {name} is not built from the repository's Dockerfile")
        mounted = {target: source for target, source in _binds(svc).items() if Path(source).name == config_name}
        if len(mounted) != 1:
            problems.append(f"config: {name} must mount exactly one {config_name}, mounts {sorted(mounted)}")
            continue
        (target, source), = mounted.items()
        if not (root / source).is_file():
            problems.append(f"config: {name} mounts {source}, which is not in the repository")
        paths = {"signer_config": target} if config_name == "signer.toml" else {"custody_config": target}
        want = command(name, python="python", **paths)
        got = svc.get("command")
        got = shlex.split(got) if isinstance(got, str) else got
        if got != want:
            problems.append(f"command: {name} runs {got}, custody.topology says {want}")

    seed_secrets = {key for key, s in (doc.get("secrets") or {}).items() if Path(s.get("file", "")).name == SEED_FILE}
    if not seed_secrets:
        problems.append(f"seed: no top-level secret is the file {SEED_FILE}")
    holders = sorted(name for name, svc in services.items() if _secret_names(svc) & seed_secrets)
    if holders != ["custody-signer"]:
        problems.append(f"seed: the seed secret is attached to {holders}, must be ['custody-signer'] only")
    for name, svc in services.items():
        for source in _binds(svc).values():
            if "secrets" in Path(source).parts:
                problems.append(f"seed: {name} bind-mounts {source} (secrets go through `secrets:` only)")

    waited_to_complete = {dep for svc in services.values() for dep, cond in _depends(svc).items()
                          if (cond or {}).get("condition") == "service_completed_successfully"}
    for name, svc in services.items():
        check = svc.get("healthcheck") or {}
        one_shot = svc.get("restart") == "no" and name in waited_to_complete
        if not one_shot and (not check.get("test") or check.get("disable") or check["test"] in (["NONE"], "NONE")):
            problems.append(f"healthcheck: {name} has none")
        for dep, cond in _depends(svc).items():
            condition = (cond or {}).get("condition")
            if condition not in ("service_healthy", "service_completed_successfully"):
                problems.append(f"depends_on: {name} -> {dep} waits for {condition!r}, not health or completion")
            if condition == "service_healthy" and not (services.get(dep, {}).get("healthcheck") or {}).get("test"):
                problems.append(f"depends_on: {name} waits for {dep} to be healthy, which has no health check")

    anvil_version = next(p.rsplit("@", 1)[1] for p in NPM_PACKAGES if p.startswith("@foundry-rs/anvil@"))
    anvil_image = (services.get("anvil") or {}).get("image", "")
    if not anvil_image.startswith("ghcr.io/foundry-rs/foundry:") or anvil_image.rsplit(":", 1)[1] != f"v{anvil_version}":
        problems.append(f"anvil: image {anvil_image!r} is not foundry v{anvil_version} (regtest/install.py)")
    return problems


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_problems(text: str, doc: dict) -> list[str]:
    instructions = dockerfile_instructions(text)
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    stage = instructions[last_from:]
    problems = [f"dockerfile: the service stage has ENTRYPOINT {args} (compose commands must be the whole argv)"
                for word, args in stage if word == "ENTRYPOINT"]
    cmds = [args for word, args in stage if word == "CMD"]
    api_config = next((t for t, s in _binds(doc["services"]["custody-api"]).items() if Path(s).name == "custody.toml"), "")
    want = command("custody-api", python="python", custody_config=api_config)
    try:
        got = json.loads(cmds[-1]) if cmds else None
    except json.JSONDecodeError:
        got = f"(shell form) {cmds[-1]}"
    if got != want:
        problems.append(f"dockerfile: CMD is {got}, the API's command is {want}")
    return problems


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_is_valid_and_runs_the_topology(compose: dict) -> None:
    assert_equal(compose_problems(compose), [])
    assert set(PROCESS_COMMANDS) <= set(compose["services"])


def test_dockerfile_cmd_is_the_apis_command(compose: dict) -> None:
    assert_equal(dockerfile_problems(DOCKERFILE.read_text(), compose), [])


def test_the_seed_is_kept_out_of_git_and_of_the_build_context() -> None:
    assert "deploy/secrets/" in (ROOT / ".gitignore").read_text().splitlines()
    assert "deploy/secrets/" in (ROOT / ".dockerignore").read_text().splitlines()


def _set(path: str, value) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
    return mutate


_DELETE = object()
MUTATIONS = {
    "misspelt service key": (_set("services.custody-api.healthchek", {"test": ["CMD", "true"]}), "schema: services/custody-api"),
    "unknown depends_on condition": (_set("services.custody-worker.depends_on.nats.condition", "service_ready"),
                                     "schema: services/custody-worker"),
    "ports as a number": (_set("services.custody-api.ports", 8000), "schema: services/custody-api/ports"),
    "worker on another config path": (_set("services.custody-worker.command",
                                           ["python", "-m", "custody", "worker", "--config", "/etc/custody/other.toml"]),
                                      "command: custody-worker"),
    "api started as the old serve": (_set("services.custody-api.command", "python -m custody serve"), "command: custody-api"),
    "signer config not mounted": (_set("services.custody-signer.volumes", ["signer-socket:/run/custody-signer"]),
                                  "config: custody-signer"),
    "seed given to the api too": (_set("services.custody-api.secrets", ["signer_seed"]), "seed: the seed secret is attached to"),
    "seed bind-mounted into the worker": (_set("services.custody-worker.volumes",
                                               ["./deploy/secrets/signer-seed.txt:/seed:ro",
                                                "./deploy/compose/custody.toml:/etc/custody/custody.toml:ro"]),
                                          "seed: custody-worker bind-mounts"),
    "nats without health check": (_set("services.nats.healthcheck", _DELETE), "healthcheck: nats"),
    "health check disabled": (_set("services.bitcoind.healthcheck", {"disable": True}), "healthcheck: bitcoind"),
    "depends_on without a condition": (_set("services.custody-api.depends_on", ["custody-worker"]), "depends_on: custody-api"),
    "anvil of another version": (_set("services.anvil.image", "ghcr.io/foundry-rs/foundry:latest"), "anvil: image"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_broken_compose_file_is_refused(compose: dict, mutation: str) -> None:
    mutate, expected = MUTATIONS[mutation]
    broken = copy.deepcopy(compose)
    mutate(broken)
    problems = compose_problems(broken)
    assert any(p.startswith(expected) for p in problems), problems


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda t: t + 'ENTRYPOINT ["tini", "--"]\n', "dockerfile: the service stage has ENTRYPOINT"),
    (lambda t: t.replace('"api", "--config"', '"serve", "--config"'), "dockerfile: CMD is"),
    (lambda t: t + "CMD python -m custody api --config /etc/custody/custody.toml\n", "dockerfile: CMD is (shell form)"),
], ids=["entrypoint", "other command", "shell form"])
def test_a_broken_dockerfile_is_refused(compose: dict, edit, expected: str) -> None:
    problems = dockerfile_problems(edit(DOCKERFILE.read_text()), compose)
    assert any(p.startswith(expected) for p in problems), problems


def test_each_custody_process_holds_its_own_signer_key_only(compose: dict) -> None:
    """The compose signer.toml names the deployed clients (worker: every method; api: reserves and
    public keys), each key a secret of its own; the api is given the api's key and the worker the
    worker's, never the other's, and each speaks as its own client (custody.toml is the api's; the
    worker's environment overrides)."""
    import tomllib

    from signer.config import DEPLOYED_CLIENTS, load_config

    signer_cfg = load_config(ROOT / "deploy" / "compose" / "signer.toml")
    assert_equal({c.name: set(c.methods) for c in signer_cfg.clients}, {k: set(v) for k, v in DEPLOYED_CLIENTS.items()})
    secret_of = {c.name: Path(c.auth_key_file).name for c in signer_cfg.clients}  # /run/secrets/<secret>
    services = compose["services"]
    assert set(secret_of.values()) <= _secret_names(services["custody-signer"])
    assert_equal(_secret_names(services["custody-api"]) & set(secret_of.values()), {secret_of["api"]})
    assert_equal(_secret_names(services["custody-worker"]) & set(secret_of.values()), {secret_of["worker"]})
    files = {Path(s["file"]).name for s in compose["secrets"].values()}
    assert_equal(len({compose["secrets"][secret_of[n]]["file"] for n in secret_of}), len(secret_of))  # one file each
    assert {"signer-worker.key", "signer-api.key"} <= files
    custody_signer = tomllib.loads((ROOT / "deploy" / "compose" / "custody.toml").read_text())["signer"]
    assert_equal((custody_signer["client"], custody_signer["auth_key_file"]), ("api", f"/run/secrets/{secret_of['api']}"))
    worker_env = services["custody-worker"]["environment"]
    assert_equal((worker_env["CUSTODY_WORKER_SIGNER_CLIENT"], worker_env["CUSTODY_WORKER_SIGNER_AUTH_KEY_FILE"]),
                 ("worker", f"/run/secrets/{secret_of['worker']}"))


def test_the_worker_and_the_api_are_given_the_stacks_nats(compose: dict) -> None:
    """Both processes read [events] nats_url from the custody.toml they mount: the stack's `nats`
    service on a network each is on, and each waits for its health check (the worker publishes
    there; the api's /health/ready checks it). Without it the worker would start an embedded
    nats-server in its own container, which no consumer outside that container can reach."""
    import tomllib
    from urllib.parse import urlsplit

    services = compose["services"]
    nats_port = 4222  # nats-server's default client port (the service's command sets no other)
    assert "-p" not in services["nats"]["command"] and "--port" not in services["nats"]["command"]
    for name in ("custody-worker", "custody-api"):
        source = next(s for t, s in _binds(services[name]).items() if Path(s).name == "custody.toml")
        events = tomllib.loads((ROOT / source).read_text()).get("events", {})
        url = urlsplit(events.get("nats_url", ""))
        assert_equal((url.scheme, url.hostname, url.port or nats_port), ("nats", "nats", nats_port))
        assert events.get("sink", "jetstream") == "jetstream", name
        assert set(services[name]["networks"]) & set(services["nats"]["networks"]), name
        assert_equal(services[name]["depends_on"]["nats"], {"condition": "service_healthy"})
