"""The custody processes hold no key material: importing everything `python -m custody api` and
`python -m custody worker` run (their roots, the HTTP app, the scheduler, the CLI, the config
check) loads neither `signer.keys` nor `signer.service`. Checked in a fresh interpreter, since
this test process has imported both. (The e2e suite checks the running processes the same way,
from the module list each writes on SIGUSR1.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KEY_MODULES = {"signer.keys", "signer.service"}

PROGRAMS = {
    "api": "import custody.__main__, custody.roots.api, custody.api.app, custody.trading, custody.config_check",
    "worker": "import custody.__main__, custody.roots.worker, custody.jobs, custody.config_check",
}


@pytest.mark.parametrize("process", sorted(PROGRAMS))
def test_a_custody_process_never_imports_the_signers_key_code(process):
    # the signer client is imported when the root is built; include it once it is part of the build
    client = "\nimport importlib.util\nif importlib.util.find_spec('signer.client'): import signer.client"
    code = PROGRAMS[process] + client + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert f"custody.roots.{process}" in loaded
    assert "signer.protocol" in loaded  # the boundary module is what they use instead
    assert loaded & KEY_MODULES == set()


def test_the_check_sees_a_key_import():
    """The same probe reports the key code when something does import it (the test can fail). The
    in-process signer is such a thing (custody.devchains no longer imports signer.keys at all)."""
    code = "import signer.service\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert set(json.loads(out)) & KEY_MODULES == {"signer.keys", "signer.service"}
