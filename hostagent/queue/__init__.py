"""`hostagent queue`: who waits in the resident agent's fair queue (gpupin.hostagent.serve.queue)."""
