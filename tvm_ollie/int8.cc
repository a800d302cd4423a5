// tvm_ollie.cpu.conv2d_int8 and tvm_ollie.cpu.matmul_int8: 8-bit integer convolution and matmul
// on oneDNN (u8/s8 source, s8 weights), with the source zero point, the weight (or combined)
// scales, a bias and the destination zero point applied inside the primitive.
//
// Calling convention (destination-passing style, Out last; optional operands in this order):
//   tvm_ollie.cpu.conv2d_int8(attrs, data, weight, [xzp], [scale], [bias], [yzp], Out)
//   tvm_ollie.cpu.matmul_int8(attrs, A, B, [xzp], [scale], [bias], [yzp], Out)
// data/A: uint8 or int8; weight/B: int8 (OIHW or OHWI; B [K, N], or [N, K] with tb=1).
// xzp, yzp: int32 [1] (source and destination zero points); scale: float32 [1] or [O] (per
// output channel), the multiplier of the int32 accumulator; bias: float32 [O], added after the
// scale. Out: int32, float32, uint8 or int8:
//   Out = saturate(round(scale * Σ (x - xzp) * w + bias) + yzp)
// (no scale: 1; round and saturate only for 8-bit Out; oneDNN rounds half to even). Padding
// reads xzp (it contributes zero to the sum), as ONNX's ConvInteger/QLinearConv specify.
// With rq=1 the epilogue is ONNX's QLinearConv/QLinearMatMul requantization instead:
//   Out = saturate(round_half_even(float(Σ (x - xzp) * w + bias) * scale) + yzp)
// bias (integers held in float32) added before the scale, the scale a binary multiply post-op,
// the rounding an eltwise_round post-op before the zero point is added (oneDNN would otherwise
// add yzp to the unrounded value, which moves ties: fl(0.5 + 2^-20 + 200) = 200.5). Exact while
// |Σ| and |bias| stay within 2^24 (float32 integers: float(Σ) + float(bias) is then float(Σ +
// bias) rounded once); beyond, the caller only uses it where every such value saturates.
// attrs (conv): layout=NCHW|NHWC, klayout=OIHW|OHWI, stride=SH,SW, pad=TOP,LEFT,BOTTOM,RIGHT,
//               dil=DH,DW, groups=G, wpacked=0|1 with kernel=KH,KW; (matmul): tb=0|1;
//               (both): xzp=0|1, scale=none|tensor|channel, bias=0|1, yzp=0|1, rq=0|1.
// oneDNN converts the int32 accumulator to float32 for its epilogue, also for an int32 Out:
// an int32 Out is exact while |accumulator| <= 2^24 (the pass only rewrites such calls).
//
// Packed weights (conv): oneDNN reorders the s8 weights into its blocked format with the
// source-zero-point compensation on every call, which costs 100x the convolution itself at small
// spatial sizes (256x256x3x3: 8-12 ms against 0.09 ms). tvm_ollie.cpu.conv2d_int8_pack_weight
// (attrs, data, weight, Out, Packed) does it once (int8 Packed of conv2d_int8_packed_size(attrs,
// data, weight, Out) bytes: a 64-byte header, magic, a hash of the problem, the format and the
// CPU ISA, and the OpenMP thread count it was made under, then the blocked weights); a call with
// wpacked=1;kernel=KH,KW takes it as weight and rejects a header made for another problem, format
// or machine. oneDNN's int8 format can differ by thread count, so a call that would run with
// another count than its pack's (the stall fallback's serial window, a serial threshold or
// set_num_threads changed since) runs with the pack's count instead (RunAtPackThreads). The matmul's B likewise:
// tvm_ollie.cpu.matmul_int8_packed_size(attrs, A, B, Out) / matmul_int8_pack_weight(attrs, A, B,
// Out, Packed), then calls with wpacked=1 (B the 1-D pack; K from A, N from Out).
//
// tvm_ollie.cpu.conv2d_int8_preferred_format(attrs, data, weight, Out) -> [src, dst]: the
// activation formats ("nchw", "nhwc", "other") the primitive of such a call runs on; a call in
// another layout reorders inside (transform/int8_layout.py keeps chains in that format).
//
// Per call: the attrs are parsed once per thread (ParsedAttrs), the pack hash and the sizes are
// kept with the cached primitive, and each thread keeps the dnnl::memory objects of each
// primitive and only resets their data handles; calls below the serial threshold run on the
// calling thread (ThreadScope::SerialBelow, as the float kernels). Together these took a
// 1x64x4x4 3x3 rq=1 call from ~20 to ~9.5 us of CPU (Python loop, one thread).
#include <omp.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

namespace {

constexpr const char* kConvName = "tvm_ollie.cpu.conv2d_int8";
constexpr const char* kMatmulName = "tvm_ollie.cpu.matmul_int8";

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

enum class Scale { kNone, kTensor, kChannel };

// The quantization keys both kernels share.
struct QuantParams {
  bool xzp = false, bias = false, yzp = false, rq = false;
  Scale scale = Scale::kNone;
  std::string canonical;
};

QuantParams ParseQuant(Attrs* attrs) {
  QuantParams q;
  q.xzp = attrs->GetBool("xzp", false);
  std::string s = attrs->GetStr("scale", "none", {"none", "tensor", "channel"});
  q.scale = s == "tensor" ? Scale::kTensor : (s == "channel" ? Scale::kChannel : Scale::kNone);
  q.bias = attrs->GetBool("bias", false);
  q.yzp = attrs->GetBool("yzp", false);
  q.rq = attrs->GetBool("rq", false);
  q.canonical = std::string(";xzp=") + (q.xzp ? "1" : "0") + ";scale=" + s +
                ";bias=" + (q.bias ? "1" : "0") + ";yzp=" + (q.yzp ? "1" : "0") +
                ";rq=" + (q.rq ? "1" : "0");
  return q;
}

// The oneDNN data type of an 8-bit/int32/float32 tensor; throws for anything else.
dt DataType(const ffi::TensorView& t, const char* kernel, const char* what, bool allow_wide) {
  DLDataType d = t.dtype();
  if (d.lanes == 1 && d.bits == 8 && d.code == kDLUInt) return dt::u8;
  if (d.lanes == 1 && d.bits == 8 && d.code == kDLInt) return dt::s8;
  if (allow_wide && d.lanes == 1 && d.bits == 32 && d.code == kDLInt) return dt::s32;
  if (allow_wide && d.lanes == 1 && d.bits == 32 && d.code == kDLFloat) return dt::f32;
  TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be uint8 or int8"
                           << (allow_wide ? ", int32 or float32" : "");
}

// Checks a CPU, contiguous tensor of `bits`-bit elements; returns its data (byte_offset applied).
void* CheckTensor(const ffi::TensorView& t, const char* kernel, const char* what, int rank) {
  if (t.device().device_type != kDLCPU) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must be on the CPU";
  }
  if (rank >= 0 && t.ndim() != rank) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must have rank " << rank
                              << ", got shape " << ShapeStr(t);
  }
  if (!t.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must be contiguous (row-major)";
  }
  if (t.data_ptr() == nullptr && t.numel() > 0) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " has no data";
  }
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

