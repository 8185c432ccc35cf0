"""The record: who used which card, when, for how long and how much energy (docs/serve.md, "The record").

`store` is the SQLite file and its queries, `writer` the agent's writer (the agent holds it: `agent.record`), `report`
the `hostagent usage` command.
"""

BY = ("user", "card", "image", "day")  # what `usage` sums per (here: the parser needs it without SQLite's import)
