// tvm_ollie.cpu.lstm: a whole ONNX LSTM layer (every step, every direction) in one call, float32.
//
// For direction d (reverse: the steps from the last down), with gates in ONNX's order i, o, f, c
// and its default activations (sigmoid, tanh, tanh):
//
//   G[t]  = X[t] W_d + B_d                                   (all steps: one GEMM, before the loop)
//   g     = G[t] + H R_d,   i = sigmoid(g_i), o = sigmoid(g_o), f = sigmoid(g_f), c~ = tanh(g_c)
//   C     = f . C + i . c~,  H = o . tanh(C),  Y[t, d] = H      (H, C start at H0[d], C0[d])
//
// Calling convention (destination-passing style, Y last):
//   tvm_ollie.cpu.lstm(attrs: str, X [T, N, I], W [I, D*4H], R [D, H, 4H], B [D, 4H],
//                      H0 [D, N, H], C0 [D, N, H], Y [T, D, N, H])
// attrs: dir=forward|reverse|bidirectional (D = 2 for bidirectional, else 1).
// W is ONNX's W transposed with the directions side by side ([I, 4H] of direction 0, then of
// direction 1), R is ONNX's R transposed per direction, B is ONNX's Wb + Rb: the frontend packs
// them once from the model's constants (frontend/onnx_rnn.py), so a call reads them as they lie.
//
// Why a kernel: unrolled into per-step operators (the frontend's general path), a bidirectional
// layer of 48 steps with H = 512 became 96 library GEMV calls of a 4 MB weight each, 86.5 ms of
// ddddocr's CRNN (docs/onnx-operators.md) against ONNX Runtime's fused LSTM. Here the input
// projection of all steps and directions is one OpenBLAS GEMM on the calling thread's team; the
// recurrence then runs one direction per OpenMP thread (a bidirectional layer on two threads:
// each walks its own weight, no barrier), its step product H R_d in the widest vectors the CPU
// has, four rows of R_d per pass over the accumulator, and the gates fused after it.
#include <omp.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cblas.h"
#include "common.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kLstm = "tvm_ollie.cpu.lstm";

// x86-64 with GCC or Clang: the function built for AVX-512, AVX2 and the baseline, the widest
// the CPU has chosen when the library loads (as norm.cc); elsewhere as the compiler builds it.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define OLLIE_LSTM_VECTORS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define OLLIE_LSTM_VECTORS
#endif

struct LstmParams {
  int directions = 1;
  bool reverse_first = false;  // direction 0 walks backwards (dir=reverse)
};

LstmParams ParseLstmAttrs(const std::string& text) {
  Attrs attrs(kLstm, text);
  const std::string dir =
      attrs.GetStr("dir", "forward", {"forward", "reverse", "bidirectional"});
  attrs.CheckAllUsed();
  LstmParams p;
  p.directions = dir == "bidirectional" ? 2 : 1;
  p.reverse_first = dir == "reverse";
  return p;
}

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kLstm << ": " << what << " must be a tensor";
  return t.value();
}

// The tensor's data after checking its shape is exactly `want`.
float* ShapedArg(const ffi::TensorView& t, const char* what, const std::vector<int64_t>& want) {
  float* data = CheckFloatTensor(t, kLstm, what, static_cast<int>(want.size()));
  if (Dims(t) != want) {
    std::string expected = "[";
    for (size_t i = 0; i < want.size(); ++i) {
      expected += (i ? ", " : "") + std::to_string(want[i]);
    }
    TVM_FFI_THROW(ValueError) << kLstm << ": " << what << " has shape " << ShapeStr(t)
                              << ", expected " << expected << "]";
  }
  return data;
}

