"""`hostagent setup authz`'s edit of daemon.json (hostagent/setup.py): gpupin added last and removed, every other
key and plugin kept, the file replaced at once with its mode, and a file the daemon would not read refused with
one line (64). What it does against a running daemon is the docker tier's (tests/docker/test_setup_authz.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupin.core.errors import UsageError
from gpupin.hostagent import setup
from gpupin.hostagent.authz import NAME as PLUGIN
from tests.support.host import hostagent
from tests.support.hypo import examples

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def test_setup_names_the_plugin_as_the_plugin_does() -> None:
    from gpupin.hostagent import authz

    assert (setup.PLUGIN, setup.SOCKET, setup.PROBE, setup.PLUGIN_CONTENT_TYPE) == (
        authz.NAME,
        authz.SOCKET,
        authz.PROBE,
        authz.CONTENT_TYPE,
    )


def test_gpupin_goes_last_and_every_other_key_and_plugin_stays(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    path.write_text('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}, "authorization-plugins": ["opa"]}')
    path.chmod(0o640)
    config, changed = setup.with_plugin(setup.read_config(str(path)), on=True)
    assert changed
    setup.write_config(str(path), config)
    assert json.loads(path.read_text()) == {
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
        "authorization-plugins": ["opa", "gpupin"],
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["daemon.json"]  # no temporary file left
    again, changed = setup.with_plugin(setup.read_config(str(path)), on=True)
    assert not changed and again["authorization-plugins"] == ["opa", "gpupin"]
    off, changed = setup.with_plugin(again, on=False)
    assert changed and off["authorization-plugins"] == ["opa"]


def test_the_last_plugin_out_takes_the_key_with_it() -> None:
    config, changed = setup.with_plugin({"debug": True, "authorization-plugins": ["gpupin"]}, on=False)
    assert changed and config == {"debug": True}


def test_no_file_is_no_settings_and_a_new_one_is_0644(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    assert setup.read_config(str(path)) == {}
    setup.write_config(str(path), setup.with_plugin({}, on=True)[0])
    assert json.loads(path.read_text()) == {"authorization-plugins": ["gpupin"]}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[1, 2]", "not a JSON object (a list)"),
        ('"gpupin"', "not a JSON object (a str)"),
        ('{"debug": true,', "not JSON (line 1)"),
        ('{"authorization-plugins": "gpupin"}', "authorization-plugins is 'gpupin', not a list of plugin names"),
        ('{"authorization-plugins": [1]}', "not a list of plugin names"),
    ],
)
def test_a_file_the_daemon_would_not_read_is_refused(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "daemon.json"
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        setup.read_config(str(path))
    assert says in caught.value.message


@settings(max_examples=examples(100), deadline=None)
@given(value=json_values)
def test_any_json_is_read_or_refused_in_one_line(value: object, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("cfg") / "daemon.json"
    path.write_text(json.dumps(value))
    try:
        config = setup.read_config(str(path))
    except UsageError as err:
        assert "\n" not in err.line("hostagent").rstrip("\n")
        return
    assert isinstance(config, dict)
    for on in (True, False):
        edited, _ = setup.with_plugin(config, on)
        assert {k: v for k, v in edited.items() if k != setup.KEY} == {
            k: v for k, v in config.items() if k != setup.KEY
        }
        others = [p for p in config.get(setup.KEY) or [] if p != PLUGIN]
        assert [p for p in edited.get(setup.KEY) or [] if p != PLUGIN] == others
        assert (PLUGIN in (edited.get(setup.KEY) or [])) == on


@settings(max_examples=examples(100), deadline=None)
@given(raw=st.binary(max_size=40))
def test_any_bytes_are_read_or_refused(raw: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.mktemp("cfg") / "daemon.json"
    path.write_bytes(raw)
    try:
        assert isinstance(setup.read_config(str(path)), dict)
    except UsageError as err:
        assert err.exit_code == 64


def test_the_command_refuses_a_bad_file_in_one_line_with_64(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    path.write_text("[]")
    r = hostagent("setup", "authz", "--daemon-json", str(path), "--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 64, r
    assert r.stderr.count("\n") == 1 and "not a JSON object" in r.stderr, r.stderr
    assert path.read_text() == "[]"


def test_turning_it_on_with_no_plugin_answering_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}')
    r = hostagent("setup", "authz", "--daemon-json", str(path), "--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 69, r
    assert "no gpupin plugin answers at" in r.stderr and "no socket there" in r.stderr, r.stderr
    assert "would stop at the reload, or refuse every request" in r.stderr
    assert path.read_text() == '{"debug": true}'


def test_help_says_what_happens_while_the_plugin_is_down() -> None:
    r = hostagent("setup", "authz", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "WHILE THE PLUGIN PROCESS IS DOWN THE DAEMON REFUSES EVERY REQUEST" in text
    assert "--undo" in text and "--check" in text and "--daemon-json" in text


def test_a_missing_pidfile_is_said_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    r = hostagent("setup", "authz", "--undo", "--daemon-json", str(path), "--pidfile", str(tmp_path / "none.pid"))
    assert r.returncode == 69, r
    assert "none.pid: no such file: no dockerd to reload" in r.stderr
    assert not os.path.exists(path)
