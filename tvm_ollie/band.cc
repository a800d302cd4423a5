// tvm_ollie.cpu.g2bmm / tvm_ollie.cpu.gbmm: the banded batched matmuls of dilated sliding-window
// attention (Longformer), float32, as blocks of dense GEMMs (oneDNN dnnl_sgemm or OpenBLAS).
//
//   g2bmm: Out[b, i, j] = sum_k A[b, i, k] * B[b, i + D*(j - W), k],   j in [0, 2W]
//   gbmm:  Out[b, i, n] = sum_j A[b, i, j] * B[b, i + D*(j - W), n],   j in [0, 2W]
// Rows of B outside [0, L) read as 0.
//
// Calling convention (destination-passing style, Out last; leading dims are the batch, equal in
// A, B and Out):
//   tvm_ollie.cpu.g2bmm(attrs: str, A [..., L, K], B [..., L, K], Out [..., L, 2W+1])
//   tvm_ollie.cpu.gbmm(attrs: str, A [..., L, 2W+1], B [..., L, N], Out [..., L, N])
// attrs: width=W (required, >= 0), dil=D (>= 1, default 1), tile=T (rows per GEMM block, 0 or
//        absent: the default rule), lib=auto|onednn|openblas.
//
// Formulation: for a batch b and a residue r mod D, the rows i = r + D*m (m in [0, Lr)) only
// meet rows of B of the same residue, at m' = m + j - W: a dilation-1 band problem whose rows
// are D*K (D*N) floats apart in memory, so the GEMMs take them in place with a leading
// dimension of D*K. Its rows are cut into blocks of T; a block [m0, m0+T) meets the window
// [m0 - W, m0 + T + W) of B's rows (clipped to [0, Lr), which gives the zero rows for free):
//   g2bmm: C = A_blk (T x K) @ B_win^T (K x nw), then Out[m0+t, j] = C[t, t + j - (lo - m0 + W)]
//          (the band of C; the GEMM computes T*nw dot products for the T*(2W+1) wanted);
//   gbmm:  Out_blk = Aband (T x nw) @ B_win (nw x N), where Aband[t, m'-lo] = A[m0+t, m'-m0-t+W]
//          is A's block spread on its diagonals (zero elsewhere).
// The (batch, residue, block) items run in parallel over the library's OpenMP threads, each GEMM
// on one thread (oneDNN), or one after another with OpenBLAS threading each GEMM.
#include <omp.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cblas.h"
#include "common.h"
#include "kernels.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kG2bmm = "tvm_ollie.cpu.g2bmm";
constexpr const char* kGbmm = "tvm_ollie.cpu.gbmm";

enum class Lib { kAuto, kOneDNN, kOpenBLAS };

struct BandParams {
  int64_t width = 0, dil = 1, tile = 0;
  Lib lib = Lib::kAuto;
};

BandParams ParseBandAttrs(const char* kernel, const std::string& text) {
  Attrs attrs(kernel, text);
  BandParams p;
  if (!attrs.Has("width")) TVM_FFI_THROW(ValueError) << kernel << ": attrs lack width=W";
  p.width = attrs.GetInt("width", 0);
  p.dil = attrs.GetInt("dil", 1);
  p.tile = attrs.GetInt("tile", 0);
  std::string lib = attrs.GetStr("lib", "auto", {"auto", "onednn", "openblas"});
  p.lib = lib == "onednn" ? Lib::kOneDNN : (lib == "openblas" ? Lib::kOpenBLAS : Lib::kAuto);
  attrs.CheckAllUsed();
  if (p.width < 0) TVM_FFI_THROW(ValueError) << kernel << ": width must be >= 0, got " << p.width;
  if (p.dil < 1) TVM_FFI_THROW(ValueError) << kernel << ": dil must be >= 1, got " << p.dil;
  if (p.tile < 0) TVM_FFI_THROW(ValueError) << kernel << ": tile must be >= 0, got " << p.tile;
  return p;
}

// The problem after shape checks: `batch` flattened leading dims, L rows, the inner extent
// `inner` (K of g2bmm, N of gbmm), each operand's row length.
struct BandProblem {
  int64_t batch = 1, L = 0, inner = 0, a_cols = 0, b_cols = 0, out_cols = 0;
};

