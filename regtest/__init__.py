"""Start, fund and stop bitcoind -regtest and anvil, for developers and for tests.
"""
