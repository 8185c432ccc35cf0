# Sourced by the real-GPU probe scripts (run from the repository root with the wheels in .whl/): gpupin installed
# from its wheels as an image would install it, `show` to print a command with its exit status, and the host's two
# cards as U0/B0 and U1/B1 (UUID and bus id, NVML order; U1/B1 empty on a one-card host).
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
python3 -m compileall -q /tmp/site   # as a normal `pip install` leaves it
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
show() { printf '\n$ %s\n' "$*"; "$@"; printf '(exit %s)\n' "$?"; }
mapfile -t ROWS < <(nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv,noheader | tr -d ' ')
R1=${ROWS[1]:-}
U0=${ROWS[0]%,*} B0=${ROWS[0]#*,} U1=${R1%,*} B1=${R1#*,}
