"""gpupin's host side: resolve physical GPU requests through NVML and start pinned containers through the
Docker Engine, keeping a ledger (container labels) of who holds which card."""
