"""Matching engine: per-market order books behind a single-writer sequencer with a command journal,
replayable by state hash; settles fills through ledger/ only (DESIGN.md section 6).
"""