std::string DimsText(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

BandProblem CheckBandShapes(const char* kernel, bool g2, const BandParams& p,
                            const ffi::TensorView& A, const ffi::TensorView& B,
                            const ffi::TensorView& Out) {
  std::vector<int64_t> da = Dims(A), db = Dims(B), dout = Dims(Out);
  const size_t r = da.size();
  if (db.size() != r || dout.size() != r ||
      !std::equal(da.begin(), da.end() - 1, db.begin()) ||
      !std::equal(da.begin(), da.end() - 1, dout.begin())) {
    TVM_FFI_THROW(ValueError) << kernel << ": A " << ShapeStr(A) << ", B " << ShapeStr(B)
                              << " and Out " << ShapeStr(Out)
                              << " must have the same rank and leading dims [..., L]";
  }
  BandProblem pr;
  for (size_t i = 0; i + 2 < r; ++i) pr.batch *= da[i];
  pr.L = da[r - 2];
  pr.a_cols = da[r - 1];
  pr.b_cols = db[r - 1];
  pr.out_cols = dout[r - 1];
  const int64_t window = 2 * p.width + 1;
  std::vector<int64_t> want = dout;
  if (g2) {
    pr.inner = pr.a_cols;
    if (pr.b_cols != pr.a_cols) {
      TVM_FFI_THROW(ValueError) << kernel << ": A " << ShapeStr(A) << " and B " << ShapeStr(B)
                                << " differ in their last dim K";
    }
    want.back() = window;
  } else {
    pr.inner = pr.b_cols;
    if (pr.a_cols != window) {
      TVM_FFI_THROW(ValueError) << kernel << ": A " << ShapeStr(A) << " must have 2W+1 = "
                                << window << " columns (width=" << p.width << ")";
    }
    want.back() = pr.b_cols;
  }
  if (want != dout) {
    TVM_FFI_THROW(ValueError) << kernel << ": Out has shape " << ShapeStr(Out) << ", expected "
                              << DimsText(want) << " for A " << ShapeStr(A) << " and B "
                              << ShapeStr(B) << " (width=" << p.width << ")";
  }
  return pr;
}

// C (M x N, ldc) = op(A) @ op(B), row-major; one thread for oneDNN (called inside the items'
// parallel loop), the library's threads for OpenBLAS.
void Gemm(Lib lib, bool tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (lib == Lib::kOpenBLAS) {
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                      static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K),
                      1.f, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), 0.f, c,
                      static_cast<blasint>(ldc));
    return;
  }
  dnnl_status_t st = dnnl_sgemm('N', tb ? 'T' : 'N', M, N, K, 1.f, a, lda, b, ldb, 0.f, c, ldc);
  if (st != dnnl_success) {
    TVM_FFI_THROW(RuntimeError) << "dnnl_sgemm failed (status " << static_cast<int>(st) << ")";
  }
}

// One GEMM block: batch b, residue r, rows [m0, m0 + T) of the residue's Lr rows.
struct Item {
  int64_t b, r, m0, lr;
};

std::vector<Item> Items(const BandProblem& pr, int64_t dil, int64_t tile) {
  std::vector<Item> items;
  for (int64_t b = 0; b < pr.batch; ++b) {
    for (int64_t r = 0; r < std::min(dil, pr.L); ++r) {
      const int64_t lr = (pr.L - r + dil - 1) / dil;
      for (int64_t m0 = 0; m0 < lr; m0 += tile) items.push_back({b, r, m0, lr});
    }
  }
  return items;
}

// Rows per block by default. The GEMM of a block computes T*(T+2W) dot products for the
// T*(2W+1) of the band, so T trades the GEMM's efficiency (small T: short, badly blocked GEMMs)
// against wasted work (large T): 2W rows (half the GEMM is band) within [16, 64]. Measured on
// one thread (docs/native-library.md): 4x256x32 w=16 d=4 best at T = 32..128 (flat), 12x1024x64 w=64
// and 8x2048x64 w=128 best at T = 64 (noisy, loaded machine).
int64_t DefaultTile(int64_t width) { return std::clamp<int64_t>(2 * width, 16, 64); }

// g2bmm of one item: C = A_blk @ B_win^T, then the band of C into Out.
void G2bmmItem(Lib lib, const BandParams& p, const BandProblem& pr, const Item& it, int64_t tile,
               const float* a, const float* b, float* out) {
  const int64_t W = p.width, D = p.dil, K = pr.inner, window = 2 * W + 1;
  const int64_t te = std::min(tile, it.lr - it.m0);
  const int64_t lo = std::max<int64_t>(0, it.m0 - W), hi = std::min(it.lr, it.m0 + te + W);
  const int64_t nw = hi - lo;
  const float* a0 = a + (it.b * pr.L + it.r) * K;
  const float* b0 = b + (it.b * pr.L + it.r) * K;
  float* o0 = out + (it.b * pr.L + it.r) * window;
  float* c = static_cast<float*>(ScratchBuffer(0, sizeof(float) * te * nw));
  Gemm(lib, true, te, nw, K, a0 + it.m0 * D * K, D * K, b0 + lo * D * K, D * K, c, nw);
  for (int64_t t = 0; t < te; ++t) {
    float* o = o0 + (it.m0 + t) * D * window;
    const float* crow = c + t * nw;
    // j runs over m' = m0 + t + j - W; in the window iff lo <= m' < hi.
    const int64_t base = it.m0 + t - W;
    const int64_t j_lo = std::clamp<int64_t>(lo - base, 0, window);
    const int64_t j_hi = std::clamp<int64_t>(hi - base, j_lo, window);
    std::fill(o, o + j_lo, 0.f);
    std::memcpy(o + j_lo, crow + (base + j_lo - lo), sizeof(float) * (j_hi - j_lo));
    std::fill(o + j_hi, o + window, 0.f);
  }
}

