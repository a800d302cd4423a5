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
//        when its key says so, in that order), act=... (the activations of conv2d/matmul),
//        fmt=nchw|nhwc|nChw4c|nChw8c|nChw16c (default nchw) and, for nChw{B}c, c=C (the
//        channel count, which the shape does not say): the layout of X, residual and Out,
//        those of the convolution's src_fmt/dst_fmt (docs/layouts.md). nchw: [N, C, S...];
//        nhwc: [N, S..., C] (rank >= 3); nChw{B}c: [N, ceil(C/B), S..., B] (rank >= 4), whose
//        padding channels are written as 0. Scale and bias are [C] in every format.
//
// Why formats: Candy's convolutions are separated by instance norms; with an NCHW-only norm no
// two convolutions touch and oneDNN reorders the activations in and out of every convolution
// (19 reorders per inference). With the norm in the chain's format the whole network is one
// chain (transform/blocked_layout.py). In nhwc and nChw{B}c a plane's values are interleaved
// with the other channels' (a stride of C or B floats): the kernel sums rows of channels as
// vectors, one accumulator per channel.
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
#include <vector>

#include "common.h"
#include "vectors.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kInstanceNorm = "tvm_ollie.cpu.instance_norm";

// The data formats (attribute fmt) as a block: 0 NCHW planes, -1 channels-last, B nChw{B}c.
constexpr int64_t kChannelsLast = -1;

struct NormParams {
  float eps = 1e-5f;
  bool scale = false, bias = false, res = false;
  Activation act;
  int64_t blk = 0;       // fmt as a block (kChannelsLast, or B of nChw{B}c); 0: nchw
  int64_t channels = 0;  // c=C of a blocked fmt
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
  const std::string fmt = attrs.GetStr("fmt", "nchw",
                                       {"nchw", "nhwc", "nChw4c", "nChw8c", "nChw16c"});
  p.blk = fmt == "nchw" ? 0 : (fmt == "nhwc" ? kChannelsLast
                                              : std::stoll(fmt.substr(4, fmt.size() - 5)));
  p.channels = attrs.GetInt("c", 0);
  if (p.blk > 0 && p.channels < 1) {
    TVM_FFI_THROW(ValueError) << kInstanceNorm << ": fmt=" << fmt
                              << " needs c >= 1 (the channel count)";
  }
  if (p.blk <= 0 && p.channels != 0) {
    TVM_FFI_THROW(ValueError) << kInstanceNorm << ": c is only for blocked fmt (nChw{B}c)";
  }
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

// Interleaved formats (nhwc, nChw{B}c): a *group* is `rows` rows of `lanes` floats, lane l of
// every row one channel (nhwc: a group per image, lanes = C; nChw{B}c: a group per image and
// channel block, lanes = B). Each channel's moments are shifted by its value in the group's
// first row, as PlaneMoments does, so that partial sums of row ranges add up.
//
// The loops run over tiles of kTile floats with their accumulators in registers (a loop over a
// run-time lane count kept them in memory: 2.4x the NCHW kernel's time on 1x8x64x64): when the
// lane count divides kTile, a tile is kTile / lanes consecutive rows; when it is a multiple of
// kTile, each kTile lanes of a row in turn; other counts (3, 12, 56 channels) take the plain
// loops.
constexpr int kTile = 64;

// Adds the shifted sums of `rows` rows of kTile floats (row stride `stride`) to a1/a2.
OLLIE_WIDEST_VECTORS
void TileSums(const float* x, int64_t rows, int64_t stride, const double* shift, double* a1,
              double* a2) {
  double s1[kTile], s2[kTile];
  for (int j = 0; j < kTile; ++j) {
    s1[j] = 0.0;
    s2[j] = 0.0;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * stride;
#pragma omp simd
    for (int j = 0; j < kTile; ++j) {
      const double d = static_cast<double>(row[j]) - shift[j];
      s1[j] += d;
      s2[j] += d * d;
    }
  }
  for (int j = 0; j < kTile; ++j) {
    a1[j] += s1[j];
    a2[j] += s2[j];
  }
}

// out = (x - mean) * mul + bias (+ r), relu when asked, on `rows` rows of kTile floats.
OLLIE_WIDEST_VECTORS
void TileNormalize(const float* x, const float* r, float* out, int64_t rows, int64_t stride,
                   const float* mean, const float* mul, const float* bias, bool relu) {
  for (int64_t k = 0; k < rows; ++k) {
    const float* xr = x + k * stride;
    float* o = out + k * stride;
    if (r != nullptr) {
      const float* rr = r + k * stride;
#pragma omp simd
      for (int j = 0; j < kTile; ++j) {
        const float v = (xr[j] - mean[j]) * mul[j] + bias[j] + rr[j];
        o[j] = relu && v < 0.f ? 0.f : v;
      }
    } else {
#pragma omp simd
      for (int j = 0; j < kTile; ++j) {
        const float v = (xr[j] - mean[j]) * mul[j] + bias[j];
        o[j] = relu && v < 0.f ? 0.f : v;
      }
    }
  }
}

// The plain loops: `lanes` lanes of `rows` rows (row stride `stride`).
void PlainSums(const float* x, int64_t rows, int64_t lanes, int64_t stride, const float* shift,
               double* s1, double* s2) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = x + r * stride;
    for (int64_t l = 0; l < lanes; ++l) {
      const double d = static_cast<double>(a[l]) - shift[l];
      s1[l] += d;
      s2[l] += d * d;
    }
  }
}