// The optional operands, checked against their kinds and the output channel count.
struct QuantOperands {
  void* xzp = nullptr;
  void* scale = nullptr;
  void* bias = nullptr;
  void* yzp = nullptr;
};

void CheckKind(const ffi::TensorView& t, const char* kernel, const char* what, DLDataTypeCode code,
               int64_t n) {
  DLDataType d = t.dtype();
  if (d.code != code || d.bits != 32 || d.lanes != 1) {
    TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be "
                             << (code == kDLInt ? "int32" : "float32");
  }
  if (t.ndim() != 1 || t.shape()[0] != n) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " has shape " << ShapeStr(t)
                              << ", expected [" << n << "]";
  }
}

// Reads the optional operands from args[*i...] (advancing *i).
QuantOperands QuantArgs(ffi::PackedArgs args, int* i, const QuantParams& q, const char* kernel,
                        int64_t channels) {
  auto tensor = [&](const char* what) {
    auto t = args[(*i)++].try_cast<ffi::TensorView>();
    if (!t.has_value()) TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be a tensor";
    return t.value();
  };
  QuantOperands o;
  if (q.xzp) {
    ffi::TensorView t = tensor("xzp");
    CheckKind(t, kernel, "xzp", kDLInt, 1);
    o.xzp = CheckTensor(t, kernel, "xzp", 1);
  }
  if (q.scale != Scale::kNone) {
    ffi::TensorView t = tensor("scale");
    CheckKind(t, kernel, "scale", kDLFloat, q.scale == Scale::kChannel ? channels : 1);
    o.scale = CheckTensor(t, kernel, "scale", 1);
  }
  if (q.bias) {
    ffi::TensorView t = tensor("bias");
    CheckKind(t, kernel, "bias", kDLFloat, channels);
    o.bias = CheckTensor(t, kernel, "bias", 1);
  }
  if (q.yzp) {
    ffi::TensorView t = tensor("yzp");
    CheckKind(t, kernel, "yzp", kDLInt, 1);
    o.yzp = CheckTensor(t, kernel, "yzp", 1);
  }
  return o;
}

int QuantOperandCount(const QuantParams& q) {
  return (q.xzp ? 1 : 0) + (q.scale != Scale::kNone ? 1 : 0) + (q.bias ? 1 : 0) +
         (q.yzp ? 1 : 0);
}

// The binary post-op operand holding rq=1's scale: ones but for the channel axis `axis` of a
// rank-`rank` destination (per channel), or all ones (per tensor).
dnnl::memory::desc RqScaleDesc(const QuantParams& q, int rank, int axis, int64_t channels) {
  dims d(rank, 1), strides(rank, 1);
  if (q.scale == Scale::kChannel) d[axis] = channels;
  for (int k = rank - 2; k >= 0; --k) strides[k] = strides[k + 1] * d[k + 1];
  return dnnl::memory::desc(d, dt::f32, strides);
}

// Zero points and scales as runtime arguments: the primitive is cached per shape, not per value.
// rq=1: the scale is a binary multiply post-op (after the bias) and a round post-op follows.
dnnl::primitive_attr QuantAttr(const QuantParams& q, int channel_mask,
                               const dnnl::memory::desc& rq_scale) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (q.xzp) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  if (q.rq) {
    dnnl::post_ops ops;
    if (q.scale != Scale::kNone) ops.append_binary(dnnl::algorithm::binary_mul, rq_scale);
    ops.append_eltwise(dnnl::algorithm::eltwise_round, 0.f, 0.f);
    attr.set_post_ops(ops);
  } else if (q.scale != Scale::kNone) {
    attr.set_scales_mask(DNNL_ARG_WEIGHTS, q.scale == Scale::kChannel ? channel_mask : 0);
  }
  if (q.yzp) attr.set_zero_points_mask(DNNL_ARG_DST, 0);
  return attr;
}

std::string TypeKey(dt a, dt b, dt c) {
  return std::to_string(static_cast<int>(a)) + "," + std::to_string(static_cast<int>(b)) + "," +
         std::to_string(static_cast<int>(c));
}

// ---------------------------------------------------------------------------------------------
// conv2d_int8

struct ConvParams {
  bool nhwc = false, ohwi = false, wpacked = false;
  int64_t pkh = 0, pkw = 0;  // kernel=KH,KW (with wpacked=1)
  int64_t sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0, dh = 1, dw = 1, groups = 1;
  QuantParams q;
  std::string canonical;
};

