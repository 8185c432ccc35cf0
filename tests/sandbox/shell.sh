#!/usr/bin/env bash
# `make shell`: an interactive shell on the simulated GPU host, for your own commands after `make demo`. The
# Makefile has started the sandboxed daemon and passes the simulated host's variables (DOCKER_HOST,
# LD_LIBRARY_PATH, FAKEGPU_TOPOLOGY); this puts the checkout's .venv/bin first on PATH and says where you are.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${DOCKER_HOST:?make shell sets it}" "${LD_LIBRARY_PATH:?make shell sets it}" "${FAKEGPU_TOPOLOGY:?make shell sets it}"
rc=$(mktemp "${TMPDIR:-/tmp}/gpupin-shell.XXXXXX")
# The user's own bashrc first, then what makes this shell the simulated host's (and the file removes itself).
cat >"$rc" <<RC
[ -f ~/.bashrc ] && . ~/.bashrc
export PATH="$REPO/.venv/bin:\$PATH"
PS1="(gpupin simulated host) \$PS1"
rm -f "$rc"
cat >&2 <<'BANNER'
gpupin: a shell on the simulated GPU host (mixed-4 by default: FAKEGPU_TOPOLOGY), with the sandboxed Docker
daemon as DOCKER_HOST and the checkout's hostagent and gpupin-entrypoint on PATH. Try: hostagent ls,
hostagent run --rm --gpu 1 gpupin:test (the image \`make demo\` built). \`exit\` leaves it.
BANNER
RC
exec bash --rcfile "$rc" -i
