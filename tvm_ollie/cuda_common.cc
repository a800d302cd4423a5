// Shared helpers of the tvm-ollie CUDA library (see cuda_common.h).
#include "cuda_common.h"

#include <dlfcn.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "cuda_epilogue.h"

namespace tvm_ollie {
namespace cuda {

namespace ffi = tvm::ffi;

static_assert(static_cast<int>(Act::kNone) == kEpiNone &&
                  static_cast<int>(Act::kRelu) == kEpiRelu &&
                  static_cast<int>(Act::kClip) == kEpiClip &&
                  static_cast<int>(Act::kSigmoid) == kEpiSigmoid &&
                  static_cast<int>(Act::kTanh) == kEpiTanh &&
                  static_cast<int>(Act::kGelu) == kEpiGelu &&
                  static_cast<int>(Act::kGeluTanh) == kEpiGeluTanh &&
                  static_cast<int>(Act::kSilu) == kEpiSilu,
              "the epilogue's activation codes must be those of tvm_ollie::Act");

// ---------------------------------------------------------------------------------------------
// Run-time loading.
namespace {

// dlopens the first candidate that loads: the path in `env` if set (only it), else each soname.
// Returns the handle, or null with `error` listing every failure.
void* OpenFirst(const char* env, const std::vector<std::string>& sonames, std::string* path,
                std::string* error) {
  std::vector<std::string> candidates;
  const char* forced = std::getenv(env);
  if (forced != nullptr && *forced) {
    candidates.push_back(forced);
  } else {
    candidates = sonames;
  }
  std::string why;
  for (const std::string& name : candidates) {
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) {
      *path = name;
      return h;
    }
    const char* msg = dlerror();
    why += (why.empty() ? "" : "; ") + std::string(msg ? msg : name + ": not loadable");
  }
  *error = why + (forced != nullptr && *forced ? std::string(" (from $") + env + ")" : "");
  return nullptr;
}

// Resolves `name` into `*fn`; false (and `error` set) when missing.
template <typename F>
bool Resolve(void* handle, const char* name, F* fn, std::string* error) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    *error = std::string("symbol ") + name + " not found";
    return false;
  }
  *fn = reinterpret_cast<F>(sym);
  return true;
}

CublasApi LoadCublas() {
  CublasApi api;
  void* h = OpenFirst("TVM_OLLIE_CUBLAS_LIB", {"libcublas.so.13", "libcublas.so.12"}, &api.path,
                      &api.error);
  if (h == nullptr) {
    api.error = "cuBLAS not found (pip install nvidia-cublas, or tvm-ollie[cuda]): " + api.error;
    return api;
  }
  std::string& e = api.error;
  api.ok = Resolve(h, "cublasCreate_v2", &api.Create, &e) &&
           Resolve(h, "cublasSetStream_v2", &api.SetStream, &e) &&
           Resolve(h, "cublasSetMathMode", &api.SetMathMode, &e) &&
           Resolve(h, "cublasGetStatusString", &api.GetStatusString, &e) &&
           Resolve(h, "cublasSgemm_v2", &api.Sgemm, &e) &&
           Resolve(h, "cublasSgemmStridedBatched", &api.SgemmStridedBatched, &e);
  if (!api.ok) api.error = api.path + ": " + api.error;
  return api;
}

