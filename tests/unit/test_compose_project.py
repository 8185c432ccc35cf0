"""The compose model as compose builds it: several -f files and the override file, `extends` (same file and
`file:`), `include:`, profiles, `.env` and `${VAR}` (inside x-gpupin too), `!reset`/`!override`. hostagent's own
reading (hostagent.compose.project) agrees with compose v2's `config` on every project of
tests/data/compose-projects (one row of PROJECTS each); `check` and `render` run on them through the CLI on the
simulated host. No daemon is needed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.compose import native
from gpupin.hostagent.compose.problems import ServiceError
from gpupin.hostagent.compose.project import ProjectOptions, as_mapping, build
from gpupin.hostagent.compose.request_forms import gpu_request
from gpupin.hostagent.compose.rules import examine
from tests.support.compose import FILES, V2, strip_gpu, tool
from tests.support.host import HOSTAGENT, REPO, simhost_env
from tests.support.scenarios import cards, uuids

PROJECTS_DIR = REPO / "tests" / "data" / "compose-projects"
A800, RTX, A800B, A800C = uuids("mixed-4")  # NVML order: 1B, 3B, 86, AF
# project folder, the command line's options (files, profiles, env files), what each GPU service gets
PROJECTS: list[tuple[str, ProjectOptions, dict[str, list[str]]]] = [
    ("override", ProjectOptions(), {"train": [RTX]}),
    ("multi-file", ProjectOptions(["base.yml", "gpu.yml"]), {"eval": [A800], "serve": [A800C, A800B]}),  # by name
    ("extends-same", ProjectOptions(), {"base": [RTX], "copy": [RTX]}),
    ("extends-file", ProjectOptions(), {"trainer": [A800]}),
    ("include", ProjectOptions(), {"worker": [A800C]}),
    ("profiles", ProjectOptions(), {"app": [A800]}),
    ("profiles", ProjectOptions(profiles=["train"]), {"app": [A800], "train": [RTX]}),
    ("variables", ProjectOptions(), {"job": [A800C]}),
    ("reset-override", ProjectOptions(["compose.yaml", "prod.yml"]), {"a": [A800B], "b": [A800C]}),
]
IDS = [f"{name}{'-' + '-'.join(o.profiles) if o.profiles else ''}" for name, o, _ in PROJECTS]


def own(name: str, options: ProjectOptions, environ: dict[str, str] | None = None) -> Any:
    return build(options, environ if environ is not None else {}, cwd=str(PROJECTS_DIR / name)).doc


def compose(name: str, options: ProjectOptions) -> Any:
    return native.config(tool(V2), options, cwd=str(PROJECTS_DIR / name))


def gpu_view(doc: Any) -> dict[str, Any]:
    """What the rules read of a model: each service's request and the cards render gives it on mixed-4."""
    exam = examine(doc, cards("mixed-4"), {})
    out: dict[str, Any] = {}
    for svc_name, svc in doc["services"].items():
        req = gpu_request(svc_name, svc)
        if req is not None:
            out[svc_name] = (
                req.form.name,
                req.specs,
                req.count,
                req.share,
                req.verify,
                req.capabilities,
                [t.uuid for t in exam.plan.get(svc_name, [])],
            )
    return {"services": sorted(doc["services"]), "gpus": out, "problems": sorted(p.line("F") for p in exam.problems)}


@pytest.mark.parametrize(("name", "options", "pins"), PROJECTS, ids=IDS)
def test_hostagent_and_compose_v2_build_the_same_model(
    name: str, options: ProjectOptions, pins: dict[str, list[str]]
) -> None:
    mine, theirs = own(name, options), compose(name, options)
    assert gpu_view(mine) == gpu_view(theirs)
    assert {s: v[-1] for s, v in gpu_view(mine)["gpus"].items()} == pins


@pytest.mark.parametrize(("name", "options"), [(n, o) for n, o, _ in PROJECTS], ids=IDS)
def test_the_models_agree_outside_the_gpu_parts_too(name: str, options: ProjectOptions) -> None:
    """Environment and labels as compose has them (its model writes every value as text)."""

    def view(doc: Any) -> Any:
        doc = strip_gpu(doc)
        return {
            n: {
                k: {e: None if v is None else str(v) for e, v in (as_mapping(s.get(k)) or {}).items()}
                for k in ("environment", "labels")
            }
            for n, s in doc["services"].items()
        }

    assert view(own(name, options)) == view(compose(name, options))


@pytest.mark.parametrize("src", FILES, ids=[f.stem for f in FILES])
def test_hostagent_and_compose_v2_read_each_corpus_file_alike(src: Path) -> None:
    """The single files of the render corpus (test_compose_render.py): scalars, anchors, merge keys, $$."""
    mine = build(ProjectOptions([src.name]), {}, cwd=str(src.parent))
    assert mine.editable is not None
    assert gpu_view(mine.doc) == gpu_view(native.config(tool(V2), ProjectOptions([src.name]), cwd=str(src.parent)))


