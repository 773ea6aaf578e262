"""Double-entry ledger: accounts, balanced journal transactions, two-phase holds, idempotent postings
and self-verification. Imports nothing else of ours (DESIGN.md section 5).
"""
