// Attribute parsing, activations and shape helpers (see attrs.h).
#include "attrs.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace tvm_ollie {

namespace ffi = tvm::ffi;

// ---------------------------------------------------------------------------------------------
Attrs::Attrs(const std::string& kernel, const std::string& text) : kernel_(kernel), text_(text) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    // trim spaces
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (!item.empty()) {
      size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) {
        TVM_FFI_THROW(ValueError) << kernel_ << ": bad attribute '" << item << "' in \"" << text_
                                  << "\" (expected key=value)";
      }
      std::string key = item.substr(0, eq), value = item.substr(eq + 1);
      if (values_.count(key)) {
        TVM_FFI_THROW(ValueError) << kernel_ << ": attribute '" << key << "' given twice in \""
                                  << text_ << "\"";
      }
      values_[key] = value;
      used_[key] = false;
    }
    pos = end + 1;
  }
}

void Attrs::Bad(const std::string& key, const std::string& why) const {
  auto it = values_.find(key);
  TVM_FFI_THROW(ValueError) << kernel_ << ": bad value '" << (it == values_.end() ? "" : it->second)
                            << "' for attribute '" << key << "' (" << why << ") in \"" << text_
                            << "\"";
}

bool Attrs::GetBool(const std::string& key, bool dflt) {
  auto it = values_.find(key);
  if (it == values_.end()) return dflt;
  used_[key] = true;
  if (it->second == "0") return false;
  if (it->second == "1") return true;
  Bad(key, "expected 0 or 1");
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

int64_t Attrs::GetInt(const std::string& key, int64_t dflt) {
  auto it = values_.find(key);
  if (it == values_.end()) return dflt;
  used_[key] = true;
  int64_t v;
  if (!ParseInt(it->second, &v)) Bad(key, "expected an integer");
  return v;
}

std::vector<int64_t> Attrs::GetInts(const std::string& key, size_t n, std::vector<int64_t> dflt) {
  auto it = values_.find(key);
  if (it == values_.end()) return dflt;
  used_[key] = true;
  std::vector<int64_t> out;
  std::stringstream ss(it->second);
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    int64_t v;
    if (!ParseInt(tok, &v)) Bad(key, "expected " + std::to_string(n) + " comma-separated integers");
    out.push_back(v);
  }
  if (out.size() != n || (!it->second.empty() && it->second.back() == ',')) {
    Bad(key, "expected " + std::to_string(n) + " comma-separated integers");
  }
  return out;
}

std::string Attrs::GetStr(const std::string& key, const std::string& dflt,
                          const std::vector<std::string>& allowed) {
  auto it = values_.find(key);
  if (it == values_.end()) return dflt;
  used_[key] = true;
  for (const auto& a : allowed) {
    if (a == it->second) return a;
  }
  std::string why = "expected one of";
  for (const auto& a : allowed) why += " " + a;
  Bad(key, why);
}

std::string Attrs::GetRaw(const std::string& key, const std::string& dflt) {
  auto it = values_.find(key);
  if (it == values_.end()) return dflt;
  used_[key] = true;
  return it->second;
}

void Attrs::CheckAllUsed() const {
  std::string unknown;
  for (const auto& kv : used_) {
    if (!kv.second) unknown += (unknown.empty() ? "" : ", ") + kv.first;
  }
  if (!unknown.empty()) {
    TVM_FFI_THROW(ValueError) << kernel_ << ": unknown attribute(s) " << unknown << " in \""
                              << text_ << "\"";
  }
}

// ---------------------------------------------------------------------------------------------
bool ParseFloat(const std::string& s, float* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  float v = std::strtof(s.c_str(), &end);
  if (end != s.c_str() + s.size() || std::isnan(v)) return false;  // inf is a valid bound
  *out = v;
  return true;
}

// The activations with parameters, written PREFIX followed by '_'-separated decimal numbers.
struct ParamActivation {
  const char* prefix;
  Act kind;
  size_t params;  // alpha[, beta]
};
static const ParamActivation kParamActivations[] = {
    {"hardswish_", Act::kHardswish, 2},
    {"hardsigmoid_", Act::kHardsigmoid, 2},
    {"leaky_relu_", Act::kLeakyRelu, 1},
    {"scale_", Act::kScale, 1},
};

// `n` finite decimal numbers separated by '_' (numbers hold no '_') into out[0..n).
static bool ParseParams(std::string rest, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    size_t us = i + 1 < n ? rest.find('_') : rest.size();
    if (us == std::string::npos || !ParseFloat(rest.substr(0, us), &out[i])) return false;
    if (!std::isfinite(out[i])) return false;
    rest = us < rest.size() ? rest.substr(us + 1) : "";
  }
  return rest.empty();
}