// acc[b, :] += sum_k h[b, k] r[k, :] for the N rows of acc ([N, cols]) and h ([N, K]); r is
// [K, cols]. Four rows of r per pass over an accumulator row (a quarter of the accumulator's
// loads and stores); rows whose four h values are zero are skipped (the zero initial state).
OLLIE_LSTM_VECTORS
void AccumulateProduct(const float* h, const float* r, float* acc, int64_t N, int64_t K,
                       int64_t cols) {
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const float* r0 = r + k * cols;
    const float* r1 = r0 + cols;
    const float* r2 = r1 + cols;
    const float* r3 = r2 + cols;
    for (int64_t b = 0; b < N; ++b) {
      const float* hb = h + b * K + k;
      const float h0 = hb[0], h1 = hb[1], h2 = hb[2], h3 = hb[3];
      if (h0 == 0.f && h1 == 0.f && h2 == 0.f && h3 == 0.f) continue;
      float* a = acc + b * cols;
      for (int64_t j = 0; j < cols; ++j) {
        a[j] += (h0 * r0[j] + h1 * r1[j]) + (h2 * r2[j] + h3 * r3[j]);
      }
    }
  }
  for (; k < K; ++k) {
    const float* rk = r + k * cols;
    for (int64_t b = 0; b < N; ++b) {
      const float hk = h[b * K + k];
      if (hk == 0.f) continue;
      float* a = acc + b * cols;
      for (int64_t j = 0; j < cols; ++j) a[j] += hk * rk[j];
    }
  }
}

inline float Sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

// The gates of one batch row: g [4H] (i, o, f, c), the state h, c [H] updated in place.
void ApplyGates(const float* g, int64_t H, float* h, float* c) {
  const float* gi = g;
  const float* go = g + H;
  const float* gf = g + 2 * H;
  const float* gc = g + 3 * H;
  for (int64_t j = 0; j < H; ++j) {
    const float cell = Sigmoid(gf[j]) * c[j] + Sigmoid(gi[j]) * std::tanh(gc[j]);
    c[j] = cell;
    h[j] = Sigmoid(go[j]) * std::tanh(cell);
  }
}

struct LstmProblem {
  int64_t T = 0, N = 0, I = 0, H = 0;
  int D = 1;
  const float *x = nullptr, *w = nullptr, *r = nullptr, *bias = nullptr, *h0 = nullptr,
              *c0 = nullptr;
  float* y = nullptr;
};

// One direction's recurrence over the steps. `g` is the input projection [T*N, D*4H] (this
// direction's columns at d*4H), `work` scratch of N*(4H + 2H) floats of the running thread.
void RunDirection(const LstmProblem& p, const float* g, int d, bool reverse, float* work) {
  const int64_t G4 = 4 * p.H, N = p.N, H = p.H;
  float* acc = work;
  float* h = acc + N * G4;
  float* c = h + N * H;
  std::memcpy(h, p.h0 + d * N * H, sizeof(float) * N * H);
  std::memcpy(c, p.c0 + d * N * H, sizeof(float) * N * H);
  const float* r = p.r + d * H * G4;
  const float* bias = p.bias + d * G4;
  for (int64_t s = 0; s < p.T; ++s) {
    const int64_t t = reverse ? p.T - 1 - s : s;
    for (int64_t b = 0; b < N; ++b) {
      const float* gt = g + (t * N + b) * (p.D * G4) + d * G4;
      float* a = acc + b * G4;
      for (int64_t j = 0; j < G4; ++j) a[j] = gt[j] + bias[j];
    }
    AccumulateProduct(h, r, acc, N, H, G4);
    for (int64_t b = 0; b < N; ++b) {
      ApplyGates(acc + b * G4, H, h + b * H, c + b * H);
      std::memcpy(p.y + ((t * p.D + d) * N + b) * H, h + b * H, sizeof(float) * H);
    }
  }
}

bool FitsBlasInt(int64_t v) { return v <= std::numeric_limits<blasint>::max(); }

