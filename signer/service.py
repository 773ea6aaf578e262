"""The signer's narrow interface: sign a withdrawal batch, or refuse with a code.

The signer trusts nothing custody says about a batch, and nothing custody can write. Before it
signs a withdrawal batch it re-reads, itself, from the database (read-only, except its own tables):
- the kill switch (`control_flag.withdrawals_halted`) is off;
- every output pays exactly one withdrawal of this batch, its destination and amount, and its
  output script is the one the SIGNER computes from that destination (`address_to_script`), never
  the `destination_script` column; every withdrawal of the batch has an output;
- each withdrawal's asset is in the signer's OWN asset table (`assets`, signer.assets: chain, token
  contract), on the chain of the transaction; the ERC-20 contract and the ethereum chain id
  (`ethereum_chain_id`) come from the signer's configuration, never from `chain_asset`;
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
- every input is an unspent coin of our hot wallet reserved for this batch;
- what the signer ITSELF recorded (`signer_signature`, its own table, migration 0021): a
  withdrawal it already signed is signed again only by a transaction that conflicts with every
  earlier one (bitcoin: spends an outpoint that each earlier transaction of that withdrawal spends,
  as a re-sign after a crash or a fee bump does; ethereum: the same chain id, sender and nonce), so
  at most one of them can ever confirm, and that pays exactly the asset, amount and destination
  recorded for it (a re-sign never pays more than what was first signed and counted); and value
  signed without any approval stays within the per-asset window cap (`unapproved_limits`).
Then it signs with the hot wallet keys (which never leave this package and are never logged) and,
in the same database transaction, writes one `signer_signature` row per withdrawal (the
outpoints, or sender, nonce and chain id) and its `signer_audit` row. Each request holds a
transaction-scoped advisory lock per withdrawal (`pg_advisory_xact_lock`; the signer role cannot
SELECT FOR UPDATE) from its first check to that commit, so two concurrent requests for one
withdrawal are decided one after the other, the second seeing the first's record. A request that
adds value signed without approvals then takes one more lock per asset
(`signer_unapproved:<asset>`, after its withdrawal locks, assets sorted: one lock order, no
deadlock) before it reads what the window holds, so two such requests for different withdrawals
cannot both pass the cap on the same headroom.

Every request transaction runs with `SET LOCAL lock_timeout` (`LOCK_TIMEOUT`, 10 s). The lock keys
are public (custody's roles can take the same advisory locks), so a custody process holding one
would otherwise park a signer thread forever; instead the lock wait fails with PostgreSQL's
lock_not_available, which surfaces as sqlalchemy's OperationalError: not a refusal (nothing is
audited, nothing was decided), answered by the signer process as `unavailable`
(signer.server/wire), which custody's jobs retry next run.

A fee-bump replacement (`sign_bitcoin_replacement`, `sign_ethereum_payment(replaces_txid=...)`) is
checked against the signer's own record of the version it replaces, never against
`chain_transaction`, `wallet_utxo.spent_by` or the hold's state: that version must be one the
signer signed for this batch, and the replacement must pay exactly the withdrawals, destinations and
amounts it paid and spend exactly its inputs (bitcoin) or use exactly its nonce, sender and chain id
(ethereum). The approvals are verified again over the payload rebuilt from the rows, which must
still equal what was signed; only the decision's expiry is NOT re-checked: the version being
replaced was signed while the decision was live (the record proves it), the replacement pays the
same and can never confirm beside it, and a fee bump of a payment already on the wire must not
wait for a new decision. The withdrawal must still be `signed` or `broadcast` in the batch.
The same holds for a re-sign of a batch the signer already signed (a signature it recorded whose
reply custody lost, or never stored): a withdrawal with a record in this batch is not refused
`decision_expired`, since the record proves it was signed while live and the new transaction must
conflict with that one (`already_signed` otherwise), so at most one of them can ever confirm.

Refusal codes (`RefusalCode`), in the order they are checked. A refusal about ONE withdrawal of a
new batch (its output, asset, destination, state, decision, approvals or hold) names it
(`SigningRefused.withdrawal_id`, set in one place: `_about`); custody then takes that withdrawal out
of the batch and signs the rest (custody.payouts `drop_refused`). The others name none:
| code | meaning |
| --- | --- |
| kill_switch_on | withdrawals are halted |
| chain_id_mismatch | an ethereum transaction for another chain id than the signer's own `ethereum_chain_id` (or none is configured) |
| empty_batch | the batch pays nothing |
| replacement_unknown | a CPFP child replacing a child the signer did not sign for that parent output, or not at a higher fee; a replacement of a version the signer never signed for this batch (or ethereum funding, sweep or rebalance), or one with other inputs (bitcoin) or another nonce, sender, chain id or gas limit (ethereum) than that version; an ethereum funding, sweep or rebalance replacement that does not raise both fees by at least 10% |
| output_mismatch | an output does not match exactly one withdrawal of the batch (address, amount, or a script other than the one the signer computes from the address), or a replacement pays other withdrawals, destinations or amounts than the version it replaces; the ethereum call is not the one the signer builds; change not to the batch's own change address; an ethereum funding, sweep or rebalance replacement paying another destination, asset or amount than the version it replaces |
| asset_unknown | a withdrawal's asset is not in the signer's own asset table, or that table puts it on another chain than the transaction's |
| destination_denied | a destination is on the denylist now (checked again at signing) |
| destination_internal | an output pays an address the signer derives from its own keys (hot receive and sender, hot change around the batch id, deposit and warm windows; signer.own_addresses), checked right after the denylist |
| withdrawal_not_batched | a withdrawal is not in state `batched` in this batch (`signed` or `broadcast` for a replacement) |
| no_decision | a withdrawal has no policy decision |
| payload_unprintable | the approval payload the signer rebuilds holds a Unicode control or format character (category Cc, Cf, Zl or Zp: ESC, CR, bidi overrides...) in its chain, asset, destination or policy version, which could redraw or reorder what an approver's screen shows (signer.approvals); refused whatever the approvals |
| approval_unsigned | an approval row of the decision carries no signature (inserted underneath custody, or written before approvals were signed) |
| approver_unknown | an approval is signed by a key the signer is not configured with |
| approval_signature_invalid | an approval's signature does not verify over its stored payload (a payload altered after signing; a scheme other than the key's; a failed WebAuthn assertion) |
| approval_replayed | a valid signature whose payload names another withdrawal |
| approval_payload_mismatch | a valid signature for this withdrawal over a payload that differs from the one the signer rebuilds (another amount, destination, chain, asset, decision, policy version or expiry) |
| decision_not_approved | the decision rejects, or the distinct operators of valid approvals (never the requester) are fewer than the larger of the decision's quorum and the signer's own quorum table's (an asset or amount the table does not cover is refused); a withdrawal from a non-customer account is a quarantine return naming its deposit, or is refused, and always needs one operator other than the requester |
| decision_expired | the decision is past its expiry (not checked for a replacement, nor for a withdrawal the signer already signed in this batch: see above) |
| hold_not_live | the hold is not pending, does not cover amount + fee, is on another account or is not custody's withdrawal hold (a replacement: the hold was never captured) |
| unknown_input | an input is not an unspent hot-wallet coin reserved for this batch; a CPFP parent that is not the rebalance's transaction, or whose output spent does not pay the hot receive address |
| fee_above_ceiling | the fee is above the ceiling rate for the transaction's size (bitcoin) or gas x max fee above the cap (ethereum) |
| already_signed | a second CPFP child of a parent output (not the one recorded), or a replacement of a child already replaced; an ethereum funding, sweep or rebalance version the signer already replaced, asked to be replaced at other fees (one replacement per version; the same request again is answered with the same transaction); the signer already signed this withdrawal in a transaction this one does not conflict with (bitcoin: no outpoint common to all; ethereum: another chain id, sender or nonce; or another chain): both could confirm; or one that pays another asset, amount or destination than what it recorded for it (a re-sign pays exactly what was first signed, so a row raised after a small unapproved signature cannot ride the first one past the cap); an ethereum withdrawal at a hot nonce a gas funding took; a gas funding at a hot nonce taken, of a sweep funded at another nonce, or of a deposit address holding a funding no signed sweep used yet |
| unapproved_limit_reached | a withdrawal with no valid approval would take the value the signer signed without approvals for its asset within the window above its cap (`unapproved_limits`; an asset the table does not list has cap 0); read under a per-asset advisory lock, so two requests cannot both pass on the same headroom |
| rebalance_not_open | a CPFP child's rebalance is not a bitcoin move into hot `signed` or `broadcast`; a rebalance is unknown, of another chain, not in state `open` (a replacement: not `signed` or `broadcast`, or the version it replaces is not the row's), or not hot -> cold, hot -> warm or warm -> hot |
| destination_not_cold | a rebalance to cold pays an address that is not derived at its index from the cold wallet public key the signer is configured with (`cold_xpubs`; none configured: every such rebalance is refused); to warm or hot, the same mismatch is `output_mismatch` |
| rebalance_not_approved | a warm -> hot refill carries fewer signed approvals of distinct operators (verified against the signer's own registry over the `rebalance-approval` payload it rebuilds) than the larger of the row's `approvals_required` and `rebalance_quorum` |
| sweep_not_open | an ethereum sweep (or the sweep a gas funding is for) is unknown, not `open` (a sweep's replacement: not `signed` or `broadcast`), or its row names another deposit index, address, asset, amount or nonce than the request; a gas funding for a sweep of ether (only token sweeps are funded) |
| nonce_gap | an ethereum sweep's deposit-address nonce is not the one after the last the signer itself signed from that address (0 for the first): a gap would block every later sweep of it, and a nonce already used would make two sweeps of which one cannot be mined; a gas funding for a sweep not at that nonce, or at a hot nonce more than one past the highest the signer recorded from the hot address |
| statement_invalid | `sign_reserves_message` was given anything but a proof-of-reserves statement of the fixed grammar (signer.protocol.ReservesStatement) for the chain asked, naming the address of the very key asked for |

Sweeps and rebalances (firm-internal moves) are checked instead against their own reservations:
the kill switch, the coins reserved for that row, a destination that is ours (the hot receive
address for a sweep and for a warm -> hot refill; to cold, the cold wallet key pinned in the
signer's own configuration; to warm, the signer's own warm key; never the `wallet` table), change
only to the source tier's own address (hot receive; warm at the row's change index), and the fee
ceiling. A warm -> hot refill also needs the signed approvals of `rebalance_quorum` distinct
operators (payload kind `rebalance-approval`, signer.approvals), verified here against the signer's
own approver keys, whatever custody's rows say. A fee bump of a sweep is the same request at a
higher fee over the same reserved coins; of a rebalance, `replaces_txid` names the row's version.
The cold tier is never signed here: cold -> hot goes through a PSBT signed offline (custody.psbt).
A stuck move into hot that cannot be re-signed (cold source, or no change) is bumped by a CPFP
child (`sign_bitcoin_cpfp`, custody.cpfp), checked against what the signer reads and holds
itself: the parent's bytes (it computes their txid, which must be the rebalance's: a bitcoin move
into hot, `signed` or `broadcast`, else `rebalance_not_open`), the output spent, which must pay the
hot receive address of its own hot key (`unknown_input`), one input and one output to that same
address (`output_mismatch`), a fee of at most the ceiling rate over parent + child
(`fee_above_ceiling`), and its own record `signer_cpfp` (migration 0046): one child per parent
output (another new one: `already_signed`; the same one again is answered with the same
transaction), replaced only by naming the latest child at a higher fee (`replacement_unknown`; a
child already replaced: `already_signed`). At worst a forged row makes it move a hot coin to the
same hot address once per parent output, paying a fee within its ceiling.

Ethereum sweeps (custody.eth_sweeps) are two calls; the signer BUILDS each transaction itself from
its own keys and asset table, so custody cannot name another destination, contract or calldata:
- `sign_ethereum_sweep`: sender = the deposit key at `deposit_index` (derived here), destination =
  the hot address derived here (ethereum hot account, index 0): ether as the value, or a token's
  `transfer(hot, amount)` to the contract of the signer's OWN asset table. Checked, in order:
  kill switch, chain id, asset (`asset_unknown`), the `eth_sweep` row (`sweep_not_open`), a token
  amount equal to the booked deposits reserved for the sweep at that address (`output_mismatch`),
  the fee cap, then the nonce against the signer's OWN record (`signer_eth_sweep`): a sweep it
  signed before is signed again only at the same chain id and nonce (`already_signed`: one of the
  two can be mined), a new one only at the next nonce of that address (`nonce_gap`).
- `sign_ethereum_gas_funding`: sender = the hot key, destination = the deposit address derived
  here at `deposit_index`, value at most the gas its token sweep may burn (that row's gas limit x
  max fee, within the fee cap) (`output_mismatch`), and only for an open token sweep whose amount
  equals the booked deposits reserved for it at that address (`output_mismatch`). From the
  signer's own record (`signer_eth_sweep`), a first funding of a sweep is signed only when: the
  sweep's nonce is the next the signer may sign from that deposit address (`nonce_gap`); the
  address holds no funding of another sweep that no sweep the signer signed has used yet
  (`already_signed`): so at most one funding per (deposit address, next sweep nonce), and every
  funding but the last of an address was followed by a signed sweep of its booked deposits; the
  hot nonce is at most one past the highest the signer recorded from the hot address,
  withdrawals and fundings (`nonce_gap`; 0 when none: a hot address with history from before
  the record needs its record first). One funding per sweep: a second at another nonce is
  `already_signed`, and so is a hot nonce the signer already signed a withdrawal or another
  funding at; `sign_ethereum_payment` refuses a hot nonce a funding took (`already_signed`).
  Fundings and ethereum withdrawals take one advisory lock per hot address, so the two checks
  cannot pass side by side.
Ethereum rebalances (custody.eth_rebalances): `sign_ethereum_rebalance` BUILDS the transfer from the
hot key to its own warm address (account "warm", 0/0) or to the cold address pinned in its own
configuration (`cold_addresses`; none: `destination_not_cold`), or, `destination_tier` hot, from
the warm key to the hot address after verifying the refill's signed approvals itself
(`rebalance_not_approved`); the row must be that open move (`rebalance_not_open`); the sender's
nonce is checked against every record it holds for that address (`signer_signature`, gas
fundings, `signer_eth_rebalance`): a re-sign only at the recorded nonce, a new one never at a used
nonce (`already_signed`) nor above the highest + 1 (`nonce_gap`). Method docstring for the order.
Fee bumps of those (custody.eth_moves): the same three methods with `replaces_txid`, a same-nonce
replacement of the version the signer recorded under that txid for that row. The signer rebuilds
the transaction as before and compares it with ITS record of that version (`signer_eth_sweep`,
`signer_eth_rebalance`, which since migration 0045 keep the gas limit and both fees): the same
chain id, sender, nonce and gas limit (`replacement_unknown`), the same destination, asset and
amount (`output_mismatch`), both fees raised by at least 10% (`replacement_unknown`) and within the
cap (`fee_above_ceiling`); the row `signed` or `broadcast` (a funding's sweep still `open`). One
replacement per version: the same request again (a crash after the signer answered) is signed
again (RFC 6979: the same txid) and recorded once; other fees are `already_signed`.
What the signer trusts: its keys, its own asset table, chain id and fee cap, and its own record of
what it signed. What it reads from custody's rows only as a consistency check: the sweep row and
the reserved deposits. A forged row can at worst make it sweep a wrong amount, always to our hot
address, or fund gas up to the fee cap once per deposit address and booked deposits there (the
next funding of that address needs a signed sweep of the first's first), always to an address of
its own keys; ether the hot address sends a deposit address is never credited as a deposit
(custody.deposits). It has no node: an ether sweep's value is not checked against the balance
(too much is refused by the node, too little leaves ether at the deposit address, booked there).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from bip_utils import P2WPKHAddrEncoder
from coincurve import PrivateKey
from sqlalchemy import Connection, Engine, text

from signer import bip322, eip191
from signer.approvals import (ApprovalInvalid, ApproverKey, ApproverRegistry, QuorumTable, approval_payload, operator_identity,
                              parse_payload, rebalance_approval_payload, unprintable_fields, verify_stored_approval)
from signer.assets import DEFAULT_ASSETS, SignerAsset, UnapprovedLimit
from signer.bitcoin_tx import (PayOutput, SignedTx, SpendInput, address_to_script, dust_threshold, estimate_vsize, fee_for,
                               parse_transaction, sign_batch)
from signer.errors import SignerError
from signer.ethereum_tx import SignedEthTx, erc20_transfer_data, sign_eip1559
from signer.keys import SignerKeys
from signer.protocol import BatchOutput, BtcCoin, RefusalCode, ReservesSignature, ReservesStatement, SigningRefused
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
_WITHDRAWALS_SQL = """
SELECT w.id, w.account_id, w.chain, w.asset, w.amount, w.fee_quoted, w.destination, w.requested_by, w.state, w.batch_id,
       w.decision_id, w.return_of_deposit,
       h.state AS hold_state, h.amount - h.captured - h.released AS hold_remaining,
       d.id AS d_id, d.outcome, d.required_approvals, d.policy_version, d.expires_at,
       a.kind AS account_kind
