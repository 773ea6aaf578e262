"""chain_control: regtest.control's helpers put the custody pipelines under real network conditions.

- a reorg that drops a deposit before finality: the deposit ends `orphaned`, never credited; on
  ethereum, a reorg keeping one of two deposits of a block: that one is credited at finality, the
  other orphaned;
- a fee spike: blocks full of transactions paying more than the payout, so its first fee is too low
  and it is not mined; the worker's bump pays enough and is the version that confirms;
- a hung bitcoind (SIGSTOP): `/health/ready` is 503 naming `bitcoin`, the deposit job fails with
  `node_unavailable` and records nothing; once the node continues both carry on by themselves.
  Readiness is asked through the typed custody.client (`api_helpers.readiness`: the status and the
  `Ready` body, a 503 included).
"""
from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import text

from chain_adapters.bitcoin import BitcoinAdapter
from chain_adapters.errors import ChainError
from custody.container import Container
from ledger.service import Ledger
from regtest import control
from regtest.util import assert_equal
from tests.e2e.custody.api_helpers import in_process, readiness
from tests.e2e.custody.conftest import BTC_FINALITY, ETH_FINALITY
from tests.e2e.custody.test_withdrawal_signer_refusals import fund

SAT = 100_000_000


def observations(engine, txid: str) -> list[str]:
    with engine.connect() as c:
        return list(c.execute(text("SELECT state FROM deposit_observation WHERE txid = :t"), {"t": txid}).scalars())


def test_reorg_drops_a_deposit_before_finality(custody, customer, bitcoind, engine, ledger, log):
    acct = customer("BTC")
    address = custody.wallets.issue_address(f"addr:{acct}", acct).address
    txid = control.faucet_bitcoin(bitcoind, address, 30_000_000, confirm=True)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(observations(engine, txid), ["confirming"])  # 1 of 3 confirmations
    log.info("reorg depth 1 dropping %s (1 of %d confirmations)", txid, BTC_FINALITY)
    control.reorg_bitcoin(bitcoind, 1, drop=[txid])
    bitcoind.mine(BTC_FINALITY)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(observations(engine, txid), ["orphaned"])
    assert_equal(control.confirmations(bitcoind, txid), 0)
    assert_equal(ledger.balance(acct).posted, 0)


def test_ethereum_reorg_keeps_one_deposit_and_drops_the_other(custody, customer, anvil, engine, ledger, log):
    kept, dropped = customer("ETH"), customer("ETH")
    addresses = [custody.wallets.issue_address(f"addr:{a}", a).address for a in (kept, dropped)]
    with control.hold_mining(anvil):  # both deposits in one block
        keep_tx, drop_tx = (control.pay(anvil, a, 10**17 + i) for i, a in enumerate(addresses))
    custody.deposits.run_once(["ethereum"])
    assert_equal((observations(engine, keep_tx), observations(engine, drop_tx)), (["confirming"], ["confirming"]))
    log.info("reorg depth 1 keeping %s, dropping %s", keep_tx, drop_tx)
    control.reorg_ethereum(anvil, 1, keep=[(control.raw_transaction(anvil, keep_tx), 0)])
    control.mine(anvil, ETH_FINALITY)
    custody.deposits.run_once(["ethereum"])
    assert_equal((observations(engine, keep_tx), observations(engine, drop_tx)), (["credited"], ["orphaned"]))
    assert_equal((ledger.balance(kept).posted, ledger.balance(dropped).posted), (10**17, 0))
    assert_equal(control.confirmations(anvil, drop_tx), 0)


def test_fee_spike_makes_the_first_fee_too_low_and_the_bump_confirms(custody, customer, bitcoind, engine, ledger, log):
    w, p = custody.withdrawals, custody.payouts
    [acct] = fund(custody, customer, bitcoind, 1)
    dest = bitcoind.wallet("getnewaddress", "", "bech32")
    wd = w.request(client_withdrawal_id=f"spike-{acct}", account_id=acct, amount=10_000_000, destination=dest,
                   requested_by="backend")
    p.batch_bitcoin()
    [first] = p.sign_open_batches()
    p.broadcast()
    entry = bitcoind.rpc("getmempoolentry", first)
    first_rate = Decimal(str(entry["fees"]["base"])) * SAT / entry["vsize"]
    spike_rate = int(first_rate * Decimal("1.25")) + 1  # above the first fee, below a 50 % bump
    log.info("first version pays %.1f sat/vB; the spike's blocks need %d", first_rate, spike_rate)
    with control.FeeSpike(bitcoind, spike_rate, fill=10) as spike:
        spike.mine(p.config.stuck_blocks)
        assert_equal(control.confirmations(bitcoind, first), 0)
        [second] = p.bump_fees()
        p.broadcast()
        spike.mine(1)
    assert_equal(control.confirmations(bitcoind, second), 1)
    assert_equal(control.confirmations(bitcoind, first), 0)
    bitcoind.mine(BTC_FINALITY)
    p.track()
    assert_equal(w.get(wd.id).state, "final")
    assert_equal(int(Decimal(str(bitcoind.wallet("getreceivedbyaddress", dest))) * SAT), 10_000_000)


@pytest.fixture
def quick(custody, bitcoind, engine):
    """A second api container on the session database whose bitcoin adapter gives up after 2 s."""
    adapter = BitcoinAdapter(bitcoind.rpc_url, network="regtest", timeout=2)
    container = Container(settings=custody.settings, engine=engine, ledger=Ledger(engine)).with_chains({"bitcoin": adapter})
    yield container
    adapter.close()


def test_a_hung_node_shows_in_readiness_and_jobs_wait(custody, customer, bitcoind, engine, quick, ledger, log):
    api = in_process(quick, None)  # readiness needs no key
    assert_equal(readiness(api)[0], 200)
    acct = customer("BTC")
    txid = bitcoind.fund(custody.wallets.issue_address(f"addr:{acct}", acct).address, 20_000_000)
    bitcoind.mine(BTC_FINALITY)
    with control.hang_node(bitcoind):
        status, ready = readiness(api)
        assert_equal(status, 503)
        assert ready.checks["bitcoin"].ok is False, ready
        assert ready.checks["database"].ok is True
        with pytest.raises(ChainError) as refused:
            quick.deposits.run_once(["bitcoin"])
        assert_equal(refused.value.code.value, "node_unavailable")
        assert_equal(observations(engine, txid), [])
    control.wait_answering(bitcoind)
    assert_equal(readiness(api)[0], 200)
    custody.deposits.run_once(["bitcoin"])
    assert_equal(observations(engine, txid), ["credited"])
    assert_equal(ledger.balance(acct).posted, 20_000_000)
