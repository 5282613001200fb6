"""The Lua scripts the Redis engine runs, each in its own file under ``lua/``.

A script is read from the package with ``importlib.resources`` (a checkout, an
installed wheel, a zip alike: ``pyproject.toml`` ships ``lua/*.lua`` as package
data) when the module that runs it is imported, and sent to Redis as the file
reads, its head comment saying its KEYS, ARGV and reply. Which module runs which
script, and under which SHA, is that module's; this one only reads the files.
No socket.
"""

from __future__ import annotations

from importlib.resources import files

FOLDER = "lua"


def read_script(name: str) -> str:
    """The text of ``lua/<name>.lua`` (FileNotFoundError if the package lacks it)."""
    return files(__package__).joinpath(FOLDER, f"{name}.lua").read_text(encoding="utf-8")


def script_names() -> list[str]:
    """The name of every script the package holds, sorted."""
    return sorted(entry.name.removesuffix(".lua") for entry in files(__package__)
                  .joinpath(FOLDER).iterdir() if entry.name.endswith(".lua"))
