// Activations over contiguous floats, in place (ApplyActivation, common.h): the epilogue of the
// kernels whose library gives none (the GEMM deconvolution, the OpenBLAS and matrix-vector
// matmuls, the norms).
//
// Until 2026-12-05 this was one loop with a switch on the kind per element, and tanh, sigmoid,
// SiLU and GELU called libm per element; the GEMM deconvolution sent the exp/tanh kinds to
// oneDNN's eltwise primitive instead. Neither was vectorized where it mattered: on the AVX2-only
// EPYC, DCGAN quick's last deconvolution (3x64x64 outputs) took 31 us bare, 71 with oneDNN's
// tanh (its AVX2 tanh gathers table coefficients) and 52 with the loop's relu
// (docs/profiling.md, "gap15"). Here each kind is its own loop:
//
//   relu, clip, leaky_relu, hardswish, hardsigmoid, scale   selects and products;
//   sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) otherwise, e = exp(-|x|);
//   silu(x)    = x * sigmoid(x);
//   tanh(x)    = sign(x) * (1 - e) / (1 + e), e = exp(-2|x|), for |x| >= 1/8; below, the odd
//                Taylor polynomial to x^9 (the quotient would cancel: relative error ~1e-11);
//   gelu_tanh  = x / 2 * (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2 / pi) * (x + 0.044715 x^3)
//                (the sigmoid does not cancel where tanh(u) is near -1);
//   gelu (erf) = x / 2 * (1 + erf(x / sqrt(2))), erf from libm per element (not vectorized).
//
// with exp(-|x|) by the polynomial of vectors.h (ExpNonPositive / Exp8). NaN stays NaN;
// tanh(+-inf) = +-1, sigmoid(-inf) = 0.
//
// Two implementations, the widest the CPU runs chosen once (vectors.h):
//   avx2      AVX2 + FMA intrinsics for the exp kinds, the portable loops compiled for AVX2 for
//             the others (which GCC vectorizes: selects and products);
//   baseline  the portable loops for the x86-64 baseline (or any other CPU).
// tvm_ollie.cpu.activation_vectors lists them (best first), and
// tvm_ollie.cpu.activation_with_vectors(vectors, act, X, Out) runs a named one on Out = act(X)
// (tests check each against numpy).
#include <omp.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "vectors.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kWithVectors = "tvm_ollie.cpu.activation_with_vectors";

using ActFn = void (*)(const Activation& act, float* x, int64_t n);

constexpr float kTanhSmall = 0.125f;  // below: tanh by its polynomial
constexpr float kGeluTanhScale = 0.79788456080286536f;  // sqrt(2 / pi)
constexpr float kGeluTanhCubic = 0.044715f;

// ---------------------------------------------------------------------------------------------
// The portable loops (always inlined into a function compiled for the target's vectors).

inline __attribute__((always_inline)) float SigmoidPortable(float v) {
  const float e = ExpNonPositive(-std::fabs(v));
  const float r = 1.0f / (1.0f + e);
  return v >= 0.0f ? r : e * r;
}

inline __attribute__((always_inline)) float TanhPortable(float v) {
  const float a = std::fabs(v);
  const float e = ExpNonPositive(-2.0f * a);
  const float big = (1.0f - e) / (1.0f + e);
  const float a2 = a * a;
  float p = 62.0f / 2835.0f;
  p = p * a2 - 17.0f / 315.0f;
  p = p * a2 + 2.0f / 15.0f;
  p = p * a2 - 1.0f / 3.0f;
  const float small = a + a * a2 * p;
  return std::copysign(a < kTanhSmall ? small : big, v);
}

inline __attribute__((always_inline)) void PortableLoops(const Activation& act, float* x,
                                                        int64_t n) {
  const float lo = act.lo, hi = act.hi, alpha = act.alpha, beta = act.beta;
  switch (act.kind) {
    case Act::kNone:
      return;
    case Act::kRelu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
      return;
    case Act::kClip:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
      return;
    case Act::kLeakyRelu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : alpha * x[i];
      return;
    case Act::kHardswish:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        x[i] = x[i] * std::min(1.f, std::max(0.f, alpha * x[i] + beta));
      }
      return;
    case Act::kHardsigmoid:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = std::min(1.f, std::max(0.f, alpha * x[i] + beta));
      return;
    case Act::kScale:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = alpha * x[i];
      return;
    case Act::kSigmoid:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = SigmoidPortable(x[i]);
      return;
    case Act::kSilu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] * SigmoidPortable(x[i]);
      return;
    case Act::kTanh:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) x[i] = TanhPortable(x[i]);
      return;
    case Act::kGeluTanh:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        x[i] = v * SigmoidPortable(2.0f * kGeluTanhScale * (v + kGeluTanhCubic * v * v * v));
      }
      return;
    case Act::kGelu:
      for (int64_t i = 0; i < n; ++i) {
        x[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * 0.70710678118654752f));
      }
      return;
  }
}

void BaselineLoops(const Activation& act, float* x, int64_t n) { PortableLoops(act, x, n); }

#if OLLIE_X86_VECTORS
// ---------------------------------------------------------------------------------------------
// The AVX2 + FMA loops.

OLLIE_AVX2 __m256 Abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

OLLIE_AVX2 __m256 Sigmoid8(__m256 v) {
  const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), Abs8(v)));
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 negative = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(r, _mm256_mul_ps(e, r), negative);
}