// gbmm of one item: Out_blk = Aband @ B_win, Aband the block of A spread on its diagonals.
void GbmmItem(Lib lib, const BandParams& p, const BandProblem& pr, const Item& it, int64_t tile,
              const float* a, const float* b, float* out) {
  const int64_t W = p.width, D = p.dil, N = pr.inner, window = 2 * W + 1;
  const int64_t te = std::min(tile, it.lr - it.m0);
  const int64_t lo = std::max<int64_t>(0, it.m0 - W), hi = std::min(it.lr, it.m0 + te + W);
  const int64_t nw = hi - lo;
  const float* a0 = a + (it.b * pr.L + it.r) * window;
  const float* b0 = b + (it.b * pr.L + it.r) * N;
  float* o0 = out + (it.b * pr.L + it.r) * N;
  float* band = static_cast<float*>(ScratchBuffer(0, sizeof(float) * te * nw));
  std::fill(band, band + te * nw, 0.f);
  for (int64_t t = 0; t < te; ++t) {
    const float* arow = a0 + (it.m0 + t) * D * window;
    const int64_t base = it.m0 + t - W;
    const int64_t j_lo = std::clamp<int64_t>(lo - base, 0, window);
    const int64_t j_hi = std::clamp<int64_t>(hi - base, j_lo, window);
    std::memcpy(band + t * nw + (base + j_lo - lo), arow + j_lo, sizeof(float) * (j_hi - j_lo));
  }
  Gemm(lib, false, te, N, nw, band, nw, b0 + lo * D * N, D * N, o0 + it.m0 * D * N, D * N);
}

bool FitsBlasInt(int64_t v) { return v <= std::numeric_limits<blasint>::max(); }

void RunBand(const char* kernel, bool g2, ffi::PackedArgs args) {
  ThreadScope threads;
  if (args.size() != 4) {
    TVM_FFI_THROW(TypeError) << kernel << ": expected 4 arguments (attrs, A, B, Out), got "
                             << args.size();
  }
  auto attrs_opt = args[0].try_cast<ffi::String>();
  if (!attrs_opt.has_value()) {
    TVM_FFI_THROW(TypeError) << kernel << ": first argument must be the attrs string";
  }
  BandParams p = ParseBandAttrs(kernel, std::string(attrs_opt.value()));
  auto tensor = [&](int i, const char* what) {
    auto t = args[i].try_cast<ffi::TensorView>();
    if (!t.has_value()) TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be a tensor";
    return t.value();
  };
  ffi::TensorView A = tensor(1, "A"), B = tensor(2, "B"), Out = tensor(3, "Out");
  const float* a = CheckFloatTensor(A, kernel, "A", 2);
  const float* b = CheckFloatTensor(B, kernel, "B", 2);
  float* out = CheckFloatTensor(Out, kernel, "Out", 2);
  BandProblem pr = CheckBandShapes(kernel, g2, p, A, B, Out);
  if (Out.numel() == 0) return;
  if (pr.inner == 0 && g2) {  // empty dot products
    std::fill(out, out + Out.numel(), 0.f);
    return;
  }
  Lib lib = p.lib == Lib::kAuto ? Lib::kOneDNN : p.lib;
  const int64_t tile = p.tile > 0 ? p.tile : DefaultTile(p.width);
  if (lib == Lib::kOpenBLAS &&
      !(FitsBlasInt(p.dil * std::max(pr.inner, 2 * p.width + 1)) &&
        FitsBlasInt(tile + 2 * p.width))) {
    TVM_FFI_THROW(ValueError) << kernel << ": problem too large for 32-bit BLAS";
  }
  const std::vector<Item> items = Items(pr, p.dil, tile);
  const int64_t n = static_cast<int64_t>(items.size());
  auto run = [&](int64_t k) {
    if (g2) {
      G2bmmItem(lib, p, pr, items[k], tile, a, b, out);
    } else {
      GbmmItem(lib, p, pr, items[k], tile, a, b, out);
    }
  };
  if (lib == Lib::kOpenBLAS || n == 1 || GetNumThreads() == 1) {
    for (int64_t k = 0; k < n; ++k) run(k);
    return;
  }
  // Exceptions must not cross the OpenMP region: the first error is rethrown after it.
  std::string error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t k = 0; k < n; ++k) {
    try {
      run(k);
    } catch (const std::exception& e) {
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) TVM_FFI_THROW(RuntimeError) << kernel << ": " << error;
}

}  // namespace

std::string BandInfo() {
  return "g2bmm/gbmm: per (batch, residue mod dil) band as GEMM blocks of clamp(2W, 16, 64) rows, "
         "onednn dnnl_sgemm (one thread per block) or openblas";
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kG2bmm, [](ffi::PackedArgs args, ffi::Any*) { RunBand(kG2bmm, true, args); })
      .def_packed(kGbmm, [](ffi::PackedArgs args, ffi::Any*) { RunBand(kGbmm, false, args); });
}

}  // namespace tvm_ollie
