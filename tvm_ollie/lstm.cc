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
// Dynamically quantized (attrs quant=1; com.microsoft DynamicQuantizeLSTM as ONNX Runtime runs
// it):
//   tvm_ollie.cpu.lstm(attrs, X, W, R, B, H0, C0, WS [D, 4H], RS [D, 4H], Y)
// W and R hold the centered 8-bit weights (W - w_zp, integers in [-255, 255], as float32 in the
// layouts above), WS and RS their scales per column. X (all steps at once) and H (every step)
// are quantized as ONNX Runtime does, one scale and zero point per tensor: lo = min(min(A), 0),
// hi = max(max(A), 0), s = (hi - lo) / 255 (1 when hi = lo), z = clip(rint(-lo / s), 0, 255),
// q = clip(rint(A / s) + z, 0, 255); A W = float(sum_k (q - z) W) * (s * WS) with exact integer
// sums, and the gates (X W + H R) + B in that order (frontend/onnx_rnn.py's decomposition has
// the same equations). The integer sums run in float32 GEMMs over chunks of kExactChunk rows of
// K: every partial sum of a chunk is an integer below 2^24 in magnitude (256 * 255 * 255), so
// float32 holds it exactly whatever the order, and the chunks are added in int32.
//
// Why a kernel: unrolled into per-step operators (the frontend's general path), a bidirectional
// layer of 48 steps with H = 512 became 96 library GEMV calls of a 4 MB weight each, 86.5 ms of
// ddddocr's CRNN (docs/onnx-operators.md) against ONNX Runtime's fused LSTM. Here the input
// projection of all steps and directions is one oneDNN matmul on the library's OpenMP threads;
// the recurrence then runs on the calling thread, direction after direction, its step product
// H R_d in the widest vectors the CPU has, four rows of R_d per pass over the accumulator, and
// the gates fused after it. Why not a direction per thread: on the shared 2-core machine (load
// 5-7) the two directions on two threads took 43.9 ms (median) against 23.6 ms on one, with
// the same best runs (14.7 vs 15.1 ms): each step reads its 4 MB R_d from the shared L3, so a
// second thread added no bandwidth and waited for its descheduled partner (docs/onnx-operators.md).
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "vectors.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kLstm = "tvm_ollie.cpu.lstm";

struct LstmParams {
  int directions = 1;
  bool reverse_first = false;  // direction 0 walks backwards (dir=reverse)
  bool quantized = false;      // quant=1: DynamicQuantizeLSTM's products
};

// Rows of K per exact float32 chunk of an integer product (see the header).
constexpr int64_t kExactChunk = 256;

LstmParams ParseLstmAttrs(const std::string& text) {
  Attrs attrs(kLstm, text);
  const std::string dir =
      attrs.GetStr("dir", "forward", {"forward", "reverse", "bidirectional"});
  LstmParams p;
  p.quantized = attrs.GetBool("quant", false);
  attrs.CheckAllUsed();
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
OLLIE_WIDEST_VECTORS
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
  const float *ws = nullptr, *rs = nullptr;  // quant=1: the weights' scales per column
  float* y = nullptr;
};

// ONNX Runtime's dynamic quantization of n floats (the header's equations): (scale, zero
// point), and centered[i] = q[i] - z as floats (integers in [-255, 255]).
std::pair<float, float> QuantizeCentered(const float* a, int64_t n, float* centered) {
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, a[i]);
    hi = std::max(hi, a[i]);
  }
  const float scale = hi == lo ? 1.f : (hi - lo) / 255.f;
  const float zero = std::min(std::max(std::nearbyint(0.f - lo / scale), 0.f), 255.f);
  for (int64_t i = 0; i < n; ++i) {
    centered[i] = std::min(std::max(std::nearbyint(a[i] / scale) + zero, 0.f), 255.f) - zero;
  }
  return {scale, zero};
}

// A oneDNN matmul of plain row-major operands, kept per problem (and thread count).
struct LstmGemm {
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md, scratch_md;
};