ConvParams ParseConvAttrs(const std::string& text) {
  Attrs attrs(kConvName, text);
  ConvParams p;
  p.nhwc = attrs.GetStr("layout", "NCHW", {"NCHW", "NHWC"}) == "NHWC";
  p.ohwi = attrs.GetStr("klayout", "OIHW", {"OIHW", "OHWI"}) == "OHWI";
  auto s = attrs.GetInts("stride", 2, {1, 1});
  auto pad = attrs.GetInts("pad", 4, {0, 0, 0, 0});
  auto d = attrs.GetInts("dil", 2, {1, 1});
  p.groups = attrs.GetInt("groups", 1);
  p.wpacked = attrs.GetBool("wpacked", false);
  auto kernel = attrs.GetInts("kernel", 2, {0, 0});
  p.pkh = kernel[0], p.pkw = kernel[1];
  p.q = ParseQuant(&attrs);
  attrs.CheckAllUsed();
  p.sh = s[0], p.sw = s[1], p.pt = pad[0], p.pl = pad[1], p.pb = pad[2], p.pr = pad[3];
  p.dh = d[0], p.dw = d[1];
  if (p.sh < 1 || p.sw < 1 || p.dh < 1 || p.dw < 1 || p.groups < 1) {
    TVM_FFI_THROW(ValueError) << kConvName << ": stride, dil and groups must be >= 1";
  }
  if (p.pt < 0 || p.pl < 0 || p.pb < 0 || p.pr < 0) {
    TVM_FFI_THROW(ValueError) << kConvName << ": pad must be >= 0";
  }
  if (p.wpacked && (p.pkh < 1 || p.pkw < 1)) {
    TVM_FFI_THROW(ValueError) << kConvName << ": wpacked=1 needs kernel=KH,KW";
  }
  p.canonical = std::string(p.nhwc ? "NHWC" : "NCHW") + (p.ohwi ? ";OHWI" : ";OIHW") + ";" +
                std::to_string(p.sh) + "," + std::to_string(p.sw) + ";" + std::to_string(p.pt) +
                "," + std::to_string(p.pl) + "," + std::to_string(p.pb) + "," +
                std::to_string(p.pr) + ";" + std::to_string(p.dh) + "," + std::to_string(p.dw) +
                ";" + std::to_string(p.groups) + p.q.canonical;
  return p;
}

struct ConvShape {
  int64_t N, C, H, W, O, I, KH, KW, OH, OW;
};

ConvShape CheckConvShape(const ConvParams& p, const std::vector<int64_t>& x,
                         const std::vector<int64_t>& w, const std::vector<int64_t>& out) {
  if (x.size() != 4 || w.size() != 4 || out.size() != 4) {
    TVM_FFI_THROW(ValueError) << kConvName << ": data, weight and Out must be 4-D";
  }
  ConvShape s;
  s.N = x[0];
  s.C = p.nhwc ? x[3] : x[1];
  s.H = p.nhwc ? x[1] : x[2];
  s.W = p.nhwc ? x[2] : x[3];
  s.O = w[0];
  s.I = p.ohwi ? w[3] : w[1];
  s.KH = p.ohwi ? w[1] : w[2];
  s.KW = p.ohwi ? w[2] : w[3];
  if (s.I * p.groups != s.C || s.O % p.groups != 0 || s.O == 0 || s.KH < 1 || s.KW < 1) {
    TVM_FFI_THROW(ValueError) << kConvName << ": weight does not fit data with groups="
                              << p.groups << " (need I * groups == C and O % groups == 0)";
  }
  const int64_t ekh = (s.KH - 1) * p.dh + 1, ekw = (s.KW - 1) * p.dw + 1;
  const int64_t hp = s.H + p.pt + p.pb, wp = s.W + p.pl + p.pr;
  if (hp < ekh || wp < ekw) {
    TVM_FFI_THROW(ValueError) << kConvName << ": the kernel is larger than the padded input";
  }
  s.OH = (hp - ekh) / p.sh + 1;
  s.OW = (wp - ekw) / p.sw + 1;
  std::vector<int64_t> want = p.nhwc ? std::vector<int64_t>{s.N, s.OH, s.OW, s.O}
                                     : std::vector<int64_t>{s.N, s.O, s.OH, s.OW};
  if (out != want) {
    TVM_FFI_THROW(ValueError) << kConvName << ": Out has the wrong shape for data and weight";
  }
  return s;
}

dnnl::memory::desc Activation4d(dt type, bool nhwc, int64_t n, int64_t c, int64_t h, int64_t w) {
  dims st = nhwc ? dims{h * w * c, 1, w * c, c} : dims{c * h * w, h * w, w, 1};
  return dnnl::memory::desc(dims{n, c, h, w}, type, st);
}

// The user's s8 weight: dims {O, I, KH, KW} or {G, O/G, I, KH, KW}, strides of its layout.
dnnl::memory::desc ConvWeightDesc(const ConvParams& p, const ConvShape& s) {
  const int64_t so = s.I * s.KH * s.KW;
  const int64_t si = p.ohwi ? 1 : s.KH * s.KW, sh = p.ohwi ? s.KW * s.I : s.KW,
                sw = p.ohwi ? s.I : 1;
  if (p.groups == 1) return dnnl::memory::desc(dims{s.O, s.I, s.KH, s.KW}, dt::s8,
                                               dims{so, si, sh, sw});
  const int64_t og = s.O / p.groups;
  return dnnl::memory::desc(dims{p.groups, og, s.I, s.KH, s.KW}, dt::s8,
                            dims{og * so, so, si, sh, sw});
}

struct Int8Conv {
  dnnl::convolution_forward prim;
  dnnl::memory::desc user_src, user_wei, user_dst, bias_md, src_md, wei_md, dst_md, scratch_md;
  dnnl::memory::desc rq_scale;  // rq=1's scale operand
  Reorder src_in, wei_in, dst_out;
  size_t src_bytes = 0, wei_bytes = 0, dst_bytes = 0, scratch_bytes = 0;
  uint64_t pack_hash = 0;  // PackHash of this problem (set at creation)
};

