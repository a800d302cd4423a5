// The CUDA library's epilogue kernel (see cuda_epilogue.h): bias, residual and activation in
// one pass over the output, with the same formulas as the CPU library's ApplyActivation.
#include "cuda_epilogue.h"

namespace tvm_ollie {
namespace cuda {

namespace {

__device__ __forceinline__ float Activate(float v, int act, float lo, float hi) {
  switch (act) {
    case kEpiRelu:
      return v > 0.f ? v : 0.f;
    case kEpiClip:
      return v < lo ? lo : (v > hi ? hi : v);
    case kEpiSigmoid:
      return 1.f / (1.f + expf(-v));
    case kEpiTanh:
      return tanhf(v);
    case kEpiGelu:
      return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case kEpiGeluTanh:
      return 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case kEpiSilu:
      return v / (1.f + expf(-v));
    default:
      return v;
  }
}

__global__ void EpilogueKernel(float* __restrict__ out, const float* __restrict__ bias,
                               const float* __restrict__ res, int64_t n, int64_t inner,
                               int64_t channels, int act, float lo, float hi) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v = out[i];
    if (bias != nullptr) v += bias[(i / inner) % channels];
    if (res != nullptr) v += res[i];
    out[i] = Activate(v, act, lo, hi);
  }
}

}  // namespace

cudaError_t LaunchEpilogue(float* out, const float* bias, const float* res, int64_t n,
                           int64_t inner, int64_t channels, int act, float lo, float hi,
                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65536 ? blocks : 65536);  // grid-stride beyond
  EpilogueKernel<<<grid, kThreads, 0, stream>>>(out, bias, res, n, inner < 1 ? 1 : inner,
                                                channels < 1 ? 1 : channels, act, lo, hi);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace tvm_ollie