FROM withdrawal_request w
JOIN account a ON a.id = w.account_id
LEFT JOIN hold h ON h.id = w.hold_id AND h.account_id = w.account_id AND h.owner = :hold_owner
LEFT JOIN policy_decision d ON d.id = w.decision_id AND d.withdrawal_id = w.id
WHERE w.id = ANY(:w)
"""
_SIGNATURES_SQL = """
SELECT withdrawal_id, batch_id, chain, asset, amount, destination, txid, approvals, inputs, sender, nonce, chain_id
FROM signer_signature
WHERE withdrawal_id = ANY(:w)
ORDER BY id
"""
_VERSION_SQL = """
SELECT withdrawal_id, chain, asset, amount, destination, inputs, sender, nonce, chain_id
FROM signer_signature
WHERE batch_id = :b
  AND txid = :t
ORDER BY id
"""
_RESIGN_SQL = """
SELECT DISTINCT withdrawal_id
FROM signer_signature
WHERE batch_id = :b
  AND withdrawal_id = ANY(:w)
"""
_UNAPPROVED_SQL = """
SELECT coalesce(sum(amount), 0)
FROM (SELECT DISTINCT withdrawal_id, amount
      FROM signer_signature
      WHERE asset = :a
        AND approvals = 0
        AND signed_at > :since) s
"""
# One row per paid withdrawal (the arrays, in the order paid), in one statement; what the request
# signed as a whole (time, batch, txid, inputs or ethereum slot) is the same on every row.
_INSERT_SIGNATURE_SQL = """
INSERT INTO signer_signature (signed_at, withdrawal_id, batch_id, chain, asset, amount, destination, txid, replaces_txid,
                              approvals, inputs, sender, nonce, chain_id)
SELECT CAST(:at AS timestamptz), p.w, CAST(:b AS bigint), p.chain, p.asset, p.amount, p.dest, CAST(:txid AS text),
       CAST(:replaces AS text), p.approvals, CAST(:inputs AS text[]), CAST(:sender AS text), CAST(:nonce AS numeric),
       CAST(:chain_id AS bigint)
FROM unnest(CAST(:w AS bigint[]), CAST(:chain AS text[]), CAST(:asset AS text[]), CAST(:amount AS numeric[]),
            CAST(:dest AS text[]), CAST(:approvals AS integer[])) WITH ORDINALITY AS p(w, chain, asset, amount, dest, approvals, n)
ORDER BY p.n
"""
# the signer's own record of the CPFP children it signed of one parent output (custody.cpfp)
_CPFP_RECORDS_SQL = text("""
SELECT txid, fee, replaces_txid FROM signer_cpfp WHERE parent_txid = :t AND parent_vout = :v ORDER BY id
""")
_INSERT_CPFP_SQL = text("""
INSERT INTO signer_cpfp (signed_at, rebalance_id, parent_txid, parent_vout, txid, fee, replaces_txid)
VALUES (:at, :r, :t, :v, :txid, :f, :rep)
""")
_ETH_SWEEP_ROW_SQL = text("""
SELECT asset, address, deposit_index, nonce, amount, gas_limit, max_fee_wei, max_fee_cap_wei, state
FROM eth_sweep
WHERE id = :s
""")
_ETH_SWEEP_RESERVED_SQL = text("""
SELECT coalesce(sum(amount), 0)
FROM deposit_observation
WHERE eth_swept_by = :s
  AND chain = 'ethereum'
  AND asset = :a
  AND lower(address) = lower(:addr)
  AND state IN ('credited', 'quarantined', 'released', 'returned', 'dust')
""")
_ETH_SWEEP_RECORDS_SQL = text("""
SELECT chain_id, sender, nonce, txid
FROM signer_eth_sweep
WHERE kind = :k
  AND sweep_id = :s
""")
_ETH_SENDER_SWEEPS_SQL = text("""
SELECT sweep_id, chain_id, nonce
FROM signer_eth_sweep
WHERE kind = 'sweep'
  AND lower(sender) = lower(:a)
""")
_HOT_NONCE_TAKEN_SQL = text("""
SELECT txid FROM signer_signature
WHERE chain = 'ethereum' AND chain_id = :ci AND lower(sender) = lower(:a) AND nonce = :n
UNION ALL
SELECT txid FROM signer_eth_sweep
WHERE kind = 'gas' AND chain_id = :ci AND lower(sender) = lower(:a) AND nonce = :n AND sweep_id <> :s
UNION ALL
SELECT txid FROM signer_eth_rebalance
WHERE chain_id = :ci AND lower(sender) = lower(:a) AND nonce = :n
LIMIT 1
""")
# the highest hot-address nonce the signer recorded (withdrawals, gas fundings, rebalances): a
# funding is signed at most one past it (R15-S6), never leaving a gap the hot address cannot fill
_HOT_NONCE_MAX_SQL = text("""
SELECT max(nonce) FROM (
    SELECT nonce FROM signer_signature WHERE chain = 'ethereum' AND chain_id = :ci AND lower(sender) = lower(:a)
    UNION ALL
    SELECT nonce FROM signer_eth_sweep WHERE kind = 'gas' AND chain_id = :ci AND lower(sender) = lower(:a)
    UNION ALL
    SELECT nonce FROM signer_eth_rebalance WHERE chain_id = :ci AND lower(sender) = lower(:a)
) n
""")
# a gas funding the signer gave deposit address :d for another sweep than :s, which no sweep it
# signed from :d has used yet (R15-S1: one funding per deposit address and sweep nonce)
_UNUSED_FUNDING_SQL = text("""
SELECT g.sweep_id, g.txid FROM signer_eth_sweep g
WHERE g.kind = 'gas'
  AND lower(g.destination) = lower(:d)
  AND g.sweep_id <> :s
  AND NOT EXISTS (SELECT 1 FROM signer_eth_sweep w WHERE w.kind = 'sweep' AND w.sweep_id = g.sweep_id
                  AND lower(w.sender) = lower(:d))
LIMIT 1
""")
# a gas funding or a rebalance the signer signed at this hot slot (R15-S2: a withdrawal is never
# signed there)
_HOT_NONCE_FUNDED_SQL = text("""
SELECT txid FROM signer_eth_sweep
WHERE kind = 'gas' AND chain_id = :ci AND lower(sender) = lower(:a) AND nonce = :n
UNION ALL
SELECT txid FROM signer_eth_rebalance
WHERE chain_id = :ci AND lower(sender) = lower(:a) AND nonce = :n
LIMIT 1
""")
_INSERT_ETH_SWEEP_SQL = text("""
INSERT INTO signer_eth_sweep (signed_at, kind, sweep_id, chain_id, sender, nonce, destination, asset, amount, txid, gas_limit,
                              max_fee_wei, priority_fee_wei, replaces_txid)
