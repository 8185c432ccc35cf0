"""The documentation names only what exists: every repository path, module and test file written in backticks in
README.md, CONTRIBUTING.md, tests/README.md and docs/*.md, and every relative link there (with its #anchor), is
checked against the checkout. A rename that leaves a page behind fails here, naming the page and the line.

What counts, inside a code span (one token at a time, split at spaces, quotes, `=`, commas and brackets):
- a path whose first part is one of the checkout's top-level entries (`tests/unit/test_docs.py`, `compose/`,
  `docs/design.md`, `Makefile`); a glob must match something; `build/` and `dist/` are made by the build, and a
  token with a placeholder (`<id>`, `{name}`, `$VAR`, `...`) names no one path: neither is checked;
- a module (`gpupin.hostagent.ledger.holding_forms`), and what follows it as attributes
  (`gpupin.core.contract.nvd_keyword`, `gpupin.entrypoint.sources.READERS`), read from the source without importing it.
Outside code spans, a path is taken only whole (a folder of the checkout, then a file with its extension), and a
module only by its full dotted name. URLs and host paths (`/etc/gpupin`, `/run/...`, `/var/lib/...`, `/dev/nvidia0`)
are not the checkout's: never checked.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.support.host import REPO

PAGES = sorted(
    [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "tests" / "README.md", *(REPO / "docs").glob("*.md")]
)
# The import names and the folders they live in (pyproject.toml's package-dir).
PACKAGES = {"gpupin.core": "core", "gpupin.entrypoint": "entrypoint", "gpupin.hostagent": "hostagent"}
MADE_BY_THE_BUILD = {"build", "dist", ".venv"}
PLACEHOLDER = re.compile(r"[<>{}$]|\.\.\.|\bN\b")

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
TOKEN_SPLIT = re.compile(r"[\s\"'=,;()\[\]|]+")
TEST_FILE = re.compile(r"^test_\w+\.py$")
# Outside code spans, a checkout path is taken only in full: a known folder, then a file with its extension.
PLAIN_PATH = re.compile(r"(?<![\w/.-])((?:core|entrypoint|hostagent|tests|bench|docs|compose|contrib)/[\w./-]*\w\.\w+)")
PLAIN_MODULE = re.compile(r"(?<![\w./-])(gpupin\.(?:core|entrypoint|hostagent)(?:\.[A-Za-z_]\w*)*)")
MODULE = re.compile(r"^gpupin\.(core|entrypoint|hostagent)(\.[A-Za-z_][A-Za-z0-9_]*)*$")


# A folder beside the checkout (spelt in two pieces: the tree itself never names it).
OUTSIDE = "../" + "shared"


def top_level() -> set[str]:
    return {p.name for p in REPO.iterdir() if p.name not in MADE_BY_THE_BUILD and p.name != ".git"}


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def spans(text: str) -> list[tuple[int, str]]:
    """The inline code spans of a Markdown page (fenced blocks left out), each with its line."""
    blanked = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return [
        (line_of(blanked, m.start()), re.sub(r"\s*\n\s*", " ", m.group(2)))
        for m in CODE.finditer(blanked)
        if "\n\n" not in m.group(2)
    ]


def path_problem(token: str, tops: set[str]) -> str | None:
    """Why a path token names nothing in the checkout (None: it does, or it is not a path of the checkout). A test's
    node id (`tests/unit/test_docs.py::test_x`) names a test of that file too."""
    token, _, test = token.partition("::")
    token = token.rstrip(".:")
    first = token.split("/")[0]
    if first not in tops or PLACEHOLDER.search(token) or token.startswith("/"):
        return None
    if any(c in token for c in "*?"):
        return None if any(REPO.glob(token)) else f"{token}: no file matches"
    if not (REPO / token).exists():
        return f"{token}: no such file or folder"
    if test and test.split("[")[0].split("::")[0] not in names_in(REPO / token)[""]:
        return f"{token}::{test}: no such test"
    return None


def bare_test_file_problem(token: str) -> str | None:
    """Why a test module named alone (`test_entrypoint_hostile.py`) is in no folder of tests/."""
    return None if any((REPO / "tests").rglob(token)) else f"{token}: no such file under tests/"


@cache
def names_in(source: Path) -> dict[str, set[str]]:
    """A module's top-level names, and each class's own names ("" holds the module's)."""
    tree = ast.parse(source.read_text())
    out: dict[str, set[str]] = {"": set()}

    def bound(node: ast.AST) -> set[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return {node.name}
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return {(a.asname or a.name).split(".")[0] for a in node.names}
        if isinstance(node, (ast.If, ast.Try)):
            return {n for child in ast.iter_child_nodes(node) for n in bound(child)}
        return set()

    for node in tree.body:
        out[""] |= bound(node)
        if isinstance(node, ast.ClassDef):
            out[node.name] = {n for child in node.body for n in bound(child)}
    return out


def module_problem(token: str) -> str | None:
    """Why a dotted name is no module of gpupin, or no name in one (None: it is)."""
    parts = token.split(".")
    root = ".".join(parts[:2])
    if root not in PACKAGES:
        return f"{token}: gpupin has no package {root}"
    folder = REPO / PACKAGES[root]
    rest = parts[2:]
    source = folder / "__init__.py"
    while rest and ((folder / rest[0]).is_dir() or (folder / f"{rest[0]}.py").is_file()):
        if (folder / rest[0]).is_dir():
            folder = folder / rest[0]
            source = folder / "__init__.py"
        else:
            source = folder / f"{rest[0]}.py"
        rest = rest[1:]
        if source.name != "__init__.py":
            break
    if not rest:
        return None
    names = names_in(source)
    if rest[0] not in names[""]:
        return f"{token}: {source.relative_to(REPO)} defines no {rest[0]}"
    if len(rest) > 1 and rest[0] in names and rest[1] not in names[rest[0]]:
        return f"{token}: {rest[0]} in {source.relative_to(REPO)} has no {rest[1]}"
    return None


def link_problem(page: Path, target: str) -> str | None:
    """Why a relative link of the page leads nowhere (None: it leads to a file, and to its heading)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return None  # a URL (https:, mailto:) or an absolute path: not the checkout's
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{target}: no such file"
    if not dest.is_relative_to(REPO.resolve()):
        return f"{target}: outside the checkout"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: {dest.relative_to(REPO)} has no heading #{anchor}"
    return None


@cache
def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = FENCE.sub("", page.read_text())
    return {
        re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)
    }


def problems(page: Path) -> list[str]:
    text = page.read_text()
    tops = top_level()
    found = []
    for line, span in spans(text):
        for token in TOKEN_SPLIT.split(span):
            if MODULE.match(token):
                why = module_problem(token)
            elif TEST_FILE.match(token):
                why = bare_test_file_problem(token)
            else:
                why = path_problem(token, tops)
            if why:
                found.append(f"{page.relative_to(REPO)}:{line}: {why}")
    blanked = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    plain = CODE.sub(lambda m: " " * len(m.group(0)), blanked)
    plain = LINK.sub(lambda m: " " * len(m.group(0)), plain)
    for m in PLAIN_PATH.finditer(plain):
        why = path_problem(m.group(1), tops)
        if why:
            found.append(f"{page.relative_to(REPO)}:{line_of(plain, m.start())}: {why}")
    for m in PLAIN_MODULE.finditer(plain):
        why = module_problem(m.group(1))
        if why:
            found.append(f"{page.relative_to(REPO)}:{line_of(plain, m.start())}: {why}")
    for m in LINK.finditer(blanked):
        why = link_problem(page, m.group(1))
        if why:
            found.append(f"{page.relative_to(REPO)}:{line_of(blanked, m.start())}: {why}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_module_and_link_the_page_names_exists(page: Path) -> None:
    found = problems(page)
    assert not found, "the page names what does not exist:\n" + "\n".join(found)


def test_the_checks_catch_what_they_are_for() -> None:
    """Each kind of stale name is caught, and what is not the checkout's is left alone."""
    tops = top_level()
    assert path_problem("tests/test_real_gpu.py", tops) == "tests/test_real_gpu.py: no such file or folder"
    assert path_problem("tests/gpu/test_real_gpu.py", tops) is None
    assert path_problem("tests/fakegpu/scenarios/*.json", tops) is None
    assert path_problem("tests/nothing/*.json", tops) == "tests/nothing/*.json: no file matches"
    assert path_problem("tests/unit/test_docs.py::test_the_checks_catch_what_they_are_for", tops) is None
    assert path_problem("tests/unit/test_docs.py::test_x", tops) == "tests/unit/test_docs.py::test_x: no such test"
    assert bare_test_file_problem("test_entrypoint_hostile.py") is None
    assert bare_test_file_problem("test_real_gpu_old.py") == "test_real_gpu_old.py: no such file under tests/"
    for elsewhere in (
        "/etc/gpupin/policy.toml",
        "/run/gpupin",
        "/var/lib/gpupin",
        "build/fakegpu/lib/x.so",
        "tests/golden/ls-<scenario>.txt",
        "nvidia.com/gpu=0",
        "https://example.com/tests/x",
    ):
        assert path_problem(elsewhere, tops) is None, elsewhere
    assert module_problem("gpupin.hostagent.ledger.processes") is None
    assert module_problem("gpupin.hostagent.ledger.holding_forms.FORMS") is None
    assert (
        module_problem("gpupin.hostagent.runopts")
        == "gpupin.hostagent.runopts: hostagent/__init__.py defines no runopts"
    )
    assert (
        module_problem("gpupin.hostagent.ls.procs")
        == "gpupin.hostagent.ls.procs: hostagent/ls/__init__.py defines no procs"
    )
    assert not MODULE.match("gpupin.devices")  # a label (gpupin.devices, gpupin.shared, ...), not a module
    assert link_problem(REPO / "docs" / "ledger.md", "#when-a-container-holds") is None
    assert link_problem(REPO / "docs" / "ledger.md", "design.md#the-lock") is None
    assert link_problem(REPO / "docs" / "ledger.md", "design.md#no-such") == (
        "design.md#no-such: docs/design.md has no heading #no-such"
    )
    assert link_problem(REPO / "README.md", "https://example.com") is None
    assert link_problem(REPO / "README.md", OUTSIDE + "/DESIGN.md") is not None


DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The body rows of the first table under `## heading`, each a list of its cells."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in lines[2:]]


def test_the_benchmarks_page_is_a_current_table_not_a_diary() -> None:
    """docs/benchmarks.md: each figure with its target, command, last value and machine; no dated entries."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    machines = {row[0] for row in table_rows(text, "The machines")}
    rows = table_rows(text, "The figures")
    assert len(rows) >= 15
    for figure, target, command, value, machine in rows:
        assert figure and target and value, figure
        assert command.startswith(("`make ", "`python", "`bench/", "the GPU tier")), (figure, command)
        assert machine in machines, (figure, machine)
    assert not DATE.search(text), f"a dated entry: {DATE.search(text)}"
    assert not re.search(r"\b(Later|Again on|Earlier)\b", text)


IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def module_map() -> dict[Path, str]:
    """docs/design.md's module map: each package's folder and its row's "what it holds" cell."""
    rows = table_rows((REPO / "docs" / "design.md").read_text(), "Parts")
    found: dict[Path, str] = {}
    for _part, package, holds in rows:
        name = package.strip("`")
        if name.startswith("gpupin."):
            top, _, rest = name.removeprefix("gpupin.").partition(".")
            found[REPO.joinpath(top, *rest.split(".") if rest else [])] = holds
        elif name.startswith("."):
            found[REPO / "hostagent" / name[1:]] = holds
    return found


def defined_names(folder: Path) -> set[str]:
    """The modules under a folder and every top-level name they define, read from the source."""
    names: set[str] = set()
    for src in folder.rglob("*.py"):
        names.update((src.stem, src.parent.name))
        for node in ast.parse(src.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_the_module_map_names_every_module_and_only_what_exists() -> None:
    """docs/design.md's map of the parts lists every module of each package (a subpackage without a row of its
    own counts as a module), and each lowercase name it writes in backticks is a module or a name defined there."""
    rows = module_map()
    assert len(rows) >= 12
    problems: list[str] = []
    for folder, holds in rows.items():
        named = {m.group(2) for m in CODE.finditer(holds)}
        own = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
        own |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists() and p not in rows}
        problems += [f"{folder.relative_to(REPO)}: module {m} is not in the map" for m in sorted(own - named)]
        known = defined_names(folder) | {"__init__"}
        problems += [
            f"{folder.relative_to(REPO)}: the map names {n}, which is no module or name there"
            for n in sorted(named)
            if IDENT.match(n) and n not in known
        ]
    assert not problems, "docs/design.md's module map:\n" + "\n".join(problems)


def test_the_serve_synopsis_lists_every_option_serve_takes() -> None:
    """docs/serve.md's synopsis and its table of options name every option of `hostagent serve` (the synopsis
    lacked --policy, the one a lab's admin looks for first)."""
    from gpupin.hostagent.cli import build_parser
    from gpupin.hostagent.completion import subcommands

    serve = subcommands(build_parser())["serve"]
    options = {f for a in serve._actions for f in a.option_strings if f.startswith("--") and f != "--help"}
    text = (REPO / "docs" / "serve.md").read_text()
    synopsis = re.search(r"\n    hostagent serve (.*?)\n\n", text, re.S)
    assert synopsis is not None
    named = set(re.findall(r"--[a-z-]+", synopsis.group(1)))
    table = set(re.findall(r"^\| `(--[a-z-]+)", text, re.M))
    assert options - named == set() and options - table == set(), (options - named, options - table)
