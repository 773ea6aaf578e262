"""Matching engine: per-market order books behind a single-writer sequencer with a command journal,
replayable by state hash; settles fills through ledger/ only (DESIGN.md section 6).

This package is the pure core: no database, no I/O, standard library only. The money layer wires
it up: place the hold from `hold_requirement`, `Sequencer.submit` the command, and post what the
returned events say (see `matching.events` for what each event asks of it).

Modules: `model` (market, commands, orders, units), `states` (the ten order states), `book`,
`matcher` (plans a match), `stp`, `fees`, `holds`, `validation`, `stops`, `engine`, `events`,
`sequencer`, `snapshot`, `errors`.
"""
from matching.engine import Engine
from matching.errors import ErrorCode, MatchingError
from matching.fees import FeeSchedule, FeeTier
from matching.holds import hold_captured, hold_requirement
from matching.model import (ActivateTriggered, Amend, Cancel, Command, Evict, Market,
                            OrderType, Place, RejectTriggered, Side, TimeInForce)
from matching.order import Order
from matching.sequencer import JournalSink, MemoryJournal, Sequencer, Submitted
from matching.states import OrderState, transition
from matching.stp import StpPolicy

__all__ = [
    "ActivateTriggered", "Amend", "Cancel", "Command", "Engine", "ErrorCode", "Evict", "FeeSchedule",
    "FeeTier", "JournalSink", "Market", "MatchingError", "MemoryJournal", "Order", "OrderState",
    "OrderType", "Place", "RejectTriggered", "Sequencer", "Side", "StpPolicy", "Submitted",
    "TimeInForce", "hold_captured", "hold_requirement", "transition",
]
