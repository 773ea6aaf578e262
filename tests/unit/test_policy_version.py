"""Policy versions are signed in every approval payload and shown to approvers, so custody holds them
to a strict pattern (custody.policy_config.check_policy_version; issue 12, review R3): a base set
with another version is refused when its provider is built, i.e. at start."""
from __future__ import annotations

import dataclasses

import pytest

from custody.policy_config import PolicyProvider, check_policy_version, default_policy
from regtest.util import assert_equal


@pytest.mark.parametrize("version", ["regtest-2026-11-29.1", "regtest-2026-11-29.1+allowlist.17.v2", "v1",
                                     "regtest-2026-11-29.1+tight-velocity", "2024-05-01.1", "a" * 128])
def test_versions_custody_writes_pass(version):
    assert_equal(check_policy_version(version), version)


@pytest.mark.parametrize("version", ["", " v1", "v1 ", "-v1", "+allowlist.1.v1", "v1\x1b[1A", "v1\r", "v1\n", "v1\u202e",
                                     "v1\u200b", "v\u0131", "v1/2", "v1;drop", "a" * 129, None, 1])
def test_anything_else_is_refused(version):
    with pytest.raises(ValueError, match="policy version"):
        check_policy_version(version)


def test_a_provider_with_a_bad_base_version_fails_when_built():
    PolicyProvider()  # the default policy's version passes
    with pytest.raises(ValueError, match="policy version"):
        PolicyProvider(dataclasses.replace(default_policy(), version="v1\x1b[2K"))
