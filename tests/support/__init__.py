"""What the tests share besides fixtures (conftest.py keeps the fixtures and the hooks).

    scenarios   the shipped boxes (tests/fakegpu/scenarios/*.json): files, cards, UUIDs, bus ids, names
    host        the simulated GPU host: the checkout's paths, the CLIs' environment there, whether CI requires
                the daemons and clusters
    sandbox     the sandboxed Docker daemons (one per engine) and hostagent driven against them
    entrypoint  gpupin-entrypoint run on the host or in a container, for the tests of its contract
    wait        waiting on a condition, never on the clock
"""
