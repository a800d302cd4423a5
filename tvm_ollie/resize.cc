// Bilinear and nearest 2-D resizes, written into channel slices of one output: a concatenation
// of resized tensors as one native call (tvm_ollie.cpu.resize2d).
//
// TVM fuses the resizes that feed a concatenation, the concatenation and the layout transform
// after it into one untuned kernel; at paper-size Segformer its decode head's kernel took
// 73.4 ms against ONNX Runtime's 4 Resize + Concat 17.0 ms (docs/benchmarks.md). Here the
// output is written once, row by row, rows in parallel; in channels-last the four taps of a
// bilinear resize are rows of C contiguous floats, so the interpolation is vectorized over the
// channels.
//
// The operands X_1..X_k are logical [N, C_i, H_i, W_i] tensors, each stored as nchw or nhwc
// (attribute src); Out is [N, sum C_i, OH, OW] stored as dst. Out's channels C_1 + .. +
// C_{i-1} onwards hold X_i resized to OH x OW (or copied: copy=1 for that operand, its H, W
// must be OH, OW). The resize is TVM's topi.image.resize2d, formula for formula in float32, so
// that a call replaces Relax's image.resize2d exactly (up to the rounding of a fused
// multiply-add): with s = in / out (a float32 division),
//
//   half_pixel:            in_x = (x + 0.5) s - 0.5
//   pytorch_half_pixel:    in_x = out > 1 ? (x + 0.5) s - 0.5 : 0
//   align_corners:         in_x = ((in - 1) / (out - 1)) x          (out > 1)
//   asymmetric:            in_x = s x
//   tf_half_pixel_for_nn:  in_x = (x + 0.5) s
//
// linear:  x0 = floor(in_x), t = in_x - x0, taps x0 and x0 + 1 clamped to [0, in - 1],
//          value = lerp(lerp(p00, p01, tx), lerp(p10, p11, tx), ty), lerp(a, b, t) = a(1 - t) + bt;
// nearest: the tap round(in_x) (half to even), floor(in_x + 1e-5), ceil(in_x - 1e-5),
//          ceil(in_x - 0.5) (round_prefer_floor) or floor(in_x + 0.5) (round_prefer_ceil),
//          clamped; asymmetric + floor with an integer upscale k = out / in takes x / k in
//          integers, as TVM does.
// A tap of weight 0 is not read (an identity-sized linear resize is a copy).
//
// Signature: resize2d(attrs, X_1, .., X_k, Out), float32, contiguous, k >= 1. Attributes:
// method=linear|nearest, coord=<mode above> (default half_pixel), round=round|floor|ceil|
// round_prefer_floor|round_prefer_ceil (nearest only; default round for align_corners, else
// floor: TVM's ""), src=F_1,..,F_k and dst=F (F nchw or nhwc, default nchw), copy=b_1,..,b_k
// (0 or 1, default 0).
#include <omp.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "vectors.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kResize = "tvm_ollie.cpu.resize2d";

enum class Coord { kHalfPixel, kPytorchHalfPixel, kAlignCorners, kAsymmetric, kTfHalfPixelForNn };
enum class Round { kRound, kFloor, kCeil, kPreferFloor, kPreferCeil };

struct ResizeParams {
  bool linear = true;
  Coord coord = Coord::kHalfPixel;
  Round round = Round::kFloor;
  std::vector<bool> src_nhwc;  // empty: every operand nchw
  std::vector<bool> copy;      // empty: every operand resized
  bool dst_nhwc = false;
};

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string tok;
  while (std::getline(ss, tok, ',')) out.push_back(tok);
  if (!text.empty() && text.back() == ',') out.push_back("");
  return out;
}

std::vector<bool> ParseFlags(const std::string& key, const std::string& text,
                             const std::string& yes, const std::string& no) {
  std::vector<bool> out;
  for (const std::string& tok : SplitList(text)) {
    if (tok != yes && tok != no) {
      TVM_FFI_THROW(ValueError) << kResize << ": bad attribute " << key << "=" << text
                                << ": expected a comma-separated list of " << yes << " or " << no;
    }
    out.push_back(tok == yes);
  }
  return out;
}

