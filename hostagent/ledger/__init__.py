"""The ledger: who holds which card. The ways a container can hold one (forms: one table, its rows by family and
the HostCards and CardGrant they read with; nodes: which paths reach a GPU node), the holders and when they hold
(holders: when a container holds, which gpupin labels are its own, whether the entrypoint proved its cards), the
processes that hold (processes: a pid's container and user from /proc), the reading of them from the daemon
(read), the lease of a container in the middle of its start and its renewals (lease) and the lock that makes "look,
then create" exclusive among every client of one daemon (lock)."""
