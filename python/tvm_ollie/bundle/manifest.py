"""The bundle's manifest: what the runner loads, feeds, runs and compares (``manifest.txt``).

One record a line, fields separated by single spaces, so that the C++ runner reads it with a
stream and no JSON library (the format is described at the top of ``runner.cc``)::

    ollie-bundle 1
    device cuda 0
    preload lib/libtvm_runtime_cuda.so
    model resnet18 0.001 0.001
    input data/resnet18/in0.bin float32 1,3,32,32
    output data/resnet18/out0.bin float32 1,10
    system tvm models/resnet18.tvm.so
    system ollie models/resnet18.ollie.so
    model resnet18.u0 0.001 0.001
    random float32 1,64,8,8
    reference first
    system a0 candidates/resnet18.u0.a0.so

``random`` is an input the runner makes (no file carried) and ``reference first`` makes the
first system's outputs the reference of the others (the candidate kernels of
:mod:`.candidates`). Paths are relative to the bundle; no field may contain a space.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

__all__ = ["FORMAT_VERSION", "Manifest", "ModelEntry", "TensorEntry", "read_manifest",
           "write_manifest"]

FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """A raw tensor file (little-endian, row-major) with its type and shape; ``file`` empty:
    an input the runner makes (uniform in ``[-1, 1)`` from a fixed seed)."""

    file: str
    dtype: str
    shape: Tuple[int, ...]


@dataclasses.dataclass
class ModelEntry:
    """A model: ``main``'s inputs (weights included), reference outputs, and executables
    ``(system, library)``; outputs must satisfy ``|out - ref| <= atol * max|ref| + rtol *
    |ref|``, where ``ref`` is the first system's output when ``reference_first``."""

    name: str
    rtol: float
    atol: float
    inputs: List[TensorEntry] = dataclasses.field(default_factory=list)
    outputs: List[TensorEntry] = dataclasses.field(default_factory=list)
    systems: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
    reference_first: bool = False


@dataclasses.dataclass
class Manifest:
    """Everything the runner reads: the device, libraries to load first, the models."""

    device: str
    device_id: int = 0
    preload: List[str] = dataclasses.field(default_factory=list)
    models: List[ModelEntry] = dataclasses.field(default_factory=list)


def _field(text: str) -> str:
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"manifest field {text!r} is empty or contains white space")
    return text


def _shape(shape: Sequence[int]) -> str:
    return ",".join(str(int(d)) for d in shape) if len(shape) else "-"


def _parse_shape(text: str) -> Tuple[int, ...]:
    return () if text == "-" else tuple(int(d) for d in text.split(","))


def write_manifest(path: str, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` in the line format of the module docstring."""
    lines = [f"ollie-bundle {FORMAT_VERSION}",
             f"device {_field(manifest.device)} {int(manifest.device_id)}"]
    lines += [f"preload {_field(lib)}" for lib in manifest.preload]
    for model in manifest.models:
        lines.append(f"model {_field(model.name)} {model.rtol!r} {model.atol!r}")
        for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
            lines += [f"{kind} {_field(t.file)} {_field(t.dtype)} {_shape(t.shape)}"
                      if t.file else f"random {_field(t.dtype)} {_shape(t.shape)}"
                      for t in tensors]
        if model.reference_first:
            lines.append("reference first")
        lines += [f"system {_field(name)} {_field(lib)}" for name, lib in model.systems]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def read_manifest(path: str) -> Manifest:
    """Parse a manifest written by :func:`write_manifest` (raises ``ValueError`` on a bad
    line)."""
    manifest = None
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            kind, rest = parts[0], parts[1:]
            if kind == "ollie-bundle":
                if rest != [str(FORMAT_VERSION)]:
                    raise ValueError(f"unsupported manifest version {rest}")
                manifest = Manifest("cpu")
            elif manifest is None:
                raise ValueError(f"{path} is not an ollie bundle manifest")
            elif kind == "device":
                manifest.device, manifest.device_id = rest[0], int(rest[1])
            elif kind == "preload":
                manifest.preload.append(rest[0])
            elif kind == "model":
                manifest.models.append(ModelEntry(rest[0], float(rest[1]), float(rest[2])))
            elif kind in ("input", "output"):
                target = manifest.models[-1].inputs if kind == "input" else \
                    manifest.models[-1].outputs
                target.append(TensorEntry(rest[0], rest[1], _parse_shape(rest[2])))
            elif kind == "random":
                manifest.models[-1].inputs.append(TensorEntry("", rest[0],
                                                              _parse_shape(rest[1])))
            elif kind == "reference":
                if rest != ["first"]:
                    raise ValueError(f"unknown reference {rest}")
                manifest.models[-1].reference_first = True
            elif kind == "system":
                manifest.models[-1].systems.append((rest[0], rest[1]))
            else:
                raise ValueError(f"unknown manifest record {kind!r}")
    if manifest is None:
        raise ValueError(f"{path} is empty")
    return manifest
