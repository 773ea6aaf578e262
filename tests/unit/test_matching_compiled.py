"""The compiled matching core (`matching._compiled`, Cython) behaves exactly as the pure-Python
reference engine: seeded random streams go through both engines in lockstep and every command must
give the same events (or the same error), and the two must have the same state hash along the way
and at the end. The streams are those of `test_matching_fastpaths` (every order type, the three STP
policies, fee tiers, icebergs, stops and their activation, refusals and malformed commands) plus
the benchmark's stream of moves over a deep book (`bench/matching_peers.py`).

The compiled engine must be built (`scripts/bootstrap.sh` builds it): a missing or stale build
fails these tests, it does not skip them. Also checked: how `matching.compiled` chooses an engine
(`MATCHING_ENGINE`, stale builds refused) and that snapshots restore into the chosen class.

    .venv/bin/python -m pytest tests/unit/test_matching_compiled.py -q
"""
from __future__ import annotations

import hashlib
import importlib.util
import random
import shutil
import sys
from pathlib import Path

import pytest

from matching import (ActivateTriggered, Cancel, Engine, MemoryJournal, RejectTriggered, Sequencer,
                      StpPolicy)
from matching import compiled
from matching.errors import MatchingError
from matching.model import Market
from matching.snapshot import restore, state_hash, take
from tests.unit.test_matching_fastpaths import (FEES, GOLDEN, _amend, _pick, _place, event_key,
                                                stream_digest)

# The peers benchmark's stream generator, loaded by path (bench/ is not a package, and putting it
# on sys.path would let bench/matching.py shadow the matching package).
_SPEC = importlib.util.spec_from_file_location(
    "matching_peers", Path(__file__).resolve().parents[2] / "bench" / "matching_peers.py")
matching_peers = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(matching_peers)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def compiled_cls() -> type:
    cls, why = compiled.compiled_engine()
    assert cls is not None, f"compiled engine unavailable: {why} (run scripts/bootstrap.sh)"
    return cls


def _outcome(sequencer: Sequencer, cmd: object) -> tuple:
    try:
        sub = sequencer.submit(cmd)
    except MatchingError as exc:
        return ("error", exc.code.value, str(exc))
    return (sub.seq, [event_key(e) for e in sub.events])


def _lockstep(seed: int, n: int, crowded: bool, compiled_cls: type) -> int:
    """Run one random stream through both engines; return the number of events compared."""
    rng = random.Random(seed)
    market = Market("T-Q", "T", "Q", lot_size=7, quote_per_tick_lot=3,
                    min_notional=50 if crowded else 0)
    stp = StpPolicy.cancel_newest if seed % 2 else StpPolicy.decrement_both
    pure, fast = Engine(market, FEES, stp), compiled_cls(market, FEES, stp)
    seq_pure, seq_fast = Sequencer(pure, MemoryJournal()), Sequencer(fast, MemoryJournal())
    ids: list[str] = []
    accounts = ["a", "b", "c", "d", "e"] if crowded else [f"x{i}" for i in range(40)]
    mid, compared = 1000, 0
    for i in range(n):
        r, account = rng.random(), rng.choice(accounts)
        if r < 0.35 or not ids:
            cmd: object = _place(rng, ids, account, mid)
        elif r < 0.45:
            order_id = _pick(rng, pure, ids)
            order = pure.order(order_id)
            cmd = Cancel(order_id, order.account if order and rng.random() < 0.95 else account)
        elif r < 0.93:
            cmd = _amend(rng, pure, ids, account, mid)
        else:
            order_id = (rng.choice(list(pure.awaiting))
                        if pure.awaiting and rng.random() < 0.9 else rng.choice(ids))
            cmd = (ActivateTriggered if rng.random() < 0.8 else RejectTriggered)(order_id)
        if rng.random() < 0.003:
            cmd = rng.choice([Cancel(5, "a"), "junk"])
        expected = _outcome(seq_pure, cmd)
        assert _outcome(seq_fast, cmd) == expected, f"command {i}: {cmd!r}"
        compared += len(expected[1]) if expected[0] != "error" else 1
        if i % 101 == 0:
            assert state_hash(fast) == state_hash(pure), f"state differs after command {i}"
        mid += rng.choice((-1, 0, 1))
    assert state_hash(fast) == state_hash(pure)
    return compared


def test_the_compiled_engine_is_a_distinct_compiled_class(compiled_cls):
    assert compiled_cls is not Engine
    assert compiled_cls.__module__ == "matching._compiled.engine"
    assert sys.modules["matching._compiled.book"].__file__.endswith(".so")
    with pytest.raises(AttributeError):  # an extension type: no attributes beyond its fields
        compiled_cls(matching_peers.market(), matching_peers.fees()).unknown_field = 1


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("crowded", [False, True])
def test_random_streams_give_identical_events_and_state_hashes(seed, crowded, compiled_cls):
    assert _lockstep(seed, 3000, crowded, compiled_cls) > 3000


