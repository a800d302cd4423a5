"""Print the build inputs of the native library as ``NAME=VALUE`` lines for CMakeLists.txt.

Run by CMake with the build's Python (pip's isolated build environment): the oneDNN wheels
install into the data scheme (``<prefix>/include``, ``<prefix>/lib``), which is not
``sys.prefix`` inside pip's build environment, so the files are located through the installed
distributions' records instead.
"""

import importlib.metadata as md
import os
import sys


def _dist_file(dist_name, suffix):
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return None
    for f in dist.files or ():
        name = "/" + str(f).replace("\\", "/")
        if name.endswith("/" + suffix):
            path = os.path.abspath(str(dist.locate_file(f)))
            if os.path.exists(path):
                return path
    return None


def main():
    out = {}
    hpp = _dist_file("onednn-devel-cpu-gomp", "include/oneapi/dnnl/dnnl.hpp")
    if hpp:
        out["DNNL_INCLUDE_DIR"] = os.path.dirname(os.path.dirname(os.path.dirname(hpp)))
    lib = _dist_file("onednn-cpu-gomp", "libdnnl.so.3")
    if lib:
        out["DNNL_LIBRARY"] = lib
    try:
        import scipy_openblas32 as sob

        out["OPENBLAS_INCLUDE_DIR"] = sob.get_include_dir()
        out["OPENBLAS_LIBRARY"] = os.path.join(sob.get_lib_dir(),
                                               "lib" + sob.get_library() + ".so")
    except ImportError:
        pass
    # Optional (the `cuda` extra): headers of cuBLAS and cuDNN for the CUDA library, which
    # otherwise compiles against its own declarations (it loads both libraries at run time).
    for key, dists, header in (
            ("CUBLAS_INCLUDE_DIR", ("nvidia-cublas", "nvidia-cublas-cu12"), "cublas_v2.h"),
            ("CUDNN_INCLUDE_DIR", ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"), "cudnn.h")):
        for dist in dists:
            found = _dist_file(dist, "include/" + header)
            if found:
                out[key] = os.path.dirname(found)
                break
    try:
        import tvm_ffi.libinfo

        out["TVM_FFI_CMAKE_DIR"] = tvm_ffi.libinfo.find_cmake_path()
    except (ImportError, RuntimeError):
        pass
    for key, value in out.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