std::shared_ptr<Int8Conv> CreateConv(const ConvParams& p, const ConvShape& s, dt src_t,
                                     dt dst_t) {
  auto e = std::make_shared<Int8Conv>();
  e->user_src = Activation4d(src_t, p.nhwc, s.N, s.C, s.H, s.W);
  e->user_dst = Activation4d(dst_t, p.nhwc, s.N, s.O, s.OH, s.OW);
  e->user_wei = ConvWeightDesc(p, s);
  auto any = [](const dnnl::memory::desc& md) {
    return dnnl::memory::desc(md.get_dims(), md.get_data_type(), dnnl::memory::format_tag::any);
  };
  // Per output channel: mask bit 0 of {O, I, ...}, bits 0 and 1 of {G, O/G, I, ...}.
  e->rq_scale = RqScaleDesc(p.q, 4, 1, s.O);
  const dnnl::primitive_attr attr = QuantAttr(p.q, p.groups == 1 ? 1 : 3, e->rq_scale);
  dims strides{p.sh, p.sw}, dil{p.dh - 1, p.dw - 1}, pad_l{p.pt, p.pl}, pad_r{p.pb, p.pr};
  const auto prop = dnnl::prop_kind::forward_inference;
  const auto alg = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc pd;
  if (p.q.bias) {
    e->bias_md = dnnl::memory::desc(dims{s.O}, dt::f32, dims{1});
    pd = dnnl::convolution_forward::primitive_desc(Engine(), prop, alg, any(e->user_src),
                                                   any(e->user_wei), e->bias_md, any(e->user_dst),
                                                   strides, dil, pad_l, pad_r, attr);
  } else {
    pd = dnnl::convolution_forward::primitive_desc(Engine(), prop, alg, any(e->user_src),
                                                   any(e->user_wei), any(e->user_dst), strides,
                                                   dil, pad_l, pad_r, attr);
  }
  e->src_md = pd.src_desc();
  e->wei_md = pd.weights_desc();
  e->dst_md = pd.dst_desc();
  e->scratch_md = pd.scratchpad_desc();
  e->prim = dnnl::convolution_forward(pd);
  e->src_in.Init(e->user_src, e->src_md);
  e->wei_in.Init(e->user_wei, e->wei_md);
  e->dst_out.Init(e->dst_md, e->user_dst);
  e->src_bytes = e->src_md.get_size();
  e->wei_bytes = e->wei_md.get_size();
  e->dst_bytes = e->dst_md.get_size();
  e->scratch_bytes = e->scratch_md.get_size();
  return e;
}

ffi::TensorView Arg(ffi::PackedArgs args, int i, const char* kernel, const char* what) {
  auto t = args[i].try_cast<ffi::TensorView>();
  if (!t.has_value()) TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be a tensor";
  return t.value();
}

std::string AttrsArg(ffi::PackedArgs args, const char* kernel) {
  if (args.size() < 1) TVM_FFI_THROW(TypeError) << kernel << ": missing attrs";
  auto text = args[0].try_cast<ffi::String>();
  if (!text.has_value()) {
    TVM_FFI_THROW(TypeError) << kernel << ": first argument must be the attrs string";
  }
  return std::string(text.value());
}

// One conv2d_int8 problem: its shape, types and cached primitive.
struct ConvProblem {
  ConvShape s;
  dt src_t, dst_t;
  std::shared_ptr<Int8Conv> e;
};

// The weight dims of a packed call in klayout order: O from Out, I = C / groups, kernel=KH,KW.
std::vector<int64_t> PackedWeightDims(const ConvParams& p, const std::vector<int64_t>& x,
                                      const std::vector<int64_t>& out) {
  if (x.size() != 4 || out.size() != 4) {
    TVM_FFI_THROW(ValueError) << kConvName << ": data and Out must be 4-D";
  }
  const int64_t c = p.nhwc ? x[3] : x[1], o = p.nhwc ? out[3] : out[1];
  if (c % p.groups != 0) {
    TVM_FFI_THROW(ValueError) << kConvName << ": data channels not divisible by groups";
  }
  return p.ohwi ? std::vector<int64_t>{o, p.pkh, p.pkw, c / p.groups}
                : std::vector<int64_t>{o, c / p.groups, p.pkh, p.pkw};
}

constexpr size_t kPackHeaderBytes = 64;
constexpr uint64_t kPackMagic = 0x3849454c4c4f4b50ULL;  // "PKOLLIE8"

// How a problem's thread count is chosen before its primitive is looked up (the cache keys by
// it): a call's by SerialBelow (threshold and stall window), a pack's by the threshold alone (a
// pack outlives a passing stall), or fixed by RunAtPackThreads.
enum class Threading { kCall, kPack, kFixed };

void ChooseThreads(ThreadScope* threads, Threading how, double flops) {
  if (how == Threading::kCall) threads->SerialBelow(flops);
  if (how == Threading::kPack) threads->SerialBelowThreshold(flops);
}

// The header of a pack: magic, the problem's hash, the OpenMP thread count it was made under.
void WritePackHeader(char* packed, uint64_t hash) {
  std::memset(packed, 0, kPackHeaderBytes);
  const uint64_t header[3] = {kPackMagic, hash, static_cast<uint64_t>(omp_get_max_threads())};
  std::memcpy(packed, header, sizeof(header));
}

// Whether a wpacked call must run at its pack's thread count: a pack of this problem whose hash
// is not that of the primitive the call resolved to, made under another thread count (header
// word 2; 0 in packs of older libraries). The scope is then fixed to that count and the caller
// resolves again; a pack of another problem or machine is still rejected by the header check.
bool RunAtPackThreads(const void* w, int64_t numel, uint64_t hash, ThreadScope* threads) {
  if (numel < static_cast<int64_t>(kPackHeaderBytes)) return false;
  uint64_t header[3];
  std::memcpy(header, w, sizeof(header));
  const int n = static_cast<int>(header[2]);
  if (header[0] != kPackMagic || header[1] == hash || n <= 0 || n == omp_get_max_threads()) {
    return false;
  }
  threads->Fix(n);
  return true;
}

