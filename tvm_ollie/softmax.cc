// Softmax over the last axis as one native call (tvm_ollie.cpu.softmax).
//
// TVM builds an untuned softmax as loop nests over the whole tensor, each row's max, sum and
// division in turn, one thread: at paper-size Segformer its eight softmaxes took 40 ms against
// ONNX Runtime's 3.4 ms (docs/benchmarks.md). Here each row is one pass for the max, one for the
// exponentials and their sum (written to the output), one to scale: the row in the cache, rows
// in parallel. Equation, per row x of length n:
//
//   out[j] = exp(x[j] - max(x)) / sum_k exp(x[k] - max(x))
//
// the sum accumulated in double, exp by a vectorizable polynomial (ExpNonPositive). A row of
// -inf everywhere gives NaN, as the formula (and TVM's kernel) does.
//
// Signature: softmax(X, Out), X and Out float32, contiguous, the same shape, rank >= 1.
#include <omp.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kSoftmax = "tvm_ollie.cpu.softmax";

// exp(x) for x <= 0 (every row is shifted by its max), in a form the compiler vectorizes:
// 2^t with t = x log2(e) split into round(t) and r in [-1/2, 1/2], 2^r by its Taylor polynomial
// of degree 7 (relative error below 1e-8 on that range, under float32's rounding), the integer
// part added to the exponent bits. Below -87 (exp < 2^-126, float32's smallest normal) it is 0;
// a NaN stays NaN (a row of -inf: -inf - -inf).
// Built for the widest vectors the CPU has, chosen when the library loads (as lstm.cc, norm.cc):
// with the baseline x86-64 vectors alone the row loop took 4.35 ns an element, with AVX-512
// 0.62 (a standalone build of SoftmaxRow, 16384 rows of 256, one thread).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OLLIE_SOFTMAX_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OLLIE_SOFTMAX_VECTORS
#endif

inline float ExpNonPositive(float x) {
  const float t = std::max(x, -87.0f) * 1.44269504088896341f;
  // round to nearest by the 1.5 * 2^23 shift (|t| <= 126): plain arithmetic, no libm call
  const float k = (t + 12582912.0f) - 12582912.0f;
  const float r = (t - k) * 0.693147180559945309f;  // 2^(t - k) = e^r
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof(bits));
  bits += static_cast<int32_t>(k) * (1 << 23);
  std::memcpy(&p, &bits, sizeof(bits));
  return x < -87.0f ? 0.0f : p;
}

OLLIE_SOFTMAX_VECTORS void SoftmaxRow(const float* x, float* out, int64_t n) {
  float top = x[0];
#pragma omp simd reduction(max : top)
  for (int64_t j = 1; j < n; ++j) top = x[j] > top ? x[j] : top;
  // float partial sums of 64 elements, added in double: vector lanes, no float-to-double
  // conversion per element
  double sum = 0.0;
  for (int64_t lo = 0; lo < n; lo += 64) {
    const int64_t hi = std::min<int64_t>(n, lo + 64);
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int64_t j = lo; j < hi; ++j) {
      const float e = ExpNonPositive(x[j] - top);
      out[j] = e;
      part += e;
    }
    sum += part;
  }
  const float scale = static_cast<float>(1.0 / sum);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] *= scale;
}

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kSoftmax << ": " << what << " must be a tensor";
  return t.value();
}

void RunSoftmax(ffi::PackedArgs args) {
  ThreadScope threads;
  if (args.size() != 2) {
    TVM_FFI_THROW(TypeError) << kSoftmax << ": expected 2 arguments (X, Out), got "
                             << args.size();
  }
  ffi::TensorView X = TensorArg(args, 0, "X"), Out = TensorArg(args, 1, "Out");
  const float* x = CheckFloatTensor(X, kSoftmax, "X", 1);
  float* out = CheckFloatTensor(Out, kSoftmax, "Out", 1);
  if (Dims(X) != Dims(Out)) {
    TVM_FFI_THROW(ValueError) << kSoftmax << ": Out has shape " << ShapeStr(Out)
                              << ", expected X's " << ShapeStr(X);
  }
  const int64_t n = X.shape()[X.ndim() - 1];
  if (X.numel() == 0 || n == 0) return;
  const int64_t rows = X.numel() / n;
  // about 5 operations an element (max, subtract, exp counted as one, add, scale)
  threads.SerialBelow(5.0 * static_cast<double>(X.numel()));
  if (rows == 1 || omp_get_max_threads() == 1) {
    for (int64_t r = 0; r < rows; ++r) SoftmaxRow(x + r * n, out + r * n, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) SoftmaxRow(x + r * n, out + r * n, n);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kSoftmax, [](ffi::PackedArgs args, ffi::Any*) { RunSoftmax(args); });
}

}  // namespace tvm_ollie