ResizeParams ParseResizeAttrs(const std::string& text) {
  Attrs attrs(kResize, text);
  ResizeParams p;
  p.linear = attrs.GetStr("method", "linear", {"linear", "nearest"}) == "linear";
  const std::string coord = attrs.GetStr(
      "coord", "half_pixel",
      {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"});
  p.coord = coord == "half_pixel"           ? Coord::kHalfPixel
            : coord == "pytorch_half_pixel" ? Coord::kPytorchHalfPixel
            : coord == "align_corners"      ? Coord::kAlignCorners
            : coord == "asymmetric"         ? Coord::kAsymmetric
                                            : Coord::kTfHalfPixelForNn;
  const std::string dflt = coord == "align_corners" ? "round" : "floor";
  if (p.linear && attrs.Has("round")) {
    TVM_FFI_THROW(ValueError) << kResize << ": round is for method=nearest only";
  }
  const std::string round = attrs.GetStr(
      "round", dflt, {"round", "floor", "ceil", "round_prefer_floor", "round_prefer_ceil"});
  p.round = round == "round"                ? Round::kRound
            : round == "floor"              ? Round::kFloor
            : round == "ceil"               ? Round::kCeil
            : round == "round_prefer_floor" ? Round::kPreferFloor
                                            : Round::kPreferCeil;
  if (attrs.Has("src")) p.src_nhwc = ParseFlags("src", attrs.GetRaw("src", ""), "nhwc", "nchw");
  if (attrs.Has("copy")) p.copy = ParseFlags("copy", attrs.GetRaw("copy", ""), "1", "0");
  p.dst_nhwc = attrs.GetStr("dst", "nchw", {"nchw", "nhwc"}) == "nhwc";
  attrs.CheckAllUsed();
  return p;
}

// One axis of one operand: for each output index the two taps and the weight of the second
// (nearest: one tap, i1 = i0, w = 0).
struct AxisMap {
  std::vector<int64_t> i0, i1;
  std::vector<float> w;
  bool identity = true;   // i0[x] = x and w[x] = 0 everywhere (in = out)
  bool weighted = false;  // some w[x] != 0 (else each output reads the tap i0 alone)
};

// TVM's can_convert_multiply_to_intdiv: out = k in with an integer k small enough that
// floor(x / k + 1e-5) cannot differ from x / k.
bool IntegerUpscale(int64_t in, int64_t out) {
  const float div = static_cast<float>(out) / static_cast<float>(in);
  if (std::fmod(div, 1.0f) != 0.0f) return false;
  const float check = 1.0f / (1e-5f * static_cast<float>(in) + 1e-5f);
  return !(div > check);
}

float InCoord(const ResizeParams& p, int64_t x, int64_t in, int64_t out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float fx = static_cast<float>(x);
  switch (p.coord) {
    case Coord::kHalfPixel:
      return (fx + 0.5f) * scale - 0.5f;
    case Coord::kPytorchHalfPixel:
      return out > 1 ? (fx + 0.5f) * scale - 0.5f : 0.0f;
    case Coord::kAlignCorners:
      return static_cast<float>(in - 1) / static_cast<float>(out - 1) * fx;
    case Coord::kAsymmetric:
      return scale * fx;
    case Coord::kTfHalfPixelForNn:
      return (fx + 0.5f) * scale;
  }
  return 0.0f;
}

int64_t Nearest(const ResizeParams& p, float v) {
  switch (p.round) {
    case Round::kRound:
      return static_cast<int64_t>(std::nearbyint(v));
    case Round::kFloor:
      return static_cast<int64_t>(std::floor(v + 1e-5f));
    case Round::kCeil:
      return static_cast<int64_t>(std::ceil(v - 1e-5f));
    case Round::kPreferFloor:
      return static_cast<int64_t>(std::ceil(v - 0.5f));
    case Round::kPreferCeil:
      return static_cast<int64_t>(std::floor(v + 0.5f));
  }
  return 0;
}

inline int64_t Clamp(int64_t v, int64_t in) { return v < 0 ? 0 : (v > in - 1 ? in - 1 : v); }

AxisMap MapAxis(const ResizeParams& p, bool copy, int64_t in, int64_t out) {
  AxisMap m;
  m.i0.resize(out);
  m.i1.resize(out);
  m.w.assign(out, 0.0f);
  const bool int_div = !p.linear && p.coord == Coord::kAsymmetric && p.round == Round::kFloor &&
                       IntegerUpscale(in, out);
  for (int64_t x = 0; x < out; ++x) {
    if (copy) {
      m.i0[x] = m.i1[x] = x;
    } else if (int_div) {
      m.i0[x] = m.i1[x] = Clamp(x / (out / in), in);
    } else if (!p.linear) {
      m.i0[x] = m.i1[x] = Clamp(Nearest(p, InCoord(p, x, in, out)), in);
    } else {
      const float v = InCoord(p, x, in, out);
      const float f = std::floor(v);
      const int64_t lo = static_cast<int64_t>(f);
      m.i0[x] = Clamp(lo, in);
      m.i1[x] = Clamp(lo + 1, in);
      m.w[x] = v - static_cast<float>(static_cast<int32_t>(f));
    }
    m.identity = m.identity && m.i0[x] == x && m.w[x] == 0.0f;
    m.weighted = m.weighted || m.w[x] != 0.0f;
  }
  return m;
}

// One operand as the rows see it.
struct Operand {
  const float* x = nullptr;
  int64_t c = 0, h = 0, w = 0;
  int64_t offset = 0;  // its first channel in Out
  bool nhwc = false;
  AxisMap ym, xm;
};

struct OutShape {
  int64_t c, h, w;
  bool nhwc;
};

inline float Lerp(float a, float b, float t) { return a * (1.0f - t) + b * t; }

// Channels-last to channels-last: each output pixel is C contiguous floats, from four (or one)
// rows of C contiguous input floats.
OLLIE_WIDEST_VECTORS void RowNhwc(const Operand& op, const OutShape& o, int64_t n, int64_t oy,
                                  float* out) {
  const int64_t c = op.c;
  const int64_t y0 = op.ym.i0[oy], y1 = op.ym.i1[oy];
  const float ty = op.ym.w[oy];
  const float* row0 = op.x + (n * op.h + y0) * op.w * c;
  const float* row1 = op.x + (n * op.h + y1) * op.w * c;
  float* dst = out + ((n * o.h + oy) * o.w) * o.c + op.offset;
  for (int64_t ox = 0; ox < o.w; ++ox, dst += o.c) {
    const int64_t x0 = op.xm.i0[ox], x1 = op.xm.i1[ox];
    const float tx = op.xm.w[ox];
    const float* a = row0 + x0 * c;
    if (tx == 0.0f && ty == 0.0f) {
      std::memcpy(dst, a, sizeof(float) * c);
      continue;
    }
    const float* b = row0 + x1 * c;
    const float* d = row1 + x0 * c;
    const float* e = row1 + x1 * c;
    if (ty == 0.0f) {
#pragma omp simd
      for (int64_t k = 0; k < c; ++k) dst[k] = Lerp(a[k], b[k], tx);
    } else if (tx == 0.0f) {
#pragma omp simd
      for (int64_t k = 0; k < c; ++k) dst[k] = Lerp(a[k], d[k], ty);
    } else {
#pragma omp simd
      for (int64_t k = 0; k < c; ++k) dst[k] = Lerp(Lerp(a[k], b[k], tx), Lerp(d[k], e[k], tx), ty);
    }
  }
}

// Planar to planar: each output row of each channel from one or two input rows.
OLLIE_WIDEST_VECTORS void RowNchw(const Operand& op, const OutShape& o, int64_t n, int64_t oy,
                                  float* out) {
  const int64_t y0 = op.ym.i0[oy], y1 = op.ym.i1[oy];
  const float ty = op.ym.w[oy];
  const int64_t* xi0 = op.xm.i0.data();
  const int64_t* xi1 = op.xm.i1.data();
  const float* tx = op.xm.w.data();
  for (int64_t k = 0; k < op.c; ++k) {
    const float* plane = op.x + (n * op.c + k) * op.h * op.w;
    const float* row0 = plane + y0 * op.w;
    const float* row1 = plane + y1 * op.w;
    float* dst = out + ((n * o.c + op.offset + k) * o.h + oy) * o.w;
    if (!op.xm.weighted) {
      if (op.xm.identity && ty == 0.0f) {
        std::memcpy(dst, row0, sizeof(float) * o.w);
      } else if (ty == 0.0f) {
#pragma omp simd
        for (int64_t ox = 0; ox < o.w; ++ox) dst[ox] = row0[xi0[ox]];
      } else {
#pragma omp simd
        for (int64_t ox = 0; ox < o.w; ++ox) dst[ox] = Lerp(row0[xi0[ox]], row1[xi0[ox]], ty);
      }
    } else if (ty == 0.0f) {
#pragma omp simd
      for (int64_t ox = 0; ox < o.w; ++ox) dst[ox] = Lerp(row0[xi0[ox]], row0[xi1[ox]], tx[ox]);
    } else {
#pragma omp simd
      for (int64_t ox = 0; ox < o.w; ++ox) {
        dst[ox] = Lerp(Lerp(row0[xi0[ox]], row0[xi1[ox]], tx[ox]),
                       Lerp(row1[xi0[ox]], row1[xi1[ox]], tx[ox]), ty);
      }
    }
  }
}

// Any other pair of formats: strided loads and stores, the output's contiguous axis inner.
void RowStrided(const Operand& op, const OutShape& o, int64_t n, int64_t oy, float* out) {
  // element strides of the operand and of Out, as (c, h, w)
  const int64_t sc = op.nhwc ? 1 : op.h * op.w, sh = op.nhwc ? op.w * op.c : op.w,
                sw = op.nhwc ? op.c : 1;
  const int64_t dc = o.nhwc ? 1 : o.h * o.w, dh = o.nhwc ? o.w * o.c : o.w,
                dw = o.nhwc ? o.c : 1;
  const float* base = op.x + n * op.c * op.h * op.w;
  float* dst = out + n * o.c * o.h * o.w + oy * dh + op.offset * dc;
  const int64_t y0 = op.ym.i0[oy], y1 = op.ym.i1[oy];
  const float ty = op.ym.w[oy];
  auto pixel = [&](int64_t k, int64_t ox) {
    const float* p = base + k * sc;
    const int64_t x0 = op.xm.i0[ox], x1 = op.xm.i1[ox];
    const float tx = op.xm.w[ox];
    float top = p[y0 * sh + x0 * sw];
    if (tx != 0.0f) top = Lerp(top, p[y0 * sh + x1 * sw], tx);
    if (ty == 0.0f) return top;
    float bottom = p[y1 * sh + x0 * sw];
    if (tx != 0.0f) bottom = Lerp(bottom, p[y1 * sh + x1 * sw], tx);
    return Lerp(top, bottom, ty);
  };
  if (o.nhwc) {
    for (int64_t ox = 0; ox < o.w; ++ox)
      for (int64_t k = 0; k < op.c; ++k) dst[ox * dw + k * dc] = pixel(k, ox);
  } else {
    for (int64_t k = 0; k < op.c; ++k)
      for (int64_t ox = 0; ox < o.w; ++ox) dst[ox * dw + k * dc] = pixel(k, ox);
  }
}

void Row(const Operand& op, const OutShape& o, int64_t n, int64_t oy, float* out) {
  if (op.nhwc && o.nhwc) {
    RowNhwc(op, o, n, oy, out);
  } else if (!op.nhwc && !o.nhwc) {
    RowNchw(op, o, n, oy, out);
  } else {
    RowStrided(op, o, n, oy, out);
  }
}

ffi::TensorView TensorArg(ffi::PackedArgs args, int i, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kResize << ": " << what << " must be a tensor";
  return t.value();
}

// The operands after their checks against Out: the same batch, Out's channels their sum, a
// copied operand of Out's spatial size.
std::vector<Operand> Operands(const ResizeParams& p, ffi::PackedArgs args, int k,
                              const ffi::TensorView& out, OutShape* o) {
  const int64_t n = out.shape()[0];
  *o = {p.dst_nhwc ? out.shape()[3] : out.shape()[1], p.dst_nhwc ? out.shape()[1] : out.shape()[2],
        p.dst_nhwc ? out.shape()[2] : out.shape()[3], p.dst_nhwc};
  std::vector<Operand> ops(k);
  int64_t offset = 0;
  for (int i = 0; i < k; ++i) {
    const std::string what = "X" + std::to_string(i + 1);
    ffi::TensorView t = TensorArg(args, 1 + i, what.c_str());
    Operand& op = ops[i];
    op.x = CheckFloatTensor(t, kResize, what.c_str(), 4);
    op.nhwc = !p.src_nhwc.empty() && p.src_nhwc[i];
    const bool copy = !p.copy.empty() && p.copy[i];
    if (t.ndim() != 4) {
      TVM_FFI_THROW(ValueError) << kResize << ": " << what << " has shape " << ShapeStr(t)
                                << ", expected rank 4";
    }
    op.c = t.shape()[op.nhwc ? 3 : 1];
    op.h = t.shape()[op.nhwc ? 1 : 2];
    op.w = t.shape()[op.nhwc ? 2 : 3];
    if (t.shape()[0] != n) {
      TVM_FFI_THROW(ValueError) << kResize << ": " << what << " has shape " << ShapeStr(t)
                                << ", expected batch " << n << " (Out's)";
    }
    if (copy && (op.h != o->h || op.w != o->w)) {
      TVM_FFI_THROW(ValueError) << kResize << ": " << what << " has shape " << ShapeStr(t)
                                << " but copy=1 needs Out's spatial size " << o->h << "x" << o->w;
    }
    if ((op.h == 0 || op.w == 0) && o->h * o->w > 0) {
      TVM_FFI_THROW(ValueError) << kResize << ": " << what << " has shape " << ShapeStr(t)
                                << ": nothing to resize from";
    }
    if (!copy && p.coord == Coord::kAlignCorners && (o->h == 1 || o->w == 1)) {
      TVM_FFI_THROW(ValueError) << kResize << ": coord=align_corners needs an output of at "
                                << "least 2x2, got " << o->h << "x" << o->w;
    }
    op.offset = offset;
    offset += op.c;
  }
  if (offset != o->c) {
    TVM_FFI_THROW(ValueError) << kResize << ": Out has shape " << ShapeStr(out) << ", expected "
                              << offset << " channels (the operands' sum)";
  }
  return ops;
}

void RunResize(ffi::PackedArgs args) {
  ThreadScope threads;
  std::optional<ffi::String> holder;
  const ResizeParams& p = ParsedAttrs<ResizeParams>(AttrsView(args, kResize, &holder),
                                                    ParseResizeAttrs);
  const int k = args.size() - 2;
  if (k < 1) {
    TVM_FFI_THROW(TypeError) << kResize << ": expected attrs, at least one operand and Out, got "
                             << args.size() << " arguments";
  }
  if ((!p.src_nhwc.empty() && static_cast<int>(p.src_nhwc.size()) != k) ||
      (!p.copy.empty() && static_cast<int>(p.copy.size()) != k)) {
    TVM_FFI_THROW(ValueError) << kResize << ": src and copy need one entry per operand (" << k
                              << ")";
  }
  ffi::TensorView Out = TensorArg(args, k + 1, "Out");
  float* out = CheckFloatTensor(Out, kResize, "Out", 4);
  if (Out.ndim() != 4) {
    TVM_FFI_THROW(ValueError) << kResize << ": Out has shape " << ShapeStr(Out)
                              << ", expected rank 4";
  }
  OutShape o;
  std::vector<Operand> ops = Operands(p, args, k, Out, &o);
  if (Out.numel() == 0) return;
  for (int i = 0; i < k; ++i) {
    const bool copy = !p.copy.empty() && p.copy[i];
    ops[i].ym = MapAxis(p, copy, ops[i].h, o.h);
    ops[i].xm = MapAxis(p, copy, ops[i].w, o.w);
  }
  const int64_t batch = Out.shape()[0];
  const int64_t rows = batch * o.h;
  // about 4 operations an output element (two lerps of the taps, weights shared)
  threads.SerialBelow(4.0 * static_cast<double>(Out.numel()));
  auto row = [&](int64_t r) {
    for (const Operand& op : ops) Row(op, o, r / o.h, r % o.h, out);
  };
  if (rows == 1 || omp_get_max_threads() == 1) {
    for (int64_t r = 0; r < rows; ++r) row(r);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) row(r);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed(kResize, [](ffi::PackedArgs args, ffi::Any*) { RunResize(args); });
}

}  // namespace tvm_ollie
