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
// the sum accumulated in double (float partial sums of a block), exp by a polynomial on
// vectors. A row of -inf everywhere gives NaN, as the formula (and TVM's kernel) does.
//
// Three row implementations, the widest the CPU runs chosen once (Available(), vectors.h):
//   avx512f   the portable row (PortableRow) compiled for AVX-512: the compiler vectorizes it
//             (0.62 ns an element, one thread, 16384 rows of 256, on the AVX-512 Xeon);
//   avx2      AVX2 + FMA intrinsics (Avx2Row). The portable row compiled for AVX2 was not
//             vectorized by GCC 12 (its exp loop stayed scalar, a branch per element): 5.2 ns an
//             element on the AVX2-only EPYC, against 0.69-0.80 for this one (docs/profiling.md);
//   baseline  the portable row for the x86-64 baseline (or any other CPU).
// tvm_ollie.cpu.softmax_vectors lists the ones this CPU runs (best first), and
// tvm_ollie.cpu.softmax_with_vectors runs a named one (tests check each against numpy).
//
// Signatures: softmax(X, Out), X and Out float32, contiguous, the same shape, rank >= 1;
// softmax_with_vectors(vectors, X, Out); softmax_vectors() -> "avx2,baseline" (say).
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

constexpr const char* kSoftmax = "tvm_ollie.cpu.softmax";
constexpr const char* kWithVectors = "tvm_ollie.cpu.softmax_with_vectors";

using RowFn = void (*)(const float* x, float* out, int64_t n);

// ---------------------------------------------------------------------------------------------
// The portable row: plain loops the compiler vectorizes (always inlined into a function compiled
// for the target's vectors).

inline __attribute__((always_inline)) void PortableRow(const float* x, float* out, int64_t n) {
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

void BaselineRow(const float* x, float* out, int64_t n) { PortableRow(x, out, n); }

#if OLLIE_X86_VECTORS
__attribute__((target("avx512f"))) void Avx512Row(const float* x, float* out, int64_t n) {
  PortableRow(x, out, n);
}

// ---------------------------------------------------------------------------------------------
// The AVX2 + FMA row.

OLLIE_AVX2 float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// The sum of a float vector's lanes, added to two double vectors.
OLLIE_AVX2 void AddToDouble(__m256 v, __m256d* lo, __m256d* hi) {
  *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

OLLIE_AVX2 float RowMax(const float* x, int64_t n) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 m0 = neg_inf, m1 = neg_inf, m2 = neg_inf, m3 = neg_inf;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + j + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + j + 24));
  }
  for (; j + 8 <= n; j += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
  if (j < n) {
    const __m256i mask = FirstLanes(n - j);
    const __m256 v = _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + j, mask),
                                      _mm256_castsi256_ps(mask));
    m1 = _mm256_max_ps(m1, v);
  }
  return HorizontalMax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