void PlainNormalize(const float* x, const float* r, float* out, int64_t rows, int64_t lanes,
                    int64_t stride, const float* mean, const float* mul, const float* bias,
                    bool relu) {
  for (int64_t k = 0; k < rows; ++k) {
    for (int64_t l = 0; l < lanes; ++l) {
      const int64_t i = k * stride + l;
      float v = (x[i] - mean[l]) * mul[l] + bias[l];
      if (r != nullptr) v += r[i];
      out[i] = relu && v < 0.f ? 0.f : v;
    }
  }
}

// Adds the shifted sums of rows [0, rows) (`lanes` floats each, contiguous) to s1/s2.
void InterleavedSums(const float* x, int64_t rows, int64_t lanes, const float* shift,
                     double* s1, double* s2) {
  double sh[kTile], a1[kTile], a2[kTile];
  if (kTile % lanes == 0) {
    const int64_t per = kTile / lanes, tiles = rows / per;
    for (int j = 0; j < kTile; ++j) {
      sh[j] = shift[j % lanes];
      a1[j] = a2[j] = 0.0;
    }
    TileSums(x, tiles, kTile, sh, a1, a2);
    for (int j = 0; j < kTile; ++j) {
      s1[j % lanes] += a1[j];
      s2[j % lanes] += a2[j];
    }
    PlainSums(x + tiles * kTile, rows - tiles * per, lanes, lanes, shift, s1, s2);
    return;
  }
  int64_t l0 = 0;
  for (; l0 + kTile <= lanes; l0 += kTile) {
    for (int j = 0; j < kTile; ++j) {
      sh[j] = shift[l0 + j];
      a1[j] = a2[j] = 0.0;
    }
    TileSums(x + l0, rows, lanes, sh, a1, a2);
    for (int j = 0; j < kTile; ++j) {
      s1[l0 + j] += a1[j];
      s2[l0 + j] += a2[j];
    }
  }
  PlainSums(x + l0, rows, lanes - l0, lanes, shift + l0, s1 + l0, s2 + l0);
}

