"""Planted links and other users' folders in a folder store, between two ops (issue 43, item 3).

A fault kind of the folder store only: what another local user (or a
careless script) can do to the files of a ``file://`` store while a driver
serves it.  ``plant`` picks, from a seeded ``random.Random``, one thing in
the store and does one of:

* ``folder-link``: a folder below the root becomes a link to ``outside``
  (the real folder is renamed aside inside the store, under a name starting
  with ``=``, which no key uses);
* ``object-link``: an object file becomes a link to a file outside;
* ``locks-link``: the lock folder becomes a link to ``outside``;
* ``foreign-folder``: a folder below the root is given to another uid
  (root only: ``chown``).

The same seed plants the same things in the same order on a store that
went through the same ops, so a failing run replays from its seed.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

KINDS = ("folder-link", "object-link", "locks-link", "foreign-folder")


def _below(root: Path) -> tuple[list[Path], list[Path]]:
    """The store's folders and object files below ``root``, in a stable order (never the renamed-aside ones)."""
    folders: list[Path] = []
    objects: list[Path] = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("=") and not os.path.islink(os.path.join(dirpath, d)))
        folders.extend(Path(dirpath, d) for d in dirs)
        objects.extend(Path(dirpath, f) for f in sorted(files) if f.endswith("=") and not f.startswith("="))
    return folders, objects


def plant(root: Path, outside: Path, rng: random.Random, stranger: int | None) -> str:
    """Plant one fault in store ``root`` pointing at ``outside``; what was done (kind and path), for the report.

    ``stranger``: a uid to give a folder to (``foreign-folder``), or None
    when not running as root (that kind is then not chosen).
    """
    folders, objects = _below(root)
    kinds = [k for k in KINDS if k != "foreign-folder" or (stranger is not None and folders)]
    kinds = [k for k in kinds if (k != "folder-link" or folders) and (k != "object-link" or objects)]
    kind = rng.choice(kinds)
    aside = f"=aside.{rng.randrange(10**9)}"
    if kind == "folder-link":
        target = rng.choice(folders)
        target.rename(target.parent / aside)
        target.symlink_to(outside)
    elif kind == "object-link":
        target = rng.choice(objects)
        target.rename(target.parent / aside)
        target.symlink_to(outside / "host")
    elif kind == "locks-link":
        target = root / "=locks"
        if target.is_dir() and not target.is_symlink():
            target.rename(root / aside)
        elif target.is_symlink():
            target.unlink()
        target.symlink_to(outside)
    else:
        target = rng.choice(folders)
        assert stranger is not None
        os.chown(target, stranger, stranger)
    return f"{kind} {target.relative_to(root)}"
