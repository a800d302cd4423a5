// Matrix-vector products: tvm_ollie.cpu.matmul's calls with M == 1 or N == 1 (gemv.h).
//
// Why not OpenBLAS's sgemm: scipy-openblas32 0.3.34 (Haswell kernels, the AVX2 EPYC) runs an
// sgemm with M == 1 through its GEMM path, packing B on every call: 1x256x320 took 26-27 us
// against 5.7 us for its own sgemv, 5.9-8.2 us for oneDNN's matmul and 5.8 us for these loops
// (one thread; EfficientViT's head, docs/profiling.md). OpenBLAS's sgemv would run two of its
// own pthreads above 9216 elements, beside the OpenMP workers that every other kernel uses;
// these loops run on the calling thread. Equation, W K x n (gemv.h's two storage forms):
//
//   y[j] = (accumulate ? y[j] : 0) + sum_k x[k] * W(k, j)
//
// Two implementations, the widest the CPU runs chosen once:
//   avx2      AVX2 + FMA intrinsics: W stored as K rows, up to eight 8-lane accumulators across
//             a block of up to 64 outputs (the last vector masked) while the rows stream past;
//             W stored as n rows, four accumulators along each row, summed across lanes;
//   baseline  plain loops (the x86-64 baseline, or any other CPU).
// tvm_ollie.cpu.gemv_vectors lists the ones this CPU runs (best first), and
// tvm_ollie.cpu.gemv_with_vectors runs a named one (tests check each against numpy).
//
// Signatures: gemv_with_vectors(vectors, x, W, y, form, accumulate): x [K], W [K, n] with
// form="rows" or [n, K] with form="columns", y [n], float32 and contiguous; gemv_vectors() ->
// "avx2,baseline" (say).
#include "gemv.h"

#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common.h"
#include "vectors.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kWithVectors = "tvm_ollie.cpu.gemv_with_vectors";

void BaselineGemv(const float* x, const float* w, int64_t K, int64_t n, int64_t ld,
                  GemvForm form, bool accumulate, float* y) {
  if (form == GemvForm::kRows) {
    if (!accumulate) {
      for (int64_t j = 0; j < n; ++j) y[j] = 0.f;
    }
    for (int64_t k = 0; k < K; ++k) {
      const float xk = x[k];
      const float* row = w + k * ld;
      for (int64_t j = 0; j < n; ++j) y[j] += xk * row[j];
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float* row = w + j * ld;
    float s = 0.f;
    for (int64_t k = 0; k < K; ++k) s += x[k] * row[k];
    y[j] = accumulate ? y[j] + s : s;
  }
}

#if OLLIE_X86_VECTORS
OLLIE_AVX2 float LaneSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Vector v of a block of V vectors from p, the last one masked.
template <int V>
OLLIE_AVX2 __m256 Part(const float* p, int v, __m256i last) {
  return v + 1 < V ? _mm256_loadu_ps(p + 8 * v) : _mm256_maskload_ps(p + 8 * v, last);
}

// W stored as K rows: the outputs y[0, width) (0 < width <= 64) in V = ceil(width / 8)
// accumulators while the rows stream past; the last vector masked. Fewer than five vectors take
// two rows a step into two sets of accumulators, so that enough FMAs are in flight.
template <int V>
OLLIE_AVX2 void Avx2RowsBlock(const float* x, const float* w, int64_t K, int64_t ld,
                              int64_t width, bool accumulate, float* y) {
  const __m256i last = FirstLanes(width - 8 * (V - 1));
  __m256 acc[V], odd[V];
  for (int v = 0; v < V; ++v) {
    odd[v] = _mm256_setzero_ps();
    acc[v] = !accumulate    ? _mm256_setzero_ps()
             : v + 1 < V ? _mm256_loadu_ps(y + 8 * v)
                         : _mm256_maskload_ps(y + 8 * v, last);
  }
  int64_t k = 0;
  if (V <= 4) {
    for (; k + 2 <= K; k += 2) {
      const __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[k + 1]);
      const float* r0 = w + k * ld;
      for (int v = 0; v < V; ++v) {
        acc[v] = _mm256_fmadd_ps(x0, Part<V>(r0, v, last), acc[v]);
        odd[v] = _mm256_fmadd_ps(x1, Part<V>(r0 + ld, v, last), odd[v]);
      }
    }
  }
  for (; k < K; ++k) {
    const __m256 xk = _mm256_set1_ps(x[k]);
    for (int v = 0; v < V; ++v) acc[v] = _mm256_fmadd_ps(xk, Part<V>(w + k * ld, v, last), acc[v]);
  }
  for (int v = 0; v < V; ++v) {
    const __m256 sum = V <= 4 ? _mm256_add_ps(acc[v], odd[v]) : acc[v];
    if (v + 1 < V) {
      _mm256_storeu_ps(y + 8 * v, sum);
    } else {
      _mm256_maskstore_ps(y + 8 * v, last, sum);
    }
  }
}

