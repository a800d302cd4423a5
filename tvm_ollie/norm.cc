// tvm_ollie.cpu.instance_norm: instance normalization with its affine and epilogue in one pass
// over each (n, c) plane, float32.
//
//   Out[n, c, s] = act(scale[c] * (X[n, c, s] - mean) / sqrt(var + eps) + bias[c] + res[n, c, s])
//   mean = (1/S) sum_s X[n, c, s],  var = (1/S) sum_s (X[n, c, s] - mean)^2   (biased)
//
// with s running over the spatial dims (everything after the channel axis, S of them).
//
// Calling convention (destination-passing style, Out last):
//   tvm_ollie.cpu.instance_norm(attrs: str, X [N, C, ...], [scale [C]], [bias [C]],
//                               [residual (X's shape)], Out (X's shape))
// attrs: eps=E (float >= 0, default 1e-5), scale=0|1, bias=0|1, res=0|1 (each operand present
//        when its key says so, in that order), act=... (the activations of conv2d/matmul).
//
// Why a kernel: TVM builds the ONNX importer's decomposition (mean, variance, sqrt, subtract,
// divide, multiply, add) as two kernels per norm, each a serial loop nest reading the tensor
// again (Candy's 9 norms: 18 kernels, 4x ONNX Runtime's InstanceNormalization + Relu nodes,
// docs/profiling.md). Here a plane is read twice while it sits in the cache (the shifted sums
// of x and x^2 in double, then the normalization), in the widest vectors the CPU has (AVX-512,
// AVX2 or the baseline, picked at load); planes run in parallel over the
// library's OpenMP threads above the serial threshold.
#include <omp.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kInstanceNorm = "tvm_ollie.cpu.instance_norm";

struct NormParams {
  float eps = 1e-5f;
  bool scale = false, bias = false, res = false;
  Activation act;
};

NormParams ParseNormAttrs(const std::string& text) {
  Attrs attrs(kInstanceNorm, text);
  NormParams p;
  if (attrs.Has("eps")) {
    std::string v = attrs.GetRaw("eps", "");
    if (!ParseFloat(v, &p.eps) || !(p.eps >= 0.f) || std::isinf(p.eps)) {
      TVM_FFI_THROW(ValueError) << kInstanceNorm << ": eps must be a finite float >= 0, got "
                                << v;
    }
  }
  p.scale = attrs.GetBool("scale", false);
  p.bias = attrs.GetBool("bias", false);
  p.res = attrs.GetBool("res", false);
  p.act = ParseActivation(attrs, attrs.GetRaw("act", "none"));
  attrs.CheckAllUsed();
  return p;
}

// Partial sums per lane: independent accumulators that the compiler keeps in vector registers
// (one accumulator per sum would make the loop wait on each add's latency).
constexpr int kLanes = 32;

// Mean and biased variance of `count` floats in one pass: sums of d and d^2 in double with
// d = x - x[0]. The shift keeps sum(d^2) - sum(d)^2 / count free of the cancellation that the
// unshifted one-pass formula suffers when |mean| >> std: x[0] is one of the values, so
// |mean - x[0]| is bounded by the data's range, not by |mean|.
inline __attribute__((always_inline)) void PlaneMoments(const float* x, int64_t count,
                                                        double* mean, double* var) {
  const double shift = x[0];
  double s1[kLanes] = {}, s2[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      const double d = static_cast<double>(x[i + j]) - shift;
      s1[j] += d;
      s2[j] += d * d;
    }
  }
  double t1 = 0.0, t2 = 0.0;
  for (; i < count; ++i) {
    const double d = static_cast<double>(x[i]) - shift;
    t1 += d;
    t2 += d * d;
  }
  for (int j = 0; j < kLanes; ++j) {
    t1 += s1[j];
    t2 += s2[j];
  }
  const double n = static_cast<double>(count), m = t1 / n;
  *mean = shift + m;
  *var = std::max(0.0, t2 / n - m * m);
}

// x86-64 with GCC or Clang: the function built for AVX-512, AVX2 and the baseline, the widest
// the CPU has chosen when the library loads; elsewhere as the compiler builds it.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OLLIE_WIDEST_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OLLIE_WIDEST_VECTORS
#endif