// A hash of the problem (its cache key), the blocked weight format and the CPU ISA (FNV-1a).
uint64_t PackHash(const std::string& key, const dnnl::memory::desc& md) {
  std::string text = key + "|isa=" + std::to_string(static_cast<int>(
                                         dnnl::get_effective_cpu_isa())) +
                     "|size=" + std::to_string(md.get_size());
  for (const dims& d :
       {md.get_dims(), md.get_strides(), md.get_inner_blks(), md.get_inner_idxs()}) {
    for (int64_t v : d) text += "," + std::to_string(v);
    text += "|";
  }
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

double ConvOps(const ConvShape& s) { return 2.0 * s.N * s.O * s.OH * s.OW * s.I * s.KH * s.KW; }

// Resolves the problem and its cached primitive. A call below the serial threshold runs on the
// calling thread alone (ThreadScope::SerialBelow, as the float kernels do: no OpenMP region to
// wake for a few microseconds of work); this is done before the lookup, which is keyed by the
// thread count in effect, and a pack is made for the entry its calls will use.
ConvProblem ResolveConv(const ConvParams& p, const ffi::TensorView& X,
                        const std::vector<int64_t>& w_dims, const ffi::TensorView& Out,
                        ThreadScope* threads, Threading how) {
  ConvProblem c{{}, DataType(X, kConvName, "data", false), DataType(Out, kConvName, "Out", true),
                nullptr};
  c.s = CheckConvShape(p, Dims(X), w_dims, Dims(Out));
  const ConvShape& s = c.s;
  ChooseThreads(threads, how, ConvOps(s));
  const std::string key =
      std::string(kConvName) + "|" + p.canonical + "|" + TypeKey(c.src_t, dt::s8, c.dst_t) + "|" +
      std::to_string(s.N) + "," + std::to_string(s.C) + "," + std::to_string(s.H) + "," +
      std::to_string(s.W) + "|" + std::to_string(s.O) + "," + std::to_string(s.KH) + "," +
      std::to_string(s.KW);
  c.e = CachedGet<Int8Conv>(key, [&]() {
    auto e = CreateConv(p, s, c.src_t, c.dst_t);
    e->pack_hash = PackHash(key, e->wei_md);
    return e;
  });
  return c;
}

int64_t PackedBytes(const ConvProblem& c) {
  return static_cast<int64_t>(kPackHeaderBytes + c.e->wei_bytes);
}

// The blocked weights of a wpacked=1 call, after checking the header.
void* PackedWeights(const ConvProblem& c, const ffi::TensorView& Wt) {
  void* w = CheckTensor(Wt, kConvName, "weight", 1);
  uint64_t header[2];
  if (Wt.numel() == PackedBytes(c)) std::memcpy(header, w, sizeof(header));
  if (Wt.numel() != PackedBytes(c) || header[0] != kPackMagic ||
      header[1] != c.e->pack_hash) {
    TVM_FFI_THROW(ValueError) << kConvName << ": the packed weight was made for another problem, "
                              << "format or machine; repack it with "
                              << "tvm_ollie.cpu.conv2d_int8_pack_weight in this process";
  }
  return static_cast<char*>(w) + kPackHeaderBytes;
}

// The arguments of one thread's calls to one cached primitive: dnnl::memory objects made once
// per (thread, primitive), whose data handles each call sets (creating the ~8 objects of a call
// anew cost about as much as a small convolution). Weights are not kept here: a blocked weight
// memory would be zero-padded again at every handle change.
struct CallArgs {
  std::shared_ptr<void> entry;  // keeps the primitive (the key of this cache) alive
  std::unordered_map<int, dnnl::memory> args;
};

std::unordered_map<int, dnnl::memory>* ThreadArgs(const std::shared_ptr<void>& entry) {
  constexpr size_t kMaxEntries = 4096;
  thread_local std::unordered_map<const void*, CallArgs> cache;
  auto it = cache.find(entry.get());
  if (it != cache.end()) return &it->second.args;
  if (cache.size() >= kMaxEntries) cache.clear();
  return &cache.emplace(entry.get(), CallArgs{entry, {}}).first->second.args;
}

// Sets args[arg] to memory of `md` at `data`: the kept object with a new handle, or a new one.
void SetArg(std::unordered_map<int, dnnl::memory>* args, int arg, const dnnl::memory::desc& md,
            void* data) {
  auto it = args->find(arg);
  if (it == args->end()) {
    args->emplace(arg, dnnl::memory(md, Engine(), data));
  } else if (it->second.get_data_handle() != data) {
    it->second.set_data_handle(data);
  }
}

// The quantization operands of a call as arguments of the primitive.
void SetQuantArgs(const QuantParams& q, const QuantOperands& o, int64_t channels,
                  const dnnl::memory::desc& bias_md, const dnnl::memory::desc& rq_scale,
                  std::unordered_map<int, dnnl::memory>* args) {
  const dnnl::memory::desc one_s32(dims{1}, dt::s32, dims{1});
  if (q.xzp) SetArg(args, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, one_s32, o.xzp);
  if (q.rq && q.scale != Scale::kNone) {
    SetArg(args, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, rq_scale, o.scale);
  } else if (q.scale != Scale::kNone) {
    const int64_t n = q.scale == Scale::kChannel ? channels : 1;
    SetArg(args, DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS,
           dnnl::memory::desc(dims{n}, dt::f32, dims{1}), o.scale);
  }
  if (q.bias) SetArg(args, DNNL_ARG_BIAS, bias_md, o.bias);
  if (q.yzp) SetArg(args, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, one_s32, o.yzp);
}

const ConvParams& ConvAttrsArg(ffi::PackedArgs args, const char* kernel) {
  return ParsedAttrs<ConvParams>(AttrsArg(args, kernel), ParseConvAttrs);
}

void Conv2dInt8(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const ConvParams& p = ConvAttrsArg(args, kConvName);
  const int want = 4 + QuantOperandCount(p.q);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kConvName << ": expected " << want << " arguments for attrs \""
                             << p.canonical << "\", got " << args.size();
  }
  ffi::TensorView X = Arg(args, 1, kConvName, "data");
  ffi::TensorView Wt = Arg(args, 2, kConvName, "weight");
  ffi::TensorView Out = Arg(args, args.size() - 1, kConvName, "Out");
  if (DataType(Wt, kConvName, "weight", false) != dt::s8) {
    TVM_FFI_THROW(TypeError) << kConvName << ": weight must be int8";
  }
  void* x = CheckTensor(X, kConvName, "data", 4);
  void* out = CheckTensor(Out, kConvName, "Out", 4);
  const std::vector<int64_t> w_dims =
      p.wpacked ? PackedWeightDims(p, Dims(X), Dims(Out)) : Dims(Wt);
  ConvProblem c = ResolveConv(p, X, w_dims, Out, &threads, Threading::kCall);
  if (p.wpacked && RunAtPackThreads(CheckTensor(Wt, kConvName, "weight", 1), Wt.numel(),
                                    c.e->pack_hash, &threads)) {
    c = ResolveConv(p, X, w_dims, Out, &threads, Threading::kFixed);
  }
  int i = 3;
  const QuantOperands o = QuantArgs(args, &i, p.q, kConvName, c.s.O);
  if (Out.numel() == 0) return;
  Int8Conv* e = c.e.get();
  const dnnl::engine& eng = Engine();
  std::unordered_map<int, dnnl::memory>* cargs = ThreadArgs(c.e);
  // Scratch slots: 0 conv scratchpad, 1 src, 2 weights, 3 dst, 5 reorder scratch.
  if (e->src_in.needed) {
    dnnl::memory user_src(e->user_src, eng, x);
    SetArg(cargs, DNNL_ARG_SRC, e->src_md, ScratchBuffer(1, e->src_bytes));
    e->src_in.Run(user_src, cargs->at(DNNL_ARG_SRC), 5);
  } else {
    SetArg(cargs, DNNL_ARG_SRC, e->src_md, x);
  }
  if (p.wpacked) {
    (*cargs)[DNNL_ARG_WEIGHTS] = dnnl::memory(e->wei_md, eng, PackedWeights(c, Wt));
  } else {
    dnnl::memory wei(e->user_wei, eng, CheckTensor(Wt, kConvName, "weight", 4));
    if (e->wei_in.needed) {
      dnnl::memory blocked(e->wei_md, eng, ScratchBuffer(2, e->wei_bytes));
      e->wei_in.Run(wei, blocked, 5);
      wei = blocked;
    }
    (*cargs)[DNNL_ARG_WEIGHTS] = wei;
  }
  SetArg(cargs, DNNL_ARG_DST, e->dst_md, e->dst_out.needed ? ScratchBuffer(3, e->dst_bytes) : out);
  SetQuantArgs(p.q, o, c.s.O, e->bias_md, e->rq_scale, cargs);
  if (e->scratch_bytes > 0) {
    SetArg(cargs, DNNL_ARG_SCRATCHPAD, e->scratch_md, ScratchBuffer(0, e->scratch_bytes));
  }
  Execute(e->prim, *cargs);
  if (e->dst_out.needed) {
    e->dst_out.Run(cargs->at(DNNL_ARG_DST), dnnl::memory(e->user_dst, eng, out), 5);
  }
  Stream().wait();
}