OLLIE_AVX2 __m256 Tanh8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 a = Abs8(v);
  const __m256 e = Exp8(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
  const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  const __m256 a2 = _mm256_mul_ps(a, a);
  __m256 p = _mm256_set1_ps(62.0f / 2835.0f);
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-17.0f / 315.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3.0f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(a, a2), p, a);
  const __m256 t =
      _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(kTanhSmall), _CMP_LT_OQ));
  return _mm256_or_ps(t, _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));  // v's sign
}

OLLIE_AVX2 __m256 GeluTanh8(__m256 v) {
  const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
  const __m256 u2 = _mm256_mul_ps(_mm256_set1_ps(2.0f * kGeluTanhScale),
                                  _mm256_fmadd_ps(cube, _mm256_set1_ps(kGeluTanhCubic), v));
  return _mm256_mul_ps(v, Sigmoid8(u2));
}

// f over x[0, n) in place, 8 lanes a step, the last vector masked.
template <typename F>
OLLIE_AVX2 void Map8(float* x, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_ps(x + i, f(_mm256_loadu_ps(x + i)));
    _mm256_storeu_ps(x + i + 8, f(_mm256_loadu_ps(x + i + 8)));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i mask = FirstLanes(n - i);
    _mm256_maskstore_ps(x + i, mask, f(_mm256_maskload_ps(x + i, mask)));
  }
}

struct SigmoidOp {
  OLLIE_AVX2 __m256 operator()(__m256 v) const { return Sigmoid8(v); }
};
struct SiluOp {
  OLLIE_AVX2 __m256 operator()(__m256 v) const { return _mm256_mul_ps(v, Sigmoid8(v)); }
};
struct TanhOp {
  OLLIE_AVX2 __m256 operator()(__m256 v) const { return Tanh8(v); }
};
struct GeluTanhOp {
  OLLIE_AVX2 __m256 operator()(__m256 v) const { return GeluTanh8(v); }
};

__attribute__((target("avx2,fma"))) void Avx2Loops(const Activation& act, float* x, int64_t n) {
  switch (act.kind) {
    case Act::kSigmoid:
      return Map8(x, n, SigmoidOp());
    case Act::kSilu:
      return Map8(x, n, SiluOp());
    case Act::kTanh:
      return Map8(x, n, TanhOp());
    case Act::kGeluTanh:
      return Map8(x, n, GeluTanhOp());
    default:
      return PortableLoops(act, x, n);
  }
}
#endif  // OLLIE_X86_VECTORS

// ---------------------------------------------------------------------------------------------
// Choosing the loops.

// The implementations this CPU runs, best first.
const std::vector<Vectors<ActFn>>& Available() {
  static const std::vector<Vectors<ActFn>> loops = []() {
    std::vector<Vectors<ActFn>> v;
#if OLLIE_X86_VECTORS
    if (CpuRunsAvx2()) v.push_back({"avx2", &Avx2Loops});
#endif
    v.push_back({"baseline", &BaselineLoops});
    return v;
  }();
  return loops;
}

void Apply(ActFn loops, const Activation& act, float* x, int64_t n, bool parallel) {
  constexpr int64_t kParallelFrom = 32768;  // elements; smaller ranges stay on the caller
  if (act.kind == Act::kNone || n <= 0) return;
  if (!parallel || n <= kParallelFrom || omp_get_max_threads() == 1) {
    loops(act, x, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t team = omp_get_num_threads(), i = omp_get_thread_num();
    // ranges of whole 8-lane vectors but the last
    const int64_t vectors = (n + 7) / 8;
    const int64_t b = std::min(n, vectors * i / team * 8);
    const int64_t e = std::min(n, vectors * (i + 1) / team * 8);
    if (e > b) loops(act, x + b, e - b);
  }
}

// activation_with_vectors(vectors, act, X, Out): Out = act(X) by the implementation `vectors`.
void WithVectors(ffi::PackedArgs args, ffi::Any*) {
  ThreadScope threads;
  if (args.size() != 4) {
    TVM_FFI_THROW(TypeError) << kWithVectors << ": expected 4 arguments (vectors, act, X, Out), "
                             << "got " << args.size();
  }
  auto name = args[0].try_cast<std::string>();
  auto text = args[1].try_cast<std::string>();
  auto X = args[2].try_cast<ffi::TensorView>();
  auto Out = args[3].try_cast<ffi::TensorView>();
  if (!name || !text || !X || !Out) {
    TVM_FFI_THROW(TypeError) << kWithVectors << ": expected (str vectors, str act, X, Out)";
  }
  const ActFn loops = RequireVectors(Available(), name.value(), kWithVectors, ", ");
  Attrs attrs(kWithVectors, "");
  const Activation act = ParseActivation(attrs, text.value());
  const float* x = CheckFloatTensor(X.value(), kWithVectors, "X", 0);
  float* out = CheckFloatTensor(Out.value(), kWithVectors, "Out", 0);
  if (Dims(X.value()) != Dims(Out.value())) {
    TVM_FFI_THROW(ValueError) << kWithVectors << ": Out has shape " << ShapeStr(Out.value())
                              << ", expected X's " << ShapeStr(X.value());
  }
  const int64_t n = X.value().numel();
  if (out != x) std::memmove(out, x, sizeof(float) * n);
  Apply(loops, act, out, n, true);
}

}  // namespace

void ApplyActivation(const Activation& act, float* x, int64_t n, bool parallel) {
  static const ActFn best = Available().front().fn;
  Apply(best, act, x, n, parallel);
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kWithVectors, WithVectors)
      .def("tvm_ollie.cpu.activation_vectors",
           []() -> std::string { return VectorsNames(Available(), ","); });
}

}  // namespace tvm_ollie
