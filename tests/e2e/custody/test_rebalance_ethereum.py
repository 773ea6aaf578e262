"""rebalance_ethereum: ether and USDT over the hot address's ceiling move to warm and cold, against anvil.

The hot address is funded (treasury, booked from the chain) past each asset's ceiling; the decision
opens one rebalance per asset: ether to the signer's own warm address (ethereum account "warm",
0/0), USDT to the cold address pinned in the signer's configuration. A signer WITHOUT the pinned
cold address refuses the USDT move (`destination_not_cold`) and the refusal gives its hot nonce
back: the counter is where it was, the row stays open without a nonce, and the next signing takes
that very nonce (no hole). At every step (decided, signed, sent, mined, final) reconciliation's
ethereum lines, warm and cold included, are exactly what they were before the test; the books at
finality move hot -> warm (2 ETH) and hot -> cold (600 USDT) exactly, the gas of both to the
network-fee expense to the wei; the ledger verifies and nothing is left in flight.

The third scenario drives hot below its floor: a warm -> hot refill (warm holds ether from an
earlier move and pays its own gas) waits for the signed approvals of two operators: before them the
worker does not ask and the signer, asked directly, refuses (`rebalance_not_approved`, also with one
approval); after them it is signed, sent and booked warm -> hot at finality, reconciled throughout.
The operators work over HTTP with the typed client (custody.client, on the in-process app): they
find the refill in `GET /v1/eth-rebalances`, read `GET /v1/eth-rebalances/{id}/approval-payload`,
sign it with their own keys and POST `/v1/eth-rebalances/{id}/approve`; a second approval by the
same operator is `already_acted`.

The second scenario kills the process after the signer signed and before custody stored the
signature: the restart signs the same rebalance at the same hot nonce (the signer's record), the
same txid, and the move is booked once.
"""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from eth_utils import keccak, to_checksum_address
from sqlalchemy import text

import custody.eth_rebalances as eth_rebalances_module
from custody.api.app import create_app
from custody.client import Conflict, CustodyClient
from custody.container import Container
from custody.devchains import signer_asset_entries
from custody.eth_rebalances import EthRebalanceConfig
from custody.rebalances import RebalanceThreshold
from regtest.anvil_node import FAUCET_ADDRESS
from regtest.util import assert_equal
from signer.assets import assets_from_entries
from signer.protocol import RefusalCode, SigningRefused
from tests.approvers import operator_key, registry, sign_approval, signature_json
from tests.e2e.custody.conftest import ETH_FINALITY

USDT = 10**6
ETHER = 10**18
COLD = to_checksum_address("0x" + keccak(b"rebalance-ethereum: a cold address no key of ours holds")[-20:].hex())
TIERS = [(t, a) for t in ("deposit", "hot", "warm", "cold") for a in ("ETH", "USDT")]


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler of ours swallows it."""


def service(custody, signer_keys, usdt, eth_adapter, *, cold: str | None = COLD) -> Container:
    """Fresh service objects on the session's database and nodes with ethereum rebalances configured
    (no thresholds yet) and, unless `cold` is None, the signer's pinned cold address."""
    fresh = Container(settings=custody.settings, engine=custody.engine, ledger=custody.ledger)
    fresh.with_chains(custody.adapters, signer_keys=signer_keys, approvers=registry(),
                      signer_assets=assets_from_entries(signer_asset_entries(usdt.address)), ethereum_chain_id=eth_adapter.chain_id,
                      eth_rebalance_config=EthRebalanceConfig(cold_address=COLD),
                      cold_addresses={"ethereum": cold} if cold else None)
    return fresh


def differences(svc) -> dict:
    svc.deposits.run_once(["ethereum"])
    lines = svc.reconciliation.run(chains=["ethereum"])
    assert_equal(sorted((line.tier, line.asset) for line in lines), sorted(TIERS))
    return {(line.tier, line.asset): line.difference for line in lines}


