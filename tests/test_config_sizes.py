"""Byte sizes with units (pushup/config/sizes.py): every ``*_bytes`` setting takes
``256MiB`` as the README writes it, from a flag, a ``PUSHUP_*`` variable or the config
file, and a unit that could mean two things is refused with both readings named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pushup.config import SIZES, ConfigError, build_parser, load
from pushup.config.sizes import UNITS, parse_size


@pytest.mark.parametrize(("text", "size"), [
    ("1048576", 1048576), ("256MiB", 256 * 1024 ** 2), ("64 KiB", 64 * 1024),
    ("1GiB", 1024 ** 3), ("512KB", 512_000), ("512kB", 512_000), ("1MB", 1_000_000),
    ("2gb", 2_000_000_000), ("1.5KiB", 1536), ("100B", 100), (" 8mib ", 8 * 1024 ** 2),
    (4096, 4096),
])
def test_a_size_is_read_in_the_unit_it_is_written_in(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "reason"), [
    ("256M", "'256M': M alone is ambiguous; write 256MiB (powers of 1024) or 256MB "
             "(powers of 1000)"),
    ("1.5B", "'1.5B' is not a whole number of bytes"),
    ("10 parsecs", "'10 parsecs': unknown unit 'parsecs' (one of B, KiB, MiB, GiB, TiB, kB, "
                   "MB, GB, TB)"),
    ("MiB", "'MiB' is not a size: write bytes, or a number with a unit (B, KiB, MiB, GiB, "
            "TiB, kB, MB, GB, TB), e.g. 256MiB"),
    ("-1MiB", "'-1MiB' is not a size: write bytes, or a number with a unit (B, KiB, MiB, "
              "GiB, TiB, kB, MB, GB, TB), e.g. 256MiB"),
])
def test_a_size_that_cannot_be_read_says_why(text, reason):
    with pytest.raises(ValueError) as caught:
        parse_size(text)
    assert str(caught.value) == reason


@given(number=st.integers(min_value=0, max_value=10 ** 6), unit=st.sampled_from(sorted(UNITS)))
def test_a_whole_number_of_any_unit_is_that_many_times_the_unit(number, unit):
    assert parse_size(f"{number}{unit}") == number * UNITS[unit]
    assert parse_size(f"{number} {unit.upper()}") == number * UNITS[unit]


def test_every_byte_setting_takes_units_from_flags_the_environment_and_the_file():
    assert set(SIZES) == {"max_body_bytes", "max_message_bytes", "max_cached_bytes",
                          "max_response_bytes", "stream_retention_bytes"}
    config = load(["serve", "--max-body-bytes", "2MiB", "--config", "node.toml",
                   "--stream-retention-bytes", "64 KiB"],
                  {"PUSHUP_MAX_CACHED_BYTES": "1GiB", "PUSHUP_MAX_MESSAGE_BYTES": "128KiB"},
                  lambda path: b'max_response_bytes = "512KB"\n')
    assert (config.max_body_bytes, config.max_cached_bytes, config.max_message_bytes,
            config.max_response_bytes, config.stream_retention_bytes) == (
        2 * 1024 ** 2, 1024 ** 3, 128 * 1024, 512_000, 64 * 1024)


def test_a_toml_integer_is_still_a_number_of_bytes():
    config = load(["serve", "--config", "node.toml"], {},
                  lambda path: b"max_cached_bytes = 1048576\n")
    assert config.max_cached_bytes == 1048576


def test_a_size_refused_names_where_it_was_given_and_why():
    with pytest.raises(ConfigError) as caught:
        load(["serve"], {"PUSHUP_MAX_CACHED_BYTES": "256M"})
    assert str(caught.value) == ("PUSHUP_MAX_CACHED_BYTES: '256M': M alone is ambiguous; "
                                 "write 256MiB (powers of 1024) or 256MB (powers of 1000)")
    with pytest.raises(ConfigError) as caught:
        load(["serve", "--config", "node.toml"], {}, lambda path: b"max_body_bytes = true\n")
    assert str(caught.value).startswith("config file node.toml, key max_body_bytes: ")


def test_the_help_says_a_size_takes_a_unit():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore
    text = " ".join(serve.format_help().split())
    assert "--max-cached-bytes SIZE bytes of messages cached in all (oldest evicted) in " \
           "bytes, or with a unit: 64KiB, 256MiB, 1GB" in text
