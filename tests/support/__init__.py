"""What the tests share besides fixtures (tests/conftest.py and each tier's conftest.py keep the fixtures and hooks).

scenarios     the shipped boxes (tests/fakegpu/scenarios/*.json): files, cards, UUIDs, bus ids, names
host          the simulated GPU host: the checkout's paths, a process's environment there, the CLIs run there,
              whether this run requires the daemons and clusters (CI)
sandbox       the sandboxed Docker daemons (one per engine), and hostagent driven against them
entrypoint    gpupin-entrypoint run on the host or in a container, for the tests of its contract
ls            `hostagent ls` as the tests run it, and its golden files
compose       compose files as the compose tests write and read them
wait          waiting on a condition, never on the clock
spawn         the signal dispositions of the processes the tests start (the default, whatever the run inherited)
hypo          hypothesis's example counts, scaled by the profile (ci, fuzz: tests/conftest.py)
flood         what any local user can do to the resident agent: idle connections, a task limit to meet
daemon_proxy  a script: another address in front of a sandboxed daemon, failing on request
"""
