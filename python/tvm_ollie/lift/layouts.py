"""Layout strings of convolution and pooling attributes (``NCHW``, ``NHWC``, ``OIHW``, ``HWIO``)."""

from __future__ import annotations

from typing import Dict

from .errors import LiftError

#: Spatial axis letters of N-d operators, in their canonical order.
SPATIAL = {1: "W", 2: "HW", 3: "DHW"}


def parse_layout(layout: str, fixed: str, n_spatial: int, what: str) -> Dict[str, int]:
    """Map each axis letter of ``layout`` to its position.

    ``layout`` must be a permutation of ``fixed`` (``"NC"`` for data, ``"OI"`` for kernels) plus
    the spatial letters, with the spatial letters in canonical order: TOPI pairs spatial axes with
    strides and kernel axes by order of appearance, so another order (or a packed layout such as
    ``NCHW4c``) is something TVM's legalizer itself does not handle consistently.
    """
    spatial = SPATIAL.get(n_spatial)
    layout = str(layout)
    if spatial is None or sorted(layout) != sorted(fixed + spatial):
        raise LiftError(f"{what}: unsupported layout {layout!r} (expected a permutation of "
                        f"{fixed + (spatial or '')!r})")
    order = [c for c in layout if c in spatial]
    if "".join(order) != spatial:
        raise LiftError(f"{what}: layout {layout!r} orders the spatial axes unlike {spatial!r}")
    return {c: k for k, c in enumerate(layout)}
