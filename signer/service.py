"""The signer's narrow interface: sign a withdrawal batch, or refuse with a code.

The signer trusts nothing custody says about a batch. Before it signs it re-reads, itself, from the
database (read-only):
- the kill switch (`control_flag.withdrawals_halted`) is off;
- every output pays exactly one withdrawal of this batch, to that withdrawal's destination and
  amount, and every withdrawal of the batch has an output;
- each withdrawal is `batched` in this batch, its policy decision is not a rejection and is
  unexpired, and it carries enough approvals, where an approval is a SIGNATURE, not a row
  (signer.approvals): the signer rebuilds the approval payload itself from the withdrawal and
  decision rows, and every approval row of the decision must carry a signature by a key of the
  signer's OWN registry (`approvers`, never a table custody can write) that verifies over the
  stored payload, and that payload must be the rebuilt one. It then counts the distinct operators
  of those keys (from its registry, not the row's `operator` column), never the requester, and
  requires the larger of the decision's own quorum and its OWN quorum table's
  (`quorum.required(asset, amount)`), so a decision row forged to "approve" with no approvals
  still needs the operators the amount needs. No quorum table: every withdrawal needs one
  approval; no registry: no approval counts. One from an account that is not a customer's must be
  a quarantine return (the quarantine account, naming its deposit) and has at least one eligible
  operator's approval whatever its decision says;
- no output pays an address the signer derives from its own keys (signer.own_addresses: a forged
  row naming the hot wallet would send the coins back to the firm while the customer's balance is
  gone);
- each withdrawal's ledger hold is pending (live), covers amount + quoted fee, is on the
  withdrawal's own account and is owned by custody's withdrawals (`withdrawals`): a forged row
  pointing at another account's live hold would otherwise pass;
- every input is an unspent coin of our hot wallet reserved for this batch.
Then it signs with the hot wallet keys (which never leave this package and are never logged) and
writes its own audit record of what it signed or refused. In deployment the signer runs as its own
process with its own read-only database role; here it is called in-process.

Refusal codes (`RefusalCode`), in the order they are checked:
| code | meaning |
| --- | --- |
| kill_switch_on | withdrawals are halted |
| empty_batch | the batch pays nothing |
| output_mismatch | an output does not match exactly one withdrawal of the batch (address or amount) |
| withdrawal_not_batched | a withdrawal is not in state `batched` in this batch |
| no_decision | a withdrawal has no policy decision |
| approval_unsigned | an approval row of the decision carries no signature (inserted underneath custody, or written before approvals were signed) |
| approver_unknown | an approval is signed by a key the signer is not configured with |
| approval_signature_invalid | an approval's signature does not verify over its stored payload (a payload altered after signing; a scheme other than the key's; a failed WebAuthn assertion) |
| approval_replayed | a valid signature whose payload names another withdrawal |
| approval_payload_mismatch | a valid signature for this withdrawal over a payload that differs from the one the signer rebuilds (another amount, destination, chain, asset, decision, policy version or expiry) |
| decision_not_approved | the decision rejects, or the distinct operators of valid approvals (never the requester) are fewer than the larger of the decision's quorum and the signer's own quorum table's (an asset or amount the table does not cover is refused); a withdrawal from a non-customer account is a quarantine return naming its deposit, or is refused, and always needs one operator other than the requester |
| decision_expired | the decision is past its expiry |
| hold_not_live | the hold is not pending, does not cover amount + fee, is on another account or is not custody's withdrawal hold |
| unknown_input | an input is not an unspent hot-wallet coin reserved for this batch |
| destination_denied | a destination is on the denylist now (checked again at signing) |
| destination_internal | an output pays an address the signer derives from its own keys (hot receive and sender, hot change around the batch id, deposit and warm windows; signer.own_addresses), checked right after the denylist |
| fee_above_ceiling | the fee is above the ceiling rate for the transaction's size (bitcoin) or gas x max fee above the cap (ethereum) |
| rebalance_not_open | a rebalance is unknown, of another chain, or not in state `open` |
| destination_not_cold | a rebalance pays an address that is not derived from the registered cold wallet's public key at its index |

Sweeps and rebalances (firm-internal moves) are checked instead against their own reservations:
the kill switch, the coins reserved for that row, a destination that is ours (the hot receive
address for a sweep; the registered, watch-only cold wallet for a rebalance), change only to the
hot receive address, and the fee ceiling.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Callable, Sequence

from sqlalchemy import Connection, Engine, text

from signer.approvals import (ApprovalInvalid, ApproverKey, ApproverRegistry, QuorumTable, approval_payload, operator_identity,
                              parse_payload, verify_approval)
from signer.bitcoin_tx import PayOutput, SignedTx, SpendInput, address_to_script, estimate_vsize, fee_for, sign_batch
from signer.ethereum_tx import sign_eip1559
from signer.keys import SignerKeys
from signer.protocol import RESERVES_PREFIX, BatchOutput, BtcCoin, RefusalCode, SigningRefused
from signer.own_addresses import (CHANGE_WINDOW, DEPOSIT_WINDOW, RECEIVE_WINDOW, bitcoin_change_scripts, bitcoin_own_scripts,
                                  ethereum_own_addresses, pays_own_address)

log = logging.getLogger(__name__)
_APPROVALS_SQL = """
SELECT id, decision_id, operator, key_id, scheme, signed_payload, signature, authenticator_data, client_data_json
FROM approval
WHERE decision_id = ANY(:d)
  AND action = 'approve'
