"""deposit_screening: a deposit touching a denylisted address is quarantined at finality, never
credited to the customer, and reaches them only through an operator's release, which is audited."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from custody.deposits import ScreenResult
from ledger.errors import LedgerError
from regtest.util import assert_equal
from tests.approvers import approve
from tests.e2e.custody.conftest import BTC_FINALITY


def test_denylisted_address_quarantined_then_released(custody, customer, bitcoind, engine, ledger, log):
    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    with engine.begin() as c:
        c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, 'test: flagged by compliance')"), {"a": addr})
    bitcoind.fund(addr, 3_000_000)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    [obs] = custody.deposits.list(account_id=acct)
    log.info("screen hit: %s", obs["state"])
    assert_equal(obs["state"], "quarantined")
    assert_equal(ledger.balance(acct).posted, 0)
    quarantine = custody.wallets.firm_account("quarantine", "BTC")
    held = ledger.balance(quarantine).posted
    assert held >= 3_000_000

    with pytest.raises(LedgerError) as err:
        custody.deposits.release_quarantined(obs["id"], operator="op-1", comment=" ")
    assert_equal(err.value.code.value, "invalid_request")
    tx = custody.deposits.release_quarantined(obs["id"], operator="op-1", comment="false positive: customer's own cold wallet")
    assert_equal(custody.deposits.release_quarantined(obs["id"], operator="op-1", comment="again"), tx)
    assert_equal(ledger.balance(acct).posted, 3_000_000)
    assert_equal(ledger.balance(quarantine).posted, held - 3_000_000)
    with engine.connect() as c:
        audit = c.execute(text("SELECT actor, detail->>'comment' FROM audit_event WHERE action = 'deposit.release' "
                               "AND subject = :s"), {"s": f"observation:{obs['id']}"}).all()
    assert_equal([tuple(a) for a in audit], [("op-1", "false positive: customer's own cold wallet")])


def test_external_screener_hook(custody, customer, anvil, ledger, log):
    acct = customer("ETH")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    calls = []

    def screener(chain, asset, address, senders, amount):
        calls.append((chain, asset, address, amount))
        return ScreenResult(amount == 777, ("external: amount flagged",) if amount == 777 else ())

    custody.deposits.external_screener = screener
    try:
        anvil.fund(addr, 777_000_000_000)
        anvil.fund(addr, 777)
        anvil.mine(12)
        custody.deposits.run_once(["ethereum"])
    finally:
        custody.deposits.external_screener = None
    got = sorted((int(d["amount"]), d["state"]) for d in custody.deposits.list(account_id=acct))
    log.info("external screener saw %d deposit(s); outcome %s", len(calls), got)
    # 777 wei is both flagged and below the ETH dust minimum: screening comes first
    assert_equal(got, [(777, "quarantined"), (777_000_000_000, "credited")])
    assert_equal(ledger.balance(acct).posted, 777_000_000_000)


def deposit_from_denylisted_sender(custody, customer, btc, bitcoind, engine, amount: int, reason: str):
    """A fresh customer address is paid `amount` by a Python-held key that is on the denylist; the
    deposit jobs run to finality. Returns (account id, sender key, the deposit's row)."""
    from tests.e2e import txbuild

    acct = customer("BTC")
    addr = custody.wallets.issue_address(f"addr:{acct}", acct).address
    key, utxo = btc.funded_key(amount + 1_000_000)
    with engine.begin() as c:
        c.execute(text("INSERT INTO denylist_address (address, reason) VALUES (:a, :r)"), {"a": key.address, "r": reason})
    raw = txbuild.spend_p2wpkh(key, utxo.txid, utxo.index, utxo.amount, [(addr, amount), (key.address, utxo.amount - amount - 2_000)])
    btc.adapter.broadcast(raw)
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    [obs] = custody.deposits.list(account_id=acct)
    return acct, key, obs


def test_denylisted_sender_quarantined(custody, customer, btc, bitcoind, engine, ledger, log):
    acct, key, obs = deposit_from_denylisted_sender(custody, customer, btc, bitcoind, engine, 1_500_000, "test: sanctioned sender")
    log.info("a sanctioned address %s paid our deposit address: %s", key.address, obs["state"])
    assert_equal((obs["state"], list(obs["senders"])), ("quarantined", [key.address]))
    assert_equal(ledger.balance(acct).posted, 0)


def test_quarantined_deposit_returned_to_sender(custody, customer, btc, bitcoind, engine, ledger, log):
    acct, key, obs = deposit_from_denylisted_sender(custody, customer, btc, bitcoind, engine, 2_000_000, "test: flagged exchange")
    assert_equal(obs["state"], "quarantined")
    with engine.begin() as c:  # the return goes to the flagged sender itself: allowed as a return
        c.execute(text("DELETE FROM denylist_address WHERE address = :a"), {"a": key.address})
    p = custody.payouts
    bitcoind.fund(p.hot_address("bitcoin"), 100_000_000)
    bitcoind.mine(1)
    p.sync_hot_wallet()
    log.info("operator returns the deposit to its sender %s; a second operator approves, whatever the amount", key.address)
    wid = custody.deposits.return_quarantined(obs["id"], operator="op-carol", comment="returned per compliance",
                                              withdrawals=custody.withdrawals)
    assert_equal(custody.deposits.return_quarantined(obs["id"], operator="op-carol", comment="again",
                                                     withdrawals=custody.withdrawals), wid)
    w = custody.withdrawals.get(wid)
    assert_equal((w.state, w.decision_reasons), ("pending_approval", ("quarantine_return_requires_approval",)))
    assert_equal(approve(custody.withdrawals, wid, "op-dave", "checked").state, "approved")
    p.batch_bitcoin()
    p.sign_open_batches()
    p.broadcast()
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(custody.withdrawals.get(wid).state, "final")
    # the sender's coins: its change from paying us, and the deposit returned less the quoted fee
    assert_equal(sorted(u.amount for u in btc.adapter.unspent([key.address])), [998_000, 2_000_000 - 5_000])
    assert_equal(ledger.balance(acct).posted, 0)