@pytest.mark.parametrize(("seed", "crowded"), sorted(GOLDEN))
def test_the_compiled_engine_reproduces_the_golden_digests(seed, crowded, compiled_cls):
    assert stream_digest(seed, 2500, crowded, engine_cls=compiled_cls) == GOLDEN[(seed, crowded)]


def test_the_benchmark_stream_gives_identical_events_and_state_hashes(compiled_cls):
    seeds, mixed = matching_peers.generate(8_000, seed=11, resting=300)
    market = matching_peers.market()
    pure, fast = (Engine(market, matching_peers.fees()), compiled_cls(market, matching_peers.fees()))
    for i, cmd in enumerate(seeds + mixed, 1):
        assert ([event_key(e) for e in fast.apply(i, cmd)]
                == [event_key(e) for e in pure.apply(i, cmd)]), f"command {i}: {cmd!r}"
    assert pure.last_price is not None  # the stream traded
    assert state_hash(fast) == state_hash(pure)


def test_a_snapshot_restores_into_the_requested_engine_with_the_same_hash(compiled_cls):
    seeds, mixed = matching_peers.generate(2_000, seed=3, resting=200)
    pure = Engine(matching_peers.market(), matching_peers.fees())
    for i, cmd in enumerate(seeds + mixed, 1):
        pure.apply(i, cmd)
    snap = take(pure)
    fast = restore(snap, compiled_cls)
    assert type(fast) is compiled_cls
    assert state_hash(fast) == snap.hash
    assert type(restore(snap, Engine)) is Engine


def test_matching_engine_env_chooses_the_engine(compiled_cls):
    assert compiled.select("pure") == (Engine, "pure (MATCHING_ENGINE=pure)")
    assert compiled.select("auto") == (compiled_cls, "compiled")
    assert compiled.select("compiled") == (compiled_cls, "compiled")
    with pytest.raises(ValueError, match="MATCHING_ENGINE must be one of"):
        compiled.select("fast")


def _sources_in(tmp_path: Path, monkeypatch) -> None:
    """A copy of the compiled modules' sources and declarations, taken as the sources on disk."""
    here = Path(compiled.__file__).parent
    (tmp_path / "_compiled").mkdir()
    for name in compiled.MODULES:
        shutil.copy(here / f"{name}.py", tmp_path / f"{name}.py")
        if (here / "_compiled" / f"{name}.pxd").exists():
            shutil.copy(here / "_compiled" / f"{name}.pxd", tmp_path / "_compiled" / f"{name}.pxd")
    monkeypatch.setattr(compiled, "_SOURCE_DIR", tmp_path)


def test_a_build_older_than_its_source_is_not_used(tmp_path, monkeypatch, compiled_cls):
    _sources_in(tmp_path, monkeypatch)
    assert compiled.compiled_engine() == (compiled_cls, "")
    with open(tmp_path / "book.py", "a") as f:
        f.write("\n# edited after the build\n")
    cls, why = compiled.compiled_engine()
    assert cls is None and "stale build: matching/book.py" in why
    cls, label = compiled.select("auto")
    assert cls is Engine and label.startswith("pure (compiled engine stale build")
    with pytest.raises(compiled.CompiledEngineUnavailable, match="stale build"):
        compiled.select("compiled")


def test_a_build_older_than_its_static_declarations_is_not_used(tmp_path, monkeypatch,
                                                                compiled_cls):
    _sources_in(tmp_path, monkeypatch)
    with open(tmp_path / "_compiled" / "engine.pxd", "a") as f:
        f.write("\n# edited after the build\n")
    cls, why = compiled.compiled_engine()
    assert cls is None and "stale build: matching/engine.py" in why


def test_the_source_hash_is_the_one_setup_py_embeds(compiled_cls):
    here = Path(compiled.__file__).parent
    source = (here / "engine.py").read_bytes() + (here / "_compiled" / "engine.pxd").read_bytes()
    assert sys.modules["matching._compiled.engine"].SOURCE_SHA256 == hashlib.sha256(source).hexdigest()
    assert compiled.source_sha256("engine") == hashlib.sha256(source).hexdigest()


def test_the_order_class_is_still_reachable_from_the_model():
    import matching.model
    import matching.order
    assert matching.model.Order is matching.order.Order
    with pytest.raises(AttributeError):
        matching.model.NoSuchThing  # noqa: B018