// conv2d_int8_packed_size(attrs, data, weight, Out) and conv2d_int8_pack_weight(attrs, data,
// weight, Out, Packed): attrs those of the calls that will use it, without wpacked; data and Out
// give the shapes and types only.
ConvProblem PackProblem(ffi::PackedArgs args, const char* name, int count,
                        ThreadScope* threads) {
  if (args.size() != count) {
    TVM_FFI_THROW(TypeError) << name << ": expected " << count << " arguments";
  }
  const ConvParams& p = ConvAttrsArg(args, name);
  if (p.wpacked) TVM_FFI_THROW(ValueError) << name << ": attrs must not set wpacked";
  ffi::TensorView Wt = Arg(args, 2, name, "weight");
  if (DataType(Wt, name, "weight", false) != dt::s8) {
    TVM_FFI_THROW(TypeError) << name << ": weight must be int8";
  }
  return ResolveConv(p, Arg(args, 1, name, "data"), Dims(Wt), Arg(args, 3, name, "Out"),
                     threads, Threading::kPack);
}

constexpr const char* kPackSizeName = "tvm_ollie.cpu.conv2d_int8_packed_size";
constexpr const char* kPackName = "tvm_ollie.cpu.conv2d_int8_pack_weight";

void PackedSize(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  *rv = PackedBytes(PackProblem(args, kPackSizeName, 4, &threads));
}

void PackWeight(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const ConvProblem c = PackProblem(args, kPackName, 5, &threads);
  ffi::TensorView Wt = Arg(args, 2, kPackName, "weight");
  ffi::TensorView P = Arg(args, 4, kPackName, "Packed");
  if (DataType(P, kPackName, "Packed", false) != dt::s8 || P.ndim() != 1 ||
      P.numel() != PackedBytes(c)) {
    TVM_FFI_THROW(ValueError) << kPackName << ": Packed must be int8 [" << PackedBytes(c)
                              << "] (" << kPackSizeName << "), got " << ShapeStr(P);
  }
  char* packed = static_cast<char*>(CheckTensor(P, kPackName, "Packed", 1));
  WritePackHeader(packed, c.e->pack_hash);
  dnnl::memory user(c.e->user_wei, Engine(), CheckTensor(Wt, kPackName, "weight", 4));
  dnnl::memory blocked(c.e->wei_md, Engine(), packed + kPackHeaderBytes);
  if (c.e->wei_in.needed) {
    c.e->wei_in.Run(user, blocked, 5);
    Stream().wait();
  } else {
    std::memcpy(packed + kPackHeaderBytes, user.get_data_handle(), c.e->wei_bytes);
  }
}

constexpr const char* kPreferredName = "tvm_ollie.cpu.conv2d_int8_preferred_format";

// "nchw" or "nhwc" for a plain 4-D activation descriptor, else "other".
std::string PlainFormat(const dnnl::memory::desc& md) {
  const dims d = md.get_dims(), st = md.get_strides();
  if (d.size() != 4 || st.size() != 4 || !md.get_inner_blks().empty()) return "other";
  if (st[3] == 1 && st[2] == d[3] && st[1] == d[2] * d[3]) return "nchw";
  if (st[1] == 1 && st[3] == d[1] && st[2] == d[3] * d[1]) return "nhwc";
  return "other";
}

// conv2d_int8_preferred_format(attrs, data, weight, Out) -> [src format, dst format]: the
// activation formats oneDNN's int8 primitive for this call runs on ("nchw", "nhwc" or "other"),
// whatever the call's own layout: a call whose layout differs reorders inside.
void PreferredFormat(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const ConvProblem c = PackProblem(args, kPreferredName, 4, &threads);
  *rv = ffi::Array<ffi::String>{ffi::String(PlainFormat(c.e->src_md)),
                                ffi::String(PlainFormat(c.e->dst_md))};
}

// ---------------------------------------------------------------------------------------------
// matmul_int8: A [..., M, K] (batch folded into M), B [K, N] or [N, K] (tb=1).

struct MatmulParams {
  bool tb = false, wpacked = false;
  QuantParams q;
  std::string canonical;
};

MatmulParams ParseMatmulAttrs(const std::string& text) {
  Attrs attrs(kMatmulName, text);
  MatmulParams p;
  p.tb = attrs.GetBool("tb", false);
  p.wpacked = attrs.GetBool("wpacked", false);
  p.q = ParseQuant(&attrs);
  attrs.CheckAllUsed();
  p.canonical = std::string("tb=") + (p.tb ? "1" : "0") + p.q.canonical;
  return p;
}

