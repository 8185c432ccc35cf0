"""gpupin at Docker's door: an authorization plugin (`hostagent authz`) that the daemon asks about every request.
It reads a container's create with the ledger's one table of holding forms, denies what would take a held or busy
card, what pins no card, and (enforce mode `on`) what carries no grant of the agent's; the agent judges what needs
the ledger (POST /api/authz). What it does and does not stop: docs/authz.md.
"""

NAME = "gpupin"  # the plugin's name in the daemon's authorization-plugins
SOCKET = f"/run/docker/plugins/{NAME}.sock"  # where dockerd finds a plugin of that name (a fixed folder)
CONTENT_TYPE = "application/vnd.docker.plugins.v1.2+json"  # the plugin protocol's answers
# A container name the plugin denies every inspect and create of, in every mode: `hostagent setup authz` and doctor
# see from the daemon's answer (403 naming the plugin, or 404) whether it asks gpupin now (docker info shows only
# the plugins the daemon started with).
PROBE = "gpupin-authz-probe"
