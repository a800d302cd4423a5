// Shared helpers of the tvm-ollie CUDA library (libtvm_ollie_cuda): cuBLAS and cuDNN loaded at run
// time, error checks, tensor checks, the device and stream of a call, per-thread handles,
// stream-ordered scratch memory and the epilogue.
//
// cuBLAS and cuDNN are dlopen-ed on first use (libcublas.so.13 / .12, libcudnn.so.9; or the
// paths in $TVM_OLLIE_CUBLAS_LIB / $TVM_OLLIE_CUDNN_LIB): the library builds and loads without
// them, and a kernel that needs a missing one raises with the reason. The CUDA runtime
// (libcudart.so.13) is linked: TVM's own CUDA runtime links the same library, so a process that
// runs CUDA modules has it, and sharing it shares the device contexts and streams.
#ifndef TVM_OLLIE_CUDA_COMMON_H_
#define TVM_OLLIE_CUDA_COMMON_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <string>

#include "attrs.h"
#include "cuda_vendor.h"

namespace tvm_ollie {
namespace cuda {

// The entry points of a dlopen-ed vendor library; `ok` is false with `error` saying why.
struct CublasApi {
  bool ok = false;
  std::string error, path;
  decltype(&cublasCreate_v2) Create = nullptr;
  decltype(&cublasSetStream_v2) SetStream = nullptr;
  decltype(&cublasSetMathMode) SetMathMode = nullptr;
  decltype(&cublasGetStatusString) GetStatusString = nullptr;
  decltype(&cublasSgemm_v2) Sgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched = nullptr;
};

struct CudnnApi {
  bool ok = false;
  std::string error, path;
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnCreateTensorDescriptor) CreateTensorDescriptor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) DestroyTensorDescriptor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) SetTensor4dDescriptor = nullptr;
  decltype(&cudnnCreateFilterDescriptor) CreateFilterDescriptor = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) DestroyFilterDescriptor = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) SetFilter4dDescriptor = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) CreateConvolutionDescriptor = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) DestroyConvolutionDescriptor = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) SetConvolution2dDescriptor = nullptr;
  decltype(&cudnnSetConvolutionGroupCount) SetConvolutionGroupCount = nullptr;
  decltype(&cudnnSetConvolutionMathType) SetConvolutionMathType = nullptr;
  decltype(&cudnnGetConvolution2dForwardOutputDim) GetConvolution2dForwardOutputDim = nullptr;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) GetConvolutionForwardAlgorithm_v7 = nullptr;
  decltype(&cudnnConvolutionForward) ConvolutionForward = nullptr;
  // Optional (null when the library lacks it): algorithms timed on the device, fastest first.
  decltype(&cudnnFindConvolutionForwardAlgorithm) FindConvolutionForwardAlgorithm = nullptr;
};

// Loaded once per process (thread-safe); never unloaded.
const CublasApi& Cublas();
const CudnnApi& Cudnn();
// The API, or a RuntimeError naming `kernel` and the reason it did not load.
const CublasApi& RequireCublas(const char* kernel);
const CudnnApi& RequireCudnn(const char* kernel);

// Errors: RuntimeError naming the kernel, the step and the library's message.
void CheckCuda(cudaError_t err, const char* kernel, const char* what);
void CheckCublas(cublasStatus_t st, const char* kernel, const char* what);
void CheckCudnn(cudnnStatus_t st, const char* kernel, const char* what);

// Checks float32, a CUDA device, row-major contiguous, rank >= min_rank; returns the device
// pointer (byte_offset applied). `device` is set to the tensor's device id on the first tensor
// and every later tensor must be on the same device.
float* CheckCudaTensor(const tvm::ffi::TensorView& t, const char* kernel, const char* what,
                       int min_rank, int* device);

// Makes `device` current for the scope of a call and restores the caller's device.
class DeviceScope {
 public:
  DeviceScope(int device, const char* kernel);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// The stream TVM runs `device`'s kernels on (TVMFFIEnvGetStream; null = the default stream), so
// that the library's work is ordered with the module's other kernels.
cudaStream_t CurrentStream(int device);

// Per-thread, per-device handles bound to `stream` (created on first use, never destroyed: they
// live as long as the thread, and destroying them at exit races with the CUDA runtime's own
// teardown).
cublasHandle_t CublasHandle(int device, cudaStream_t stream, const char* kernel);
cudnnHandle_t CudnnHandle(int device, cudaStream_t stream, const char* kernel);

// Stream-ordered device scratch memory (cudaMallocAsync / cudaFreeAsync on the call's stream).
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, cudaStream_t stream, const char* kernel);
  ~StreamBuffer();
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// out = act(out + bias[(i / inner) % channels] + res) on the device; nothing when there is
// nothing to do (no bias, no residual, no activation).
void ApplyEpilogue(const Activation& act, float* out, const float* bias, const float* res,
                   int64_t n, int64_t inner, int64_t channels, cudaStream_t stream,
                   const char* kernel);

// One line each: CUDA runtime and device count, cuBLAS, cuDNN (versions or why not loaded).
std::string RuntimeInfo();

}  // namespace cuda
}  // namespace tvm_ollie

#endif  // TVM_OLLIE_CUDA_COMMON_H_
