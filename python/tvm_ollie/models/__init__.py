"""Benchmark models built in code with seeded random weights (nothing is downloaded).

``get_model(name, quick=False, batch=1) -> ModelSpec`` and ``list_models()``; the OLLIE paper's
models (InfoGAN, DCGAN, FSRCNN, GCN, ResNet-18, CSRNet back end, Longformer layer), the Korch
paper's (Candy, YOLOX-nano, SegFormer-B0, EfficientViT-B0) and a BERT-base layer. Every model
also has a small ``quick`` size for tests and fast runs. :mod:`.export` turns a spec into a
Relax module (``torch.export``) or an ONNX file. Needs ``torch``.
"""

from .registry import ModelSpec, get_model, list_models, paper_batches, register  # noqa: F401
from .export import export_program, to_onnx, to_relax  # noqa: F401
