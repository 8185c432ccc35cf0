"""gpupin at Docker's door: an authorization plugin (`hostagent authz`) that the daemon asks about every request.
It reads a container's create with the ledger's one table of holding forms, denies what would take a held or busy
card, what pins no card, and (enforce mode `on`) what carries no grant of the agent's; the agent judges what needs
the ledger (POST /api/authz). What it does and does not stop: docs/authz.md.
"""
