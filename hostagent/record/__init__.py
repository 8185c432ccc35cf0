"""The record: who used which card, when, for how long and how much energy (docs/serve.md, "The record").

`store` is the SQLite file and its queries, `writer` the agent's writer (the agent holds it: `agent.record`), `report`
the `hostagent usage` command.
"""

BY = ("user", "card", "image", "day")  # what `usage` sums per (here: the parser needs it without SQLite's import)


class Scope:
    """Whose intervals a caller of the agent sees (docs/serve.md, "Who can reach it"): everyone's (root, the policy's
    `usage.readers`, and HTTP where the host's owner turned it on: `serve --http-per-user`), one uid's own (any other
    user of the socket: the record is root's, 0600), or the host's totals alone (HTTP otherwise: no row or series
    per user)."""

    __slots__ = ("per_user", "uid")

    def __init__(self, uid: int | None = None, per_user: bool = True) -> None:
        self.uid = uid  # only this uid's intervals; None: everyone's
        self.per_user = per_user  # rows and series per user; False: the host's totals alone

    def __repr__(self) -> str:
        return f"Scope(uid={self.uid}, per_user={self.per_user})"


EVERYONE = Scope()
TOTALS = Scope(per_user=False)