Activation ParseActivation(const Attrs& attrs, const std::string& value) {
  Activation a;
  a.text = value;
  for (const ParamActivation& pa : kParamActivations) {
    const std::string prefix = pa.prefix;
    if (value.rfind(prefix, 0) != 0) continue;
    float p[2] = {0.f, 0.f};
    if (!ParseParams(value.substr(prefix.size()), pa.params, p)) {
      TVM_FFI_THROW(ValueError) << attrs.kernel() << ": bad activation '" << value
                                << "' (expected hardswish_A_B, hardsigmoid_A_B, leaky_relu_A or "
                                   "scale_A with finite decimal A, B, e.g. leaky_relu_0.1)";
    }
    a.kind = pa.kind;
    a.alpha = p[0];
    a.beta = p[1];
    return a;
  }
  if (value == "none") {
    a.kind = Act::kNone;
  } else if (value == "relu") {
    a.kind = Act::kRelu;
  } else if (value == "sigmoid") {
    a.kind = Act::kSigmoid;
  } else if (value == "tanh") {
    a.kind = Act::kTanh;
  } else if (value == "gelu") {
    a.kind = Act::kGelu;
  } else if (value == "gelu_tanh") {
    a.kind = Act::kGeluTanh;
  } else if (value == "silu") {
    a.kind = Act::kSilu;
  } else if (value.rfind("clip_", 0) == 0) {
    // clip_LO_HI; LO may be negative ("clip_-1_1"), so split at the last '_'.
    std::string rest = value.substr(5);
    size_t us = rest.rfind('_');
    bool ok = us != std::string::npos && us > 0 && ParseFloat(rest.substr(0, us), &a.lo) &&
              ParseFloat(rest.substr(us + 1), &a.hi) && a.lo <= a.hi;
    if (!ok) {
      TVM_FFI_THROW(ValueError) << attrs.kernel() << ": bad activation '" << value
                                << "' (expected clip_LO_HI with decimal LO <= HI, e.g. clip_0_6 "
                                   "or clip_0.0_inf)";
    }
    a.kind = Act::kClip;
  } else {
    TVM_FFI_THROW(ValueError) << attrs.kernel() << ": bad activation '" << value
                              << "' (expected none, relu, clip_LO_HI, sigmoid, tanh, gelu, "
                                 "gelu_tanh, silu, hardswish_A_B, hardsigmoid_A_B, "
                                 "leaky_relu_A or scale_A)";
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
std::string ShapeStr(const ffi::TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.shape()[i]);
  return s + "]";
}

std::vector<int64_t> Dims(const ffi::TensorView& t) {
  return std::vector<int64_t>(t.shape().begin(), t.shape().end());
}

GemmShape CheckGemmShapes(const char* kernel, bool ta, bool tb, const ffi::TensorView& A,
                          const ffi::TensorView& B, const ffi::TensorView& Out) {
  GemmShape pr;
  const int ra = A.ndim(), rb = B.ndim();
  const int64_t a0 = A.shape()[ra - 2], a1 = A.shape()[ra - 1];
  const int64_t b0 = B.shape()[rb - 2], b1 = B.shape()[rb - 1];
  pr.M = ta ? a1 : a0;
  pr.N = tb ? b0 : b1;
  const int64_t ka = ta ? a0 : a1, kb = tb ? b1 : b0;
  if (ka != kb) {
    TVM_FFI_THROW(ValueError) << kernel << ": inner dimensions differ: A " << ShapeStr(A)
                              << (ta ? " (ta=1)" : "") << " has K=" << ka << ", B "
                              << ShapeStr(B) << (tb ? " (tb=1)" : "") << " has K=" << kb;
  }
  pr.K = ka;
  const int nb = std::max(ra, rb) - 2;
  pr.a_batch.assign(nb, 1);
  pr.b_batch.assign(nb, 1);
  pr.batch.assign(nb, 1);
  for (int i = 0; i < ra - 2; ++i) pr.a_batch[nb - (ra - 2) + i] = A.shape()[i];
  for (int i = 0; i < rb - 2; ++i) pr.b_batch[nb - (rb - 2) + i] = B.shape()[i];
  for (int i = 0; i < nb; ++i) {
    const int64_t x = pr.a_batch[i], y = pr.b_batch[i];
    if (x != y && x != 1 && y != 1) {
      TVM_FFI_THROW(ValueError) << kernel << ": batch dimensions of A " << ShapeStr(A)
                                << " and B " << ShapeStr(B) << " do not broadcast";
    }
    pr.batch[i] = x == 1 ? y : x;
    pr.count *= pr.batch[i];
  }
  std::vector<int64_t> want = pr.batch;
  want.push_back(pr.M);
  want.push_back(pr.N);
  if (Dims(Out) != want) {
    std::string w = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    TVM_FFI_THROW(ValueError) << kernel << ": Out has shape " << ShapeStr(Out) << ", expected "
                              << w << "] for A " << ShapeStr(A) << " and B " << ShapeStr(B);
  }
  return pr;
}

}  // namespace tvm_ollie