// One cached matmul primitive. Packed (wpacked=1, and the pack functions): the weights in the
// format oneDNN chooses (format_tag::any) with the source zero point's compensation, made once
// by a reorder from the user's [K, N]; plain: the user's [K, N] itself, and oneDNN computes the
// compensation (sum over K of each column) inside every call.
struct Int8Matmul {
  dnnl::matmul prim;
  dnnl::memory::desc src_md, user_wei, wei_md, bias_md, dst_md, scratch_md, rq_scale;
  Reorder wei_in;
  size_t wei_bytes = 0, scratch_bytes = 0;
  uint64_t pack_hash = 0;
};

std::shared_ptr<Int8Matmul> CreateMatmul(const MatmulParams& p, bool packed, int64_t M,
                                         int64_t K, int64_t N, dt src_t, dt dst_t) {
  auto e = std::make_shared<Int8Matmul>();
  e->src_md = dnnl::memory::desc(dims{M, K}, src_t, dims{K, 1});
  e->user_wei = dnnl::memory::desc(dims{K, N}, dt::s8, p.tb ? dims{1, K} : dims{N, 1});
  const dnnl::memory::desc wei_any =
      packed ? dnnl::memory::desc(dims{K, N}, dt::s8, dnnl::memory::format_tag::any)
             : e->user_wei;
  e->dst_md = dnnl::memory::desc(dims{M, N}, dst_t, dims{N, 1});
  e->rq_scale = RqScaleDesc(p.q, 2, 1, N);
  const dnnl::primitive_attr attr = QuantAttr(p.q, 2, e->rq_scale);  // per column: bit 1
  dnnl::matmul::primitive_desc pd;
  if (p.q.bias) {
    e->bias_md = dnnl::memory::desc(dims{1, N}, dt::f32, dims{N, 1});
    pd = dnnl::matmul::primitive_desc(Engine(), e->src_md, wei_any, e->bias_md, e->dst_md, attr);
  } else {
    pd = dnnl::matmul::primitive_desc(Engine(), e->src_md, wei_any, e->dst_md, attr);
  }
  e->wei_md = pd.weights_desc();
  e->wei_in.Init(e->user_wei, e->wei_md);
  e->wei_bytes = e->wei_md.get_size();
  e->scratch_md = pd.scratchpad_desc();
  e->scratch_bytes = e->scratch_md.get_size();
  e->prim = dnnl::matmul(pd);
  return e;
}

// One matmul_int8 problem: M, K, N, the types and the cached primitive (after the checks).
struct MatmulProblem {
  int64_t M = 0, K = 0, N = 0;
  std::shared_ptr<Int8Matmul> e;
};

// K and N from B's shape, or for a packed call (1-D B) from A's last dim and Out's.
MatmulProblem ResolveMatmul(const MatmulParams& p, bool packed, const ffi::TensorView& A,
                            const ffi::TensorView& B, const ffi::TensorView& Out,
                            const char* name, ThreadScope* threads, Threading how) {
  const dt src_t = DataType(A, name, "A", false);
  if (DataType(B, name, "B", false) != dt::s8) {
    TVM_FFI_THROW(TypeError) << name << ": B must be int8";
  }
  const dt dst_t = DataType(Out, name, "Out", true);
  const std::vector<int64_t> ad = Dims(A), od = Dims(Out);
  if (ad.size() < 2 || od.size() != ad.size()) {
    TVM_FFI_THROW(ValueError) << name << ": A and Out must have the same rank >= 2";
  }
  MatmulProblem m;
  if (p.wpacked) {
    if (B.ndim() != 1) TVM_FFI_THROW(ValueError) << name << ": with wpacked=1 B must be 1-D";
    m.K = ad.back(), m.N = od.back();
  } else {
    if (B.ndim() != 2) TVM_FFI_THROW(ValueError) << name << ": B must have rank 2";
    m.K = p.tb ? B.shape()[1] : B.shape()[0], m.N = p.tb ? B.shape()[0] : B.shape()[1];
  }
  std::vector<int64_t> want_out(ad);
  if (ad.back() != m.K) {
    TVM_FFI_THROW(ValueError) << name << ": A " << ShapeStr(A) << " does not fit B "
                              << ShapeStr(B) << (p.tb ? " (tb=1)" : "");
  }
  want_out.back() = m.N;
  if (od != want_out) {
    TVM_FFI_THROW(ValueError) << name << ": Out has shape " << ShapeStr(Out)
                              << ", expected A's with the last dim " << m.N;
  }
  m.M = m.K > 0 ? A.numel() / m.K : 0;
  ChooseThreads(threads, how, 2.0 * m.M * m.K * m.N);
  const std::string key = std::string(kMatmulName) + "|" + p.canonical + "|wp=" +
                          (packed ? "1" : "0") + "|" + TypeKey(src_t, dt::s8, dst_t) + "|" +
                          std::to_string(m.M) + "x" + std::to_string(m.K) + "x" +
                          std::to_string(m.N);
  m.e = CachedGet<Int8Matmul>(key, [&]() {
    auto e = CreateMatmul(p, packed, m.M, m.K, m.N, src_t, dst_t);
    e->pack_hash = PackHash(key, e->wei_md);
    return e;
  });
  return m;
}

int64_t MatmulPackedBytes(const Int8Matmul& e) {
  return static_cast<int64_t>(kPackHeaderBytes + e.wei_bytes);
}

