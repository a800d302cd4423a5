"""CUDA executables that load without a compiler: the kernels compiled here, not at load time.

TVM 0.27 stores a CUDA module in an exported library as CUDA C source (format ``"cuda"``), and
its runtime compiles that source when the library is loaded, through the Python callback
``tvm_callback_cuda_compile`` (NVRTC or nvcc): a process without TVM's Python package cannot
load it. :func:`export_precompiled` exports the library with every CUDA module's source
replaced by a cubin that ``nvcc`` builds here for the target's architecture (format
``"cubin"``, which the runtime hands to ``cuModuleLoadData`` as it is).

The library's import blob (``__tvm_ffi__library_bin``, as ``ModulePackImportsToC`` writes
it) is little-endian: ``u64 size``, the import tree (``u64 n, n x u64`` row pointers, ``u64
m, m x u64`` child indices), then per module its kind (a string: ``u64 length, bytes``) and,
except for the host library ``"_lib"``, its bytes (a string). A CUDA module's bytes are
``fmt, fmap, data``: strings ``fmt`` and ``data`` (the source), ``fmap`` a ``u64`` count of
``(name, FunctionInfo)`` with ``FunctionInfo = name, arg_types (u64 n, n x 4 bytes),
launch_param_tags (u64 n, n strings), arg_extra_tags (u64 n, n x 4 bytes)``. Parsing is
exact: any other layout (a TVM upgrade) raises :class:`~.sizes.BundleError` rather than
writing a library that would not load.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Callable, List, Tuple

from tvm.support.nvcc import compile_cuda

from ..compat import tvm
from .sizes import BundleError

__all__ = ["CUDA_FORMAT", "compile_cubin", "export_precompiled", "patch_blob", "split_blob"]

#: The format written for precompiled CUDA modules.
CUDA_FORMAT = "cubin"


class _Reader:
    """Sequential little-endian reads over ``data`` (raises BundleError past its end)."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def u64(self) -> int:
        if self.pos + 8 > len(self.data):
            raise BundleError("CUDA pack: unexpected end of the library blob")
        value = struct.unpack_from("<Q", self.data, self.pos)[0]
        self.pos += 8
        return value

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise BundleError("CUDA pack: a length runs past the library blob")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def string(self) -> bytes:
        return self.raw(self.u64())


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def split_blob(blob: bytes) -> Tuple[bytes, List[Tuple[bytes, bytes]]]:
    """``(import tree bytes, [(kind, module bytes)])`` of a library blob (module docstring);
    the host library's entry has ``None`` bytes."""
    r = _Reader(blob)
    if r.u64() != len(blob) - 8:
        raise BundleError("CUDA pack: the library blob's size field does not match")
    start = r.pos
    for _ in range(2):  # row pointers, child indices
        r.raw(8 * r.u64())
    tree = blob[start:r.pos]
    modules = []
    while r.pos < len(blob):
        kind = r.string()
        modules.append((kind, None if kind == b"_lib" else r.string()))
    return tree, modules


def _cuda_parts(payload: bytes) -> Tuple[bytes, bytes, bytes]:
    """``(fmt, fmap bytes, data)`` of a CUDA module's bytes, parsed exactly."""
    r = _Reader(payload)
    fmt = r.string()
    fmap_start = r.pos
    for _ in range(r.u64()):
        r.string()  # key
        r.string()  # FunctionInfo.name
        r.raw(4 * r.u64())  # arg_types (DLDataType)
        for _ in range(r.u64()):
            r.string()  # launch_param_tags
        r.raw(4 * r.u64())  # arg_extra_tags
    fmap = payload[fmap_start:r.pos]
    data = r.string()
    if r.pos != len(payload):
        raise BundleError("CUDA pack: unknown CUDA module layout (bytes after the data)")
    return fmt, fmap, data


def patch_blob(blob: bytes, compile_source: Callable[[str], bytes]) -> Tuple[bytes, int]:
    """The blob with every CUDA source module compiled by ``compile_source`` (source text ->
    binary), and how many were."""
    tree, modules = split_blob(blob)
    body, count = [tree], 0
    for kind, payload in modules:
        body.append(_string(kind))
        if payload is None:
            continue
        if kind == b"cuda":
            fmt, fmap, data = _cuda_parts(payload)
            if fmt == b"cuda":
                payload = _string(CUDA_FORMAT.encode()) + fmap + \
                    _string(bytes(compile_source(data.decode())))
                count += 1
        body.append(_string(payload))
    out = b"".join(body)
    return struct.pack("<Q", len(out)) + out, count


def compile_cubin(target) -> Callable[[str], bytes]:
    """A ``source -> cubin`` compiler for ``target``'s architecture (its ``arch``, e.g.
    ``sm_90``) with TVM's nvcc options (:func:`tvm.support.nvcc.compile_cuda`)."""

    arch = str(target.attrs.get("arch", ""))
    if not arch.startswith("sm_"):
        raise BundleError(f"CUDA pack: the target has no sm_ architecture ({arch!r})")

    def compile_source(code: str) -> bytes:
        with target:
            return bytes(compile_cuda(code, target_format="cubin", arch=arch, compiler="nvcc"))

    return compile_source


_ARRAY = re.compile(r"(const unsigned char (\w+)\[)(\d+)(\] = \{)(.*?)(\};)", re.S)


def _pack_imports(compile_source: Callable[[str], bytes], counter: list):
    """An ``fpack_imports`` for ``export_library``: TVM's C packing with a patched blob."""

    def pack(mod, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
        source = tvm.runtime._ffi_api.ModulePackImportsToC(  # pylint: disable=protected-access
            mod, is_system_lib, prefix)
        match = _ARRAY.search(source)
        if match is None:
            raise BundleError("CUDA pack: ModulePackImportsToC wrote no byte array")
        blob = bytes(int(x, 16) for x in re.findall(r"0x([0-9a-fA-F]{2})", match.group(5)))
        if len(blob) != int(match.group(3)):
            raise BundleError("CUDA pack: the packed byte array has another length")
        blob, count = patch_blob(blob, compile_source)
        counter.append(count)
        rows = ",\n".join(",".join(f"0x{b:02x}" for b in blob[i:i + 32])
                          for i in range(0, len(blob), 32))
        source = (source[:match.start()] + match.group(1) + str(len(blob)) + match.group(4)
                  + "\n" + rows + ",\n" + match.group(6) + source[match.end():])
        path = os.path.join(workspace_dir, f"{prefix}devc.c")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(source)
        return path

    return pack


def export_precompiled(executable, path: str, target) -> int:
    """Export ``executable`` (built for CUDA ``target``) to ``path`` with its CUDA kernels
    compiled to cubins here; returns the number of CUDA modules compiled."""
    counter: list = []
    executable.export_library(path, fpack_imports=_pack_imports(compile_cubin(target), counter))
    return sum(counter)