def unfinished(engine) -> int:
    with engine.connect() as c:
        return c.execute(text("SELECT count(*) FROM eth_rebalance WHERE state NOT IN ('final', 'reverted')")).scalar_one()


def counter(engine, hot: str) -> int | None:
    with engine.connect() as c:
        return c.execute(text("SELECT next_nonce FROM eth_nonce WHERE address = :a"), {"a": hot}).scalar()


def fund_hot(svc, anvil, usdt, *, ether: int, tokens: int) -> None:
    """Treasury pays the hot address ether and USDT, booked from the chain once final."""
    hot = svc.payouts.hot_address("ethereum")
    usdt.mint(FAUCET_ADDRESS, tokens)
    txids = [anvil.fund(hot, ether), usdt.transfer(FAUCET_ADDRESS, hot, tokens)]
    anvil.mine(ETH_FINALITY)
    for txid in txids:
        svc.payouts.book_ethereum_funding(txid, by="test-rebalance-ethereum")


def drain(svc, anvil, baseline, rounds: int = 4) -> None:
    """Run the rebalance jobs, mining as the chain would, until nothing is in flight; reconciliation
    equals `baseline` after every step."""
    r = svc.eth_rebalances
    for _ in range(rounds):
        r.sign()
        r.broadcast()
        assert_equal(differences(svc), baseline)  # signed or sent: nothing moved yet
        anvil.mine(1)
        r.track()
        assert_equal(differences(svc), baseline)  # mined, not final: in transit on both lines
        anvil.mine(ETH_FINALITY)
        r.track()
        assert_equal(differences(svc), baseline)  # booked
        if unfinished(svc.engine) == 0:
            return
    raise AssertionError(f"rebalances still in flight after {rounds} rounds")


@pytest.fixture
def svc(custody, signer_keys, usdt, eth_adapter):
    fresh = service(custody, signer_keys, usdt, eth_adapter)
    yield fresh
    assert_equal(unfinished(custody.engine), 0)
    bad = [c.name for c in fresh.ledger.verify() if not c.ok]
    assert_equal(bad, [])


