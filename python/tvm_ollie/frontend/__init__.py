"""What the command line reads from the user: models, targets, inputs and compiled libraries.

* :mod:`.loader`: ONNX files, saved Relax modules and Python functions -> Relax ``IRModule``;
* :mod:`.onnx_prep`: fixed input shapes and folded shape computations for exported ONNX models;
* :mod:`.torch_entry`: ``from_torch`` (``torch.export``) and ``compile_torch``;
* :mod:`.torch_backend`: the ``torch.compile`` backend ``"tvm_ollie"``;
* :mod:`.targets`: ``llvm`` / ``cuda`` / tags / JSON dicts -> ``tvm.target.Target``;
* :mod:`.inputs`: a model's input signature, ``NAME=FILE.npy`` inputs, seeded random inputs;
* :mod:`.runner`: load a compiled library and run (and time) its ``main`` with the Relax VM;
* :mod:`.explain`: readable text of the optimizer's per-operator decisions;
* :mod:`.progress`: progress of long steps on stderr.

Every user-caused problem raises a :class:`FrontendError` subclass with a one-line message.
"""

from .errors import FrontendError  # noqa: F401
from .loader import ModelLoadError, iter_op_calls, load_module  # noqa: F401
