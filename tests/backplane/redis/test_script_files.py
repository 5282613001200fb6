"""pushup/backplane/redis/scripts.py: each Lua script is a file of the package, read whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from pushup.backplane.redis import partitions, stream_keys
from pushup.backplane.redis.client import script_sha
from pushup.backplane.redis.scripts import read_script, script_names

LUA = Path(partitions.__file__).parent / "lua"


def test_every_script_file_is_named_and_read_as_it_is() -> None:
    assert script_names() == sorted(p.stem for p in LUA.glob("*.lua"))
    for name in script_names():
        assert read_script(name) == (LUA / f"{name}.lua").read_text(encoding="utf-8")


def test_each_script_is_its_files_and_its_sha_is_of_that_text() -> None:
    assert partitions.CHECK == read_script("log_checked") + read_script("log_check")
    assert partitions.PUBLISH == read_script("log_checked") + read_script("log_publish")
    assert partitions.READ_CHANNELS == read_script("log_checked") + read_script("log_channels")
    assert partitions.READ_CHANNELS_SHA == script_sha(partitions.READ_CHANNELS)
    assert partitions.CHECK_SHA == script_sha(partitions.CHECK)
    assert partitions.PUBLISH_SHA == script_sha(partitions.PUBLISH)
    for name in ("read", "write", "point", "unpoint", "touch"):
        text = getattr(stream_keys, name.upper())
        assert getattr(stream_keys, f"{name.upper()}_SHA") == script_sha(text)
        assert text.splitlines()[0].startswith("-- ")  # opens with what it takes and returns


def test_every_file_is_run_by_the_engine() -> None:
    used = {"log_checked", "log_check", "log_publish", "log_channels", "stream_read",
            "stream_write",
            "stream_point", "stream_unpoint", "stream_touch"}
    assert set(script_names()) == used


def test_the_dropping_notice_is_put_in_the_write_script() -> None:
    assert "GONE .. " not in stream_keys.WRITE
    assert f"{stream_keys.GONE!r} .. c.u" in stream_keys.WRITE


def test_a_script_the_package_lacks_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        read_script("no_such_script")
