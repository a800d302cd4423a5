"""The notebooks in ``tutorials/``: each is valid and its code compiles (fast), and each runs top
to bottom in a fresh kernel with nbclient (``slow``: kernel start plus TVM and torch imports
and one to three ollie builds each: 34-94 s per notebook measured on 2 cores at load 4-7)."""

import json
import os
import time

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
TUTORIALS = os.path.join(ROOT, "tutorials")
NOTEBOOKS = sorted(name for name in os.listdir(TUTORIALS) if name.endswith(".ipynb"))


def test_tutorials_exist():
    assert NOTEBOOKS == ["00_derivation_by_hand.ipynb", "01_quick_start.ipynb",
                         "02_pytorch.ipynb", "03_onnx.ipynb", "04_orchestration.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_valid_and_compiles(name):
    path = os.path.join(TUTORIALS, name)
    with open(path, encoding="utf-8") as file:
        book = json.load(file)
    nbformat = pytest.importorskip("nbformat")
    nbformat.validate(nbformat.from_dict(book))
    code = [cell for cell in book["cells"] if cell["cell_type"] == "code"]
    assert code and all(not cell.get("outputs") for cell in code)  # stored without outputs
    for index, cell in enumerate(code):
        compile("".join(cell["source"]), f"{name}[{index}]", "exec")


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    book = nbformat.read(os.path.join(TUTORIALS, name), as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(book, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    print(f"{name}: {time.perf_counter() - start:.1f} s")