__attribute__((target("avx2,fma"))) void Avx2Row(const float* x, float* out, int64_t n) {
  const __m256 top = _mm256_set1_ps(RowMax(x, n));
  // Exponentials written to out; their sum in float lanes over a block of 256 elements, the
  // blocks added in double.
  constexpr int64_t kBlock = 256;
  __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
  int64_t j = 0;
  while (j < n) {
    const int64_t block_end = std::min(n, j + kBlock);
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; j + 16 <= block_end; j += 16) {
      const __m256 e0 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), top));
      const __m256 e1 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), top));
      _mm256_storeu_ps(out + j, e0);
      _mm256_storeu_ps(out + j + 8, e1);
      s0 = _mm256_add_ps(s0, e0);
      s1 = _mm256_add_ps(s1, e1);
    }
    for (; j + 8 <= block_end; j += 8) {
      const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), top));
      _mm256_storeu_ps(out + j, e);
      s0 = _mm256_add_ps(s0, e);
    }
    if (j < block_end) {  // the row's last, partial vector
      const __m256i mask = FirstLanes(block_end - j);
      const __m256 e = _mm256_and_ps(
          Exp8(_mm256_sub_ps(_mm256_maskload_ps(x + j, mask), top)), _mm256_castsi256_ps(mask));
      _mm256_maskstore_ps(out + j, mask, e);
      s1 = _mm256_add_ps(s1, e);
      j = block_end;
    }
    AddToDouble(_mm256_add_ps(s0, s1), &sum_lo, &sum_hi);
  }
  __m256d s = _mm256_add_pd(sum_lo, sum_hi);
  __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  h = _mm_add_sd(h, _mm_unpackhi_pd(h, h));
  const __m256 scale = _mm256_set1_ps(static_cast<float>(1.0 / _mm_cvtsd_f64(h)));
  j = 0;
  for (; j + 32 <= n; j += 32) {
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(out + j), scale));
    _mm256_storeu_ps(out + j + 8, _mm256_mul_ps(_mm256_loadu_ps(out + j + 8), scale));
    _mm256_storeu_ps(out + j + 16, _mm256_mul_ps(_mm256_loadu_ps(out + j + 16), scale));
    _mm256_storeu_ps(out + j + 24, _mm256_mul_ps(_mm256_loadu_ps(out + j + 24), scale));
  }
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(out + j), scale));
  }
  if (j < n) {
    const __m256i mask = FirstLanes(n - j);
    _mm256_maskstore_ps(out + j, mask, _mm256_mul_ps(_mm256_maskload_ps(out + j, mask), scale));
  }
}
#endif  // OLLIE_X86_VECTORS

// ---------------------------------------------------------------------------------------------
// Choosing the row.

// The row implementations this CPU runs, best first.
const std::vector<Vectors<RowFn>>& Available() {
  static const std::vector<Vectors<RowFn>> rows = []() {
    std::vector<Vectors<RowFn>> v;
#if OLLIE_X86_VECTORS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) v.push_back({"avx512f", &Avx512Row});
    if (CpuRunsAvx2()) v.push_back({"avx2", &Avx2Row});
#endif
    v.push_back({"baseline", &BaselineRow});
    return v;
  }();
  return rows;
}

RowFn Named(const std::string& name) {
  return RequireVectors(Available(), name, kWithVectors, ", ");
}

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kSoftmax << ": " << what << " must be a tensor";
  return t.value();
}

// softmax(X, Out) with the row `row`; args[first], args[first + 1] are X and Out.
void RunSoftmax(ffi::PackedArgs args, int first, RowFn row) {
  ThreadScope threads;
  if (args.size() != first + 2) {
    TVM_FFI_THROW(TypeError) << kSoftmax << ": expected " << first + 2 << " arguments ("
                             << (first ? "vectors, " : "") << "X, Out), got " << args.size();
  }
  ffi::TensorView X = TensorArg(args, first, "X"), Out = TensorArg(args, first + 1, "Out");
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
    for (int64_t r = 0; r < rows; ++r) row(x + r * n, out + r * n, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) row(x + r * n, out + r * n, n);
}


}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kSoftmax,
                  [](ffi::PackedArgs args, ffi::Any*) {
                    static const RowFn best = Available().front().fn;
                    RunSoftmax(args, 0, best);
                  })
      .def_packed(kWithVectors,
                  [](ffi::PackedArgs args, ffi::Any*) {
                    if (args.size() < 1) {
                      TVM_FFI_THROW(TypeError) << kWithVectors << ": expected (vectors, X, Out)";
                    }
                    auto name = args[0].try_cast<std::string>();
                    if (!name.has_value()) {
                      TVM_FFI_THROW(TypeError) << kWithVectors << ": vectors must be a string";
                    }
                    RunSoftmax(args, 1, Named(name.value()));
                  })
      .def("tvm_ollie.cpu.softmax_vectors",
           []() -> std::string { return VectorsNames(Available(), ","); });
}

}  // namespace tvm_ollie
