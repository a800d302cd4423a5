// The epilogue of the CUDA kernels, one elementwise pass on the device:
//   out[i] = act(out[i] + bias[(i / inner) % channels] + res[i])
// (bias and res optional). Compiled by nvcc (cuda_epilogue.cu); plain C++ interface.
#ifndef TVM_OLLIE_CUDA_EPILOGUE_H_
#define TVM_OLLIE_CUDA_EPILOGUE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tvm_ollie {
namespace cuda {

// Activation codes: the values of tvm_ollie::Act (attrs.h), checked in cuda_common.cc.
enum EpilogueAct : int {
  kEpiNone = 0,
  kEpiRelu = 1,
  kEpiClip = 2,
  kEpiSigmoid = 3,
  kEpiTanh = 4,
  kEpiGelu = 5,
  kEpiGeluTanh = 6,
  kEpiSilu = 7,
};

// Launches the epilogue over n floats on `stream`; bias and res may be null. `inner` is the
// number of consecutive elements sharing a bias value (1 for a matmul or an NHWC convolution,
// OH * OW for NCHW) and `channels` the bias length. Returns the launch status.
cudaError_t LaunchEpilogue(float* out, const float* bias, const float* res, int64_t n,
                           int64_t inner, int64_t channels, int act, float lo, float hi,
                           cudaStream_t stream);

}  // namespace cuda
}  // namespace tvm_ollie

#endif  // TVM_OLLIE_CUDA_EPILOGUE_H_