def test_reset_and_override_in_one_file_mean_what_compose_says(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text(
        "services:\n  a:\n    image: i\n    ports: !reset []\n    x-gpupin: !override {gpus: ['1']}\n"
    )
    project = build(ProjectOptions(), {}, cwd=str(tmp_path))
    assert project.doc["services"]["a"] == {"image": "i", "x-gpupin": {"gpus": ["1"]}}
    assert project.editable is None  # written as one merged file: the tags are gone


def test_an_include_cycle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("include: [b.yml]\nservices: {a: {image: i}}\n")
    (tmp_path / "b.yml").write_text("include: [compose.yaml]\nservices: {b: {image: i}}\n")
    with pytest.raises(ServiceError, match="includes it back"):
        build(ProjectOptions(), {}, cwd=str(tmp_path))


def test_the_override_file_is_read_only_without_f() -> None:
    assert own("override", ProjectOptions())["services"]["train"]["environment"] == {"EPOCHS": "3", "DEBUG": "1"}
    alone = own("override", ProjectOptions(["compose.yaml"]))["services"]["train"]
    assert alone["environment"] == {"EPOCHS": "3"} and alone["x-gpupin"] == {"gpus": ["0"]}


def test_variables_reach_x_gpupin_and_dollars_stay_literal() -> None:
    svc = own("variables", ProjectOptions())["services"]["job"]
    assert svc["x-gpupin"] == {"gpus": ["GPU-e218"]} and svc["environment"] == {"PRICE": "$5", "TAG": "v1.2"}
    assert own("variables", ProjectOptions(), {"GPU": "1"})["services"]["job"]["x-gpupin"] == {"gpus": ["1"]}


def test_a_required_variable_that_is_unset_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("services:\n  a:\n    image: ${IMAGE?give the image}\n")
    with pytest.raises(ServiceError, match="IMAGE is required: give the image"):
        build(ProjectOptions(), {}, cwd=str(tmp_path))


def test_an_extends_cycle_and_a_missing_base_are_refused(tmp_path: Path) -> None:
    (tmp_path / "compose.yaml").write_text("services:\n  a: {extends: b}\n  b: {extends: a}\n")
    with pytest.raises(ServiceError, match="extends itself"):
        build(ProjectOptions(), {}, cwd=str(tmp_path))
    (tmp_path / "compose.yaml").write_text("services:\n  a: {extends: nope, image: i}\n")
    with pytest.raises(ServiceError, match="does not define"):
        build(ProjectOptions(), {}, cwd=str(tmp_path))


# --- the CLI ---------------------------------------------------------------------------------------------------


def hostagent(
    cwd: Path,
    *args: str,
    compose_v2: bool = False,
    docker_host: str = "unix:///nonexistent/docker.sock",
    topology: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """hostagent on the simulated host; without a daemon by default (`check` of named cards needs none; a count
    is placed only on a ledger that can be read: tests/docker/test_compose_project.py)."""
    env = simhost_env("mixed-4")
    env.update(DOCKER_HOST=docker_host, GPUPIN_COMPOSE=str(tool(V2)) if compose_v2 else "none")
    if topology is not None:
        env["FAKEGPU_TOPOLOGY"] = topology
    return subprocess.run([HOSTAGENT, *args], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_check_sees_that_extends_books_the_same_card_twice() -> None:
    r = hostagent(PROJECTS_DIR / "extends-same", "compose", "check")
    assert r.returncode == 64, r.stdout + r.stderr
    assert f"service copy: {RTX}" in r.stdout and "is also given to service base" in r.stdout


def test_render_keeps_dollars_literal_in_the_merged_file(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    for f in (PROJECTS_DIR / "variables").iterdir():
        (folder / f.name).write_text(f.read_text())
    (folder / "more.yml").write_text("services:\n  job:\n    labels: {cost: $$3}\n")
    out = tmp_path / "pinned.yml"
    r = hostagent(folder, "compose", "render", "-f", "compose.yaml", "-f", "more.yml", "-o", str(out))
    assert r.returncode == 0, r.stderr
    svc = own(str(tmp_path), ProjectOptions([str(out)]))["services"]["job"]
    assert svc["environment"]["PRICE"] == "$5" and svc["labels"]["cost"] == "$3"
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [A800C]


def test_render_of_one_file_with_a_variable_in_x_gpupin_is_edited_in_place(tmp_path: Path) -> None:
    src = tmp_path / "compose.yaml"
    src.write_text("services:\n  a:\n    image: ${IMAGE:-busybox}   # the image\n    x-gpupin: {gpus: ['${GPU:-0}']}\n")
    r = hostagent(tmp_path, "compose", "render")
    assert r.returncode == 0, r.stderr
    assert "    image: ${IMAGE:-busybox}   # the image\n" in r.stdout and "Merged" not in r.stdout
    assert A800 in r.stdout and "x-gpupin" not in r.stdout


@pytest.mark.parametrize(
    ("name", "options"),
    [(n, o) for n, o, _ in PROJECTS if n != "profiles"],
    ids=[i for i, (n, _, _) in zip(IDS, PROJECTS) if n != "profiles"],
)
def test_check_says_the_same_with_either_model(name: str, options: ProjectOptions) -> None:
    args = [a for f in options.files for a in ("-f", f)]
    mine = hostagent(PROJECTS_DIR / name, "compose", "check", *args)
    theirs = hostagent(PROJECTS_DIR / name, "compose", "check", *args, compose_v2=True)
    assert (mine.returncode, mine.stdout) == (theirs.returncode, theirs.stdout)
    # a card booked twice (extends), device ids that are NVML indices (reset-override): errors of the files; a count
    # (multi-file, extends-file) with no daemon to read the ledger from: what render would refuse, check reports
    # (69, as render and `run --dry-run --count` say it)
    expect = 64 if name in ("extends-same", "reset-override") else 69 if name in ("multi-file", "extends-file") else 0
    assert mine.returncode == expect, mine.stdout
    if name in ("multi-file", "extends-file"):
        assert "which cards are free is unknown: the ledger was not read" in mine.stdout, mine.stdout
