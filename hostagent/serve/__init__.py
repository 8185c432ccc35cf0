"""`hostagent serve`: the resident host agent. It keeps NVML and the Engine client open, follows the daemon's events,
and serves the live `ls` view (with idle holders) as JSON, Prometheus metrics and a dashboard, over a unix socket for
the CLI and over loopback HTTP (docs/serve.md; its place: docs/design.md, "The resident agent")."""