// c [M, N] (rows ldc apart) = a [M, K] @ b [K, N] (rows lda, ldb apart), float32, on the
// library's OpenMP team (the one its other kernels use; OpenBLAS keeps a second pool of workers
// that spin after a call).
void Gemm(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
          int64_t M, int64_t K, int64_t N) {
  using dims = dnnl::memory::dims;
  const std::string key = std::string(kLstm) + "|gemm|" + std::to_string(M) + "," +
                          std::to_string(K) + "," + std::to_string(N) + "|" +
                          std::to_string(lda) + "," + std::to_string(ldb) + "," +
                          std::to_string(ldc);
  auto e = CachedGet<LstmGemm>(key, [&]() {
    auto made = std::make_shared<LstmGemm>();
    const auto f32 = dnnl::memory::data_type::f32;
    made->a_md = dnnl::memory::desc(dims{M, K}, f32, dims{lda, 1});
    made->b_md = dnnl::memory::desc(dims{K, N}, f32, dims{ldb, 1});
    made->c_md = dnnl::memory::desc(dims{M, N}, f32, dims{ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(Engine(), made->a_md, made->b_md, made->c_md, attr);
    made->scratch_md = pd.scratchpad_desc();
    made->prim = dnnl::matmul(pd);
    return made;
  });
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(e->a_md, Engine(), const_cast<float*>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(e->b_md, Engine(), const_cast<float*>(b))},
      {DNNL_ARG_DST, dnnl::memory(e->c_md, Engine(), c)}};
  const size_t scratch = e->scratch_md.get_size();
  if (scratch > 0) {
    args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(e->scratch_md, Engine(), ScratchBuffer(5, scratch));
  }
  e->prim.execute(Stream(), args);
  Stream().wait();
}

// acc (int32 [M, cols]) = a [M, K] @ b [K, cols] (rows lda, ldb apart) of integer-valued
// floats, exactly: float32 GEMMs over chunks of kExactChunk rows of K into `part` ([M, cols]
// floats), added in int32.
// `blas`: a library GEMM (the input projection) or the kernel's own product (a step, on one
// thread).
void ExactIntegerProduct(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t M,
                         int64_t K, int64_t cols, float* part, int32_t* acc, bool blas) {
  std::fill(acc, acc + M * cols, 0);
  for (int64_t k0 = 0; k0 < K; k0 += kExactChunk) {
    const int64_t kc = std::min(kExactChunk, K - k0);
    if (blas) {
      Gemm(a + k0, lda, b + k0 * ldb, ldb, part, cols, M, kc, cols);
    } else {  // the step product: b is [K, cols] (ldb == cols)
      std::fill(part, part + M * cols, 0.f);
      for (int64_t m = 0; m < M; ++m) {
        AccumulateProduct(a + m * lda + k0, b + k0 * ldb, part + m * cols, 1, kc, cols);
      }
    }
    for (int64_t i = 0; i < M * cols; ++i) acc[i] += static_cast<int32_t>(part[i]);
  }
}

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

// RunDirection with DynamicQuantizeLSTM's recurrent product: `g` holds X W already scaled
// (QuantizedInputProjection); each step quantizes H and adds (g + H R) + B.
void RunQuantizedDirection(const LstmProblem& p, const float* g, int d, bool reverse,
                           float* work) {
  const int64_t G4 = 4 * p.H, N = p.N, H = p.H;
  float* gates = work;
  float* h = gates + N * G4;
  float* c = h + N * H;
  float* centered = c + N * H;
  float* part = centered + N * H;
  int32_t* acc = reinterpret_cast<int32_t*>(part + N * G4);
  std::memcpy(h, p.h0 + d * N * H, sizeof(float) * N * H);
  std::memcpy(c, p.c0 + d * N * H, sizeof(float) * N * H);
  const float* r = p.r + d * H * G4;
  const float* bias = p.bias + d * G4;
  const float* rs = p.rs + d * G4;
  for (int64_t s = 0; s < p.T; ++s) {
    const int64_t t = reverse ? p.T - 1 - s : s;
    const float scale = QuantizeCentered(h, N * H, centered).first;
    ExactIntegerProduct(centered, H, r, G4, N, H, G4, part, acc, false);
    for (int64_t b = 0; b < N; ++b) {
      const float* gt = g + (t * N + b) * (p.D * G4) + d * G4;
      const int32_t* ab = acc + b * G4;
      float* out = gates + b * G4;
      for (int64_t j = 0; j < G4; ++j) {
        out[j] = (gt[j] + static_cast<float>(ab[j]) * (scale * rs[j])) + bias[j];
      }
      ApplyGates(out, H, h + b * H, c + b * H);
      std::memcpy(p.y + ((t * p.D + d) * N + b) * H, h + b * H, sizeof(float) * H);
    }
  }
}

// G = X W for all steps and directions ([T*N, I] @ [I, D*4H]): X, W, G plain row-major.
void InputProjection(const LstmProblem& p, float* g) {
  const int64_t rows = p.T * p.N, cols = p.D * 4 * p.H;
  if (p.I == 0) {
    std::fill(g, g + rows * cols, 0.f);
    return;
  }
  Gemm(p.x, p.I, p.w, cols, g, cols, rows, p.I, cols);
}

// G = X W of DynamicQuantizeLSTM, all directions: X quantized at once (one scale for the
// tensor), the exact integer product scaled per column (s * WS); no bias (added after H R at
// each step).
void QuantizedInputProjection(const LstmProblem& p, float* g) {
  const int64_t rows = p.T * p.N, cols = p.D * 4 * p.H;
  float* centered = static_cast<float*>(ScratchBuffer(2, sizeof(float) * rows * p.I));
  float* part = static_cast<float*>(ScratchBuffer(3, sizeof(float) * rows * cols));
  int32_t* acc = static_cast<int32_t*>(ScratchBuffer(4, sizeof(int32_t) * rows * cols));
  const float scale = QuantizeCentered(p.x, rows * p.I, centered).first;
  ExactIntegerProduct(centered, p.I, p.w, cols, rows, p.I, cols, part, acc, true);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      g[i * cols + j] = static_cast<float>(acc[i * cols + j]) * (scale * p.ws[j]);
    }
  }
}

