"""`hostagent compose render|check`: compose services pinned to physical GPUs by UUID, and the files that are not.

A service asks for cards with the extension key `x-gpupin` (the compose spec lets `x-` keys be anywhere):

    x-gpupin:
      gpus: [GPU-95c6, 3]     # any `hostagent run --gpu` SPEC; list order = local-rank order (cuda:0 first)
      # or: count: 2          # N free cards, best first (most free memory, least load)
      share: true             # optional: may share its cards with other services or running pinned containers
      verify: cuda            # optional: GPUPIN_VERIFY for the entrypoint (nvml, cuda, torch)

or in any form docker compose takes: `deploy.resources.reservations.devices` (`driver: nvidia` with `device_ids`
or `count`, or `driver: cdi` with `nvidia.com/gpu=...` names), CDI names in `devices:` and the service-level
`gpus:` (compose v2.30+), or the legacy `runtime: nvidia` with NVIDIA_VISIBLE_DEVICES. `render` resolves every
request against this host's cards (NVML) and the ledger (running containers) and writes a plain compose file
pinned by UUID (hostagent.pin: through CDI where the daemon serves the cards so, else the nvidia driver); `check`
reports what would land a job on the wrong card or double-book one. Both run the same rules.

The modules, in the order a file goes through them:
    args        the command line of `hostagent compose`: its parsers, help texts, and checks of the options
    model       which model the commands read (project's, or compose v2's own), and what render writes
    project     the project as compose builds it: -f files, the override file, include, extends, profiles,
                !reset/!override; native asks compose v2 (`docker compose config`) for the same model
    interpolate .env files and ${VAR} in every value
    load        bytes -> text -> YAML -> a plain tree, with the limits (size, depth, aliases, duplicate keys)
    gpurequest  what one service asks for (GpuRequest), and what the forms of asking share (GpuRequestForm)
    forms       one reader per form (x-gpupin, deploy devices, CDI, gpus:, runtime): gpu_request
    devicerequest  a device request's keys, capabilities, count and device_ids, as compose-go reads them
    devicefiles the cards a service holds by device file (/dev/nvidiaN, or a folder above it)
    service     the service's other parts the rules read (environment, labels, replicas, reservations)
    rules       every check, each written once; `examine` runs them all (and placement) for both commands
    place       the booking rule and the placement of counts on free cards
    render      the rules + placement + the pin, written into a copy of the document
    roundtrip   the source text edited where the pin changed the document, and nowhere else (ruamel.yaml)
    stack       `render --swarm`: the same requests as Swarm reservations (Swarm places; render only reserves)
    command     the two CLI adapters: NVML, the ledger, `-o`
    problems    the one Problem type both commands print, one line each

Exit codes (docs/exit-codes.md): 64 a malformed file or a request that cannot mean one card (unknown, ambiguous, a card
given to two services, more cards than the host has, replicas > 1, hand-set pin variables), or a bad `-o`; 75 a
render that cannot place a service only because running containers hold the cards it needs (they are named); 69
NVML unusable. `check` exits 64 when it finds an error, else 0 (warnings alone do not fail it).
"""
