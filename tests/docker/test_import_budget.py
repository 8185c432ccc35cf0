"""What `hostagent run` may import on each of its paths, measured with `python -X importtime` on a real run: through
the resident agent, without it on the local unix socket, and with the docker SDK (a daemon over tcp). The modules
(by top-level name) are a fixed list per path, so a change that imports one more fails here and says which; the
milliseconds (the sum of every module's own import time, the least of three runs) have a ceiling per path as a
multiple of the bare interpreter's own (`python -c pass`, measured alongside), so that a loaded machine slows
both alike. `make bench` gives the figures these protect."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.forwarder import Forwarder
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent

# An editable install's finder is named for the version (__editable___gpupin_0_3_0_finder): one name for any.
EDITABLE_FINDER = "__editable___gpupin_finder"
# The interpreter's own start-up (site, encodings, the editable install's finder...) is in every path.
STARTUP = {
    EDITABLE_FINDER, "__future__", "_abc", "_codecs", "_collections_abc", "_distutils_hack",
    "_frozen_importlib_external", "_io", "_signal", "_sitebuiltins", "_stat", "_winapi", "abc", "codecs",
    "encodings", "genericpath", "io", "marshal", "nt", "ntpath", "os", "posix", "posixpath", "site", "sitecustomize",
    "stat", "time", "winreg", "zipimport",
}  # fmt: skip
# Through the agent: the parse, the request, the agent's socket and the follow; no SDK, no NVML.
AGENT = STARTUP | {
    "_collections", "_contextvars", "_functools", "_json", "_locale", "_operator", "_socket", "_sre", "_string",
    "_struct", "_weakrefset", "argparse", "collections", "contextlib", "contextvars", "copyreg", "enum", "errno",
    "functools", "gettext", "gpupin", "itertools", "json", "keyword", "locale", "math", "operator", "re", "reprlib",
    "select", "shlex", "signal", "socket", "string", "struct", "threading", "types", "warnings", "weakref",
    "array", "fnmatch", "importlib", "ipaddress", "pathlib", "selectors", "urllib",
}  # fmt: skip
# Without the agent on the local socket: NVML (nvidia-ml-py brings ctypes.util: shutil, subprocess, tempfile), the
# ledger, the lock and the create too; still no SDK, and no dataclasses (with inspect, ast and dis: the policy's model
# is plain classes).
UNIX = AGENT | {
    "_bisect", "_bz2", "_compression", "_ctypes", "_datetime", "_lzma", "_posixsubprocess", "_random", "_sha512",
    "array", "bisect", "bz2", "ctypes", "datetime", "fcntl", "fnmatch", "importlib", "ipaddress", "lzma", "msvcrt",
    "org", "pathlib", "pynvml", "random", "selectors", "shutil", "subprocess", "tempfile", "urllib", "zlib", "copy",
}  # fmt: skip
# Over tcp: the docker SDK and what it brings (requests, urllib3, http.client, ssl, email...).
SDK_TOP = {
    "docker", "requests", "urllib3", "http", "ssl", "email", "certifi", "idna", "charset_normalizer", "base64",
    "hashlib", "hmac", "_hashlib", "_blake2", "_ssl", "_csv", "_heapq", "_queue", "_typing", "atexit", "backports",
    "binascii", "brotli", "brotlicffi", "calendar", "chardet", "csv", "gc", "grp", "heapq", "logging", "mimetypes",
    "netrc", "paramiko", "pwd", "pywintypes", "queue", "quopri", "simplejson", "socks", "stringprep", "tarfile",
    "textwrap", "traceback", "typing", "unicodedata", "zipfile", "linecache", "token", "tokenize",
}  # fmt: skip
# Ceilings in multiples of the bare interpreter's import time. Measured on a 2-core machine at a load average of
# 10: agent 4.6x to 4.7x, unix 4.3x to 21.6x (Engine 26), sdk 16.6x to 19.6x; the module lists are the exact guard,
# the times a coarse one (the SDK or NVML coming back doubles them).
CEILING = {"agent": 10.0, "unix": 30.0, "sdk": 40.0}
RUNS = 3


def own_ms(stderr: str) -> tuple[set[str], float]:
    """The top-level names of what was imported, and the sum of their own import times (ms)."""
    names, total = set(), 0
    for line in stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own, _, name = line[len("import time:") :].split("|")
            names.add(name.strip().split(".")[0])
            total += int(own)
    return names, total / 1000


def floor_ms() -> float:
    """The bare interpreter's import time (its start-up's modules), the least of RUNS."""
    argv = [sys.executable, "-X", "importtime", "-c", "pass"]
    return min(own_ms(subprocess.run(argv, capture_output=True, text=True).stderr)[1] for _ in range(RUNS))


def imported(argv: list[str], env: dict[str, str]) -> tuple[int, set[str], float]:
    """The run's exit code, the top-level names of what it imported, and their own import times' sum (ms): every
    run's names, the least of RUNS runs' times."""
    code = "import sys\nfrom gpupin.hostagent.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    codes, names, times = [], set(), []
    for _ in range(RUNS):
        r = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        seen, ms = own_ms(r.stderr)
        codes.append(r.returncode)
        names |= {EDITABLE_FINDER if n.startswith("__editable___gpupin_") else n for n in seen}
        times.append(ms)
    return max(codes), names, min(times)


def run_argv(agent: Agent) -> list[str]:
    return ["run", "--rm", "--label", f"gpupin.test={agent.tag}", "--gpu", "1", TEST_IMAGE, "--quiet", "true"]


@pytest.fixture
def resident(agent: Agent) -> Iterator[Resident]:
    r = Resident(agent.env)
    yield r
    r.close()


def check(path: str, allowed: set[str], code: int, names: set[str], ms: float) -> None:
    floor = floor_ms()
    print(f"import budget, {path}: {len(names)} top-level modules, {ms:.1f} ms of imports ({ms / floor:.1f}x the bare")
    print(f"  interpreter's {floor:.1f} ms)")
    assert code == 0
    more = sorted(names - allowed)
    assert not more, f"{path}: imports more than its budget allows: {' '.join(more)}"
    assert ms <= CEILING[path] * floor, f"{path}: {ms:.1f} ms of imports, over {CEILING[path]}x {floor:.1f} ms"


def test_through_the_agent(agent: Agent, resident: Resident, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    env = {**agent.env, "GPUPIN_AGENT_SOCKET": resident.socket, "GPUPIN_TRACE": str(trace)}
    code, names, ms = imported(run_argv(agent), env)
    assert "cards" not in trace.read_text()  # the agent booked: this run read no NVML
    check("agent", AGENT, code, names, ms)


def test_without_the_agent_on_the_unix_socket(agent: Agent) -> None:
    code, names, ms = imported(run_argv(agent), {**agent.env, "GPUPIN_AGENT": "0"})
    check("unix", UNIX, code, names, ms)


def test_with_the_sdk_over_tcp(agent: Agent) -> None:
    f = Forwarder(agent.sandbox.host[len("unix://") :])
    try:
        env = {**agent.env, "GPUPIN_AGENT": "0", "DOCKER_HOST": f.url, "GPUPIN_LOCAL_LOCK": "0"}
        code, names, ms = imported(run_argv(agent), env)
    finally:
        f.close()
    assert "docker" in names
    check("sdk", UNIX | SDK_TOP, code, names, ms)
