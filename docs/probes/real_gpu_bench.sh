set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
python3 -m compileall -q /tmp/site
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
mapfile -t ROWS < <(nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv,noheader | tr -d ' ')
U0=${ROWS[0]%,*} B0=${ROWS[0]#*,} U1=${ROWS[1]%,*} B1=${ROWS[1]#*,}
echo "\$ python3 bench/run.py entrypoint -n 20 --expect $U1@$B1"
python3 bench/run.py entrypoint -n 20 --expect "$U1@$B1"
echo "\$ python3 bench/run.py entrypoint -n 20 --expect $U1,$U0"
python3 bench/run.py entrypoint -n 20 --expect "$U1,$U0"