LstmProblem CheckLstmArgs(const LstmParams& params, ffi::PackedArgs args) {
  const int count = params.quantized ? 10 : 8;
  if (args.size() != count) {
    TVM_FFI_THROW(TypeError) << kLstm << ": expected " << count << " arguments (attrs, X, W, R, "
                             << "B, H0, C0, " << (params.quantized ? "WS, RS, " : "")
                             << "Y), got " << args.size();
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
  if (params.quantized) {
    p.ws = ShapedArg(TensorArg(args, 7, "WS"), "WS", {p.D, G4});
    p.rs = ShapedArg(TensorArg(args, 8, "RS"), "RS", {p.D, G4});
  }
  p.y = ShapedArg(TensorArg(args, count - 1, "Y"), "Y", {p.T, p.D, p.N, p.H});
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
  // The fastest parallel call of this thread, for the stall fallback (docs/threads.md).
  thread_local int64_t best_ns = 0;
  threads.SerialBelow(2.0 * p.T * p.N * p.D * G4 * p.I, &best_ns);  // the projection's work
  float* g = static_cast<float*>(ScratchBuffer(0, sizeof(float) * p.T * p.N * p.D * G4));
  if (params.quantized) {
    QuantizedInputProjection(p, g);
  } else {
    InputProjection(p, g);
  }
  // gates, h, c (and quantized: centered h, the chunk's float part, the int32 sums)
  const size_t work_bytes = sizeof(float) * p.N * (params.quantized ? 3 * G4 + 3 * p.H
                                                                    : G4 + 2 * p.H);
  auto direction = [&](int d) {
    const bool reverse = d == 1 || params.reverse_first;
    float* work = static_cast<float*>(ScratchBuffer(1, work_bytes));
    if (params.quantized) {
      RunQuantizedDirection(p, g, d, reverse, work);
    } else {
      RunDirection(p, g, d, reverse, work);
    }
  };
  for (int d = 0; d < p.D; ++d) direction(d);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kLstm, [](ffi::PackedArgs args, ffi::Any*) { RunLstm(args); });
}

}  // namespace tvm_ollie
