"""`hostagent ls`: the cards, their holders and processes (listing, procs), drawn as a table (view) or through
--format (template)."""