// out = (x - mean) * mul + bias (+ r), then relu when asked, for rows [0, rows).
void InterleavedNormalize(const float* x, const float* r, float* out, int64_t rows,
                          int64_t lanes, const float* mean, const float* mul, const float* bias,
                          bool relu) {
  float m[kTile], k[kTile], b[kTile];
  if (kTile % lanes == 0) {
    const int64_t per = kTile / lanes, tiles = rows / per;
    for (int j = 0; j < kTile; ++j) {
      m[j] = mean[j % lanes];
      k[j] = mul[j % lanes];
      b[j] = bias[j % lanes];
    }
    TileNormalize(x, r, out, tiles, kTile, m, k, b, relu);
    const int64_t done = tiles * kTile;
    PlainNormalize(x + done, r != nullptr ? r + done : nullptr, out + done, rows - tiles * per,
                   lanes, lanes, mean, mul, bias, relu);
    return;
  }
  int64_t l0 = 0;
  for (; l0 + kTile <= lanes; l0 += kTile) {
    TileNormalize(x + l0, r != nullptr ? r + l0 : nullptr, out + l0, rows, lanes, mean + l0,
                  mul + l0, bias + l0, relu);
  }
  PlainNormalize(x + l0, r != nullptr ? r + l0 : nullptr, out + l0, rows, lanes - l0, lanes,
                 mean + l0, mul + l0, bias + l0, relu);
}

// The shapes of an interleaved call: groups of rows x lanes, and how many lanes of a group are
// real channels (a blocked format's last block may be partly padding).
struct Interleaved {
  int64_t groups = 0, rows = 0, lanes = 0, blocks = 1, channels = 0;
  int64_t Channel(int64_t group, int64_t lane) const {
    return (group % blocks) * lanes + lane;  // nhwc: blocks = 1
  }
};

Interleaved InterleavedShape(const NormParams& p, const ffi::TensorView& X) {
  Interleaved s;
  const int64_t rank = X.ndim();
  if (p.blk == kChannelsLast) {
    s.lanes = s.channels = X.shape()[rank - 1];
    s.groups = X.shape()[0];
  } else {
    if (rank < 4 || X.shape()[rank - 1] != p.blk) {
      TVM_FFI_THROW(ValueError) << kInstanceNorm << ": X has shape " << ShapeStr(X)
                                << ", expected [N, C/" << p.blk << ", ..., " << p.blk
                                << "] for fmt=nChw" << p.blk << "c";
    }
    s.blocks = X.shape()[1];
    if (s.blocks != (p.channels + p.blk - 1) / p.blk) {
      TVM_FFI_THROW(ValueError) << kInstanceNorm << ": X has " << s.blocks
                                << " channel blocks, expected ceil(c / " << p.blk << ") for c="
                                << p.channels;
    }
    s.lanes = p.blk;
    s.channels = p.channels;
    s.groups = X.shape()[0] * s.blocks;
  }
  const int64_t per_group = s.groups * s.lanes;
  s.rows = per_group == 0 ? 0 : X.numel() / per_group;
  return s;
}

// One group's per-lane mean, multiplier and bias from its summed moments (padding lanes: all 0,
// so they normalize to 0 before the residual).
void GroupAffine(const NormParams& p, const Interleaved& s, int64_t group, const double* s1,
                 const double* s2, const float* shift, const float* scale, const float* bias,
                 float* mean, float* mul, float* add) {
  const double n = static_cast<double>(s.rows);
  for (int64_t l = 0; l < s.lanes; ++l) {
    const int64_t c = s.Channel(group, l);
    if (c >= s.channels) {
      mean[l] = mul[l] = add[l] = 0.f;
      continue;
    }
    const double m = s1[l] / n, var = std::max(0.0, s2[l] / n - m * m);
    mean[l] = static_cast<float>(shift[l] + m);
    mul[l] = static_cast<float>((scale != nullptr ? scale[c] : 1.f) /
                                std::sqrt(var + static_cast<double>(p.eps)));
    add[l] = bias != nullptr ? bias[c] : 0.f;
  }
}

