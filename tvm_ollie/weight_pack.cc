// Headers of packed weights (weight_pack.h).
#include "weight_pack.h"

#include <cstring>

namespace tvm_ollie {
namespace weight_pack {

namespace {

uint64_t Fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

void AddDims(std::string* text, const char* what, const dnnl::memory::dims& d) {
  *text += std::string("|") + what;
  for (int64_t v : d) *text += "," + std::to_string(v);
}

}  // namespace

uint64_t Hash(const std::string& key, const dnnl::memory::desc& md) {
  const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
  std::string text = key + "|isa=" + std::to_string(isa);
  AddDims(&text, "dims", md.get_dims());
  AddDims(&text, "strides", md.get_strides());
  AddDims(&text, "blks", md.get_inner_blks());
  AddDims(&text, "idxs", md.get_inner_idxs());
  text += "|size=" + std::to_string(md.get_size());
  return Fnv1a(text);
}

uint64_t DimsHash(const dnnl::memory::dims& dims) {
  std::string text = "dims";
  for (int64_t v : dims) text += "," + std::to_string(v);
  return Fnv1a(text);
}

uint64_t TagOf(const dnnl::memory::desc& md) {
  for (int t = dnnl_format_tag_any + 1; t < dnnl_format_tag_last; ++t) {
    try {
      dnnl::memory::desc cand(md.get_dims(), md.get_data_type(),
                              static_cast<dnnl::memory::format_tag>(t));
      if (cand == md) return static_cast<uint64_t>(t);
    } catch (const dnnl::error&) {
      continue;  // a tag of another rank
    }
  }
  return 0;
}

Header MakeHeader(const std::string& key, const dnnl::memory::desc& md, uint64_t magic) {
  return Header{magic, Hash(key, md), TagOf(md), md.get_size(), DimsHash(md.get_dims())};
}

Header ReadHeader(const float* data, int64_t numel) {
  Header h;
  if (numel < kHeaderFloats) return h;
  uint64_t v[5];
  std::memcpy(v, data, sizeof(v));
  return Header{v[0], v[1], v[2], v[3], v[4]};
}

void WriteHeader(const Header& h, float* data) {
  std::memset(data, 0, kHeaderFloats * sizeof(float));
  const uint64_t v[5] = {h.magic, h.hash, h.tag, h.bytes, h.dims};
  std::memcpy(data, v, sizeof(v));
}

int64_t PackedFloats(uint64_t bytes) {
  return kHeaderFloats + static_cast<int64_t>((bytes + 3) / 4);
}

}  // namespace weight_pack
}  // namespace tvm_ollie
