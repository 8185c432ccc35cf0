"""`hostagent run`: the request from docker run's options (request, options), the lock, ledger read and create of a
pinned container (launch), its image (image) and the attach, start and wait of docker run (attach)."""
