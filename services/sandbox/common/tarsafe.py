"""Tar extraction that refuses to write outside its destination, on every
Python 3.11 the sandbox runs on: tarfile's extraction filters (``data``,
``tar``) where they exist (3.11.4+), the same checks here where they do not
(Debian bookworm's 3.11.2, the offline base image of the service images).

Policies:
- ``data``: no absolute paths, nothing outside ``dest``, no links that lead
  outside it, no device files; owners are not restored, setuid/setgid dropped.
- ``tar``: no absolute paths and nothing outside ``dest``; symlinks kept as
  they are (repositories have absolute ones); setuid/setgid dropped.
- ``owned``: ``tar``, but numeric owners and every mode bit kept (a root
  worker unpacking an image's own tree to pack it back).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Literal

Policy = Literal["data", "tar", "owned"]
_HAS_FILTERS = hasattr(tarfile, "data_filter")


def extractall(tar: tarfile.TarFile, dest: Path, policy: Policy = "data") -> None:
    if _HAS_FILTERS:
        if policy == "owned":
            tar.extractall(dest, numeric_owner=True, filter=_keep_modes)
        else:
            tar.extractall(dest, filter=policy)
        return
    members = [_checked(member, dest, policy) for member in tar.getmembers()]
    tar.extractall(dest, members=members, numeric_owner=policy == "owned")


def _keep_modes(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    return tarfile.tar_filter(member, dest).replace(mode=member.mode, deep=False)  # type: ignore[attr-defined]


def _checked(member: tarfile.TarInfo, dest: Path, policy: Policy) -> tarfile.TarInfo:
    root = os.path.realpath(dest)
    name = member.name.lstrip("/")
    target = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, target]) != root:
        raise tarfile.TarError(f"{member.name!r} would land outside {dest}")
    if member.ischr() or member.isblk() or (policy == "data" and member.isfifo()):
        raise tarfile.TarError(f"{member.name!r} is a device file")
    if policy == "data" and (member.issym() or member.islnk()):
        base = os.path.dirname(target) if member.issym() else root
        if os.path.isabs(member.linkname):
            raise tarfile.TarError(f"{member.name!r} links to an absolute path")
        linked = os.path.realpath(os.path.join(base, member.linkname))
        if os.path.commonpath([root, linked]) != root:
            raise tarfile.TarError(f"{member.name!r} links outside {dest}")
    member.name = name
    if policy != "owned":
        member.mode &= ~0o6000 & 0o7777
    if policy == "data":
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    return member
