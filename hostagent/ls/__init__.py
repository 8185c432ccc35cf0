"""`hostagent ls`: the cards, their holders and processes (listing; a pid's container from /proc is the ledger's:
gpupin.hostagent.ledger.processes), drawn as a table (view) or through --format (template)."""