void MatmulInt8(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const MatmulParams& p = ParsedAttrs<MatmulParams>(AttrsArg(args, kMatmulName),
                                                    ParseMatmulAttrs);
  const int want = 4 + QuantOperandCount(p.q);
  if (args.size() != want) {
    TVM_FFI_THROW(TypeError) << kMatmulName << ": expected " << want << " arguments for attrs \""
                             << p.canonical << "\", got " << args.size();
  }
  ffi::TensorView A = Arg(args, 1, kMatmulName, "A");
  ffi::TensorView B = Arg(args, 2, kMatmulName, "B");
  ffi::TensorView Out = Arg(args, args.size() - 1, kMatmulName, "Out");
  void* a = CheckTensor(A, kMatmulName, "A", -1);
  void* b = CheckTensor(B, kMatmulName, "B", -1);
  void* out = CheckTensor(Out, kMatmulName, "Out", -1);
  MatmulProblem m = ResolveMatmul(p, p.wpacked, A, B, Out, kMatmulName, &threads,
                                  Threading::kCall);
  if (p.wpacked && RunAtPackThreads(b, B.numel(), m.e->pack_hash, &threads)) {
    m = ResolveMatmul(p, true, A, B, Out, kMatmulName, &threads, Threading::kFixed);
  }
  int i = 3;
  const QuantOperands o = QuantArgs(args, &i, p.q, kMatmulName, m.N);
  if (Out.numel() == 0) return;
  Int8Matmul* e = m.e.get();
  std::unordered_map<int, dnnl::memory>* margs = ThreadArgs(m.e);
  if (p.wpacked) {
    uint64_t header[2] = {0, 0};
    if (B.numel() == MatmulPackedBytes(*e)) std::memcpy(header, b, sizeof(header));
    if (B.numel() != MatmulPackedBytes(*e) || header[0] != kPackMagic ||
        header[1] != e->pack_hash) {
      TVM_FFI_THROW(ValueError) << kMatmulName << ": the packed B was made for another problem, "
                                << "format or machine; repack it with "
                                << "tvm_ollie.cpu.matmul_int8_pack_weight in this process";
    }
    (*margs)[DNNL_ARG_WEIGHTS] =
        dnnl::memory(e->wei_md, Engine(), static_cast<char*>(b) + kPackHeaderBytes);
  } else {
    SetArg(margs, DNNL_ARG_WEIGHTS, e->wei_md, b);  // plain [K, N]: no padding to redo
  }
  SetArg(margs, DNNL_ARG_SRC, e->src_md, a);
  SetArg(margs, DNNL_ARG_DST, e->dst_md, out);
  SetQuantArgs(p.q, o, m.N, e->bias_md, e->rq_scale, margs);
  if (e->scratch_bytes > 0) {
    SetArg(margs, DNNL_ARG_SCRATCHPAD, e->scratch_md, ScratchBuffer(0, e->scratch_bytes));
  }
  Execute(e->prim, *margs);
  Stream().wait();
}

// matmul_int8_packed_size(attrs, A, B, Out) -> int and matmul_int8_pack_weight(attrs, A, B, Out,
// Packed): attrs those of the calls that will use it, without wpacked; A and Out give the shapes
// and types only. Packed: int8 [size], a 64-byte header (magic, hash of the problem, the format
// and the CPU ISA) and B in the primitive's format with its compensation.
constexpr const char* kMatmulPackSizeName = "tvm_ollie.cpu.matmul_int8_packed_size";
constexpr const char* kMatmulPackName = "tvm_ollie.cpu.matmul_int8_pack_weight";

MatmulProblem MatmulPackProblem(ffi::PackedArgs args, const char* name, int count,
                                ThreadScope* threads) {
  if (args.size() != count) {
    TVM_FFI_THROW(TypeError) << name << ": expected " << count << " arguments";
  }
  const MatmulParams& p = ParsedAttrs<MatmulParams>(AttrsArg(args, name), ParseMatmulAttrs);
  if (p.wpacked) TVM_FFI_THROW(ValueError) << name << ": attrs must not set wpacked";
  return ResolveMatmul(p, true, Arg(args, 1, name, "A"), Arg(args, 2, name, "B"),
                       Arg(args, 3, name, "Out"), name, threads, Threading::kPack);
}

void MatmulPackedSize(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  *rv = MatmulPackedBytes(*MatmulPackProblem(args, kMatmulPackSizeName, 4, &threads).e);
}

void MatmulPackWeight(ffi::PackedArgs args, ffi::Any* rv) {
  ThreadScope threads;
  const MatmulProblem m = MatmulPackProblem(args, kMatmulPackName, 5, &threads);
  ffi::TensorView B = Arg(args, 2, kMatmulPackName, "B");
  ffi::TensorView P = Arg(args, 4, kMatmulPackName, "Packed");
  if (DataType(P, kMatmulPackName, "Packed", false) != dt::s8 || P.ndim() != 1 ||
      P.numel() != MatmulPackedBytes(*m.e)) {
    TVM_FFI_THROW(ValueError) << kMatmulPackName << ": Packed must be int8 ["
                              << MatmulPackedBytes(*m.e) << "] (" << kMatmulPackSizeName
                              << "), got " << ShapeStr(P);
  }
  char* packed = static_cast<char*>(CheckTensor(P, kMatmulPackName, "Packed", 1));
  WritePackHeader(packed, m.e->pack_hash);
  dnnl::memory user(m.e->user_wei, Engine(), CheckTensor(B, kMatmulPackName, "B", 2));
  dnnl::memory blocked(m.e->wei_md, Engine(), packed + kPackHeaderBytes);
  if (m.e->wei_in.needed) {
    m.e->wei_in.Run(user, blocked, 5);
    Stream().wait();
  } else {
    std::memcpy(packed + kPackHeaderBytes, user.get_data_handle(), m.e->wei_bytes);
  }
}

// Whether oneDNN's int8 kernels here sum u8 x s8 products exactly: with VNNI (vpdpbusd) they do;
// without it they add pairs of products in saturating int16 (pmaddubsw), exact only for weights
// in [-64, 63].
bool ExactProducts() {
  const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
  const int avx2_vnni = static_cast<int>(dnnl::cpu_isa::avx2_vnni);
  const int avx512_vnni = static_cast<int>(dnnl::cpu_isa::avx512_core_vnni);
  return (isa & avx2_vnni) == avx2_vnni || (isa & avx512_vnni) == avx512_vnni;
}

}  // namespace

std::string Int8Info() {
  return std::string("conv2d_int8/matmul_int8: oneDNN int8 (u8/s8 x s8), zero points and scales "
                     "as runtime arguments, conv on oneDNN's blocked formats; exact products: ") +
         (ExactProducts() ? "yes (VNNI)" : "only for weights in [-64, 63] (no VNNI)");
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed(kConvName, Conv2dInt8)
      .def_packed(kMatmulName, MatmulInt8)
      .def_packed(kPackSizeName, PackedSize)
      .def_packed(kPackName, PackWeight)
      .def_packed(kPreferredName, PreferredFormat)
      .def_packed(kMatmulPackSizeName, MatmulPackedSize)
      .def_packed(kMatmulPackName, MatmulPackWeight)
      .def("tvm_ollie.cpu.int8_exact_products", []() -> bool { return ExactProducts(); });
}

}  // namespace tvm_ollie
