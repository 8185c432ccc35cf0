"""`hostagent compose render|check`: compose services pinned to physical GPUs by UUID, and the files that are not.

A service asks for cards with `x-gpupin` or in any form docker compose takes; `render` resolves every request
against this host's cards and the ledger and writes a compose file pinned by UUID (gpupin.hostagent.pin);
`check` reports what would land a job on the wrong card or double-book one, by the same rules. The forms, the
rules, the exit codes and a module per step a file goes through: docs/compose.md.
"""
