"""Inputs of a compiled model: its signature, ``--input NAME=FILE.npy`` files, random inputs.

A Relax VM library records the names of ``main``'s parameters but not their shapes or dtypes, so
``tvm-ollie compile`` writes them next to the library (:func:`signature_path`) and
``tvm-ollie run`` reads them back to check the given inputs and to generate random ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..compat import relax, tvm
from .errors import FrontendError


class InputError(FrontendError):
    """A model input is missing, unknown, unreadable, or has the wrong shape or dtype."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One tensor parameter of ``main``: name, shape (``None`` for a symbolic dim), dtype."""

    name: str
    shape: Optional[Tuple[Optional[int], ...]]
    dtype: Optional[str]

    def describe(self) -> str:
        """``x: float32[1, 3, 8, 8]`` (``?`` for unknown dimensions)."""
        if self.shape is None:
            return f"{self.name}: {self.dtype or '?'}[...]"
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype or '?'}[{dims}]"


def module_signature(mod: "tvm.IRModule", func: str = "main") -> List[Param]:
    """The parameters of ``mod[func]`` as :class:`Param` (non-tensor parameters have no shape)."""
    params = []
    for var in mod[func].params:
        ty = var.ty
        shape = None
        dtype = None
        if isinstance(ty, relax.TensorType):
            dtype = str(ty.dtype) if str(ty.dtype) not in ("", "void") else None
            if ty.shape is not None and isinstance(ty.shape, relax.ShapeExpr):
                shape = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else None
                              for d in ty.shape.values)  # fmt: skip
        params.append(Param(var.name, shape, dtype))
    return params


def signature_path(library: str) -> str:
    """Where the signature of ``library`` is stored: ``model.so`` -> ``model.so.signature.json``."""
    return library + ".signature.json"


def save_signature(library: str, params: Sequence[Param]) -> str:
    """Write ``params`` beside ``library``; returns the file written."""
    path = signature_path(library)
    with open(path, "w", encoding="utf-8") as file:
        json.dump({"main": [dataclasses.asdict(p) for p in params]}, file, indent=1)
    return path


def load_signature(library: str) -> Optional[List[Param]]:
    """The signature saved beside ``library``; ``None`` if there is none or it is unreadable."""
    path = signature_path(library)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            entries = json.load(file)["main"]
        return [Param(e["name"], None if e["shape"] is None else tuple(e["shape"]), e["dtype"])
                for e in entries]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_input_files(specs: Sequence[str]) -> Dict[str, np.ndarray]:
    """``["x=a.npy", ...]`` -> ``{"x": array}``."""
    arrays = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise InputError(f"bad --input {spec!r}: expected NAME=FILE.npy")
        if name in arrays:
            raise InputError(f"input {name!r} given twice")
        if not os.path.exists(path):
            raise InputError(f"no such input file: {path}")
        try:
            arrays[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise InputError(f"cannot read {path} as a .npy array: {err}") from err
        if not isinstance(arrays[name], np.ndarray):
            raise InputError(f"{path} holds several arrays (.npz); give one .npy per input")
    return arrays


def arrange_inputs(
    names: Sequence[str],
    given: Mapping[str, np.ndarray],
    signature: Optional[Sequence[Param]],
    random: bool = False,
    seed: int = 0,
) -> Tuple[List[np.ndarray], List[str]]:
    """Order ``given`` by ``names``, checked against ``signature``; fill the rest if ``random``.

    Returns the arrays and notes for the user (random inputs made, dtypes converted).
    """
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InputError(
            f"unknown input {', '.join(unknown)} (the model's inputs: {', '.join(names)})"
        )
    by_name = {p.name: p for p in signature or ()}
    arrays, notes = [], []
    rng = np.random.default_rng(seed)
    for name in names:
        param = by_name.get(name)
        if name in given:
            array, note = _check_array(name, given[name], param)
            if note:
                notes.append(note)
        elif random:
            if param is None or param.shape is None or None in param.shape or not param.dtype:
                raise InputError(
                    f"the shape of input {name!r} is not known (no signature file beside the "
                    f"library, or a dynamic shape): give --input {name}=FILE.npy"
                )
            array = _random_array(rng, param.shape, param.dtype)
            notes.append(f"random input {param.describe()} (seed {seed})")
        else:
            missing = [n for n in names if n not in given]
            raise InputError(
                f"missing input {', '.join(missing)}: give --input NAME=FILE.npy for each, or "
                "--random-inputs"
            )
        arrays.append(array)
    return arrays, notes


def _check_array(name: str, array: np.ndarray, param: Optional[Param]) -> Tuple[np.ndarray, str]:
    if param is None:
        return np.ascontiguousarray(array), ""
    if param.shape is not None:
        expected = param.shape
        if len(expected) != array.ndim or any(
            e is not None and e != a for e, a in zip(expected, array.shape)
        ):
            raise InputError(
                f"input {name!r} has shape {list(array.shape)}, the model expects "
                f"{param.describe()}"
            )
    note = ""
    if param.dtype and str(array.dtype) != param.dtype:
        if not np.can_cast(array.dtype, param.dtype, casting="same_kind"):
            raise InputError(
                f"input {name!r} has dtype {array.dtype}, the model expects {param.dtype}"
            )
        note = f"input {name!r} converted from {array.dtype} to {param.dtype}"
        array = array.astype(param.dtype)
    return np.ascontiguousarray(array), note


def _random_array(rng: np.random.Generator, shape: Tuple[int, ...], dtype: str) -> np.ndarray:
    kind = np.dtype(dtype).kind
    if kind == "f":
        return rng.uniform(-1.0, 1.0, shape).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    raise InputError(f"cannot make random inputs of dtype {dtype}")
