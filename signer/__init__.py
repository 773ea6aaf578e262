"""Signer: key custody and signing. Signs only what carries an approved decision and a live hold.

- `signer.keys`: loads the BIP39 seed (file or environment, held in a redacting `Secret`, never
  logged, never persisted), derives one BIP84 (bitcoin) and one BIP44 (ethereum) account per
  wallet tier (deposit 0, hot 1, warm 2, cold 3), hands custody account xpubs via
  `SignerKeys.account_xpub`, and releases raw private keys only to signing code in this package
  via `SignerKeys.private_key_for` (never for the watch-only cold tier).
- `signer.errors`: the signer's refusal codes.
"""