def thresholds_over(svc, *, eth_extra: int, usdt_extra: int) -> dict[str, RebalanceThreshold]:
    """Ceilings just under what hot will hold after `*_extra` more arrives: ether -> warm, USDT -> cold."""
    r = svc.eth_rebalances
    with svc.engine.connect() as c:
        eth, tok = r.hot_spendable(c, "ETH"), r.hot_spendable(c, "USDT")
    return {"ETH": RebalanceThreshold(ceiling=eth + eth_extra * 2 // 3, target=eth + eth_extra // 3, excess_to="warm"),
            "USDT": RebalanceThreshold(ceiling=tok + usdt_extra * 4 // 5, target=tok + usdt_extra * 2 // 5, excess_to="cold")}


def test_hot_over_its_ceiling_moves_ether_to_warm_and_usdt_to_cold(svc, custody, signer_keys, usdt, eth_adapter, anvil,
                                                                    ledger, log):
    r = svc.eth_rebalances
    hot = svc.payouts.hot_address("ethereum")
    warm = r.warm_address
    assert_equal(r.destinations(), {"warm": warm, "cold": COLD})
    accounts = {k: svc.wallets.location_account("ethereum", *k) for k in TIERS}
    expense = svc.wallets.firm_account("network_fees", "ETH")

    def held(tier: str, asset: str) -> int:  # asset locations run negative
        return -ledger.balance(accounts[(tier, asset)]).posted

    baseline = differences(svc)
    for tier in ("warm", "cold"):
        assert_equal((baseline[(tier, "ETH")], baseline[(tier, "USDT")]), (0, 0))
    r.config = EthRebalanceConfig(thresholds=thresholds_over(svc, eth_extra=3 * ETHER, usdt_extra=1000 * USDT),
                                  cold_address=COLD)
    log.info("below the ceilings: nothing is decided")
    assert_equal(r.decide(), [])

    fund_hot(svc, anvil, usdt, ether=3 * ETHER, tokens=1000 * USDT)
    assert_equal(differences(svc), baseline)
    books_before = {k: held(*k) for k in TIERS}
    expense_before = ledger.balance(expense).posted
    chain_before = {"warm_eth": eth_adapter.balance(warm), "cold_usdt": usdt.balance_of(COLD),
                    "hot_eth": eth_adapter.balance(hot), "hot_usdt": usdt.balance_of(hot)}

    log.info("over the ceilings: one move per asset, spendable - target each")
    made = r.decide()
    assert_equal(len(made), 2)
    assert_equal(r.decide(), [])  # one unfinished move per asset at a time
    with svc.engine.connect() as c:
        rows = {x.asset: x for x in c.execute(text("SELECT * FROM eth_rebalance WHERE id = ANY(:i)"), {"i": made})}
    assert_equal({a: (x.destination_tier, x.destination, int(x.amount), x.nonce, x.state) for a, x in rows.items()},
                 {"ETH": ("warm", warm, 2 * ETHER, None, "open"), "USDT": ("cold", COLD, 600 * USDT, None, "open")})
    assert_equal(differences(svc), baseline)

    log.info("a signer without the pinned cold address refuses USDT -> cold; its nonce goes back (no hole)")
    unpinned = service(custody, signer_keys, usdt, eth_adapter, cold=None)
    r.signer, kept = unpinned.eth_rebalances.signer, r.signer
    try:
        signed = r.sign()
    finally:
        r.signer = kept
    assert_equal(len(signed), 1)
    assert_equal(r.refusals[-1], (rows["USDT"].id, RefusalCode.destination_not_cold.value))
    with svc.engine.connect() as c:
        now = {x.asset: x for x in c.execute(text("SELECT * FROM eth_rebalance WHERE id = ANY(:i)"), {"i": made})}
    assert_equal((now["USDT"].state, now["USDT"].nonce), ("open", None))
    eth_nonce = int(now["ETH"].nonce)
    assert_equal(counter(svc.engine, hot), eth_nonce + 1)  # the refused one took nothing
    assert_equal(differences(svc), baseline)

    log.info("the pinned signer signs USDT at the very next hot nonce")
    drain(svc, anvil, baseline)
    with svc.engine.connect() as c:
        done = {x.asset: x for x in c.execute(text("SELECT * FROM eth_rebalance WHERE id = ANY(:i)"), {"i": made})}
    assert_equal({a: x.state for a, x in done.items()}, {"ETH": "final", "USDT": "final"})
    assert_equal(int(done["USDT"].nonce), eth_nonce + 1)
    gas = int(done["ETH"].fee) + int(done["USDT"].fee)
    assert gas > 0

    log.info("books: hot -> warm 2 ETH, hot -> cold 600 USDT, gas -> expense; the chain agrees")
    moved = {k: held(*k) - books_before[k] for k in TIERS}
    assert_equal(moved, {("deposit", "ETH"): 0, ("deposit", "USDT"): 0, ("hot", "ETH"): -2 * ETHER - gas,
                         ("hot", "USDT"): -600 * USDT, ("warm", "ETH"): 2 * ETHER, ("warm", "USDT"): 0,
                         ("cold", "ETH"): 0, ("cold", "USDT"): 600 * USDT})
    assert_equal(expense_before - ledger.balance(expense).posted, gas)  # debited: credits count positive
    assert_equal(eth_adapter.balance(warm) - chain_before["warm_eth"], 2 * ETHER)
    assert_equal(usdt.balance_of(COLD) - chain_before["cold_usdt"], 600 * USDT)
    assert_equal(chain_before["hot_eth"] - eth_adapter.balance(hot), 2 * ETHER + gas)
    assert_equal(chain_before["hot_usdt"] - usdt.balance_of(hot), 600 * USDT)
    log.info("back at target: nothing more is decided")
    assert_equal(r.decide(), [])
    assert_equal(differences(svc), baseline)


def test_crash_after_the_signer_signed_re_signs_the_same_slot(svc, custody, signer_keys, usdt, eth_adapter, anvil,
                                                             monkeypatch, log):
    r = svc.eth_rebalances
    hot = svc.payouts.hot_address("ethereum")
    baseline = differences(svc)
    r.config = EthRebalanceConfig(thresholds={"ETH": thresholds_over(svc, eth_extra=3 * ETHER, usdt_extra=3)["ETH"]},
                                  cold_address=COLD)
    fund_hot(svc, anvil, usdt, ether=3 * ETHER, tokens=1)
    [made] = r.decide()

    log.info("the process dies after the signer answered, before custody stored the signature")
    real_advance = eth_rebalances_module.advance

    def dying(c, machine, row_id, frm, to, **cols):
        if (machine, frm, to) == ("eth_rebalance", "open", "signed"):
            raise Crash()
        return real_advance(c, machine, row_id, frm, to, **cols)

    monkeypatch.setattr(eth_rebalances_module, "advance", dying)
    with pytest.raises(Crash):
        r.sign()
    monkeypatch.setattr(eth_rebalances_module, "advance", real_advance)
    with svc.engine.connect() as c:
        recorded = c.execute(text("SELECT nonce, txid FROM signer_eth_rebalance WHERE rebalance_id = :r"), {"r": made}).all()
        row = c.execute(text("SELECT state, nonce FROM eth_rebalance WHERE id = :r"), {"r": made}).one()
    assert_equal(len(recorded), 1)  # the signer committed its record
    assert_equal((row.state, row.nonce), ("open", None))  # custody stored nothing

    log.info("restart: the same hot nonce, the same txid; booked once")
    restarted = service(custody, signer_keys, usdt, eth_adapter)
    restarted.eth_rebalances.config = r.config
    assert_equal(restarted.eth_rebalances.sign(), [recorded[0].txid])
    with svc.engine.connect() as c:
        row = c.execute(text("SELECT state, nonce, txid FROM eth_rebalance WHERE id = :r"), {"r": made}).one()
    assert_equal((row.state, int(row.nonce), row.txid), ("signed", int(recorded[0].nonce), recorded[0].txid))
    assert_equal(counter(svc.engine, hot), int(recorded[0].nonce) + 1)
    drain(restarted, anvil, baseline)
    with svc.engine.connect() as c:
        booked = c.execute(text("SELECT count(*) FROM journal_transaction WHERE idempotency_key LIKE :k"),
                           {"k": f"%eth_rebalance:{made}:%"}).scalar_one()
    assert_equal(booked, 1)


def operator_api(svc, name: str) -> CustodyClient:
    """The typed client as operator `name` (API key and approver key of that name) on `svc`'s app."""
    return CustodyClient("http://testserver", operator_key(svc, name), http=TestClient(create_app(svc)), retries=0)


def approve_over_http(api: CustodyClient, refill: int, operator: str) -> int:
    """`operator` reads the refill's payload over HTTP, signs it with their key, approves it; the approvals so far."""
    payload = api.eth_refill_approval_payload(refill).payload.encode()
    answer = api.approve_eth_refill(refill, comment="refill checked", signature=signature_json(sign_approval(payload, operator)))
    assert_equal((answer.rebalance.id, answer.rebalance.approvals), (refill, answer.approvals))
    return answer.approvals


def test_hot_under_its_floor_is_refilled_from_warm_only_after_a_quorum(svc, anvil, usdt, eth_adapter, ledger, log):
    r = svc.eth_rebalances
    hot, warm = svc.payouts.hot_address("ethereum"), r.warm_address
    baseline = differences(svc)
    log.info("warm first receives ether from hot (it pays a refill's gas itself; hot never funds it)")
    r.config = EthRebalanceConfig(thresholds={"ETH": thresholds_over(svc, eth_extra=3 * ETHER, usdt_extra=3)["ETH"]},
                                  cold_address=COLD)
    fund_hot(svc, anvil, usdt, ether=3 * ETHER, tokens=1)
    assert_equal(len(r.decide()), 1)
    drain(svc, anvil, baseline)

    with svc.engine.connect() as c:
        spendable = r.hot_spendable(c, "ETH")
    r.config = EthRebalanceConfig(thresholds={"ETH": RebalanceThreshold(ceiling=spendable + 3 * ETHER, target=spendable + ETHER,
                                                                        floor=spendable + ETHER // 2)},
                                  cold_address=COLD, refill_quorum=2)
    warm_account, hot_account = (svc.wallets.location_account("ethereum", t, "ETH") for t in ("warm", "hot"))
    books_before = (-ledger.balance(warm_account).posted, -ledger.balance(hot_account).posted)
    chain_before = (eth_adapter.balance(warm), eth_adapter.balance(hot))

    log.info("hot below its floor: a refill of target - spendable from warm, open for approvals")
    [refill] = r.decide()
    assert_equal(r.decide(), [])  # one refill at a time
    with svc.engine.connect() as c:
        row = c.execute(text("SELECT * FROM eth_rebalance WHERE id = :r"), {"r": refill}).one()
    assert_equal((row.source_tier, row.destination_tier, row.destination, int(row.amount), row.approvals_required, row.state),
                 ("warm", "hot", hot, ETHER, 2, "open"))

    def ask_signer():  # what a worker that skipped custody's count would ask
        return r.signer.sign_ethereum_rebalance(
            refill, asset="ETH", amount=ETHER, destination_tier="hot", chain_id=eth_adapter.chain_id,
            nonce=eth_adapter.nonce(warm), gas=int(row.gas_limit), max_fee_wei=int(row.max_fee_wei),
            priority_fee_wei=int(row.priority_fee_wei))

    log.info("before the quorum: the worker waits and the signer refuses")
    assert_equal(r.sign(), [])
    with pytest.raises(SigningRefused) as refused:
        ask_signer()
    assert_equal(refused.value.code, RefusalCode.rebalance_not_approved)
    alice, bob = operator_api(svc, "op-alice"), operator_api(svc, "op-bob")
    [listed] = [x for x in alice.list_eth_rebalances(state="open") if x.id == refill]
    assert_equal((listed.source_tier, listed.destination_tier, listed.amount_minor, listed.approvals_required, listed.approvals),
                 ("warm", "hot", ETHER, 2, 0))
    assert_equal(approve_over_http(alice, refill, "op-alice"), 1)
    with pytest.raises(Conflict) as again:
        approve_over_http(alice, refill, "op-alice")
    assert_equal(again.value.code, "already_acted")
    assert_equal(r.sign(), [])
    with pytest.raises(SigningRefused) as refused:
        ask_signer()
    assert_equal(refused.value.code, RefusalCode.rebalance_not_approved)  # one operator is not a quorum
    assert_equal(differences(svc), baseline)

    log.info("a second operator: signed, sent, booked warm -> hot at finality; reconciled at every step")
    assert_equal(approve_over_http(bob, refill, "op-bob"), 2)
    drain(svc, anvil, baseline)
    with svc.engine.connect() as c:
        done = c.execute(text("SELECT state, fee FROM eth_rebalance WHERE id = :r"), {"r": refill}).one()
    gas = int(done.fee)
    assert_equal(done.state, "final")
    assert_equal((-ledger.balance(warm_account).posted - books_before[0], -ledger.balance(hot_account).posted - books_before[1]),
                 (-ETHER - gas, ETHER))
    assert_equal((eth_adapter.balance(warm) - chain_before[0], eth_adapter.balance(hot) - chain_before[1]), (-ETHER - gas, ETHER))
    assert_equal(r.decide(), [])  # back at target
    assert_equal(differences(svc), dict.fromkeys(TIERS, 0))  # reconciliation: zero on every ethereum line
    assert_equal(unfinished(svc.engine), 0)
    ledger.assert_verified()
