"""Transactions built and signed in Python for the e2e tests (the node is the judge).

Bitcoin: P2WPKH spends with python-bitcoinlib, keys derived deterministically from a label, no
global network parameters (the regtest address prefix `bcrt` is passed explicitly).
Ethereum: EIP-1559 transfers signed with eth-account.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from bitcoin.core import (
    CMutableTransaction,
    CMutableTxIn,
    CMutableTxOut,
    COutPoint,
    CScriptWitness,
    CTxInWitness,
    CTxWitness,
    Hash160,
    lx,
)
from bitcoin.core.script import (
    OP_0,
    OP_CHECKSIG,
    OP_DUP,
    OP_EQUALVERIFY,
    OP_HASH160,
    SIGHASH_ALL,
    SIGVERSION_WITNESS_V0,
    CScript,
    SignatureHash,
)
from bitcoin.segwit_addr import decode as bech32_decode
from bitcoin.segwit_addr import encode as bech32_encode
from bitcoin.wallet import CKey
from eth_account import Account

REGTEST_HRP = "bcrt"
RBF_SEQUENCE = 0xFFFFFFFD


@dataclass(frozen=True)
class BtcKey:
    key: CKey
    address: str
    script_pubkey: bytes

    @classmethod
    def from_label(cls, label: str, hrp: str = REGTEST_HRP) -> BtcKey:
        key = CKey(hashlib.sha256(f"custody-e2e:{label}".encode()).digest(), compressed=True)
        program = Hash160(key.pub)
        return cls(key, bech32_encode(hrp, 0, program), bytes(CScript([OP_0, program])))


def script_for(address: str, hrp: str = REGTEST_HRP) -> bytes:
    """scriptPubKey of a native segwit address."""
    version, program = bech32_decode(hrp, address)
    if version is None:
        raise ValueError(f"not a {hrp} segwit address: {address}")
    return bytes([0 if version == 0 else 0x50 + version, len(program)]) + bytes(program)


def spend_p2wpkh(key: BtcKey, txid: str, vout: int, amount: int,
                 pay_to: list[tuple[str, int]], *, sequence: int = RBF_SEQUENCE) -> bytes:
    """A signed transaction spending one P2WPKH output of `key`; fee = amount - sum(outputs)."""
    return spend_p2wpkh_to_scripts(key, txid, vout, amount, [(script_for(addr), value) for addr, value in pay_to],
                                   sequence=sequence)


def spend_p2wpkh_to_scripts(key: BtcKey, txid: str, vout: int, amount: int,
                            outputs: list[tuple[bytes, int]], *, sequence: int = RBF_SEQUENCE) -> bytes:
    """`spend_p2wpkh` with the outputs given as (scriptPubKey, satoshis): no address decoding, for
    transactions of thousands of outputs (bench/wallet_scale.py)."""
    tx = CMutableTransaction(
        [CMutableTxIn(COutPoint(lx(txid), vout), nSequence=sequence)],
        [CMutableTxOut(value, CScript(script)) for script, value in outputs])
    script_code = CScript([OP_DUP, OP_HASH160, Hash160(key.key.pub), OP_EQUALVERIFY, OP_CHECKSIG])
    sighash = SignatureHash(script_code, tx, 0, SIGHASH_ALL, amount=amount, sigversion=SIGVERSION_WITNESS_V0)
    sig = key.key.sign(sighash) + bytes([SIGHASH_ALL])
    tx.wit = CTxWitness([CTxInWitness(CScriptWitness([sig, key.key.pub]))])
    return tx.serialize()


# anvil's default dev account #1 (public test mnemonic): signs the Python-built ethereum txs
ETH_DEV_KEY_1 = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"


def eip1559_transfer(private_key: str, *, to: str, value: int, nonce: int, chain_id: int,
                     max_fee: int, priority_fee: int, gas: int = 21_000, data: bytes = b"") -> bytes:
    tx = {"type": 2, "chainId": chain_id, "nonce": nonce, "to": to, "value": value, "gas": gas,
          "maxFeePerGas": max_fee, "maxPriorityFeePerGas": priority_fee, "data": data}
    return bytes(Account.sign_transaction(tx, private_key).raw_transaction)


def eth_address(private_key: str) -> str:
    return Account.from_key(private_key).address


def eth_new_address(label: str) -> str:
    return Account.from_key(hashlib.sha256(f"custody-e2e:eth:{label}".encode()).digest()).address
