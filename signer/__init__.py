"""Signer: key custody and signing. Signs only what carries an approved decision and a live hold.
"""