// One (n, c) plane of `count` floats, in the widest vectors (the library is compiled for the
// baseline x86-64, where the loops ran 4 floats at a time: ONNX Runtime's
// InstanceNormalization took half our time per call).
OLLIE_WIDEST_VECTORS
void NormalizePlane(const NormParams& p, const float* x, const float* r, float* out,
                    int64_t count, float scale, float bias) {
  double mean = 0.0, var = 0.0;
  PlaneMoments(x, count, &mean, &var);
  const float mul = static_cast<float>(scale / std::sqrt(var + static_cast<double>(p.eps)));
  const float m = static_cast<float>(mean);
  const bool relu = p.act.kind == Act::kRelu;  // the common case, applied in the same pass
  if (r != nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) {
      const float v = (x[i] - m) * mul + bias + r[i];
      out[i] = relu && v < 0.f ? 0.f : v;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) {
      const float v = (x[i] - m) * mul + bias;
      out[i] = relu && v < 0.f ? 0.f : v;
    }
  }
  if (!relu) ApplyActivation(p.act, out, count, false);
}

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kInstanceNorm << ": " << what
                                               << " must be a tensor";
  return t.value();
}

const float* ChannelVector(const ffi::TensorView& t, const char* what, int64_t channels) {
  const float* data = CheckFloatTensor(t, kInstanceNorm, what, 1);
  if (t.numel() != channels) {
    TVM_FFI_THROW(ValueError) << kInstanceNorm << ": " << what << " has shape " << ShapeStr(t)
                              << ", expected " << channels << " elements (one per channel)";
  }
  return data;
}

void RunInstanceNorm(ffi::PackedArgs args) {
  ThreadScope threads;
  std::optional<ffi::String> holder;
  const NormParams& p = ParsedAttrs<NormParams>(AttrsView(args, kInstanceNorm, &holder),
                                                ParseNormAttrs);
  const int expected = 3 + p.scale + p.bias + p.res;
  if (args.size() != expected) {
    TVM_FFI_THROW(TypeError) << kInstanceNorm << ": expected " << expected
                             << " arguments (attrs, X, [scale], [bias], [residual], Out), got "
                             << args.size();
  }
  ffi::TensorView X = TensorArg(args, 1, "X"), Out = TensorArg(args, expected - 1, "Out");
  const float* x = CheckFloatTensor(X, kInstanceNorm, "X", 3);
  float* out = CheckFloatTensor(Out, kInstanceNorm, "Out", 3);
  if (Dims(X) != Dims(Out)) {
    TVM_FFI_THROW(ValueError) << kInstanceNorm << ": Out has shape " << ShapeStr(Out)
                              << ", expected X's " << ShapeStr(X);
  }
  const int64_t channels = X.shape()[1];
  const int64_t planes = X.shape()[0] * channels;
  const int64_t count = planes == 0 ? 0 : X.numel() / planes;
  int at = 2;
  const float* scale = p.scale ? ChannelVector(TensorArg(args, at++, "scale"), "scale", channels)
                               : nullptr;
  const float* bias = p.bias ? ChannelVector(TensorArg(args, at++, "bias"), "bias", channels)
                             : nullptr;
  const float* res = nullptr;
  if (p.res) {
    ffi::TensorView R = TensorArg(args, at++, "residual");
    res = CheckFloatTensor(R, kInstanceNorm, "residual", 3);
    if (Dims(R) != Dims(X)) {
      TVM_FFI_THROW(ValueError) << kInstanceNorm << ": residual has shape " << ShapeStr(R)
                                << ", expected X's " << ShapeStr(X);
    }
  }
  if (X.numel() == 0) return;
  if (count == 0) return;
  threads.SerialBelow(8.0 * static_cast<double>(X.numel()));
  auto plane = [&](int64_t k) {
    const int64_t c = k % channels;
    NormalizePlane(p, x + k * count, res != nullptr ? res + k * count : nullptr,
                   out + k * count, count, scale != nullptr ? scale[c] : 1.f,
                   bias != nullptr ? bias[c] : 0.f);
  };
  if (planes == 1 || omp_get_max_threads() == 1) {
    for (int64_t k = 0; k < planes; ++k) plane(k);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < planes; ++k) plane(k);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kInstanceNorm,
                               [](ffi::PackedArgs args, ffi::Any*) { RunInstanceNorm(args); });
}

}  // namespace tvm_ollie