VALUES (:at, :k, :s, :ci, :a, :n, :d, :asset, :amount, :t, :gas, :max_fee, :priority, :replaces)
""")
# the signer's own record of one version it signed (what a replacement must repeat), and of the
# replacement it signed of that version, if any (at most one per version)
_ETH_SWEEP_VERSION_SQL = text("""
SELECT chain_id, sender, nonce, destination, asset, amount, gas_limit, max_fee_wei, priority_fee_wei, txid
FROM signer_eth_sweep WHERE kind = :k AND sweep_id = :s AND txid = :t ORDER BY id LIMIT 1
""")
_ETH_SWEEP_REPLACED_SQL = text("""
SELECT txid, max_fee_wei, priority_fee_wei FROM signer_eth_sweep WHERE kind = :k AND sweep_id = :s AND replaces_txid = :t
ORDER BY id LIMIT 1
""")
_ETH_REBALANCE_VERSION_SQL = text("""
SELECT chain_id, sender, nonce, destination, asset, amount, gas_limit, max_fee_wei, priority_fee_wei, txid
FROM signer_eth_rebalance WHERE rebalance_id = :r AND txid = :t ORDER BY id LIMIT 1
""")
_ETH_REBALANCE_REPLACED_SQL = text("""
SELECT txid, max_fee_wei, priority_fee_wei FROM signer_eth_rebalance WHERE rebalance_id = :r AND replaces_txid = :t
ORDER BY id LIMIT 1
""")
MIN_REPLACEMENT_PERCENT = 10  # both fees of an ethereum replacement at least +10% (geth's and anvil's minimum)
_ETH_REBALANCE_ROW_SQL = text("""
SELECT source_tier, destination_tier, asset, amount, destination, state, approvals_required
FROM eth_rebalance
WHERE id = :r
""")
_ETH_REBALANCE_RECORDS_SQL = text("""
SELECT chain_id, sender, nonce, txid FROM signer_eth_rebalance WHERE rebalance_id = :r
""")
# every hot-address transaction the signer recorded: withdrawals, gas fundings, rebalances
_HOT_SLOTS = """
SELECT nonce, txid FROM signer_signature WHERE chain = 'ethereum' AND chain_id = :ci AND lower(sender) = lower(:a)
UNION ALL
SELECT nonce, txid FROM signer_eth_sweep WHERE kind = 'gas' AND chain_id = :ci AND lower(sender) = lower(:a)
UNION ALL
SELECT nonce, txid FROM signer_eth_rebalance WHERE chain_id = :ci AND lower(sender) = lower(:a)
"""
_HOT_SLOT_TAKEN_SQL = text(f"SELECT txid FROM ({_HOT_SLOTS}) s WHERE nonce = :n LIMIT 1")
_HOT_SLOT_HIGHEST_SQL = text(f"SELECT max(nonce) FROM ({_HOT_SLOTS}) s")
_INSERT_ETH_REBALANCE_SQL = text("""
INSERT INTO signer_eth_rebalance (signed_at, rebalance_id, chain_id, sender, nonce, destination, asset, amount, txid, gas_limit,
                                  max_fee_wei, priority_fee_wei, replaces_txid)
