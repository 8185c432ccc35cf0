"""The ledger: who holds which card, read from the containers themselves on every run, and the lock and lease that
make "look, then create" exclusive among every client of one daemon. A module per idea: docs/design.md, "Parts" and
"The ledger".
"""