CudnnApi LoadCudnn() {
  CudnnApi api;
  void* h = OpenFirst("TVM_OLLIE_CUDNN_LIB", {"libcudnn.so.9"}, &api.path, &api.error);
  if (h == nullptr) {
    api.error = "cuDNN not found (pip install nvidia-cudnn-cu13, or tvm-ollie[cuda]): " +
                api.error;
    return api;
  }
  std::string& e = api.error;
  api.ok =
      Resolve(h, "cudnnGetVersion", &api.GetVersion, &e) &&
      Resolve(h, "cudnnGetErrorString", &api.GetErrorString, &e) &&
      Resolve(h, "cudnnCreate", &api.Create, &e) &&
      Resolve(h, "cudnnSetStream", &api.SetStream, &e) &&
      Resolve(h, "cudnnCreateTensorDescriptor", &api.CreateTensorDescriptor, &e) &&
      Resolve(h, "cudnnDestroyTensorDescriptor", &api.DestroyTensorDescriptor, &e) &&
      Resolve(h, "cudnnSetTensor4dDescriptor", &api.SetTensor4dDescriptor, &e) &&
      Resolve(h, "cudnnCreateFilterDescriptor", &api.CreateFilterDescriptor, &e) &&
      Resolve(h, "cudnnDestroyFilterDescriptor", &api.DestroyFilterDescriptor, &e) &&
      Resolve(h, "cudnnSetFilter4dDescriptor", &api.SetFilter4dDescriptor, &e) &&
      Resolve(h, "cudnnCreateConvolutionDescriptor", &api.CreateConvolutionDescriptor, &e) &&
      Resolve(h, "cudnnDestroyConvolutionDescriptor", &api.DestroyConvolutionDescriptor, &e) &&
      Resolve(h, "cudnnSetConvolution2dDescriptor", &api.SetConvolution2dDescriptor, &e) &&
      Resolve(h, "cudnnSetConvolutionGroupCount", &api.SetConvolutionGroupCount, &e) &&
      Resolve(h, "cudnnSetConvolutionMathType", &api.SetConvolutionMathType, &e) &&
      Resolve(h, "cudnnGetConvolution2dForwardOutputDim", &api.GetConvolution2dForwardOutputDim,
              &e) &&
      Resolve(h, "cudnnGetConvolutionForwardAlgorithm_v7",
              &api.GetConvolutionForwardAlgorithm_v7, &e) &&
      Resolve(h, "cudnnConvolutionForward", &api.ConvolutionForward, &e);
  std::string optional;  // (a missing Find leaves the heuristics: cuda_conv2d.cc)
  Resolve(h, "cudnnFindConvolutionForwardAlgorithm", &api.FindConvolutionForwardAlgorithm,
          &optional);
  if (!api.ok) api.error = api.path + ": " + api.error;
  return api;
}

}  // namespace

const CublasApi& Cublas() {
  static const CublasApi api = LoadCublas();  // C++11: initialized once, thread-safe
  return api;
}

const CudnnApi& Cudnn() {
  static const CudnnApi api = LoadCudnn();
  return api;
}

const CublasApi& RequireCublas(const char* kernel) {
  const CublasApi& api = Cublas();
  if (!api.ok) TVM_FFI_THROW(RuntimeError) << kernel << ": " << api.error;
  return api;
}

const CudnnApi& RequireCudnn(const char* kernel) {
  const CudnnApi& api = Cudnn();
  if (!api.ok) TVM_FFI_THROW(RuntimeError) << kernel << ": " << api.error;
  return api;
}

// ---------------------------------------------------------------------------------------------
void CheckCuda(cudaError_t err, const char* kernel, const char* what) {
  if (err == cudaSuccess) return;
  TVM_FFI_THROW(RuntimeError) << kernel << ": " << what << " failed: " << cudaGetErrorName(err)
                              << " (" << cudaGetErrorString(err) << ")";
}

void CheckCublas(cublasStatus_t st, const char* kernel, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  TVM_FFI_THROW(RuntimeError) << kernel << ": " << what << " failed: "
                              << Cublas().GetStatusString(st) << " (cublasStatus "
                              << static_cast<int>(st) << ")";
}

void CheckCudnn(cudnnStatus_t st, const char* kernel, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  TVM_FFI_THROW(RuntimeError) << kernel << ": " << what << " failed: "
                              << Cudnn().GetErrorString(st) << " (cudnnStatus "
                              << static_cast<int>(st) << ")";
}

// ---------------------------------------------------------------------------------------------
float* CheckCudaTensor(const ffi::TensorView& t, const char* kernel, const char* what,
                       int min_rank, int* device) {
  DLDataType dt = t.dtype();
  if (dt.code != kDLFloat || dt.bits != 32 || dt.lanes != 1) {
    TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be float32";
  }
  if (t.device().device_type != kDLCUDA) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must be on a CUDA device";
  }
  if (*device < 0) {
    *device = t.device().device_id;
  } else if (t.device().device_id != *device) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " is on cuda:" << t.device().device_id
                              << ", the other tensors on cuda:" << *device;
  }
  if (t.ndim() < min_rank) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must have rank >= " << min_rank
                              << ", got shape " << ShapeStr(t);
  }
  if (!t.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must be contiguous (row-major)";
  }
  if (t.data_ptr() == nullptr && t.numel() > 0) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " has no data";
  }
  return reinterpret_cast<float*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

