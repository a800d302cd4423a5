"""Projections that share an input: what the pass decides for such a group, and its times.

    OMP_WAIT_POLICY=PASSIVE TVM_THREAD_POOL_SPIN_COUNT=0 TVM_NUM_THREADS=2 \\
        python -m tvm_ollie.bench.shared_inputs [--model bert_separate_qkv|bert|segformer]
        [--weights constants|params] [--search-s S]

Models:

* ``bert_separate_qkv``: one BERT encoder layer written as HuggingFace writes it (separate
  ``query``/``key``/``value`` linears; the zoo's ``bert`` already fuses them into one linear);
* ``bert``, ``segformer``: the zoo models at quick sizes (segformer's last stage has ``q`` and
  ``kv`` projections of one input).

``main`` runs the pass (``trials=0``, llvm) on the model with its weights bound as constants
(as the CLI binds them: a concatenation of weights folds at compile time) or kept as
parameters of ``main`` (the concatenation then runs on every call), and prints the pass's
report: every group of calls is a region, with the original's and the merged program's
untuned times. Each model function also works with the CLI, which binds the weights::

    tvm-ollie explain python/tvm_ollie/bench/shared_inputs.py:bert_separate_qkv

(the imports are absolute so that the CLI can load this file by its path).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, Optional, Sequence, Tuple

from tvm_ollie.bench.env import configure_threads
from tvm_ollie.config import OllieConfig
from tvm_ollie.frontend.loader import bind_params
from tvm_ollie.models.export import to_relax
from tvm_ollie.models.registry import ModelSpec, get_model
from tvm_ollie.transform import optimize_module

ModelAndParams = Tuple[object, Dict[str, object]]


def _zoo(name: str) -> ModelAndParams:
    mod, params = to_relax(get_model(name, quick=True))
    return mod, {"main": params}


def bert() -> ModelAndParams:
    """The zoo's BERT layer (fused QKV projection), quick size."""
    return _zoo("bert")


def segformer() -> ModelAndParams:
    """The zoo's Segformer (q and kv projections of the last stage share their input)."""
    return _zoo("segformer")


def bert_separate_qkv(seq: int = 32, hidden: int = 128, heads: int = 2,
                      ffn: int = 512) -> ModelAndParams:
    """One post-LN BERT layer with separate Q/K/V linears (quick size by default)."""
    # pylint: disable=import-outside-toplevel
    # lazy: torch is a heavy, optional dependency
    import torch
    from torch import nn

    class Layer(nn.Module):
        """Separate q/k/v projections of one input, attention, output projection, FFN."""

        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.proj, self.fc1, self.fc2 = (nn.Linear(hidden, hidden),
                                             nn.Linear(hidden, ffn), nn.Linear(ffn, hidden))
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

        def forward(self, x):
            b, n, _ = x.shape

            def heads_of(t):
                return t.reshape(b, n, heads, hidden // heads).permute(0, 2, 1, 3)

            q, k, v = heads_of(self.q(x)), heads_of(self.k(x)), heads_of(self.v(x))
            att = torch.softmax(q @ k.transpose(-1, -2) * (hidden // heads) ** -0.5, dim=-1)
            ctx = (att @ v).permute(0, 2, 1, 3).reshape(b, n, hidden)
            x = self.ln1(x + self.proj(ctx))
            return self.ln2(x + self.fc2(nn.functional.gelu(self.fc1(x))))

    torch.manual_seed(0)
    spec = ModelSpec("bert_separate_qkv", Layer().eval(), (torch.randn(1, seq, hidden),), True,
                     1, "extra", "BERT layer with separate Q/K/V linears")
    mod, params = to_relax(spec)
    return mod, {"main": params}


MODELS: Dict[str, Callable[[], ModelAndParams]] = {
    "bert_separate_qkv": bert_separate_qkv, "bert": bert, "segformer": segformer}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the pass on one model and print its report (decisions, then regions and groups)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="bert_separate_qkv")
    parser.add_argument("--weights", choices=["constants", "params"], default="constants")
    parser.add_argument("--search-s", type=float, default=20.0,
                        help="derivation seconds for the whole model")
    parser.add_argument("--threads", type=int, default=2,
                        help="TVM_NUM_THREADS, unless already set")
    opts = parser.parse_args(argv)
    # No spinning thread pools: TVM kernels around a oneDNN call otherwise measure 4-10 ms
    # instead of ~0.15 (docs/benchmarks-history.md), and the pass would decide on that noise.
    configure_threads(opts.threads)
    mod, params = MODELS[opts.model]()
    if opts.weights == "constants":
        mod = bind_params(mod, params)
    config = OllieConfig(target="llvm", trials=0, search_time_s=opts.search_s)
    _, report = optimize_module(mod, config=config)
    print(f"{opts.model}, weights as {opts.weights}:")
    print(report.to_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