// The outputs [j, j + width) of the rows form, 0 < width <= 64.
__attribute__((target("avx2,fma"))) void Avx2RowsColumns(const float* x, const float* w,
                                                         int64_t K, int64_t ld, int64_t width,
                                                         bool accumulate, float* y) {
  switch ((width + 7) / 8) {
    case 1: return Avx2RowsBlock<1>(x, w, K, ld, width, accumulate, y);
    case 2: return Avx2RowsBlock<2>(x, w, K, ld, width, accumulate, y);
    case 3: return Avx2RowsBlock<3>(x, w, K, ld, width, accumulate, y);
    case 4: return Avx2RowsBlock<4>(x, w, K, ld, width, accumulate, y);
    case 5: return Avx2RowsBlock<5>(x, w, K, ld, width, accumulate, y);
    case 6: return Avx2RowsBlock<6>(x, w, K, ld, width, accumulate, y);
    case 7: return Avx2RowsBlock<7>(x, w, K, ld, width, accumulate, y);
    default: return Avx2RowsBlock<8>(x, w, K, ld, width, accumulate, y);
  }
}

// One output of the columns form: the dot product of W's row and x.
__attribute__((target("avx2,fma"))) float Avx2Dot(const float* x, const float* row, int64_t K) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(row + k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(row + k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 16), _mm256_loadu_ps(row + k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 24), _mm256_loadu_ps(row + k + 24), a3);
  }
  for (; k + 8 <= K; k += 8) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(row + k), a0);
  }
  if (k < K) {
    const __m256i mask = FirstLanes(K - k);
    a1 = _mm256_fmadd_ps(_mm256_maskload_ps(x + k, mask), _mm256_maskload_ps(row + k, mask), a1);
  }
  return LaneSum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

__attribute__((target("avx2,fma"))) void Avx2Gemv(const float* x, const float* w, int64_t K,
                                                  int64_t n, int64_t ld, GemvForm form,
                                                  bool accumulate, float* y) {
  if (form == GemvForm::kRows) {
    for (int64_t j = 0; j < n; j += 64) {
      Avx2RowsColumns(x, w + j, K, ld, std::min<int64_t>(64, n - j), accumulate, y + j);
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const float s = Avx2Dot(x, w + j * ld, K);
    y[j] = accumulate ? y[j] + s : s;
  }
}
#endif  // OLLIE_X86_VECTORS

// The implementations this CPU runs, best first.
const std::vector<Vectors<GemvFn>>& Available() {
  static const std::vector<Vectors<GemvFn>> fns = []() {
    std::vector<Vectors<GemvFn>> v;
#if OLLIE_X86_VECTORS
    if (CpuRunsAvx2()) v.push_back({"avx2", &Avx2Gemv});
#endif
    v.push_back({"baseline", &BaselineGemv});
    return v;
  }();
  return fns;
}

const float* VectorArg(ffi::PackedArgs args, int i, const char* what, int rank) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) {
    TVM_FFI_THROW(TypeError) << kWithVectors << ": " << what << " must be a tensor";
  }
  if (t.value().ndim() != rank) {
    TVM_FFI_THROW(ValueError) << kWithVectors << ": " << what << " must have rank " << rank;
  }
  return CheckFloatTensor(t.value(), kWithVectors, what, rank);
}

// gemv_with_vectors(vectors, x, W, y, form, accumulate)
void GemvWithVectors(ffi::PackedArgs args, ffi::Any*) {
  if (args.size() != 6) {
    TVM_FFI_THROW(TypeError) << kWithVectors
                             << ": expected (vectors, x, W, y, form, accumulate), got "
                             << args.size() << " arguments";
  }
  auto name = args[0].try_cast<std::string>();
  auto form_name = args[4].try_cast<std::string>();
  auto accumulate = args[5].try_cast<bool>();
  if (!name || !form_name || !accumulate) {
    TVM_FFI_THROW(TypeError) << kWithVectors << ": vectors and form must be strings, "
                             << "accumulate a bool";
  }
  if (*form_name != "rows" && *form_name != "columns") {
    TVM_FFI_THROW(ValueError) << kWithVectors << ": form must be rows or columns, got "
                              << *form_name;
  }
  const GemvFn fn = RequireVectors(Available(), *name, kWithVectors, ",");
  const float* x = VectorArg(args, 1, "x", 1);
  const float* w = VectorArg(args, 2, "W", 2);
  float* y = const_cast<float*>(VectorArg(args, 3, "y", 1));
  const ffi::TensorView X = args[1].cast<ffi::TensorView>(), W = args[2].cast<ffi::TensorView>(),
                        Y = args[3].cast<ffi::TensorView>();
  const GemvForm form = *form_name == "rows" ? GemvForm::kRows : GemvForm::kColumns;
  const int64_t K = form == GemvForm::kRows ? W.shape()[0] : W.shape()[1];
  const int64_t n = form == GemvForm::kRows ? W.shape()[1] : W.shape()[0];
  if (X.shape()[0] != K || Y.shape()[0] != n) {
    TVM_FFI_THROW(ValueError) << kWithVectors << ": x " << ShapeStr(X) << ", W " << ShapeStr(W)
                              << " (" << *form_name << ") and y " << ShapeStr(Y)
                              << " do not agree";
  }
  fn(x, w, K, n, W.shape()[1], form, *accumulate, y);
}

}  // namespace

void Gemv(const float* x, const float* w, int64_t K, int64_t n, int64_t ld, GemvForm form,
          bool accumulate, float* y) {
  static const GemvFn best = Available().front().fn;
  best(x, w, K, n, ld, form, accumulate, y);
}

const char* GemvVectorsList() {
  static const std::string list = VectorsNames(Available(), ",");
  return list.c_str();
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kWithVectors, GemvWithVectors)
      .def("tvm_ollie.cpu.gemv_vectors", []() -> std::string { return GemvVectorsList(); });
}

}  // namespace tvm_ollie