DeviceScope::DeviceScope(int device, const char* kernel) {
  CheckCuda(cudaGetDevice(&previous_), kernel, "cudaGetDevice");
  if (previous_ != device) {
    CheckCuda(cudaSetDevice(device), kernel, "cudaSetDevice");
  } else {
    previous_ = -1;  // nothing to restore
  }
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

cudaStream_t CurrentStream(int device) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
}

cublasHandle_t CublasHandle(int device, cudaStream_t stream, const char* kernel) {
  const CublasApi& api = RequireCublas(kernel);
  thread_local std::map<int, cublasHandle_t> handles;
  cublasHandle_t& h = handles[device];
  if (h == nullptr) CheckCublas(api.Create(&h), kernel, "cublasCreate");
  CheckCublas(api.SetStream(h, stream), kernel, "cublasSetStream");
  return h;
}

cudnnHandle_t CudnnHandle(int device, cudaStream_t stream, const char* kernel) {
  const CudnnApi& api = RequireCudnn(kernel);
  thread_local std::map<int, cudnnHandle_t> handles;
  cudnnHandle_t& h = handles[device];
  if (h == nullptr) CheckCudnn(api.Create(&h), kernel, "cudnnCreate");
  CheckCudnn(api.SetStream(h, stream), kernel, "cudnnSetStream");
  return h;
}

StreamBuffer::StreamBuffer(size_t bytes, cudaStream_t stream, const char* kernel)
    : stream_(stream) {
  if (bytes > 0) CheckCuda(cudaMallocAsync(&ptr_, bytes, stream), kernel, "cudaMallocAsync");
}

StreamBuffer::~StreamBuffer() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
}

void ApplyEpilogue(const Activation& act, float* out, const float* bias, const float* res,
                   int64_t n, int64_t inner, int64_t channels, cudaStream_t stream,
                   const char* kernel) {
  if (bias == nullptr && res == nullptr && act.kind == Act::kNone) return;
  if (static_cast<int>(act.kind) > kEpiSilu) {  // the CPU library's newer activations
    TVM_FFI_THROW(ValueError) << kernel << ": activation '" << act.text
                              << "' is not implemented by the CUDA epilogue";
  }
  CheckCuda(LaunchEpilogue(out, bias, res, n, inner, channels, static_cast<int>(act.kind),
                           act.lo, act.hi, stream),
            kernel, "epilogue kernel launch");
}

// ---------------------------------------------------------------------------------------------
std::string RuntimeInfo() {
  std::ostringstream os;
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaError_t derr = cudaDriverGetVersion(&driver);
  cudaError_t cerr = cudaGetDeviceCount(&count);
  os << "cuda runtime: " << runtime / 1000 << "." << (runtime % 1000) / 10 << ", driver: ";
  if (derr == cudaSuccess && driver > 0) {
    os << driver / 1000 << "." << (driver % 1000) / 10;
  } else {
    os << "none";
  }
  os << ", devices: ";
  if (cerr == cudaSuccess) {
    os << count;
  } else {
    os << "0 (" << cudaGetErrorName(cerr) << ": " << cudaGetErrorString(cerr) << ")";
    cudaGetLastError();  // clear the sticky-free error state of the failed query
  }
  os << "\n";
  const CublasApi& cb = Cublas();
  os << "cublas: ";
  if (cb.ok) {
    os << "loaded from " << cb.path;
  } else {
    os << "unavailable (" << cb.error << ")";
  }
  os << "\ncudnn: ";
  const CudnnApi& dn = Cudnn();
  if (dn.ok) {
    os << dn.GetVersion() << " loaded from " << dn.path;
  } else {
    os << "unavailable (" << dn.error << ")";
  }
  return os.str();
}

}  // namespace cuda
}  // namespace tvm_ollie
