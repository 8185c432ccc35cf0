"""The ledger: who holds which card. The ways a container can hold one (holders, one table), the reading of them
from the daemon (read), the lease of a container in the middle of its start (lease) and the lock that makes
"look, then create" exclusive among every client of one daemon (lock)."""