ORDER BY id
"""
WITHDRAWAL_HOLD_OWNER = "withdrawals"  # custody.withdrawals.HOLD_OWNER: the only owner of a withdrawal's hold


class Signer:
    def __init__(self, engine: Engine, keys: SignerKeys, *, bitcoin_network: str,
                 clock: Callable[[], dt.datetime] | None = None, max_fee_rate_sat_per_kvb: int = 500_000,
                 max_eth_fee_wei: int = 10**17, deposit_window: int = DEPOSIT_WINDOW,
                 receive_window: int = RECEIVE_WINDOW, change_window: int = CHANGE_WINDOW,
                 approvers: ApproverRegistry | None = None, quorum: QuorumTable | None = None) -> None:
        self.approvers = approvers  # the only approver keys whose signatures count (None: none do)
        self.quorum = quorum  # the signer's own approvals per asset and amount (None: one for every withdrawal)
        self.deposit_window = deposit_window  # deposit indexes 0..n-1 refused as destinations (signer.own_addresses)
        self.receive_window = receive_window
        self.change_window = change_window
        self.max_fee_rate_sat_per_kvb = max_fee_rate_sat_per_kvb  # no bitcoin transaction pays more per vB
        self.max_eth_fee_wei = max_eth_fee_wei  # no ethereum transaction may spend more gas money
        self.engine = engine
        self._keys = keys
        self.bitcoin_network = bitcoin_network
        self.clock = clock or (lambda: dt.datetime.now(dt.timezone.utc))

    # ---- bitcoin --------------------------------------------------------------------------

    def sign_bitcoin_batch(self, batch_id: int, coins: Sequence[BtcCoin], outputs: Sequence[BatchOutput],
                           change: tuple[str, int] | None) -> SignedTx:
        with self.engine.connect() as c:
            try:
                self._check_batch(c, batch_id, outputs)
                self._check_coins(c, batch_id, coins)
                self._check_change_and_fee(batch_id, coins, outputs, change)
            except SigningRefused as refused:
                self._audit(batch_id, "refused", refused.code.value, None, {"message": refused.message})
                raise
        inputs = [SpendInput(k.txid, k.vout, k.amount, self._keys.private_key_for("bitcoin", "hot", k.change, k.index))
                  for k in coins]
        signed = sign_batch(inputs, [PayOutput(o.address, o.amount, o.script) for o in outputs], self.bitcoin_network,
                            change=PayOutput(*change) if change else None, rbf=True)
        self._audit(batch_id, "signed", None, signed.txid,
                    {"inputs": len(inputs), "outputs": len(outputs), "fee": signed.fee, "vsize": signed.vsize})
        return signed

    def sign_bitcoin_replacement(self, batch_id: int, replaces_txid: str, coins: Sequence[BtcCoin],
                                 outputs: Sequence[BatchOutput], change: tuple[str, int] | None) -> SignedTx:
        """Re-sign a broadcast batch at a higher fee (RBF): the same withdrawals, the same coins.

        Checked instead of live holds (they were captured when the batch was first signed): the
        version being replaced is this batch's and still pending, every withdrawal of the batch is
        signed or broadcast and its hold was captured, and the coins are the ones that version spends."""
        with self.engine.connect() as c:
            try:
                self._check_replacement(c, batch_id, replaces_txid, outputs)
                for k in coins:
                    spent = c.execute(text("SELECT t.txid FROM wallet_utxo u JOIN chain_transaction t ON t.id = u.spent_by "
                                           "WHERE u.txid = :t AND u.vout = :v AND u.reserved_by = :b"),
                                      {"t": k.txid, "v": k.vout, "b": batch_id}).scalar()
                    if spent != replaces_txid:
                        raise SigningRefused(RefusalCode.unknown_input, f"input {k.txid}:{k.vout} is not spent by {replaces_txid}")
                self._check_change_and_fee(batch_id, coins, outputs, change)
            except SigningRefused as refused:
                self._audit(batch_id, "refused", refused.code.value, None, {"message": refused.message, "replaces": replaces_txid})
                raise
        inputs = [SpendInput(k.txid, k.vout, k.amount, self._keys.private_key_for("bitcoin", "hot", k.change, k.index))
                  for k in coins]
        signed = sign_batch(inputs, [PayOutput(o.address, o.amount, o.script) for o in outputs], self.bitcoin_network,
                            change=PayOutput(*change) if change else None, rbf=True)
        self._audit(batch_id, "signed", None, signed.txid, {"replaces": replaces_txid, "fee": signed.fee, "vsize": signed.vsize})
        return signed

    def _hot_address(self, change: int, index: int) -> str:
        """A hot-wallet address derived from the signer's own keys (never taken from custody)."""
        return self._derive_address(self._keys.account_xpub("bitcoin", "hot"), change, index)

    def _derive_address(self, account_xpub: str, change: int, index: int) -> str:
        """The BIP84 address at <account>/<change>/<index> of an account-level PUBLIC key."""
        from bip_utils import Bip44Changes, Bip84, Bip84Coins

        coin = {"regtest": Bip84Coins.BITCOIN_REGTEST, "testnet": Bip84Coins.BITCOIN_TESTNET}.get(self.bitcoin_network,
                                                                                                  Bip84Coins.BITCOIN)
        chain = Bip44Changes.CHAIN_INT if change else Bip44Changes.CHAIN_EXT
        account = Bip84.FromExtendedKey(account_xpub, coin)
        if not account.IsPublicOnly():
            raise ValueError("a private extended key where a public one is expected")
        return account.Change(chain).AddressIndex(index).PublicKey().ToAddress()

    def _check_fee(self, n_inputs: int, scripts: list[bytes], fee: int) -> None:
        cap = fee_for(estimate_vsize(n_inputs, scripts), self.max_fee_rate_sat_per_kvb)
        if fee < 0 or fee > cap:
            raise SigningRefused(RefusalCode.fee_above_ceiling, f"fee {fee} sat is outside 0..{cap} for this transaction")

    def _check_change_and_fee(self, batch_id: int, coins: Sequence[BtcCoin], outputs: Sequence[BatchOutput],
                              change: tuple[str, int] | None) -> None:
        """Change may only go to this batch's own change address (derived here); the fee (inputs -
        outputs - change) may not exceed the ceiling rate for the transaction's size."""
        scripts = [o.script or address_to_script(o.address, self.bitcoin_network) for o in outputs]
        if change is not None:
            if change[0] != self._hot_address(1, batch_id):
                raise SigningRefused(RefusalCode.output_mismatch, "change must go to the batch's own hot change address")
            scripts.append(address_to_script(change[0], self.bitcoin_network))
        fee = sum(k.amount for k in coins) - sum(o.amount for o in outputs) - (change[1] if change else 0)
        self._check_fee(len(coins), scripts, fee)

    def _check_replacement(self, c: Connection, batch_id: int, replaces_txid: str, outputs: Sequence[BatchOutput]) -> None:
        halted = c.execute(text("SELECT engaged FROM control_flag WHERE name = 'withdrawals_halted'")).scalar()
        if halted:
            raise SigningRefused(RefusalCode.kill_switch_on, "withdrawals are halted by the kill switch")
        old = c.execute(text("SELECT state FROM chain_transaction WHERE txid = :t AND batch_id = :b"),
                        {"t": replaces_txid, "b": batch_id}).first()
        if old is None or old.state not in ("signed", "broadcast"):
            raise SigningRefused(RefusalCode.output_mismatch, f"{replaces_txid} is not a pending version of batch {batch_id}")
        rows = c.execute(text("SELECT w.id, w.destination, w.destination_script, w.amount, w.state, w.batch_id, "
                              "h.state AS hold_state FROM batch_output b "
                              "JOIN withdrawal_request w ON w.id = b.withdrawal_id JOIN hold h ON h.id = w.hold_id "
                              "AND h.account_id = w.account_id AND h.owner = :hold_owner "
                              "WHERE b.batch_id = :b"), {"b": batch_id, "hold_owner": WITHDRAWAL_HOLD_OWNER}).all()
        scripts = {r.id: bytes(r.destination_script or b"") for r in rows}
        if sorted((o.withdrawal_id, o.address, o.amount) for o in outputs) != sorted((r.id, r.destination, int(r.amount)) for r in rows) \
                or any(o.script and o.script != scripts[o.withdrawal_id] for o in outputs):
            raise SigningRefused(RefusalCode.output_mismatch, "a replacement must pay exactly the batch's withdrawals")
        self._check_not_own(batch_id, outputs)
        for r in rows:
            if r.state not in ("signed", "broadcast") or r.batch_id != batch_id:
                raise SigningRefused(RefusalCode.withdrawal_not_batched, f"withdrawal {r.id} is {r.state}")
            if r.hold_state not in ("captured", "released"):
                raise SigningRefused(RefusalCode.hold_not_live, f"withdrawal {r.id}: the hold was never captured")

    def sign_bitcoin_sweep(self, sweep_id: int, coins: Sequence[BtcCoin], destination: str, fee: int) -> SignedTx:
        """Sign a sweep: deposit-address coins (deposit tier, `index` = derivation index) into our own
        hot wallet. Checked first: the kill switch is off; every coin is a booked deposit reserved
        for this sweep with the amount on record; the destination is the hot wallet's receive
        address derived from the signer's own keys, so a sweep can pay nobody else."""
        with self.engine.connect() as c:
            try:
                halted = c.execute(text("SELECT engaged FROM control_flag WHERE name = 'withdrawals_halted'")).scalar()
                if halted:
                    raise SigningRefused(RefusalCode.kill_switch_on, "withdrawals and sweeps are halted by the kill switch")
                if destination != self._hot_address(0, 0):
                    raise SigningRefused(RefusalCode.output_mismatch, "a sweep pays only the hot wallet's receive address")
                rows = {(r.txid, r.output_index): r for r in c.execute(text(
                    "SELECT o.txid, o.output_index, o.amount, d.derivation_index FROM deposit_observation o "
                    "JOIN deposit_address d ON d.id = o.deposit_address_id WHERE o.swept_by = :s AND o.chain = 'bitcoin' "
                    "AND o.state IN ('credited', 'quarantined', 'released', 'returned', 'dust')"), {"s": sweep_id})}
                if len(rows) != len(coins):
                    raise SigningRefused(RefusalCode.unknown_input, "the coins differ from the deposits reserved for this sweep")
                for k in coins:
                    r = rows.get((k.txid, k.vout))
                    if r is None or int(r.amount) != k.amount or (k.change, k.index) != (0, r.derivation_index):
                        raise SigningRefused(RefusalCode.unknown_input, f"input {k.txid}:{k.vout} is not a booked deposit of this sweep")
                self._check_fee(len(coins), [address_to_script(destination, self.bitcoin_network)], fee)
            except SigningRefused as refused:
                self._audit(None, "refused", refused.code.value, None, {"sweep_id": sweep_id, "message": refused.message})
                raise
        inputs = [SpendInput(k.txid, k.vout, k.amount, self._keys.private_key_for("bitcoin", "deposit", 0, k.index))
                  for k in coins]
        signed = sign_batch(inputs, [PayOutput(destination, sum(k.amount for k in coins) - fee)], self.bitcoin_network,
                            change=None, rbf=True)
        self._audit(None, "signed", None, signed.txid, {"sweep_id": sweep_id, "inputs": len(inputs), "fee": signed.fee})
        return signed

    def sign_bitcoin_rebalance(self, rebalance_id: int, coins: Sequence[BtcCoin], destination: str, amount: int,
                               change: tuple[str, int] | None) -> SignedTx:
        """Sign a rebalance: hot-wallet coins -> `amount` to the cold wallet, `change` back to the hot
        wallet. Checked first, in this order: the kill switch is off; the rebalance is `open` on
        bitcoin; the destination is the address derived from the registered cold wallet's xpub
        (custody's `wallet` table; cold is watch-only, no private key exists here) at the index
        the rebalance recorded, and the row names that address too; the amount is the recorded
        one; the coins are exactly the unspent hot coins reserved for this rebalance, with the
        amounts and derivations on record; change goes only to the hot receive address derived
        from the signer's own keys; the fee is within the ceiling rate for the size. The cold xpub
        is read in its BIP84 serialisation (vpub on testnet/regtest, zpub on mainnet), the form
        custody stores whatever form the key was registered in (custody.wallets); a key that
        cannot be read that way is a refusal, never a crash."""
        detail = {"rebalance_id": rebalance_id}
        with self.engine.connect() as c:
            try:
                halted = c.execute(text("SELECT engaged FROM control_flag WHERE name = 'withdrawals_halted'")).scalar()
                if halted:
                    raise SigningRefused(RefusalCode.kill_switch_on, "rebalances are halted by the kill switch")
                row = c.execute(text("SELECT destination, destination_index, amount FROM rebalance WHERE id = :r "
                                     "AND chain = 'bitcoin' AND source_tier = 'hot' AND destination_tier = 'cold' "
                                     "AND state = 'open'"), {"r": rebalance_id}).first()
                if row is None:
                    raise SigningRefused(RefusalCode.rebalance_not_open, f"rebalance {rebalance_id} is not an open hot -> cold rebalance")
                cold_xpub = c.execute(text("SELECT xpub FROM wallet WHERE chain = 'bitcoin' AND tier = 'cold'")).scalar()
                try:
                    expected = self._derive_address(cold_xpub, 0, row.destination_index) if cold_xpub else None
                except Exception:  # noqa: BLE001 - an unreadable cold key is a refusal, not a crash
                    expected = None
                if expected is None or destination != expected or row.destination != expected:
                    raise SigningRefused(RefusalCode.destination_not_cold,
                                         f"{destination} is not the registered cold wallet's address {row.destination_index}")
                if amount != int(row.amount):
                    raise SigningRefused(RefusalCode.output_mismatch, f"amount {amount} is not the rebalance's {int(row.amount)}")
                reserved = {(r.txid, r.vout): r for r in c.execute(text(
                    "SELECT txid, vout, amount, derivation_change, derivation_index FROM wallet_utxo "
                    "WHERE rebalance_id = :r AND spent_by IS NULL AND reserved_by IS NULL"), {"r": rebalance_id})}
                if len(reserved) != len(coins) or len({(k.txid, k.vout) for k in coins}) != len(coins):
                    raise SigningRefused(RefusalCode.unknown_input, "the coins differ from the hot coins reserved for this rebalance")
                for k in coins:
                    r = reserved.get((k.txid, k.vout))
                    if r is None or int(r.amount) != k.amount or (r.derivation_change, r.derivation_index) != (k.change, k.index):
                        raise SigningRefused(RefusalCode.unknown_input, f"input {k.txid}:{k.vout} is not reserved for this rebalance")
                scripts = [address_to_script(destination, self.bitcoin_network)]
                if change is not None:
                    if change[0] != self._hot_address(0, 0):
                        raise SigningRefused(RefusalCode.output_mismatch, "rebalance change goes only to the hot receive address")
                    scripts.append(address_to_script(change[0], self.bitcoin_network))
                self._check_fee(len(coins), scripts, sum(k.amount for k in coins) - amount - (change[1] if change else 0))
            except SigningRefused as refused:
                self._audit(None, "refused", refused.code.value, None, {**detail, "message": refused.message})
                raise
        inputs = [SpendInput(k.txid, k.vout, k.amount, self._keys.private_key_for("bitcoin", "hot", k.change, k.index))
                  for k in coins]
        signed = sign_batch(inputs, [PayOutput(destination, amount)], self.bitcoin_network,
                            change=PayOutput(*change) if change else None, rbf=True)
        self._audit(None, "signed", None, signed.txid, {**detail, "inputs": len(inputs), "amount": amount, "fee": signed.fee})
        return signed

    # ---- proof of reserves ----------------------------------------------------------------

    RESERVES_PREFIX = RESERVES_PREFIX

    def sign_reserves_message(self, tier: str, change: int, index: int, message: str) -> tuple[bytes, bytes]:
        """Sign a proof-of-reserves statement with a bitcoin key: (compressed public key, DER
        signature over SHA-256 of the UTF-8 message). Only messages starting with RESERVES_PREFIX
        are signed, so this can never be made to sign a transaction digest."""
        import hashlib

        from coincurve import PrivateKey

        if not message.startswith(self.RESERVES_PREFIX):
            raise SigningRefused(RefusalCode.output_mismatch, "only proof-of-reserves statements are signed here")
        key = PrivateKey(self._keys.private_key_for("bitcoin", tier, change, index))
        digest = hashlib.sha256(message.encode()).digest()
        return key.public_key.format(compressed=True), key.sign(digest, hasher=None)

    # ---- ethereum -------------------------------------------------------------------------

    def sign_ethereum_payment(self, batch_id: int, output: BatchOutput, *, hot_index: int, chain_id: int, nonce: int,
                              to: str, value: int, data: bytes, gas: int, max_fee_wei: int, priority_fee_wei: int,
                              replaces_txid: str | None = None):
        """Sign the one transaction paying `output` (ether: to=destination; ERC-20: to=token, data=transfer).
        With `replaces_txid`, a same-nonce replacement of that pending version at a higher fee."""
        with self.engine.connect() as c:
            try:
                if replaces_txid is None:
                    self._check_batch(c, batch_id, [output])
                else:
                    self._check_replacement(c, batch_id, replaces_txid, [output])
                    old_nonce = c.execute(text("SELECT nonce FROM chain_transaction WHERE txid = :t"), {"t": replaces_txid}).scalar()
                    if old_nonce != nonce:
                        raise SigningRefused(RefusalCode.output_mismatch, "a replacement must reuse the nonce it replaces")
                self._check_eth_call(c, output, to, value, data)
                if gas * max_fee_wei > self.max_eth_fee_wei or priority_fee_wei > max_fee_wei:
                    raise SigningRefused(RefusalCode.fee_above_ceiling,
                                         f"gas x max fee {gas * max_fee_wei} wei is above the cap {self.max_eth_fee_wei}")
            except SigningRefused as refused:
                self._audit(batch_id, "refused", refused.code.value, None, {"message": refused.message})
                raise
        signed = sign_eip1559(self._keys.private_key_for("ethereum", "hot", 0, hot_index), chain_id=chain_id, nonce=nonce,
                              to=to, value=value, data=data, gas=gas, max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei)
        self._audit(batch_id, "signed", None, signed.txid, {"nonce": nonce, "max_fee_wei": max_fee_wei})
        return signed

    # ---- checks ---------------------------------------------------------------------------

    @staticmethod
    def _check_eth_call(c: Connection, output: BatchOutput, to: str, value: int, data: bytes) -> None:
        """The transaction must do exactly what the withdrawal says, rebuilt here from the database:
        ether: to = destination, value = amount, no data; ERC-20: to = the asset's token contract,
        value 0, data = transfer(destination, amount)."""
        from signer.ethereum_tx import erc20_transfer_data

        w = c.execute(text("SELECT w.destination, w.amount, a.contract_address FROM withdrawal_request w "
                           "JOIN chain_asset a ON a.asset = w.asset WHERE w.id = :w"), {"w": output.withdrawal_id}).one()
        if w.contract_address:
            expected = (w.contract_address.lower(), 0, erc20_transfer_data(w.destination, int(w.amount)))
        else:
            expected = (w.destination.lower(), int(w.amount), b"")
        if (to.lower(), value, bytes(data)) != expected:
            raise SigningRefused(RefusalCode.output_mismatch, f"the transaction does not do what withdrawal {output.withdrawal_id} says")

    def _check_batch(self, c: Connection, batch_id: int, outputs: Sequence[BatchOutput]) -> None:
        halted = c.execute(text("SELECT engaged FROM control_flag WHERE name = 'withdrawals_halted'")).scalar()
        if halted:
            raise SigningRefused(RefusalCode.kill_switch_on, "withdrawals are halted by the kill switch")
        if not outputs:
            raise SigningRefused(RefusalCode.empty_batch, f"batch {batch_id} has no outputs")
        rows = c.execute(
            text("SELECT w.id, w.account_id, w.chain, w.asset, w.amount, w.fee_quoted, w.destination, w.destination_script, "
                 "w.requested_by, w.state, w.batch_id, w.decision_id, w.return_of_deposit, h.state AS hold_state, h.amount - h.captured - h.released AS hold_remaining, "
                 "d.id AS d_id, d.outcome, d.required_approvals, d.reasons, d.policy_version, d.decided_at, d.expires_at, "
                 "a.kind AS account_kind "
                 "FROM batch_output b JOIN withdrawal_request w ON w.id = b.withdrawal_id "
                 "JOIN account a ON a.id = w.account_id "
                 "LEFT JOIN hold h ON h.id = w.hold_id AND h.account_id = w.account_id AND h.owner = :hold_owner "
                 "LEFT JOIN policy_decision d ON d.id = w.decision_id AND d.withdrawal_id = w.id "
                 "WHERE b.batch_id = :b"), {"b": batch_id, "hold_owner": WITHDRAWAL_HOLD_OWNER}).all()
        by_id = {r.id: r for r in rows}
        if sorted(o.withdrawal_id for o in outputs) != sorted(by_id):
            raise SigningRefused(RefusalCode.output_mismatch, "outputs and the batch's withdrawals differ")
        denied = {a.lower() for a in c.execute(text("SELECT address FROM denylist_address WHERE lower(address) = ANY(:d)"),
                                              {"d": [r.destination.lower() for r in rows]}).scalars()}
        if denied:
            raise SigningRefused(RefusalCode.destination_denied, f"denylisted destination(s): {sorted(denied)}")
        self._check_not_own(batch_id, outputs)
        approvals: dict[int, list] = {}
        for a in c.execute(text(_APPROVALS_SQL), {"d": [r.decision_id for r in rows if r.decision_id is not None]}):
            approvals.setdefault(a.decision_id, []).append(a)
        now = self.clock()
        for o in outputs:
            w = by_id[o.withdrawal_id]
            if (o.address, o.amount) != (w.destination, int(w.amount)) or (
                    o.script and o.script != bytes(w.destination_script or b"")):
                raise SigningRefused(RefusalCode.output_mismatch, f"output for withdrawal {w.id} does not match it")
            if w.state != "batched" or w.batch_id != batch_id:
                raise SigningRefused(RefusalCode.withdrawal_not_batched, f"withdrawal {w.id} is {w.state}")
            self._check_decision(w, approvals.get(w.decision_id, []), now)
            if w.hold_state != "pending" or int(w.hold_remaining) < int(w.amount) + int(w.fee_quoted):
                raise SigningRefused(RefusalCode.hold_not_live, f"withdrawal {w.id}: the hold is {w.hold_state}")

    def _check_not_own(self, batch_id: int, outputs: Sequence[BatchOutput]) -> None:
        """Refuse an output paying an address derived from the signer's own keys (module table of
        signer.own_addresses); the change output is not among `outputs` and is checked on its own."""
        tiers = ("deposit", "hot", "warm")
        btc = bitcoin_own_scripts({t: self._keys.account_xpub("bitcoin", t) for t in tiers}, self.bitcoin_network,
                                  receive_window=self.receive_window, deposit_window=self.deposit_window)
        btc |= bitcoin_change_scripts(self._keys.account_xpub("bitcoin", "hot"), self.bitcoin_network, batch_id,
                                      self.change_window)
        eth = ethereum_own_addresses({t: self._keys.account_xpub("ethereum", t) for t in tiers},
                                     receive_window=self.receive_window, deposit_window=self.deposit_window)
        for o in outputs:
            if pays_own_address(o.address, o.script, bitcoin_scripts=btc, ethereum_addresses=eth, network=self.bitcoin_network):
                raise SigningRefused(RefusalCode.destination_internal,
                                     f"output for withdrawal {o.withdrawal_id} pays {o.address}, an address of the signer's own keys")

    def _check_decision(self, w, approvals: list, now: dt.datetime) -> None:
        """The decision and its approvals, as the module table orders them: every approval row must
        be a valid signature of a known key over the payload rebuilt here; quorum from the signer's
        own table and registry."""
        if w.decision_id is None or w.d_id is None:
            raise SigningRefused(RefusalCode.no_decision, f"withdrawal {w.id} has no policy decision")
        expected = approval_payload(withdrawal_id=w.id, chain=w.chain, asset=w.asset, amount=int(w.amount),
                                    destination=w.destination, decision_id=w.d_id, policy_version=w.policy_version,
                                    expires_at=w.expires_at)
        operators = {operator_identity(self._approver(w.id, a, expected).operator) for a in approvals}
        eligible = operators - {operator_identity(w.requested_by)}
        if w.outcome not in ("approve", "needs_approval"):
            raise SigningRefused(RefusalCode.decision_not_approved, f"withdrawal {w.id}: the decision is {w.outcome}")
        required = w.required_approvals if w.outcome == "needs_approval" else 0
        try:
            required = max(required, self.quorum.required(w.asset, int(w.amount)) if self.quorum is not None else 1)
        except ApprovalInvalid as exc:
            raise SigningRefused(RefusalCode.decision_not_approved, f"withdrawal {w.id}: {exc.message}") from None
        if w.account_kind != "customer" and (w.account_kind != "quarantine" or w.return_of_deposit is None):
            raise SigningRefused(RefusalCode.decision_not_approved,
                                 f"withdrawal {w.id} from a {w.account_kind} account: only customer withdrawals and "
                                 "quarantine returns are paid")
        if w.account_kind != "customer":
            required = max(required, 1)
        if len(eligible) < required:
            raise SigningRefused(RefusalCode.decision_not_approved,
                                 f"withdrawal {w.id}: {len(eligible)} valid approval(s) of operators other than the "
                                 f"requester, {required} required")
        if now >= w.expires_at:
            raise SigningRefused(RefusalCode.decision_expired, f"withdrawal {w.id}: decision expired {w.expires_at.isoformat()}")

    def _approver(self, wid: int, a, expected: bytes) -> ApproverKey:
        """The registry key whose signature approval row `a` carries, or the refusal (module table)."""
        if a.signature is None or a.signed_payload is None or a.key_id is None:
            raise SigningRefused(RefusalCode.approval_unsigned, f"withdrawal {wid}: approval {a.id} ({a.operator!r}) is not signed")
        payload = bytes(a.signed_payload)
        try:
            key = verify_approval(self.approvers, a.key_id, a.scheme, payload, bytes(a.signature),
                                  None if a.authenticator_data is None else bytes(a.authenticator_data),
                                  None if a.client_data_json is None else bytes(a.client_data_json))
        except ApprovalInvalid as exc:
            code = RefusalCode.approver_unknown if exc.code == "approver_unknown" else RefusalCode.approval_signature_invalid
            raise SigningRefused(code, f"withdrawal {wid}: approval {a.id}: {exc.message}") from None
        if payload != expected:
            named = (parse_payload(payload) or {}).get("withdrawal_id", wid)
            if named != wid:
                raise SigningRefused(RefusalCode.approval_replayed,
                                     f"withdrawal {wid}: approval {a.id} is {key.key_id!r}'s signature for withdrawal {named}")
            raise SigningRefused(RefusalCode.approval_payload_mismatch,
                                 f"withdrawal {wid}: approval {a.id} by {key.key_id!r} signs another payload than the signer rebuilds")
        return key

    @staticmethod
    def _check_coins(c: Connection, batch_id: int, coins: Sequence[BtcCoin]) -> None:
        known = {(r.txid, r.vout): r for r in c.execute(
            text("SELECT txid, vout, amount, derivation_change, derivation_index, reserved_by, spent_by FROM wallet_utxo "
                 "WHERE reserved_by = :b"), {"b": batch_id})}
        for k in coins:
            row = known.get((k.txid, k.vout))
            if (row is None or row.spent_by is not None or int(row.amount) != k.amount
                    or (row.derivation_change, row.derivation_index) != (k.change, k.index)):
                raise SigningRefused(RefusalCode.unknown_input, f"input {k.txid}:{k.vout} is not a reserved hot-wallet coin")

    def _audit(self, batch_id: int, outcome: str, code: str | None, txid: str | None, detail: dict) -> None:
        with self.engine.begin() as c:
            c.execute(text("INSERT INTO signer_audit (batch_id, outcome, code, txid, detail) VALUES (:b, :o, :c, :t, CAST(:d AS jsonb))"),
                      {"b": batch_id, "o": outcome, "c": code, "t": txid, "d": json.dumps(detail)})
        if code:
            log.warning("signer refused batch %s: %s", batch_id, code)