// G = X W for all steps and directions: [T*N, I] @ [I, D*4H] (OpenBLAS, the library's threads).
void InputProjection(const LstmProblem& p, float* g) {
  const int64_t rows = p.T * p.N, cols = p.D * 4 * p.H;
  if (!FitsBlasInt(rows) || !FitsBlasInt(cols) || !FitsBlasInt(p.I)) {
    TVM_FFI_THROW(ValueError) << kLstm << ": problem too large for 32-bit BLAS";
  }
  if (p.I == 0) {
    std::fill(g, g + rows * cols, 0.f);
    return;
  }
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(rows),
                    static_cast<blasint>(cols), static_cast<blasint>(p.I), 1.f, p.x,
                    static_cast<blasint>(p.I), p.w, static_cast<blasint>(cols), 0.f, g,
                    static_cast<blasint>(cols));
}

LstmProblem CheckLstmArgs(const LstmParams& params, ffi::PackedArgs args) {
  if (args.size() != 8) {
    TVM_FFI_THROW(TypeError) << kLstm << ": expected 8 arguments (attrs, X, W, R, B, H0, C0, Y), "
                             << "got " << args.size();
  }
  ffi::TensorView X = TensorArg(args, 1, "X"), R = TensorArg(args, 3, "R");
  LstmProblem p;
  p.D = params.directions;
  p.x = CheckFloatTensor(X, kLstm, "X", 3);
  if (X.ndim() != 3) TVM_FFI_THROW(ValueError) << kLstm << ": X must have rank 3 [T, N, I]";
  p.T = X.shape()[0];
  p.N = X.shape()[1];
  p.I = X.shape()[2];
  CheckFloatTensor(R, kLstm, "R", 3);
  if (R.ndim() != 3) TVM_FFI_THROW(ValueError) << kLstm << ": R must have rank 3 [D, H, 4H]";
  p.H = R.shape()[1];
  const int64_t G4 = 4 * p.H;
  p.r = ShapedArg(R, "R", {p.D, p.H, G4});
  p.w = ShapedArg(TensorArg(args, 2, "W"), "W", {p.I, p.D * G4});
  p.bias = ShapedArg(TensorArg(args, 4, "B"), "B", {p.D, G4});
  p.h0 = ShapedArg(TensorArg(args, 5, "H0"), "H0", {p.D, p.N, p.H});
  p.c0 = ShapedArg(TensorArg(args, 6, "C0"), "C0", {p.D, p.N, p.H});
  p.y = ShapedArg(TensorArg(args, 7, "Y"), "Y", {p.T, p.D, p.N, p.H});
  return p;
}

void RunLstm(ffi::PackedArgs args) {
  ThreadScope threads;
  std::optional<ffi::String> holder;
  const LstmParams& params =
      ParsedAttrs<LstmParams>(AttrsView(args, kLstm, &holder), ParseLstmAttrs);
  const LstmProblem p = CheckLstmArgs(params, args);
  if (p.T == 0 || p.N == 0 || p.H == 0) return;
  const int64_t G4 = 4 * p.H;
  threads.SerialBelow(2.0 * p.T * p.N * p.D * G4 * (p.I + p.H));
  float* g = static_cast<float*>(ScratchBuffer(0, sizeof(float) * p.T * p.N * p.D * G4));
  InputProjection(p, g);
  const size_t work_bytes = sizeof(float) * p.N * (G4 + 2 * p.H);
  auto direction = [&](int d) {
    const bool reverse = d == 1 || params.reverse_first;
    RunDirection(p, g, d, reverse, static_cast<float*>(ScratchBuffer(1, work_bytes)));
  };
  if (p.D == 1 || omp_get_max_threads() < 2) {
    for (int d = 0; d < p.D; ++d) direction(d);
    return;
  }
#pragma omp parallel num_threads(2)
  direction(omp_get_thread_num());
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kLstm, [](ffi::PackedArgs args, ffi::Any*) { RunLstm(args); });
}

}  // namespace tvm_ollie
