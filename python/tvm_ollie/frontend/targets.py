"""Target strings of the command line: ``llvm``, ``cuda``, a tag, or a JSON dict.

TVM 0.27 rejects the old ``"llvm -mcpu=..."`` form; options go in the JSON form
(``'{"kind": "llvm", "num-cores": 4}'``). Plain ``cuda`` on a machine without a GPU would
default to sm_50 with a warning and lack the limits that GPU schedules read, so it becomes
the ``nvidia/nvidia-h100`` tag there (the compiled library then holds CUDA source that is
compiled when loaded on a GPU machine).
"""

from __future__ import annotations

import json
from typing import Tuple

from ..compat import tvm
from ..target import is_gpu_target, kind_name
from .errors import FrontendError, first_line

#: Used for ``cuda`` when no GPU can be queried for its architecture.
DEFAULT_CUDA_TAG = "nvidia/nvidia-h100"


class TargetError(FrontendError):
    """The target string names no target TVM knows."""


def parse_target(text: str) -> Tuple["tvm.target.Target", str]:
    """Parse a command-line target.

    Parameters
    ----------
    text : str
        ``"llvm"``, ``"cuda"``, a tag such as ``"nvidia/nvidia-h100"``, or a JSON dict string.

    Returns
    -------
    target : tvm.target.Target
        The target (for CUDA kinds, with an llvm host).
    note : str
        A remark for the user ("" if none), e.g. which GPU plain ``cuda`` was mapped to.
    """
    text = text.strip()
    note = ""
    try:
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except ValueError as err:
                raise TargetError(f"bad target {text!r}: invalid JSON ({err})") from err
            target = tvm.target.Target(spec)
        elif text == "cuda" and not tvm.cuda(0).exist:
            target = tvm.target.Target(DEFAULT_CUDA_TAG)
            note = (f"no GPU here: 'cuda' means {DEFAULT_CUDA_TAG} (give a tag or a JSON "
                    "target to choose another GPU)")  # fmt: skip
        elif " " in text:
            raise TargetError(
                f"bad target {text!r}: options go in the JSON form, e.g. "
                '\'{"kind": "llvm", "num-cores": 4}\''
            )
        else:
            target = tvm.target.Target(text)
    except TargetError:
        raise
    except (ValueError, TypeError, RuntimeError) as err:
        raise TargetError(f"bad target {text!r}: {_first_sentence(err)}") from err
    if kind_name(target) == "cuda" and target.host is None:
        target = tvm.target.Target(target, host=tvm.target.Target("llvm"))
    return target, note


def is_gpu(target: "tvm.target.Target") -> bool:
    """Whether ``target`` compiles GPU kernels (its programs need a GPU device to run):
    :func:`tvm_ollie.target.is_gpu_target`."""
    return is_gpu_target(target)


def _first_sentence(err: BaseException) -> str:
    line = first_line(err)
    # TVM appends "Target creation from string failed: ..." which repeats the input.
    return line.split(". Target creation")[0].split(" Target creation")[0]