// Instance norm over interleaved groups: each group's rows split into `chunks` ranges, the
// ranges' sums taken in parallel, combined per group, then the ranges normalized in parallel.
void RunInterleaved(const NormParams& p, const Interleaved& s, const float* x, const float* res,
                    float* out, const float* scale, const float* bias) {
  const int threads = omp_get_max_threads();
  const int64_t chunks = threads == 1 || s.groups >= threads ? 1
                         : std::min<int64_t>(s.rows, (threads + s.groups - 1) / s.groups);
  const int64_t items = s.groups * chunks, per = (s.rows + chunks - 1) / chunks;
  // the calling thread's buffers, by pointer: inside the parallel region a thread_local name
  // would be each worker's own
  thread_local std::vector<double> sum_buffer;
  thread_local std::vector<float> affine_buffer;
  sum_buffer.assign(static_cast<size_t>(items * 2 * s.lanes), 0.0);
  affine_buffer.resize(static_cast<size_t>(s.groups * 3 * s.lanes));
  double* sums = sum_buffer.data();
  float* affine = affine_buffer.data();
  const int64_t group_size = s.rows * s.lanes;
  auto range = [&](int64_t item, int64_t* begin, int64_t* end) {
    *begin = std::min(s.rows, (item % chunks) * per);
    *end = std::min(s.rows, *begin + per);
  };
  auto sum = [&](int64_t item) {
    int64_t b, e;
    range(item, &b, &e);
    const int64_t g = item / chunks;
    const float* xg = x + g * group_size;
    double* s1 = sums + item * 2 * s.lanes;
    InterleavedSums(xg + b * s.lanes, e - b, s.lanes, xg, s1, s1 + s.lanes);
  };
  auto combine = [&](int64_t g) {
    double* s1 = sums + g * chunks * 2 * s.lanes;
    for (int64_t k = 1; k < chunks; ++k) {
      const double* o = s1 + k * 2 * s.lanes;
      for (int64_t l = 0; l < 2 * s.lanes; ++l) s1[l] += o[l];
    }
    float* a = affine + g * 3 * s.lanes;
    GroupAffine(p, s, g, s1, s1 + s.lanes, x + g * group_size, scale, bias, a, a + s.lanes,
                a + 2 * s.lanes);
  };
  const bool relu = p.act.kind == Act::kRelu;
  auto normalize = [&](int64_t item) {
    int64_t b, e;
    range(item, &b, &e);
    const int64_t g = item / chunks, at = g * group_size + b * s.lanes;
    const float* a = affine + g * 3 * s.lanes;
    InterleavedNormalize(x + at, res != nullptr ? res + at : nullptr, out + at, e - b, s.lanes,
                         a, a + s.lanes, a + 2 * s.lanes, relu);
    if (!relu) ApplyActivation(p.act, out + at, (e - b) * s.lanes, false);
    const int64_t real = s.channels - (g % s.blocks) * s.lanes;
    if (real < s.lanes) {  // a blocked format's padding channels: 0 after the epilogue
      for (int64_t k = b; k < e; ++k) {
        std::fill(out + g * group_size + k * s.lanes + real,
                  out + g * group_size + (k + 1) * s.lanes, 0.f);
      }
    }
  };
  if (items == 1 || threads == 1) {
    for (int64_t i = 0; i < items; ++i) sum(i);
    for (int64_t g = 0; g < s.groups; ++g) combine(g);
    for (int64_t i = 0; i < items; ++i) normalize(i);
    return;
  }
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < items; ++i) sum(i);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < s.groups; ++g) combine(g);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < items; ++i) normalize(i);
  }
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
  Interleaved shape;
  if (p.blk != 0) shape = InterleavedShape(p, X);
  const int64_t channels = p.blk == 0 ? X.shape()[1] : shape.channels;
  const int64_t planes = X.shape()[0] * X.shape()[1];
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
  if (p.blk != 0) {
    RunInterleaved(p, shape, x, res, out, scale, bias);
    return;
  }
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
