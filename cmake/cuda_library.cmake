# libtvm_ollie_cuda: cuBLAS GEMMs and cuDNN convolutions registered as tvm_ollie.cuda.* globals.
#
# Included by CMakeLists.txt once tvm-ffi is found. Built only when the CUDA toolkit (the CUDA
# runtime headers and libcudart, and nvcc for the epilogue kernel) is found; skipped with a
# STATUS message otherwise, or with -DTVM_OLLIE_CUDA=OFF. It links only tvm-ffi and the CUDA
# runtime: cuBLAS and cuDNN are dlopen-ed at run time (tvm_ollie/cuda_common.cc), so the library
# builds without them and goes into a GPU bundle without oneDNN/OpenBLAS. When the build finds
# the vendors' headers (CUBLAS_INCLUDE_DIR / CUDNN_INCLUDE_DIR from cmake/ollie_deps.py: the
# nvidia-cublas / nvidia-cudnn wheels of the `cuda` extra) it compiles against them instead of
# the declarations in tvm_ollie/cuda_vendor.h.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
option(TVM_OLLIE_CUDA "Build libtvm_ollie_cuda when the CUDA toolkit is found" ON)
if(NOT TVM_OLLIE_CUDA)
  message(STATUS "tvm-ollie: CUDA library disabled (TVM_OLLIE_CUDA=OFF)")
  return()
endif()
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cudart)
  message(STATUS "tvm-ollie: CUDA toolkit not found; the CUDA library is not built")
  return()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "tvm-ollie: nvcc not usable; the CUDA library is not built")
  return()
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  # Turing to Hopper as machine code, Hopper's PTX for newer GPUs (JIT-compiled by the driver).
  set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;86-real;89-real;90")
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)

add_library(tvm_ollie_cuda SHARED
  tvm_ollie/attrs.cc
  tvm_ollie/cuda_common.cc
  tvm_ollie/cuda_gemm.cc
  tvm_ollie/cuda_conv2d.cc
  tvm_ollie/cuda_info.cc
  tvm_ollie/cuda_epilogue.cu)
target_link_libraries(tvm_ollie_cuda PRIVATE tvm_ffi::header tvm_ffi::shared CUDA::cudart
                                             ${CMAKE_DL_LIBS})
target_compile_options(tvm_ollie_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O3 -Wall
                                              -Wno-unused-function>)
if(CUBLAS_INCLUDE_DIR)
  target_include_directories(tvm_ollie_cuda PRIVATE "${CUBLAS_INCLUDE_DIR}")
  target_compile_definitions(tvm_ollie_cuda PRIVATE TVM_OLLIE_CUBLAS_HEADERS)
  message(STATUS "tvm-ollie: CUDA library compiled against cuBLAS headers in ${CUBLAS_INCLUDE_DIR}")
endif()
if(CUDNN_INCLUDE_DIR)
  target_include_directories(tvm_ollie_cuda PRIVATE "${CUDNN_INCLUDE_DIR}")
  target_compile_definitions(tvm_ollie_cuda PRIVATE TVM_OLLIE_CUDNN_HEADERS)
  # cuDNN 9 marks the descriptor API (still supported) deprecated in favor of its graph API.
  target_compile_options(tvm_ollie_cuda PRIVATE
                         $<$<COMPILE_LANGUAGE:CXX>:-Wno-deprecated-declarations>)
  message(STATUS "tvm-ollie: CUDA library compiled against cuDNN headers in ${CUDNN_INCLUDE_DIR}")
endif()
target_link_options(tvm_ollie_cuda PRIVATE -Wl,--no-undefined)
# libcudart.so.13: the toolkit's (build RPATH), else the loader's search path or the
# nvidia-cuda-runtime wheel (<site-packages>/nvidia/cu13/lib).
set_target_properties(tvm_ollie_cuda PROPERTIES
  BUILD_RPATH "$<TARGET_FILE_DIR:tvm_ffi::shared>;${CUDAToolkit_LIBRARY_DIR}"
  INSTALL_RPATH "$ORIGIN/../../tvm_ffi/lib;$ORIGIN/../../nvidia/cu13/lib"
  CXX_VISIBILITY_PRESET hidden
  CUDA_VISIBILITY_PRESET hidden)
message(STATUS "tvm-ollie: building the CUDA library (CUDA ${CUDAToolkit_VERSION}, "
               "architectures ${CMAKE_CUDA_ARCHITECTURES})")
if(DEFINED SKBUILD_PLATLIB_DIR OR DEFINED SKBUILD)
  install(TARGETS tvm_ollie_cuda LIBRARY DESTINATION tvm_ollie/lib)
else()
  install(TARGETS tvm_ollie_cuda LIBRARY DESTINATION lib)
endif()
