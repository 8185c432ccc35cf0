"""`python3 -m gpupin.entrypoint`: print what each cuda:k of this process is, checked against the expectation.

The training image's example CMD: it shows a workload's view after gpupin-entrypoint has set the environment.
"""

from __future__ import annotations

import os
import sys

from gpupin.core.errors import GpupinError
from gpupin.core.identity import uuid_from_bytes
from gpupin.entrypoint.api import assert_pinned, devices
from gpupin.entrypoint.sources import from_environ


def main() -> int:
    try:
        expectation = from_environ(os.environ)
        if expectation is None:
            for d in devices():
                uuid = uuid_from_bytes(bytes.fromhex(d.uuid_hex))
                print(f"cuda:{d.k} = {uuid} at {d.bus_id} ({d.name}), no expectation to check")
            return 0
        for b in assert_pinned(expectation):
            print(f"cuda:{b.local_rank} = {b.uuid} at {b.bus_id} ({b.name}), as expected")
    except GpupinError as err:
        sys.stderr.write(err.line("python3 -m gpupin.entrypoint"))
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
