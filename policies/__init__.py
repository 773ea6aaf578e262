"""Policy engine: pure decisions over a withdrawal (or batch) and its context. No I/O in the rules.
"""