VALUES (:at, :r, :ci, :a, :n, :d, :asset, :amount, :t, :gas, :max_fee, :priority, :replaces)
""")
HOT_INDEX = 0  # the ethereum hot address is the hot account's 0/0 (custody.destinations.HOT_RECEIVE_INDEX)
WITHDRAWAL_HOLD_OWNER = "withdrawals"  # custody.withdrawals.HOLD_OWNER: the only owner of a withdrawal's hold
_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"  # one per withdrawal (and per capped asset), until commit
REBALANCE_DIRECTIONS = frozenset({("hot", "cold"), ("hot", "warm"), ("warm", "hot")})  # what the signer signs between tiers
# The same locks for many keys in one statement, taken in the array's order (a function scan
# yields its rows in order and each is locked as it is read).
_LOCKS_SQL = "SELECT count(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM unnest(CAST(:k AS text[])) AS u(k)"
LOCK_TIMEOUT = "10s"  # the longest a request waits for a lock (module docstring): then OperationalError, retried


@dataclass(frozen=True)
class Paid:
    """One withdrawal output as the signer checked it: what it will sign, from its own checks."""

    withdrawal_id: int
    chain: str
    asset: str
    amount: int
    destination: str
    script: bytes  # bitcoin: computed here from `destination`; ethereum: b""
    approvals: int  # distinct valid approvers other than the requester


@dataclass(frozen=True)
class EthSlot:
    """The one thing every signature of one ethereum withdrawal must share: only one can be mined."""

    chain_id: int
    sender: str
    nonce: int


def outpoint(coin: BtcCoin) -> str:
    return f"{coin.txid}:{coin.vout}"


class Signer:
    def __init__(self, engine: Engine, keys: SignerKeys, *, bitcoin_network: str,
                 clock: Callable[[], dt.datetime] | None = None, max_fee_rate_sat_per_kvb: int = 500_000,
                 max_eth_fee_wei: int = 10**17, deposit_window: int = DEPOSIT_WINDOW,
                 receive_window: int = RECEIVE_WINDOW, change_window: int = CHANGE_WINDOW,
                 approvers: ApproverRegistry | None = None, quorum: QuorumTable | None = None,
                 assets: Mapping[str, SignerAsset] | None = None, ethereum_chain_id: int | None = None,
                 cold_xpubs: Mapping[str, str] | None = None, cold_addresses: Mapping[str, str] | None = None,
                 unapproved_limits: Mapping[str, UnapprovedLimit] | None = None, rebalance_quorum: int = 2) -> None:
        self.rebalance_quorum = rebalance_quorum  # distinct operators a warm -> hot refill needs, at least
        self.approvers = approvers  # the only approver keys whose signatures count (None: none do)
        self.quorum = quorum  # the signer's own approvals per asset and amount (None: one for every withdrawal)
        self.assets = dict(DEFAULT_ASSETS if assets is None else assets)  # the only assets it pays, and how
        self.ethereum_chain_id = ethereum_chain_id  # None: no ethereum transaction is signed
        self.cold_xpubs = dict(cold_xpubs or {})  # chain -> the cold wallet's account xpub (none: no rebalance)
        self.cold_addresses = dict(cold_addresses or {})  # ethereum -> the pinned cold address (none: no eth rebalance to cold)
        self.unapproved_limits = None if unapproved_limits is None else dict(unapproved_limits)  # None: no cap
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
        with self._request(batch_id, {}) as c:
            self._lock(c, [o.withdrawal_id for o in outputs])
            paid = self._check_batch(c, batch_id, outputs, "bitcoin")
            self._check_coins(c, batch_id, coins)
            self._check_change_and_fee(batch_id, coins, paid, change)
            inputs = [outpoint(k) for k in coins]
            first = self._check_history(c, paid, inputs=inputs)
            self._check_unapproved(c, [p for p in paid if p.withdrawal_id in first])
            signed = self._sign_btc(coins, paid, change)
            self._record(c, batch_id, signed.txid, paid, inputs=inputs,
                         detail={"inputs": len(coins), "outputs": len(paid), "fee": signed.fee, "vsize": signed.vsize})
        return signed

    def sign_bitcoin_replacement(self, batch_id: int, replaces_txid: str, coins: Sequence[BtcCoin],
                                 outputs: Sequence[BatchOutput], change: tuple[str, int] | None) -> SignedTx:
        """Re-sign a signed batch at a higher fee (RBF): exactly the withdrawals, destinations,
        amounts and inputs the signer recorded for `replaces_txid` (module docstring), approvals
        verified again (the decision's expiry excepted), change and fee checked as for a batch."""
        with self._request(batch_id, {"replaces": replaces_txid}) as c:
            self._lock(c, [o.withdrawal_id for o in outputs])
            inputs = [outpoint(k) for k in coins]
            paid = self._check_replacement(c, batch_id, replaces_txid, outputs, "bitcoin", inputs=inputs)
            self._check_coins(c, batch_id, coins, spent_ok=True)
            self._check_change_and_fee(batch_id, coins, paid, change)
            self._check_history(c, paid, inputs=inputs)
            signed = self._sign_btc(coins, paid, change)
            self._record(c, batch_id, signed.txid, paid, inputs=inputs, replaces=replaces_txid,
                         detail={"replaces": replaces_txid, "fee": signed.fee, "vsize": signed.vsize})
        return signed

    def _sign_btc(self, coins: Sequence[BtcCoin], paid: Sequence[Paid], change: tuple[str, int] | None) -> SignedTx:
        inputs = [SpendInput(k.txid, k.vout, k.amount, self._keys.private_key_for("bitcoin", "hot", k.change, k.index))
                  for k in coins]
        return sign_batch(inputs, [PayOutput(p.destination, p.amount, p.script) for p in paid], self.bitcoin_network,
                          change=PayOutput(*change) if change else None, rbf=True)

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

    def _check_change_and_fee(self, batch_id: int, coins: Sequence[BtcCoin], paid: Sequence[Paid],
                              change: tuple[str, int] | None) -> None:
        """Change may only go to this batch's own change address (derived here); the fee (inputs -
        outputs - change) may not exceed the ceiling rate for the transaction's size."""
        scripts = [p.script for p in paid]
        if change is not None:
            if change[0] != self._hot_address(1, batch_id):
                raise SigningRefused(RefusalCode.output_mismatch, "change must go to the batch's own hot change address")
            scripts.append(address_to_script(change[0], self.bitcoin_network))
        fee = sum(k.amount for k in coins) - sum(p.amount for p in paid) - (change[1] if change else 0)
        self._check_fee(len(coins), scripts, fee)

    def sign_bitcoin_sweep(self, sweep_id: int, coins: Sequence[BtcCoin], destination: str, fee: int) -> SignedTx:
        """Sign a sweep: deposit-address coins (deposit tier, `index` = derivation index) into our own
        hot wallet. Checked first: the kill switch is off; every coin is a booked deposit reserved
        for this sweep with the amount on record; the destination is the hot wallet's receive
        address derived from the signer's own keys, so a sweep can pay nobody else."""
        detail = {"sweep_id": sweep_id}
        with self._request(None, detail) as c:
            self._check_halted(c)
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
            inputs = [SpendInput(k.txid, k.vout, k.amount, self._keys.private_key_for("bitcoin", "deposit", 0, k.index))
                      for k in coins]
            signed = sign_batch(inputs, [PayOutput(destination, sum(k.amount for k in coins) - fee)], self.bitcoin_network,
                                change=None, rbf=True)
            self._audit(c, None, "signed", None, signed.txid, {**detail, "inputs": len(inputs), "fee": signed.fee})
            c.commit()
        return signed

    def sign_bitcoin_rebalance(self, rebalance_id: int, coins: Sequence[BtcCoin], destination: str, amount: int,
                               change: tuple[str, int] | None, replaces_txid: str | None = None) -> SignedTx:
        """Sign a rebalance between the firm's own tiers: hot -> cold, hot -> warm, or a warm -> hot
        refill. Checked first, in this order: the kill switch is off; the rebalance is `open` on
        bitcoin in one of those directions (a fee-bump replacement, `replaces_txid`: `signed` or
        `broadcast`, and the version it replaces is the row's); the destination is the address
        derived at the row's index from a key the SIGNER holds or pins, never custody's `wallet`
        table: cold from `cold_xpubs["bitcoin"]` (none configured: refused `destination_not_cold`),
        warm from its own warm key, a refill the hot receive address; the row names that address
        too; the amount is the recorded one; the coins are exactly those reserved for this
        rebalance (hot: unspent `wallet_utxo` rows; warm: its `rebalance_input` rows), with the
        amounts and derivations on record; change goes only to the hot receive address (from hot)
        or to the warm address at the row's change index (from warm), derived here; a refill
        carries signed approvals of distinct operators (`rebalance_approval`, each verified
        against the signer's OWN registry over the payload it rebuilds from the row: kind
        `rebalance-approval`) at least the larger of the row's count and `rebalance_quorum`
        (`rebalance_not_approved` otherwise); the fee is within the ceiling rate for the size. A
        replacement spends the same reserved coins as the version it replaces, so at most one can
        ever confirm. An unreadable pinned key is a refusal, never a crash."""
        detail: dict = {"rebalance_id": rebalance_id}
        if replaces_txid is not None:
            detail["replaces"] = replaces_txid
        with self._request(None, detail) as c:
            self._check_halted(c, "rebalances are halted by the kill switch")
            row = c.execute(text("SELECT source_tier, destination_tier, state, txid, destination, destination_index, amount, "
                                 "change_index, approvals_required FROM rebalance WHERE id = :r AND chain = 'bitcoin'"),
                            {"r": rebalance_id}).first()
            states = ("open",) if replaces_txid is None else ("signed", "broadcast")
            if row is None or row.state not in states or (replaces_txid is not None and row.txid != replaces_txid) \
                    or (row.source_tier, row.destination_tier) not in REBALANCE_DIRECTIONS:
                raise SigningRefused(RefusalCode.rebalance_not_open,
                                     f"rebalance {rebalance_id} is not an open hot -> warm/cold or warm -> hot rebalance"
                                     + (" (or the version it replaces is not its own)" if replaces_txid else ""))
            expected = self._rebalance_destination(row)
            if expected is None or destination != expected or row.destination != expected:
                raise SigningRefused(RefusalCode.destination_not_cold if row.destination_tier == "cold" else
                                     RefusalCode.output_mismatch,
                                     f"{destination}: not the {row.destination_tier} address the signer derives for this rebalance")
            if amount != int(row.amount):
                raise SigningRefused(RefusalCode.output_mismatch, f"amount {amount} is not the rebalance's {int(row.amount)}")
            self._check_rebalance_coins(c, rebalance_id, row.source_tier, coins)
            scripts = [address_to_script(destination, self.bitcoin_network)]
            if change is not None:
                own_change = self._hot_address(0, 0) if row.source_tier == "hot" else (
                    self._derive_address(self._keys.account_xpub("bitcoin", "warm"), 0, row.change_index)
                    if row.change_index is not None else None)
                if change[0] != own_change:
                    raise SigningRefused(RefusalCode.output_mismatch,
                                         f"rebalance change goes only to the {row.source_tier} wallet's own change address")
                scripts.append(address_to_script(change[0], self.bitcoin_network))
            if row.source_tier == "warm":
                self._check_rebalance_approvals(c, rebalance_id, row)
            self._check_fee(len(coins), scripts, sum(k.amount for k in coins) - amount - (change[1] if change else 0))
            inputs = [SpendInput(k.txid, k.vout, k.amount,
                                 self._keys.private_key_for("bitcoin", row.source_tier, k.change, k.index)) for k in coins]
            signed = sign_batch(inputs, [PayOutput(destination, amount)], self.bitcoin_network,
                                change=PayOutput(*change) if change else None, rbf=True)
            self._audit(c, None, "signed", None, signed.txid, {**detail, "inputs": len(inputs), "amount": amount, "fee": signed.fee,
                                                               "source_tier": row.source_tier,
                                                               "destination_tier": row.destination_tier})
            c.commit()
        return signed

    def sign_bitcoin_cpfp(self, rebalance_id: int, parent_raw: bytes, parent_vout: int, destination: str, fee: int,
                          replaces_txid: str | None = None) -> SignedTx:
        """Sign a child (CPFP) of rebalance `rebalance_id`'s stuck transaction into hot: one input,
        output `parent_vout` of `parent_raw`, one output to the hot receive address, `fee` sat.
        Checked, in this order (module table): the kill switch is off; the rebalance is a bitcoin
        move into hot, `signed` or `broadcast` (`rebalance_not_open`); `parent_raw` parses, its txid
        (computed here) is the row's, and its output `parent_vout` pays the hot receive address
        derived from the signer's OWN hot key (`unknown_input`); `destination` is that address and
        the child's output is not dust (`output_mismatch`); the fee is positive and at most the
        ceiling rate over parent + child (`fee_above_ceiling`; the parent's size counted is at most
        what its txid-covered bytes allow with P2WPKH inputs, `ParsedTx.p2wpkh_vsize`, so a padded
        witness, which keeps the txid, does not raise the ceiling); then its own record (`signer_cpfp`):
        one child per parent output (a new child where one is recorded: `already_signed`, unless
        it is the same fee again, a lost reply, answered with the same transaction); a replacement
        names the latest child recorded for that output (`replacement_unknown` otherwise) and pays
        a strictly higher fee (`replacement_unknown`); a child already replaced is `already_signed`.
        The output of the parent is what the signer reads from the bytes, never custody's figure."""
        detail: dict = {"rebalance_id": rebalance_id, "cpfp": True, "parent_vout": parent_vout, "fee": fee}
        if replaces_txid is not None:
            detail["replaces"] = replaces_txid
        with self._request(None, detail) as c:
            self._check_halted(c, "rebalances are halted by the kill switch")
            row = c.execute(text("SELECT destination_tier, state, txid FROM rebalance WHERE id = :r AND chain = 'bitcoin'"),
                            {"r": rebalance_id}).first()
            if row is None or row.destination_tier != "hot" or row.state not in ("signed", "broadcast"):
                raise SigningRefused(RefusalCode.rebalance_not_open,
                                     f"rebalance {rebalance_id} is not a bitcoin move into hot waiting to be mined")
            hot = self._hot_address(0, 0)
            hot_script = address_to_script(hot, self.bitcoin_network)
            try:
                parent = parse_transaction(parent_raw)
            except SignerError as exc:
                raise SigningRefused(RefusalCode.unknown_input, f"the parent is not a transaction: {exc}") from None
            if parent.txid != row.txid:
                raise SigningRefused(RefusalCode.unknown_input, f"the parent {parent.txid} is not rebalance {rebalance_id}'s")
            if type(parent_vout) is not int or not 0 <= parent_vout < len(parent.outputs) \
                    or parent.outputs[parent_vout][1] != hot_script:
                raise SigningRefused(RefusalCode.unknown_input,
                                     f"output {parent_vout} of {parent.txid} does not pay the hot receive address")
            value = parent.outputs[parent_vout][0]
            if destination != hot:
                raise SigningRefused(RefusalCode.output_mismatch, "a CPFP child pays only the hot wallet's receive address")
            # the parent's size as the ceiling counts it: never above what its non-witness bytes (which
            # the txid commits to) allow with P2WPKH inputs, the only kind our wallets spend. The sent
            # witness is not covered by the txid: padded, it would raise `parent.vsize` and the ceiling.
            parent_vsize = min(parent.vsize, parent.p2wpkh_vsize)
            cap = fee_for(parent_vsize + estimate_vsize(1, [hot_script]), self.max_fee_rate_sat_per_kvb)
            if type(fee) is not int or not 0 < fee <= cap:
                raise SigningRefused(RefusalCode.fee_above_ceiling,
                                     f"fee {fee} sat is outside 1..{cap} for the parent and its child")
            if value - fee < dust_threshold(hot_script):
                raise SigningRefused(RefusalCode.output_mismatch, f"a fee of {fee} sat leaves dust of a {value} sat output")
            c.execute(text(_LOCK_SQL), {"k": f"signer_cpfp:{parent.txid}:{parent_vout}"})
            records = c.execute(_CPFP_RECORDS_SQL, {"t": parent.txid, "v": parent_vout}).all()
            again = self._check_cpfp_record(records, fee, replaces_txid)
            key = self._keys.private_key_for("bitcoin", "hot", 0, 0)
            signed = sign_batch([SpendInput(parent.txid, parent_vout, value, key, hot_script)], [PayOutput(hot, value - fee)],
                                self.bitcoin_network, change=None, rbf=True)
            if not again:
                c.execute(_INSERT_CPFP_SQL, {"at": self.clock(), "r": rebalance_id, "t": parent.txid, "v": parent_vout,
                                             "txid": signed.txid, "f": fee, "rep": replaces_txid})
            self._audit(c, None, "signed", None, signed.txid, {**detail, "parent": parent.txid, "again": again})
            c.commit()
        return signed

    @staticmethod
    def _check_cpfp_record(records, fee: int, replaces_txid: str | None) -> bool:
        """The signer's own record of the children of one parent output (oldest first) against a
        request: True when it is one already signed (the same child again), else it may be signed
        and recorded; refusals as `sign_bitcoin_cpfp` says."""
        replaced = {r.replaces_txid for r in records if r.replaces_txid is not None}
        for r in records:  # the same request again: a lost reply, answered with the same transaction
            if r.replaces_txid == replaces_txid and int(r.fee) == fee:
                return True
        if replaces_txid is None:
            if records:
                raise SigningRefused(RefusalCode.already_signed,
                                     f"a child of this parent output was already signed ({records[0].txid}): one per parent")
            return False
        version = next((r for r in records if r.txid == replaces_txid), None)
        if version is None:
            raise SigningRefused(RefusalCode.replacement_unknown, f"{replaces_txid} is no child the signer signed of this parent")
        if replaces_txid in replaced:
            raise SigningRefused(RefusalCode.already_signed, f"child {replaces_txid} was already replaced")
        if fee <= int(version.fee):
            raise SigningRefused(RefusalCode.replacement_unknown,
                                 f"a replacement pays more than the {int(version.fee)} sat of the child it replaces")
        return False

    # ---- ethereum sweeps -------------------------------------------------------------------

    def sign_ethereum_sweep(self, sweep_id: int, *, deposit_index: int, asset: str, amount: int, chain_id: int,
                            nonce: int, gas: int, max_fee_wei: int, priority_fee_wei: int,
                            replaces_txid: str | None = None) -> SignedEthTx:
        """Sign one ethereum sweep: deposit address `deposit_index` -> our hot address (module docstring).
        With `replaces_txid`, a same-nonce replacement of that version at higher fees
        (`_check_eth_replacement`): the row `signed` or `broadcast`."""
        detail = {"sweep_id": sweep_id, "kind": "sweep", "asset": asset, "amount": str(amount), "nonce": nonce,
                  **({"replaces": replaces_txid, "max_fee_wei": str(max_fee_wei)} if replaces_txid else {})}
        with self._request(None, detail) as c:
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_sweep:{sweep_id}"})
            self._check_halted(c, "sweeps are halted by the kill switch")
            self._check_chain_id(chain_id)
            own = self.assets.get(asset)
            if own is None or own.chain != "ethereum":
                raise SigningRefused(RefusalCode.asset_unknown, f"the signer sweeps no asset {asset!r} on ethereum")
            key = self._keys.private_key_for("ethereum", "deposit", 0, deposit_index)
            sender, hot = _eth_address(key), self._eth_hot_address()
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_sender:{sender.lower()}"})
            row = c.execute(_ETH_SWEEP_ROW_SQL, {"s": sweep_id}).first()
            states = ("open",) if replaces_txid is None else ("signed", "broadcast")
            if (row is None or row.state not in states or (row.asset, row.deposit_index, row.address.lower(), int(row.amount),
                                                        int(row.nonce)) != (asset, deposit_index, sender.lower(), amount, nonce)):
                raise SigningRefused(RefusalCode.sweep_not_open, f"sweep {sweep_id} is not an open sweep of {amount} {asset} "
                                     f"from deposit address {deposit_index} at nonce {nonce}")
            if own.contract:
                reserved = int(c.execute(_ETH_SWEEP_RESERVED_SQL, {"s": sweep_id, "a": asset, "addr": sender}).scalar_one())
                if reserved != amount:
                    raise SigningRefused(RefusalCode.output_mismatch,
                                         f"sweep {sweep_id}: {amount} {asset}, but {reserved} booked deposits are reserved for it")
            self._check_eth_fee(gas, max_fee_wei, priority_fee_wei)
            again = False
            if replaces_txid is None:
                self._check_sweep_nonce(c, sweep_id, sender, chain_id, nonce)
            else:
                keys = {"k": "sweep", "s": sweep_id, "t": replaces_txid}
                again = self._check_eth_replacement(c.execute(_ETH_SWEEP_VERSION_SQL, keys).first(),
                                                    c.execute(_ETH_SWEEP_REPLACED_SQL, keys).first(), replaces_txid,
                                                    chain_id=chain_id, sender=sender, nonce=nonce, destination=hot, asset=asset,
                                                    amount=amount, gas=gas, max_fee_wei=max_fee_wei,
                                                    priority_fee_wei=priority_fee_wei)
            to, value, data = ((own.contract, 0, erc20_transfer_data(hot, amount)) if own.contract else (hot, amount, b""))
            signed = sign_eip1559(key, chain_id=chain_id, nonce=nonce, to=to, value=value, data=data, gas=gas,
                                  max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei)
            self._record_eth_sweep(c, "sweep", sweep_id, chain_id, signed, hot, asset, amount, detail, gas=gas,
                                   max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid,
                                   again=again)
        return signed

    def sign_ethereum_gas_funding(self, sweep_id: int, *, deposit_index: int, chain_id: int, nonce: int, value: int,
                                  gas: int, max_fee_wei: int, priority_fee_wei: int,
                                  replaces_txid: str | None = None) -> SignedEthTx:
        """Sign the hot address's payment of gas to the deposit address of token sweep `sweep_id`
        (module docstring): at most that sweep's gas limit x max fee cap, once per sweep. With
        `replaces_txid`, a same-nonce replacement of that version at higher fees
        (`_check_eth_replacement`); the sweep still `open`."""
        detail = {"sweep_id": sweep_id, "kind": "gas", "value": str(value), "nonce": nonce,
                  **({"replaces": replaces_txid, "max_fee_wei": str(max_fee_wei)} if replaces_txid else {})}
        with self._request(None, detail) as c:
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_sweep:{sweep_id}"})
            self._check_halted(c, "sweeps are halted by the kill switch")
            self._check_chain_id(chain_id)
            key = self._keys.private_key_for("ethereum", "hot", 0, HOT_INDEX)
            sender = _eth_address(key)
            destination = _eth_address(self._keys.private_key_for("ethereum", "deposit", 0, deposit_index))
            row = c.execute(_ETH_SWEEP_ROW_SQL, {"s": sweep_id}).first()
            if row is None or row.state != "open" or (row.deposit_index, row.address.lower()) != (deposit_index, destination.lower()):
                raise SigningRefused(RefusalCode.sweep_not_open, f"sweep {sweep_id} is not an open sweep of deposit address "
                                     f"{deposit_index}")
            own = self.assets.get(row.asset)
            if own is None or own.chain != "ethereum" or not own.contract:
                raise SigningRefused(RefusalCode.sweep_not_open, f"sweep {sweep_id} sweeps {row.asset}: only token sweeps are funded")
            reserved = int(c.execute(_ETH_SWEEP_RESERVED_SQL, {"s": sweep_id, "a": row.asset, "addr": destination}).scalar_one())
            if reserved != int(row.amount):
                raise SigningRefused(RefusalCode.output_mismatch, f"sweep {sweep_id}: {int(row.amount)} {row.asset}, but "
                                     f"{reserved} booked deposits are reserved for it: nothing to fund")
            need = int(row.gas_limit) * int(row.max_fee_cap_wei if row.max_fee_cap_wei is not None else row.max_fee_wei)
            if type(value) is not int or not 0 < value <= min(need, self.max_eth_fee_wei):
                raise SigningRefused(RefusalCode.output_mismatch, f"gas funding {value} wei is outside 1..{need}, the gas "
                                     f"sweep {sweep_id} may burn")
            self._check_eth_fee(gas, max_fee_wei, priority_fee_wei)
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_sender:{destination.lower()}"})  # the address's sweeps and fundings
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_sender:{sender.lower()}"})  # the hot nonces (withdrawals take it too)
            mine = c.execute(_ETH_SWEEP_RECORDS_SQL, {"k": "gas", "s": sweep_id}).all()
            for r in mine:
                if (int(r.chain_id), r.sender.lower(), int(r.nonce)) != (chain_id, sender.lower(), nonce):
                    raise SigningRefused(RefusalCode.already_signed, f"sweep {sweep_id} was funded in {r.txid} at nonce {r.nonce}")
            if not mine:
                self._check_new_funding(c, sweep_id, row, destination, sender, chain_id, nonce)
            taken = c.execute(_HOT_NONCE_TAKEN_SQL, {"a": sender, "n": nonce, "ci": chain_id, "s": sweep_id}).first()
            if taken is not None:
                raise SigningRefused(RefusalCode.already_signed, f"hot nonce {nonce} is already signed in {taken.txid}")
            again = False
            if replaces_txid is not None:
                keys = {"k": "gas", "s": sweep_id, "t": replaces_txid}
                again = self._check_eth_replacement(c.execute(_ETH_SWEEP_VERSION_SQL, keys).first(),
                                                    c.execute(_ETH_SWEEP_REPLACED_SQL, keys).first(), replaces_txid,
                                                    chain_id=chain_id, sender=sender, nonce=nonce, destination=destination,
                                                    asset="ETH", amount=value, gas=gas, max_fee_wei=max_fee_wei,
                                                    priority_fee_wei=priority_fee_wei)
            signed = sign_eip1559(key, chain_id=chain_id, nonce=nonce, to=destination, value=value, gas=gas,
                                  max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei)
            self._record_eth_sweep(c, "gas", sweep_id, chain_id, signed, destination, "ETH", value, detail, gas=gas,
                                   max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei, replaces_txid=replaces_txid,
                                   again=again)
        return signed

    @staticmethod
    def _check_new_funding(c: Connection, sweep_id: int, row, destination: str, sender: str, chain_id: int, nonce: int) -> None:
        """A first funding for `sweep_id`, from the signer's own record: the sweep is at the next
        nonce the signer may sign from the deposit address (`nonce_gap`); the address holds no
        funding of another sweep that no signed sweep used yet (`already_signed`: one funding per
        address and sweep nonce); the hot nonce is at most one past the highest the signer recorded
        from the hot address, withdrawals and fundings (`nonce_gap`: 0 when it recorded none)."""
        swept = c.execute(_ETH_SENDER_SWEEPS_SQL, {"a": destination}).all()
        expected = max((int(r.nonce) for r in swept), default=-1) + 1
        if int(row.nonce) != expected:
            raise SigningRefused(RefusalCode.nonce_gap, f"sweep {sweep_id} is at nonce {int(row.nonce)} of {destination}; "
                                 f"the next the signer may sign is {expected}: it funds no other")
        unused = c.execute(_UNUSED_FUNDING_SQL, {"d": destination, "s": sweep_id}).first()
        if unused is not None:
            raise SigningRefused(RefusalCode.already_signed, f"{destination} holds gas funding {unused.txid} of sweep "
                                 f"{unused.sweep_id}, which no sweep the signer signed has used")
        highest = c.execute(_HOT_NONCE_MAX_SQL, {"a": sender, "ci": chain_id}).scalar()
        limit = int(highest) + 1 if highest is not None else 0
        if nonce > limit:
            raise SigningRefused(RefusalCode.nonce_gap, f"hot nonce {nonce}: the highest the signer may sign a funding at "
                                 f"is {limit}, one past its record")

    def _eth_hot_address(self) -> str:
        """The ethereum hot address, derived from the signer's own keys (never taken from custody)."""
        return _eth_address(self._keys.private_key_for("ethereum", "hot", 0, HOT_INDEX))

    def _check_chain_id(self, chain_id: int) -> None:
        if self.ethereum_chain_id is None or chain_id != self.ethereum_chain_id:
            raise SigningRefused(RefusalCode.chain_id_mismatch, f"chain id {chain_id} is not the signer's own ({self.ethereum_chain_id})")

    def _check_eth_fee(self, gas: int, max_fee_wei: int, priority_fee_wei: int) -> None:
        if gas * max_fee_wei > self.max_eth_fee_wei or priority_fee_wei > max_fee_wei:
            raise SigningRefused(RefusalCode.fee_above_ceiling, f"gas x max fee {gas * max_fee_wei} wei is above the cap {self.max_eth_fee_wei}")

    @staticmethod
    def _check_sweep_nonce(c: Connection, sweep_id: int, sender: str, chain_id: int, nonce: int) -> None:
        """`already_signed` / `nonce_gap` from the signer's own record of the sweeps of `sender`."""
        records = c.execute(_ETH_SENDER_SWEEPS_SQL, {"a": sender}).all()
        mine = [r for r in records if r.sweep_id == sweep_id]
        if mine:
            if any((int(r.chain_id), int(r.nonce)) != (chain_id, nonce) for r in mine):
                raise SigningRefused(RefusalCode.already_signed, f"sweep {sweep_id} was signed at nonce {mine[0].nonce}")
            return
        expected = max((int(r.nonce) for r in records), default=-1) + 1
        if nonce != expected:
            raise SigningRefused(RefusalCode.nonce_gap, f"{sender}: nonce {nonce}, the next the signer may sign is {expected}")

    def _record_eth_sweep(self, c: Connection, kind: str, sweep_id: int, chain_id: int, signed: SignedEthTx, destination: str,
                          asset: str, amount: int, detail: dict, *, gas: int, max_fee_wei: int, priority_fee_wei: int,
                          replaces_txid: str | None, again: bool = False) -> None:
        """The signer's own record (`signer_eth_sweep`) and audit row, committed before the answer
        (a replacement asked again, `again`: the record it has already; the audit row only)."""
        if not again:
            c.execute(_INSERT_ETH_SWEEP_SQL, {"at": self.clock(), "k": kind, "s": sweep_id, "ci": chain_id, "a": signed.sender,
                                              "n": signed.nonce, "d": destination, "asset": asset, "amount": amount,
                                              "t": signed.txid, "gas": gas, "max_fee": max_fee_wei, "priority": priority_fee_wei,
                                              "replaces": replaces_txid})
        self._audit(c, None, "signed", None, signed.txid, detail)
        c.commit()

    def _check_eth_replacement(self, version, replaced, replaces_txid: str, *, chain_id: int, sender: str, nonce: int,
                               destination: str, asset: str, amount: int, gas: int, max_fee_wei: int,
                               priority_fee_wei: int) -> bool:
        """A same-nonce replacement of a funding, sweep or rebalance, checked against the signer's
        OWN record of the version it replaces (`version`), never custody's row. In order:
        `replacement_unknown` (no such version of this row; another chain id, sender or nonce;
        another gas limit; a version recorded without fees, from before fee bumps; a fee not raised
        by at least MIN_REPLACEMENT_PERCENT), `output_mismatch` (another destination, asset or
        amount: it pays exactly what the version paid), `fee_above_ceiling`, `already_signed` (that
        version was replaced already at other fees: at most one replacement per version). True when
        this very replacement was signed before (asked again after a crash: the same transaction,
        nothing new recorded)."""
        if version is None:
            raise SigningRefused(RefusalCode.replacement_unknown, f"{replaces_txid} is no version the signer signed for this row")
        if (int(version.chain_id), version.sender.lower(), int(version.nonce)) != (chain_id, sender.lower(), nonce):
            raise SigningRefused(RefusalCode.replacement_unknown,
                                 f"a replacement uses exactly the chain id, sender and nonce of {replaces_txid}")
        if version.gas_limit is None or version.max_fee_wei is None or int(version.gas_limit) != gas:
            raise SigningRefused(RefusalCode.replacement_unknown, f"a replacement uses exactly the gas limit of {replaces_txid}")
        if (version.destination.lower(), version.asset, int(version.amount)) != (destination.lower(), asset, amount):
            raise SigningRefused(RefusalCode.output_mismatch,
                                 f"a replacement pays exactly the destination, asset and amount of {replaces_txid}")
        for new, old in ((max_fee_wei, int(version.max_fee_wei)), (priority_fee_wei, int(version.priority_fee_wei))):
            if new < max(old + 1, -(-old * (100 + MIN_REPLACEMENT_PERCENT) // 100)):
                raise SigningRefused(RefusalCode.replacement_unknown, f"a replacement raises both fees of {replaces_txid} by at "
                                     f"least {MIN_REPLACEMENT_PERCENT}%")
        self._check_eth_fee(gas, max_fee_wei, priority_fee_wei)
        if replaced is None:
            return False
        if (int(replaced.max_fee_wei), int(replaced.priority_fee_wei)) != (max_fee_wei, priority_fee_wei):
            raise SigningRefused(RefusalCode.already_signed, f"{replaces_txid} was replaced already, by {replaced.txid}")
        return True

    def _rebalance_destination(self, row) -> str | None:
        """The address a rebalance must pay, from keys the signer holds or pins; None when it cannot say."""
        try:
            if row.destination_tier == "hot":
                return self._hot_address(0, 0)
            xpub = self.cold_xpubs.get("bitcoin") if row.destination_tier == "cold" else self._keys.account_xpub("bitcoin", "warm")
            return self._derive_address(xpub, 0, row.destination_index) if xpub else None
        except Exception:  # noqa: BLE001 - an unreadable pinned key is a refusal, not a crash
            return None

    @staticmethod
    def _check_rebalance_coins(c: Connection, rebalance_id: int, source_tier: str, coins: Sequence[BtcCoin]) -> None:
        """The coins are exactly those reserved for the rebalance, with the amounts and derivations on record."""
        sql = ("SELECT txid, vout, amount, derivation_change, derivation_index FROM wallet_utxo "
               "WHERE rebalance_id = :r AND spent_by IS NULL AND reserved_by IS NULL") if source_tier == "hot" else \
              "SELECT txid, vout, amount, derivation_change, derivation_index FROM rebalance_input WHERE rebalance_id = :r"
        reserved = {(r.txid, r.vout): r for r in c.execute(text(sql), {"r": rebalance_id})}
        if len(reserved) != len(coins) or len({(k.txid, k.vout) for k in coins}) != len(coins):
            raise SigningRefused(RefusalCode.unknown_input, f"the coins differ from the {source_tier} coins reserved for this rebalance")
        for k in coins:
            r = reserved.get((k.txid, k.vout))
            if r is None or int(r.amount) != k.amount or (r.derivation_change, r.derivation_index) != (k.change, k.index):
                raise SigningRefused(RefusalCode.unknown_input, f"input {k.txid}:{k.vout} is not reserved for this rebalance")

    def _check_rebalance_approvals(self, c: Connection, rebalance_id: int, row, *, chain: str = "bitcoin",
                                   table: str = "rebalance_approval") -> None:
        """Distinct operators (from the signer's own registry) whose signature verifies over the
        payload rebuilt from the row (`chain`'s; approvals read from `table`): at least
        max(row's count, rebalance_quorum)."""
        payload = rebalance_approval_payload(rebalance_id=rebalance_id, chain=chain, asset=row.asset if chain != "bitcoin" else "BTC",
                                             amount=int(row.amount), source_tier=row.source_tier,
                                             destination_tier=row.destination_tier, destination=row.destination)
        operators = set()
        for a in c.execute(text(f"SELECT key_id, scheme, signed_payload, signature, authenticator_data, client_data_json "
                                f"FROM {table} WHERE rebalance_id = :r ORDER BY id"), {"r": rebalance_id}):
            if bytes(a.signed_payload) != payload:
                continue  # signed over something else: it approves nothing here
            try:
                key = verify_stored_approval(self.approvers, a, payload)
            except ApprovalInvalid:
                continue
            operators.add(operator_identity(key.operator))
        required = max(int(row.approvals_required), self.rebalance_quorum)
        if len(operators) < required:
            raise SigningRefused(RefusalCode.rebalance_not_approved,
                                 f"refill {rebalance_id} has {len(operators)} valid operator approval(s); {required} required")

    # ---- ethereum rebalances ---------------------------------------------------------------

    def sign_ethereum_rebalance(self, rebalance_id: int, *, asset: str, amount: int, destination_tier: str, chain_id: int,
                                nonce: int, gas: int, max_fee_wei: int, priority_fee_wei: int,
                                replaces_txid: str | None = None) -> SignedEthTx:
        """Sign ethereum rebalance `rebalance_id`: `amount` of `asset` from the hot address to the
        signer's own warm address (ethereum account "warm", 0/0) or to the cold address pinned in its
        configuration (`cold_addresses["ethereum"]`); or, `destination_tier` "hot", a refill from the
        warm address to the hot address, signed only with the signed approvals of
        max(row's `approvals_required`, `rebalance_quorum`) distinct operators of its OWN registry
        over the `rebalance-approval` payload it rebuilds (chain "ethereum"; table
        `eth_rebalance_approval`; `rebalance_not_approved` otherwise, checked after the row). The signer BUILDS the transaction itself (ether
        as the value, or the token's `transfer(destination, amount)` to the contract of its own asset
        table), so custody names no destination, contract or calldata. Checked, in order: the kill
        switch (`kill_switch_on`); the chain id (`chain_id_mismatch`); the asset (`asset_unknown`);
        the destination tier and its address (`destination_not_cold`: no cold address pinned); the
        `eth_rebalance` row: open, hot -> that tier, that asset and amount, naming that destination
        (`rebalance_not_open`); the fee cap (`fee_above_ceiling`); then the hot nonce against the
        signer's OWN records: a rebalance it signed before only again at the same chain id and nonce
        (`already_signed`); a new one never at a hot nonce it signed a withdrawal, gas funding or
        other rebalance at (`already_signed`) and never above the highest it recorded + 1
        (`nonce_gap`). With `replaces_txid`, a same-nonce replacement of that version at higher
        fees: the row `signed` or `broadcast`, checked against the signer's own record of that
        version (`_check_eth_replacement`) instead of the nonce checks; a refill's approvals are
        verified again."""
        detail = {"rebalance_id": rebalance_id, "kind": "eth_rebalance", "asset": asset, "amount": str(amount), "nonce": nonce,
                  "destination_tier": destination_tier,
                  **({"replaces": replaces_txid, "max_fee_wei": str(max_fee_wei)} if replaces_txid else {})}
        with self._request(None, detail) as c:
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_rebalance:{rebalance_id}"})
            self._check_halted(c, "rebalances are halted by the kill switch")
            self._check_chain_id(chain_id)
            own = self.assets.get(asset)
            if own is None or own.chain != "ethereum":
                raise SigningRefused(RefusalCode.asset_unknown, f"the signer moves no asset {asset!r} on ethereum")
            source = "warm" if destination_tier == "hot" else "hot"  # a refill comes from warm; anything else leaves hot
            key = self._keys.private_key_for("ethereum", source, 0, HOT_INDEX if source == "hot" else 0)
            sender = _eth_address(key)
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_sender:{sender.lower()}"})
            destination = self._eth_rebalance_destination(destination_tier)
            if destination is None:
                raise SigningRefused(RefusalCode.destination_not_cold, "no ethereum cold address is pinned in the signer's configuration")
            row = c.execute(_ETH_REBALANCE_ROW_SQL, {"r": rebalance_id}).first()
            states = ("open",) if replaces_txid is None else ("signed", "broadcast")
            if (row is None or row.state not in states
                    or (row.source_tier, row.destination_tier, row.asset, int(row.amount), row.destination.lower())
                    != (source, destination_tier, asset, amount, destination.lower())):
                raise SigningRefused(RefusalCode.rebalance_not_open, f"eth rebalance {rebalance_id} is not an open move of {amount} "
                                     f"{asset} from {source} to {destination_tier} {destination}")
            if source == "warm":
                self._check_rebalance_approvals(c, rebalance_id, row, chain="ethereum", table="eth_rebalance_approval")
            self._check_eth_fee(gas, max_fee_wei, priority_fee_wei)
            again = False
            if replaces_txid is None:
                self._check_sender_slot(c, rebalance_id, sender, chain_id, nonce)
            else:
                keys = {"r": rebalance_id, "t": replaces_txid}
                again = self._check_eth_replacement(c.execute(_ETH_REBALANCE_VERSION_SQL, keys).first(),
                                                    c.execute(_ETH_REBALANCE_REPLACED_SQL, keys).first(), replaces_txid,
                                                    chain_id=chain_id, sender=sender, nonce=nonce, destination=destination,
                                                    asset=asset, amount=amount, gas=gas, max_fee_wei=max_fee_wei,
                                                    priority_fee_wei=priority_fee_wei)
            to, value, data = ((own.contract, 0, erc20_transfer_data(destination, amount)) if own.contract
                               else (destination, amount, b""))
            signed = sign_eip1559(key, chain_id=chain_id, nonce=nonce, to=to, value=value, data=data, gas=gas,
                                  max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei)
            if not again:
                c.execute(_INSERT_ETH_REBALANCE_SQL, {"at": self.clock(), "r": rebalance_id, "ci": chain_id, "a": sender, "n": nonce,
                                                      "d": destination, "asset": asset, "amount": amount, "t": signed.txid,
                                                      "gas": gas, "max_fee": max_fee_wei, "priority": priority_fee_wei,
                                                      "replaces": replaces_txid})
            self._audit(c, None, "signed", None, signed.txid, detail)
            c.commit()
        return signed

    def _eth_rebalance_destination(self, tier: str) -> str | None:
        """Hot: the hot address; warm: the signer's own warm address (account "warm", 0/0); cold: the
        pinned address; else None."""
        if tier == "hot":
            return self._eth_hot_address()
        if tier == "warm":
            return _eth_address(self._keys.private_key_for("ethereum", "warm", 0, 0))
        if tier == "cold":
            return self.cold_addresses.get("ethereum")
        return None

    @staticmethod
    def _check_sender_slot(c: Connection, rebalance_id: int, sender: str, chain_id: int, nonce: int) -> None:
        """`already_signed` / `nonce_gap` for a rebalance from `sender` (hot or warm), from the
        signer's own records of every transaction of that address (withdrawals, gas fundings, rebalances)."""
        mine = c.execute(_ETH_REBALANCE_RECORDS_SQL, {"r": rebalance_id}).all()
        if mine:
            if any((int(r.chain_id), r.sender.lower(), int(r.nonce)) != (chain_id, sender.lower(), nonce) for r in mine):
                raise SigningRefused(RefusalCode.already_signed, f"eth rebalance {rebalance_id} was signed at nonce {mine[0].nonce}")
            return
        taken = c.execute(_HOT_SLOT_TAKEN_SQL, {"a": sender, "n": nonce, "ci": chain_id}).first()
        if taken is not None:
            raise SigningRefused(RefusalCode.already_signed, f"hot nonce {nonce} is already signed in {taken.txid}")
        highest = c.execute(_HOT_SLOT_HIGHEST_SQL, {"a": sender, "ci": chain_id}).scalar()
        if highest is not None and nonce > int(highest) + 1:
            raise SigningRefused(RefusalCode.nonce_gap, f"{sender}: nonce {nonce}, the highest the signer signed is {highest}")

    # ---- proof of reserves ----------------------------------------------------------------

    def sign_reserves_message(self, chain: str, tier: str, change: int, index: int, message: str) -> ReservesSignature:
        """Sign one proof-of-reserves statement with the key at (chain, tier, change, index): a
        BIP-322 simple signature (bitcoin, P2WPKH) or an EIP-191 personal_sign signature (ethereum).
        Refused (`statement_invalid`) unless `message` is exactly a `ReservesStatement` (fixed
        prefix and grammar, signer.protocol) for `chain` naming the address the signer itself
        derives for that key: it cannot be made to sign a transaction, an approval, or a statement
        about an address it does not hold. Neither format can authorise a payment (BIP-322 signs a
        transaction spending an output that cannot exist; EIP-191 a prefixed digest). Cold keys are
        not held (`tier_watch_only`). Nothing is read from the database."""
        statement = ReservesStatement.parse(message)
        if statement is None or statement.chain != chain:
            raise SigningRefused(RefusalCode.statement_invalid, "only proof-of-reserves statements of the fixed format are signed")
        key = self._keys.private_key_for(chain, tier, change, index)
        if chain == "bitcoin":
            hrp = bip322.HRPS[self.bitcoin_network]
            address = P2WPKHAddrEncoder.EncodeKey(PrivateKey(key).public_key.format(compressed=True), hrp=hrp)
            if statement.address != address:
                raise SigningRefused(RefusalCode.statement_invalid, f"the statement names {statement.address}, not this key's {address}")
            return ReservesSignature(address, bip322.sign_simple(key, address, message))
        address = _eth_address(key)
        if statement.address.lower() != address.lower():
            raise SigningRefused(RefusalCode.statement_invalid, f"the statement names {statement.address}, not this key's {address}")
        return ReservesSignature(address, eip191.sign_personal(key, message))

    # ---- ethereum -------------------------------------------------------------------------

    def sign_ethereum_payment(self, batch_id: int, output: BatchOutput, *, hot_index: int, chain_id: int, nonce: int,
                              to: str, value: int, data: bytes, gas: int, max_fee_wei: int, priority_fee_wei: int,
                              replaces_txid: str | None = None) -> SignedEthTx:
        """Sign the one transaction paying `output` (ether: to=destination; ERC-20: to=the token
        contract of the signer's own asset table, data=transfer), for the signer's own chain id.
        With `replaces_txid`, a same-nonce replacement of that version at a higher fee: the same
        withdrawal, chain id, sender and nonce the signer recorded for it (module docstring)."""
        with self._request(batch_id, {"replaces": replaces_txid} if replaces_txid else {}) as c:
            self._lock(c, [output.withdrawal_id])
            key = self._keys.private_key_for("ethereum", "hot", 0, hot_index)
            c.execute(text(_LOCK_SQL), {"k": f"signer_eth_sender:{_eth_address(key).lower()}"})  # fundings take it too
            self._check_halted(c)
            if self.ethereum_chain_id is None or chain_id != self.ethereum_chain_id:
                raise SigningRefused(RefusalCode.chain_id_mismatch,
                                     f"chain id {chain_id} is not the signer's own ({self.ethereum_chain_id})")
            slot = EthSlot(chain_id, _eth_address(key), nonce)
            if replaces_txid is None:
                [paid] = self._check_batch(c, batch_id, [output], "ethereum")
            else:
                [paid] = self._check_replacement(c, batch_id, replaces_txid, [output], "ethereum", slot=slot)
            self._check_eth_call(paid, to, value, data)
            if gas * max_fee_wei > self.max_eth_fee_wei or priority_fee_wei > max_fee_wei:
                raise SigningRefused(RefusalCode.fee_above_ceiling,
                                     f"gas x max fee {gas * max_fee_wei} wei is above the cap {self.max_eth_fee_wei}")
            funded = c.execute(_HOT_NONCE_FUNDED_SQL, {"ci": chain_id, "a": slot.sender, "n": nonce}).first()
            if funded is not None:
                raise SigningRefused(RefusalCode.already_signed, f"hot nonce {nonce} is already signed in gas funding {funded.txid}")
            first = self._check_history(c, [paid], slot=slot)
            if replaces_txid is None:
                self._check_unapproved(c, [paid] if paid.withdrawal_id in first else [])
            signed = sign_eip1559(key, chain_id=chain_id, nonce=nonce, to=to, value=value, data=data, gas=gas,
                                  max_fee_wei=max_fee_wei, priority_fee_wei=priority_fee_wei)
            self._record(c, batch_id, signed.txid, [paid], slot=slot, replaces=replaces_txid,
                         detail={"nonce": nonce, "max_fee_wei": max_fee_wei, **({"replaces": replaces_txid} if replaces_txid else {})})
        return signed

    # ---- checks ---------------------------------------------------------------------------

    def _check_eth_call(self, paid: Paid, to: str, value: int, data: bytes) -> None:
        """The transaction must do exactly what the withdrawal says, with the contract of the
        signer's OWN asset table: ether: to = destination, value = amount, no data; ERC-20: to =
        the asset's contract, value 0, data = transfer(destination, amount)."""
        contract = self.assets[paid.asset].contract
        if contract:
            expected = (contract.lower(), 0, erc20_transfer_data(paid.destination, paid.amount))
        else:
            expected = (paid.destination.lower(), paid.amount, b"")
        if (to.lower(), value, bytes(data)) != expected:
            raise SigningRefused(RefusalCode.output_mismatch, f"the transaction does not do what withdrawal {paid.withdrawal_id} says")

    def _check_halted(self, c: Connection, message: str = "withdrawals are halted by the kill switch") -> None:
        if c.execute(text("SELECT engaged FROM control_flag WHERE name = 'withdrawals_halted'")).scalar():
            raise SigningRefused(RefusalCode.kill_switch_on, message)

    def _script(self, w, o: BatchOutput, chain: str) -> bytes:
        """The output script the signer itself computes from the withdrawal's destination
        (bitcoin); an output that names another (the custody-writable `destination_script`, say)
        is refused."""
        if chain != "bitcoin":
            if o.script:
                raise SigningRefused(RefusalCode.output_mismatch, f"output for withdrawal {w.id}: an ethereum output has no script")
            return b""
        try:
            script = address_to_script(w.destination, self.bitcoin_network)
        except SignerError as exc:
            raise SigningRefused(RefusalCode.output_mismatch, f"withdrawal {w.id}: {exc}") from None
        if o.script and bytes(o.script) != script:
            raise SigningRefused(RefusalCode.output_mismatch,
                                 f"output for withdrawal {w.id} pays another script than its destination {w.destination}'s")
        return script

    def _check_batch(self, c: Connection, batch_id: int, outputs: Sequence[BatchOutput], chain: str = "bitcoin") -> list[Paid]:
        """The module table's checks of a new signature, in its order; what will be paid, in the
        order of `outputs`."""
        self._check_halted(c)
        if not outputs:
            raise SigningRefused(RefusalCode.empty_batch, f"batch {batch_id} has no outputs")
        ids = c.execute(text("SELECT withdrawal_id FROM batch_output WHERE batch_id = :b"), {"b": batch_id}).scalars().all()
        if sorted(o.withdrawal_id for o in outputs) != sorted(ids):
            raise SigningRefused(RefusalCode.output_mismatch, "outputs and the batch's withdrawals differ")
        by_id = self._withdrawals(c, ids)
        if len(by_id) != len(ids):
            raise SigningRefused(RefusalCode.output_mismatch, f"a withdrawal of batch {batch_id} is gone")
        paid = self._check_outputs(c, batch_id, outputs, by_id, chain)
        approvals = self._approvals(c, by_id.values())
        now, counted = self.clock(), {}
        resigned = set(c.execute(text(_RESIGN_SQL), {"b": batch_id, "w": list(ids)}).scalars())
        for o in outputs:
            w = by_id[o.withdrawal_id]
            with _about(w.id):  # each refusal here is about this one withdrawal
                if w.state != "batched" or w.batch_id != batch_id:
                    raise SigningRefused(RefusalCode.withdrawal_not_batched, f"withdrawal {w.id} is {w.state}")
                counted[w.id] = self._check_decision(w, approvals.get(w.decision_id, []), now,
                                                     check_expiry=w.id not in resigned)
                if w.hold_state != "pending" or int(w.hold_remaining) < int(w.amount) + int(w.fee_quoted):
                    raise SigningRefused(RefusalCode.hold_not_live, f"withdrawal {w.id}: the hold is {w.hold_state}")
        return [Paid(p.withdrawal_id, p.chain, p.asset, p.amount, p.destination, p.script, counted[p.withdrawal_id])
                for p in paid]

    def _check_replacement(self, c: Connection, batch_id: int, replaces_txid: str, outputs: Sequence[BatchOutput],
                           chain: str, *, inputs: Sequence[str] = (), slot: EthSlot | None = None) -> list[Paid]:
        """A replacement's checks (module docstring): against the signer's own record of the
        version it replaces first, then the rows and approvals as for a batch, the decision's
        expiry excepted and the hold captured rather than live."""
        self._check_halted(c)
        if not outputs:
            raise SigningRefused(RefusalCode.empty_batch, f"batch {batch_id} has no outputs")
        version = c.execute(text(_VERSION_SQL), {"b": batch_id, "t": replaces_txid}).all()
        if not version or any(v.chain != chain for v in version):
            raise SigningRefused(RefusalCode.replacement_unknown,
                                 f"{replaces_txid} is not a {chain} transaction the signer signed for batch {batch_id}")
        if chain == "bitcoin" and any(sorted(v.inputs) != sorted(inputs) for v in version):
            raise SigningRefused(RefusalCode.replacement_unknown, f"a replacement spends exactly the inputs of {replaces_txid}")
        if chain == "ethereum" and any(EthSlot(int(v.chain_id), v.sender, int(v.nonce)) != slot for v in version):
            raise SigningRefused(RefusalCode.replacement_unknown,
                                 f"a replacement uses exactly the chain id, sender and nonce of {replaces_txid}")
        recorded = sorted({(v.withdrawal_id, v.destination, int(v.amount)) for v in version})  # a re-sign records it twice
        if sorted((o.withdrawal_id, o.address, o.amount) for o in outputs) != recorded:
            raise SigningRefused(RefusalCode.output_mismatch,
                                 f"a replacement pays exactly the withdrawals, destinations and amounts of {replaces_txid}")
        by_id = self._withdrawals(c, [o.withdrawal_id for o in outputs])
        if len(by_id) != len(outputs):
            raise SigningRefused(RefusalCode.output_mismatch, "a withdrawal of the replaced version is gone")
        paid = self._check_outputs(c, batch_id, outputs, by_id, chain)
        approvals = self._approvals(c, by_id.values())
        now, counted = self.clock(), {}
        for o in outputs:
            w = by_id[o.withdrawal_id]
            if w.state not in ("signed", "broadcast") or w.batch_id != batch_id:
                raise SigningRefused(RefusalCode.withdrawal_not_batched, f"withdrawal {w.id} is {w.state}")
            counted[w.id] = self._check_decision(w, approvals.get(w.decision_id, []), now, check_expiry=False)
            if w.hold_state not in ("captured", "released"):
                raise SigningRefused(RefusalCode.hold_not_live, f"withdrawal {w.id}: the hold was never captured")
        return [Paid(p.withdrawal_id, p.chain, p.asset, p.amount, p.destination, p.script, counted[p.withdrawal_id])
                for p in paid]

    @staticmethod
    def _withdrawals(c: Connection, ids: Sequence[int]) -> dict:
        return {r.id: r for r in c.execute(text(_WITHDRAWALS_SQL), {"w": list(ids), "hold_owner": WITHDRAWAL_HOLD_OWNER})}

    @staticmethod
    def _approvals(c: Connection, rows) -> dict[int, list]:
        out: dict[int, list] = {}
        for a in c.execute(text(_APPROVALS_SQL), {"d": [r.decision_id for r in rows if r.decision_id is not None]}):
            out.setdefault(a.decision_id, []).append(a)
        return out

    def _check_outputs(self, c: Connection, batch_id: int, outputs: Sequence[BatchOutput], by_id: dict,
                       chain: str) -> list[Paid]:
        """Each output against its withdrawal row (address, amount, the script computed here), the
        asset against the signer's own table, then the denylist and the signer's own addresses."""
        paid = []
        for o in outputs:
            w = by_id[o.withdrawal_id]
            with _about(w.id):
                if (o.address, o.amount) != (w.destination, int(w.amount)):
                    raise SigningRefused(RefusalCode.output_mismatch, f"output for withdrawal {w.id} does not match it")
                paid.append(Paid(w.id, chain, w.asset, int(w.amount), w.destination, self._script(w, o, chain), 0))
        for p in paid:
            asset = self.assets.get(p.asset)
            if asset is None or asset.chain != chain or by_id[p.withdrawal_id].chain != chain:
                raise SigningRefused(RefusalCode.asset_unknown,
                                     f"withdrawal {p.withdrawal_id}: the signer pays no asset {p.asset!r} on {chain}",
                                     p.withdrawal_id)
        denied = {a.lower() for a in c.execute(text("SELECT address FROM denylist_address WHERE lower(address) = ANY(:d)"),
                                              {"d": [p.destination.lower() for p in paid]}).scalars()}
        if denied:  # named: the first withdrawal paying one (custody drops it; the next request names the next)
            first = next(p.withdrawal_id for p in paid if p.destination.lower() in denied)
            raise SigningRefused(RefusalCode.destination_denied, f"withdrawal {first}: denylisted destination(s): "
                                 f"{sorted(denied)}", first)
        self._check_not_own(batch_id, paid)
        return paid

    def warm_up(self) -> float:
        """Derive the own-address windows once (signer.own_addresses caches them), so the first
        signing call does not pay for ~10,000 derivations; seconds taken. Public keys only."""
        import time

        started = time.monotonic()
        tiers = ("deposit", "hot", "warm")
        bitcoin_own_scripts({t: self._keys.account_xpub("bitcoin", t) for t in tiers}, self.bitcoin_network,
                            receive_window=self.receive_window, deposit_window=self.deposit_window)
        ethereum_own_addresses({t: self._keys.account_xpub("ethereum", t) for t in tiers},
                               receive_window=self.receive_window, deposit_window=self.deposit_window)
        return time.monotonic() - started

    def _check_not_own(self, batch_id: int, paid: Sequence[Paid]) -> None:
        """Refuse an output paying an address derived from the signer's own keys (module table of
        signer.own_addresses); the change output is not among `paid` and is checked on its own."""
        tiers = ("deposit", "hot", "warm")
        btc = bitcoin_own_scripts({t: self._keys.account_xpub("bitcoin", t) for t in tiers}, self.bitcoin_network,
                                  receive_window=self.receive_window, deposit_window=self.deposit_window)
        btc |= bitcoin_change_scripts(self._keys.account_xpub("bitcoin", "hot"), self.bitcoin_network, batch_id,
                                      self.change_window)
        eth = ethereum_own_addresses({t: self._keys.account_xpub("ethereum", t) for t in tiers},
                                     receive_window=self.receive_window, deposit_window=self.deposit_window)
        for p in paid:
            if pays_own_address(p.destination, p.script, bitcoin_scripts=btc, ethereum_addresses=eth, network=self.bitcoin_network):
                raise SigningRefused(RefusalCode.destination_internal,
                                     f"output for withdrawal {p.withdrawal_id} pays {p.destination}, an address of the signer's own keys",
                                     p.withdrawal_id)

    def _check_decision(self, w, approvals: list, now: dt.datetime, *, check_expiry: bool = True) -> int:
        """The decision and its approvals, as the module table orders them: every approval row must
        be a valid signature of a known key over the payload rebuilt here; quorum from the signer's
        own table and registry. Returns the number of eligible approvers counted."""
        if w.decision_id is None or w.d_id is None:
            raise SigningRefused(RefusalCode.no_decision, f"withdrawal {w.id} has no policy decision")
        unprintable = unprintable_fields({"chain": w.chain, "asset": w.asset, "destination": w.destination,
                                          "policy_version": w.policy_version})
        if unprintable:
            raise SigningRefused(RefusalCode.payload_unprintable,
                                 f"withdrawal {w.id}: control or format characters in {'; '.join(unprintable)}")
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
        if check_expiry and now >= w.expires_at:
            raise SigningRefused(RefusalCode.decision_expired, f"withdrawal {w.id}: decision expired {w.expires_at.isoformat()}")
        return len(eligible)

    def _approver(self, wid: int, a, expected: bytes) -> ApproverKey:
        """The registry key whose signature approval row `a` carries, or the refusal (module table)."""
        if a.signature is None or a.signed_payload is None or a.key_id is None:
            raise SigningRefused(RefusalCode.approval_unsigned, f"withdrawal {wid}: approval {a.id} ({a.operator!r}) is not signed")
        payload = bytes(a.signed_payload)
        try:
            key = verify_stored_approval(self.approvers, a, payload)
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
    def _check_coins(c: Connection, batch_id: int, coins: Sequence[BtcCoin], *, spent_ok: bool = False) -> None:
        """Every coin is a hot-wallet coin reserved for this batch, with the amount and derivation on
        record, unspent (`spent_ok`: a replacement re-spends the coins its version spends)."""
        known = {(r.txid, r.vout): r for r in c.execute(
            text("SELECT txid, vout, amount, derivation_change, derivation_index, reserved_by, spent_by FROM wallet_utxo "
                 "WHERE reserved_by = :b"), {"b": batch_id})}
        if not coins or len({(k.txid, k.vout) for k in coins}) != len(coins):
            raise SigningRefused(RefusalCode.unknown_input, "a batch spends at least one coin, each once")
        for k in coins:
            row = known.get((k.txid, k.vout))
            if (row is None or (row.spent_by is not None and not spent_ok) or int(row.amount) != k.amount
                    or (row.derivation_change, row.derivation_index) != (k.change, k.index)):
                raise SigningRefused(RefusalCode.unknown_input, f"input {k.txid}:{k.vout} is not a reserved hot-wallet coin")

    def _check_history(self, c: Connection, paid: Sequence[Paid], *, inputs: Sequence[str] = (),
                       slot: EthSlot | None = None) -> set[int]:
        """`already_signed` (module table) from the signer's own `signer_signature` rows: the new
        transaction must conflict with every earlier one of each withdrawal and pay exactly the
        asset, amount and destination recorded there. Returns the ids of the withdrawals signed for
        the first time."""
        earlier: dict[int, list] = {}
        for r in c.execute(text(_SIGNATURES_SQL), {"w": [p.withdrawal_id for p in paid]}):
            earlier.setdefault(r.withdrawal_id, []).append(r)
        spent = set(inputs)
        for p in paid:
            for r in earlier.get(p.withdrawal_id, []):
                if r.chain != p.chain:
                    conflicts = False
                elif p.chain == "bitcoin":
                    conflicts = bool(spent & set(r.inputs))
                else:
                    conflicts = EthSlot(int(r.chain_id), r.sender, int(r.nonce)) == slot
                if (r.asset, int(r.amount), r.destination) != (p.asset, p.amount, p.destination):
                    raise SigningRefused(RefusalCode.already_signed,
                                         f"withdrawal {p.withdrawal_id} was signed in {r.txid} (batch {r.batch_id}) paying "
                                         f"{int(r.amount)} {r.asset} to {r.destination!r}; a re-sign pays exactly that, not "
                                         f"{p.amount} {p.asset} to {p.destination!r}")
                if not conflicts:
                    raise SigningRefused(RefusalCode.already_signed,
                                         f"withdrawal {p.withdrawal_id} was already signed in {r.txid} (batch {r.batch_id}); "
                                         "this transaction could confirm beside it")
        return {p.withdrawal_id for p in paid if p.withdrawal_id not in earlier}

    def _check_unapproved(self, c: Connection, new: Sequence[Paid]) -> None:
        """`unapproved_limit_reached` (module table): the withdrawals signed for the first time with
        no valid approval, added per asset to what the signer signed that way within the window,
        read under the asset's advisory lock (module docstring), held until the request commits."""
        if self.unapproved_limits is None:
            return
        adding: dict[str, int] = {}
        for p in new:
            if p.approvals == 0:
                adding[p.asset] = adding.get(p.asset, 0) + p.amount
        now = self.clock()
        for asset, amount in sorted(adding.items()):
            limit = self.unapproved_limits.get(asset, UnapprovedLimit(0, 1))
            since = now - dt.timedelta(seconds=limit.window_secs)
            c.execute(text(_LOCK_SQL), {"k": f"signer_unapproved:{asset}"})
            used = int(c.execute(text(_UNAPPROVED_SQL), {"a": asset, "since": since}).scalar_one())
            if used + amount > limit.amount:
                raise SigningRefused(RefusalCode.unapproved_limit_reached,
                                     f"{asset}: {used} signed without approvals in the last {limit.window_secs} s, "
                                     f"{amount} more would pass the cap of {limit.amount}")

    # ---- the request's transaction ----------------------------------------------------------

    @contextmanager
    def _request(self, batch_id: int | None, detail: dict) -> Iterator[Connection]:
        """One database transaction per signing request: the body locks, checks, signs and records
        (`_record` commits); a refusal is audited in it, committed, and raised."""
        with self.engine.connect() as c:
            try:
                c.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
                yield c
            except SigningRefused as refused:
                c.rollback()
                self._audit(c, batch_id, "refused", refused.code.value, None, {**detail, "message": refused.message})
                c.commit()
                raise

    @staticmethod
    def _lock(c: Connection, withdrawal_ids: Sequence[int]) -> None:
        """Serialise requests for the same withdrawals until this transaction ends (sorted: no
        deadlock between two batches sharing withdrawals)."""
        c.execute(text(_LOCKS_SQL), {"k": [f"signer_signature:{wid}" for wid in sorted(set(withdrawal_ids))]})

    def _record(self, c: Connection, batch_id: int, txid: str, paid: Sequence[Paid], *, inputs: Sequence[str] | None = None,
                slot: EthSlot | None = None, replaces: str | None = None, detail: dict) -> None:
        """The signer's own record of what it signed (one row per withdrawal) and its audit row, in
        one transaction, committed: only then does the signed transaction leave the signer."""
        at = self.clock()
        c.execute(text(_INSERT_SIGNATURE_SQL), {
            "at": at, "b": batch_id, "txid": txid, "replaces": replaces,
            "inputs": list(inputs) if inputs is not None else None, "sender": slot.sender if slot else None,
            "nonce": slot.nonce if slot else None, "chain_id": slot.chain_id if slot else None,
            "w": [p.withdrawal_id for p in paid], "chain": [p.chain for p in paid], "asset": [p.asset for p in paid],
            "amount": [p.amount for p in paid], "dest": [p.destination for p in paid],
            "approvals": [p.approvals for p in paid]})
        self._audit(c, batch_id, "signed", None, txid, detail)
        c.commit()

    @staticmethod
    def _audit(c: Connection, batch_id: int | None, outcome: str, code: str | None, txid: str | None, detail: dict) -> None:
        c.execute(text("INSERT INTO signer_audit (batch_id, outcome, code, txid, detail) VALUES (:b, :o, :c, :t, CAST(:d AS jsonb))"),
                  {"b": batch_id, "o": outcome, "c": code, "t": txid, "d": json.dumps(detail)})
        if code:
            log.warning("signer refused batch %s: %s", batch_id, code)


@contextmanager
def _about(withdrawal_id: int) -> Iterator[None]:
    """A refusal raised inside is about withdrawal `withdrawal_id` alone: it leaves carrying that id
    (`SigningRefused.withdrawal_id`, unless a check already named one), so custody can take that
    withdrawal out of its batch and sign the rest. Wraps the per-withdrawal checks of a new batch
    (`_check_batch`, `_check_outputs`); refusals about the request as a whole stay unnamed."""
    try:
        yield
    except SigningRefused as refused:
        if refused.withdrawal_id is None:
            refused.withdrawal_id = withdrawal_id
        raise


def _eth_address(private_key: bytes) -> str:
    """The checksummed address of an ethereum private key (the sender of what it signs)."""
    from eth_account import Account

    return Account.from_key(private_key).address
