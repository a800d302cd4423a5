"""The model registry: every benchmark model is a function that builds a ``ModelSpec``.

A model is defined once, as a PyTorch ``nn.Module`` with seeded random weights; the benchmark
imports the same module into Relax (``torch.export``) and exports it to ONNX, so every system
sees identical weights and inputs. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Tuple

# torch is imported lazily (it is an optional dependency and costs about a second to import).

#: name -> (builder, paper, description, batch sizes the paper used)
_REGISTRY: Dict[str, "_Entry"] = {}


@dataclasses.dataclass(frozen=True)
class _Entry:
    builder: Callable[[bool, int], Tuple[object, tuple]]
    paper: str
    description: str
    paper_batches: Tuple[int, ...]


@dataclasses.dataclass
class ModelSpec:
    """A benchmark model ready to run.

    Attributes
    ----------
    name : str
        Registry name.
    module : torch.nn.Module
        The model in eval mode, weights seeded.
    example_inputs : tuple of torch.Tensor
        Inputs (seeded) that every system receives.
    quick : bool
        Whether this is the small "quick" size.
    batch : int
        Batch size.
    paper : str
        Which paper's evaluation the model comes from ("ollie", "korch" or "extra").
    description : str
        Shapes and what was simplified, in one line.
    """

    name: str
    module: object
    example_inputs: tuple
    quick: bool
    batch: int
    paper: str
    description: str

    @property
    def input_shapes(self) -> List[Tuple[int, ...]]:
        """Shapes of the example inputs."""
        return [tuple(x.shape) for x in self.example_inputs]

    @property
    def key(self) -> str:
        """A file-name-safe identifier of the model, size and batch (for caches)."""
        return f"{self.name}-{'quick' if self.quick else 'full'}-b{self.batch}"


def register(name: str, paper: str, description: str, paper_batches: Tuple[int, ...] = (1,)):
    """Register ``builder(quick, batch) -> (module, example_inputs)`` under ``name``."""

    def _wrap(builder):
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = _Entry(builder, paper, description, tuple(paper_batches))
        return builder

    return _wrap


def list_models() -> List[str]:
    """Names of all registered models, in registration order."""
    _load_all()
    return list(_REGISTRY)


def paper_batches(name: str) -> Tuple[int, ...]:
    """Batch sizes the source paper evaluated ``name`` at."""
    _load_all()
    return _entry(name).paper_batches


def get_model(name: str, quick: bool = False, batch: int = 1, seed: int = 0) -> ModelSpec:
    """Build a registered model with seeded random weights and inputs.

    Parameters
    ----------
    name : str
        One of :func:`list_models`.
    quick : bool
        Build the small size (for tests and ``--quick`` runs) instead of the paper's size.
    batch : int
        Batch size of the example inputs.
    seed : int
        Seed of the weights and of the inputs.
    """
    # lazy: torch is a heavy, optional dependency
    import torch  # pylint: disable=import-outside-toplevel

    _load_all()
    entry = _entry(name)
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module, inputs = entry.builder(quick, batch)
    module = module.eval()
    for param in module.parameters():
        param.requires_grad_(False)
    return ModelSpec(
        name=name,
        module=module,
        example_inputs=tuple(inputs),
        quick=quick,
        batch=batch,
        paper=entry.paper,
        description=entry.description,
    )


def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def _load_all() -> None:
    """Import the model modules (each registers itself on import)."""
    # pylint: disable=import-outside-toplevel,unused-import,cyclic-import
    # lazy: the zoo's model modules import torch (and register here)
    from . import gan, fsrcnn, gcn, resnet, csrnet, longformer  # noqa: F401
    from . import candy, yolox, segformer, efficientvit, bert  # noqa: F401
