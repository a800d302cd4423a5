// tvm_ollie.cuda.info / vendor_error / device_count: what the CUDA library can run here.
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <string>

#include "cuda_common.h"

namespace tvm_ollie {
namespace cuda {

std::string GemmInfo();
std::string Conv2dInfo();

namespace {

std::string Info() {
  return "tvm-ollie CUDA library\n" + RuntimeInfo() + "\n" + GemmInfo() + "\n" + Conv2dInfo() +
         "\n";
}

// "" when the vendor library `name` ("cublas" or "cudnn") is loaded, else why not.
std::string VendorError(const std::string& name) {
  if (name == "cublas") return Cublas().ok ? "" : Cublas().error;
  if (name == "cudnn") return Cudnn().ok ? "" : Cudnn().error;
  TVM_FFI_THROW(ValueError) << "tvm_ollie.cuda.vendor_error: unknown library '" << name
                            << "' (expected cublas or cudnn)";
}

// Number of CUDA devices (0 without a driver or a device).
int64_t DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvm_ollie.cuda.info", []() -> std::string { return Info(); })
      .def("tvm_ollie.cuda.vendor_error",
           [](const std::string& name) -> std::string { return VendorError(name); })
      .def("tvm_ollie.cuda.device_count", []() -> int64_t { return DeviceCount(); });
}

}  // namespace cuda
}  // namespace tvm_ollie
