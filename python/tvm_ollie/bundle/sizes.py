"""What a bundle weighs: per-file sizes and the limit a device run can carry.

The device machine takes at most 64 MiB of files per run; a bundle must leave room for the
command's own output, so :data:`DEFAULT_LIMIT` is 60 MiB. :func:`check_size` fails with the
per-file table when a bundle is over its limit, so that the caller sees what to drop.
"""

from __future__ import annotations

import os
from typing import List, Tuple

__all__ = ["DEFAULT_LIMIT", "MIB", "BundleError", "BundleSizeError", "check_size", "file_sizes",
           "size_table", "total_size"]

MIB = 1 << 20
#: Default size limit of a bundle in bytes (60 MiB of the device run's 64 MiB).
DEFAULT_LIMIT = 60 * MIB


class BundleError(RuntimeError):
    """A bundle cannot be built (a missing library, an unknown executable layout)."""


class BundleSizeError(BundleError):
    """A bundle is over its size limit; the message lists every file by size."""


def file_sizes(root: str) -> List[Tuple[str, int]]:
    """``(path relative to root, bytes)`` of every file under ``root``, largest first
    (symbolic links count as the file they point to, as a copy to the device makes them)."""
    out = []
    for base, _, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            out.append((os.path.relpath(path, root), os.path.getsize(path)))
    return sorted(out, key=lambda item: (-item[1], item[0]))


def total_size(sizes: List[Tuple[str, int]]) -> int:
    """Total bytes of :func:`file_sizes`' entries."""
    return sum(size for _, size in sizes)


def size_table(sizes: List[Tuple[str, int]], limit: int = DEFAULT_LIMIT) -> str:
    """A plain-text table: one line per file (MiB, path), then the total against ``limit``."""
    lines = [f"{size / MIB:9.3f} MiB  {path}" for path, size in sizes]
    total = total_size(sizes)
    lines.append(f"{total / MIB:9.3f} MiB  total ({len(sizes)} files; limit "
                 f"{limit / MIB:.1f} MiB)")
    return "\n".join(lines)


def check_size(root: str, limit: int = DEFAULT_LIMIT) -> List[Tuple[str, int]]:
    """The sizes of ``root``'s files; raises :class:`BundleSizeError` (with the table) when
    their total exceeds ``limit`` bytes."""
    sizes = file_sizes(root)
    if total_size(sizes) > limit:
        raise BundleSizeError(f"bundle {root} is {total_size(sizes) / MIB:.1f} MiB, over the "
                              f"{limit / MIB:.1f} MiB limit:\n{size_table(sizes, limit)}")
    return sizes
