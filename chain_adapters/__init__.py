"""Chain adapters: one module per chain family (bitcoin via bitcoind JSON-RPC, ethereum via web3).
No database, no ledger: they hand custody plain typed values in minor units.
"""
