"""Signer: key custody and signing. Signs only what carries an approved decision and a live hold.

- `signer.keys`: loads the BIP39 seed (file or environment, held in a redacting `Secret`, never
  logged, never persisted), derives one BIP84 (bitcoin) and one BIP44 (ethereum) account per
  wallet tier (deposit 0, hot 1, warm 2, cold 3), hands custody account xpubs via
  `SignerKeys.account_xpub`, and releases raw private keys only to signing code in this package
  via `SignerKeys.private_key_for` (never for the watch-only cold tier).
- `signer.errors`: the signer's refusal codes.
- `signer.service`: `Signer`, the checks that run before anything is signed.
- The process (`python -m signer serve|xpubs|check`, signer/__main__.py): `signer.config` (TOML +
  `SIGNER_*` env, `build_signer`), `signer.server` (the socket server, the only process holding
  the seed), `signer.wire` (the authenticated protocol and its tables) and `signer.client`
  (`SignerClient`, what custody imports: no key code).
"""
