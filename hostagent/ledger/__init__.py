"""The ledger: who holds which card. The ways a container can hold one (forms: one table, read by the rows of
requests, environment and devices, over grant's Host and Grant; nodes: which paths reach a GPU node), the
holders and when they hold (holders; labels: which gpupin labels are a container's own), the reading of them from
the daemon (read), the lease of a container in the middle of its start (lease, renewal) and the lock that makes
"look, then create" exclusive among every client of one daemon (lock)."""
