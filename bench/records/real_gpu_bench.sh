. "$(dirname "$0")/host.sh"   # set -u, the wheels installed, show, U0/B0 U1/B1
echo "\$ python3 bench/run.py entrypoint -n 20 --expect $U1@$B1"
python3 bench/run.py entrypoint -n 20 --expect "$U1@$B1"
echo "\$ python3 bench/run.py entrypoint -n 20 --expect $U1,$U0"
python3 bench/run.py entrypoint -n 20 --expect "$U1,$U0"
