// Shared helpers of the tvm-ollie CPU library: tensor checks, activations as oneDNN post-ops,
// the oneDNN engine and the primitive cache, thread settings.
#ifndef TVM_OLLIE_COMMON_H_
#define TVM_OLLIE_COMMON_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "attrs.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "stall.h"

namespace tvm_ollie {

// Adds the activation as an eltwise post-op (no-op for kNone).
void AppendActivation(const Activation& act, dnnl::post_ops* ops);
// The convolution kernels' primitive attributes: a user scratchpad, then the epilogue as
// post-ops: the residual as a sum (the caller fills the destination with it before the call;
// a binary_add post-op runs oneDNN's reference code on plain formats, ~100x slower), then the
// activation.
dnnl::primitive_attr ConvEpilogueAttr(bool residual, const Activation& act);
// In-place activation over n contiguous floats (the OpenBLAS path, the GEMM deconvolution, the
// norms), by the widest vector loops this CPU runs (activation.cc). Large n is split over the
// OpenMP threads unless `parallel` is false (a caller that is itself one thread of a parallel
// region).
void ApplyActivation(const Activation& act, float* data, int64_t n, bool parallel = true);

// ---------------------------------------------------------------------------------------------
// Tensor checks.
// Checks float32, CPU, contiguous, rank >= min_rank; returns the data pointer (byte_offset
// applied). `what` names the argument in errors. C strings, not std::string: a kernel name such
// as "tvm_ollie.cpu.conv2d" is longer than the short-string buffer, so a std::string parameter
// cost a heap allocation per tensor per call (docs/native-library.md, "Per call").
float* CheckFloatTensor(const tvm::ffi::TensorView& t, const char* kernel, const char* what,
                        int min_rank);

// ---------------------------------------------------------------------------------------------
// oneDNN engine, per-thread stream, per-thread scratch buffers.
dnnl::engine& Engine();
dnnl::stream& Stream();
// A per-thread buffer of at least `bytes` bytes (64-byte aligned); slot selects one of a few
// independent buffers so that one call can hold several at once.
void* ScratchBuffer(int slot, size_t bytes);

// Runs `prim` on the calling thread's stream with a call site's kept arguments. Through oneDNN's
// C API with a per-thread argument array: the C++ `primitive::execute` builds a std::vector of
// the arguments on every call (an allocation and a free per kernel call).
void Execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args);

// A reorder with a user scratchpad (thread-safe execution of a cached primitive).
struct Reorder {
  bool needed = false;
  dnnl::reorder prim;
  dnnl::memory::desc scratch_md;
  void Init(const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
    needed = from != to;
    if (!needed) return;
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::reorder::primitive_desc pd(Engine(), from, Engine(), to, attr);
    scratch_md = pd.scratchpad_desc();
    prim = dnnl::reorder(pd);
  }
  void Run(const dnnl::memory& from, const dnnl::memory& to, int scratch_slot) const {
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    size_t n = scratch_md.get_size();
    if (n > 0) {
      args[DNNL_ARG_SCRATCHPAD] =
          dnnl::memory(scratch_md, Engine(), ScratchBuffer(scratch_slot, n));
    }
    prim.execute(Stream(), args);
  }
  // The arguments of repeated runs between kept memory objects (a call site's), with a kept
  // scratchpad memory whose handle RunKept sets: no map or memory object made per run.
  std::unordered_map<int, dnnl::memory> KeptArgs(const dnnl::memory& from,
                                                 const dnnl::memory& to) const {
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    if (needed && scratch_md.get_size() > 0) {
      args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(scratch_md, Engine(), DNNL_MEMORY_NONE);
    }
    return args;
  }
  void RunKept(const std::unordered_map<int, dnnl::memory>& args, int scratch_slot) const {
    auto it = args.find(DNNL_ARG_SCRATCHPAD);
    if (it != args.end()) {
      void* buf = ScratchBuffer(scratch_slot, scratch_md.get_size());
      if (it->second.get_data_handle() != buf) it->second.set_data_handle(buf);
    }
    Execute(prim, args);
  }
};

// Points `m` at `data` (a handle change only when it differs: a call site's memory objects
// are kept between calls and most calls pass the same buffers).
inline void Point(const dnnl::memory& m, void* data) {
  if (m.get_data_handle() != data) m.set_data_handle(data);
}

// Process-wide cache of prepared kernels (primitives, descriptors), keyed by a string built from
// the kernel name, attributes and shapes, and by the OpenMP thread count in effect (oneDNN sizes
// a primitive's work split and scratchpad for the count at its creation). Never keyed by data
// pointers.
class PrimitiveCache {
 public:
  static PrimitiveCache& Global();
  std::shared_ptr<void> Get(const std::string& key, const std::function<std::shared_ptr<void>()>&
                                                        create);
  size_t size();
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<void>> map_;
  int64_t hits_ = 0, misses_ = 0;
};

template <typename T>
std::shared_ptr<T> CachedGet(const std::string& key, const std::function<std::shared_ptr<T>()>&
                                                         create) {
  return std::static_pointer_cast<T>(PrimitiveCache::Global().Get(
      key, [&]() -> std::shared_ptr<void> { return create(); }));
}

// The parsed form of a kernel's attribute string, parsed once per string and thread. A Relax
// module passes the same literal string on every call, and parsing it (the keys, the numbers,
// the canonical cache key) took about 4.5 us of CPU per conv2d call, as much as a small kernel
// (docs/per-call.md). The lookup takes a view of the caller's text (no copy: the map's keys view
// the strings its entries own). A string that fails to parse is not kept (its error is thrown at
// every call). The reference is valid until the calling thread's next ParsedAttrs call for T;
// it is mutable so that a kernel can keep per-thread state of the call site with it.
template <typename T>
T& ParsedAttrs(std::string_view text, T (*parse)(const std::string&)) {
  constexpr size_t kMaxStrings = 1024;  // a bound for processes that build strings at run time
  struct Entry {
    std::string text;
    T value;
  };
  thread_local std::unordered_map<std::string_view, std::unique_ptr<Entry>> parsed;
  auto it = parsed.find(text);
  if (it != parsed.end()) return it->second->value;
  std::string owned(text);
  T value = parse(owned);
  if (parsed.size() >= kMaxStrings) parsed.clear();
  auto entry = std::make_unique<Entry>(Entry{std::move(owned), std::move(value)});
  std::string_view key(entry->text);
  return parsed.emplace(key, std::move(entry)).first->second->value;
}

// The shapes of a kernel call's tensor arguments (rank, then dims, for each): the key of its call
// site (ConvSite, DeconvSite, MatmulSite), kept per attribute string and thread. Add returns false when the
// shapes do not fit (the call then runs without a kept site).
struct ShapeKey {
  static constexpr int kMax = 40;
  std::array<int64_t, kMax> d{};
  int n = 0;
  bool Add(const tvm::ffi::TensorView& t) {
    if (n + 1 + t.ndim() > kMax) return false;
    d[n++] = t.ndim();
    for (int i = 0; i < t.ndim(); ++i) d[n++] = t.shape()[i];
    return true;
  }
  bool operator==(const ShapeKey& o) const {
    return n == o.n && std::equal(d.begin(), d.begin() + n, o.d.begin());
  }
};

struct ShapeKeyHash {
  size_t operator()(const ShapeKey& k) const {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < k.n; ++i) h = (h ^ static_cast<uint64_t>(k.d[i])) * 1099511628211ULL;
    return static_cast<size_t>(h);
  }
};

// The attribute string (argument 0) of a packed call as a view: valid while `holder`, which
// keeps the caller's string object alive, is. No copy (a raw C string is wrapped once).
std::string_view AttrsView(tvm::ffi::PackedArgs args, const char* kernel,
                           std::optional<tvm::ffi::String>* holder);

// ---------------------------------------------------------------------------------------------
// Threads: one count for OpenMP (oneDNN) and OpenBLAS.
void SetNumThreads(int n);
int GetNumThreads();
void InitThreadsOnce();
// Held for the duration of every kernel call: sets the calling thread's OpenMP thread count to
// the library's and restores the caller's own on exit. OpenMP's count is per calling thread and
// shared with everything else in the process that uses OpenMP (PyTorch reads it as its
// intra-op thread count), so a kernel must not leave it changed.
class ThreadScope {
 public:
  ThreadScope();
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
  // Run the rest of this call on the calling thread alone (no OpenMP region, so no worker to
  // wake or wait for) when its work, `flops` floating-point operations, is below SerialFlops().
  // Call it before the primitive is looked up: the cache keys by the thread count in effect.
  // A call that stays parallel also runs serially while a recent stall holds parallel calls on
  // the calling thread (stall.h); with `best_ns`, its call site's fastest parallel run, it is
  // timed, and a stall of its own opens that window (docs/threads.md, "Stalled workers").
  void SerialBelow(double flops, int64_t* best_ns = nullptr);
  // SerialBelow's threshold alone, without the stall window: for work whose result outlives the
  // call and must not depend on a passing stall (a weight packed for the primitive of a thread
  // count, int8.cc).
  void SerialBelowThreshold(double flops);
  // Run the rest of this call with `n` OpenMP threads, whatever SerialBelow chose (a prepacked
  // weight made for that count's primitive, int8.cc); the call is then not timed.
  void Fix(int n);
  // Whether SerialBelow ran this call on the calling thread for a stall window (not for its
  // size): a prepacked weight then keeps the window's count rather than its pack's (conv2d.cc).
  bool HeldByStall() const { return held_by_stall_; }

 private:
  int previous_;
  bool held_by_stall_ = false;
  int64_t* best_ns_ = nullptr;  // the timed call's site (null: not timed)
  int64_t start_ns_ = 0;
  double flops_ = 0;  // the timed call's work (a stall bound of its own: stall.h)
};

// The work below which a kernel call runs single-threaded (ThreadScope::SerialBelow); 0: never.
// Default from TVM_OLLIE_SERIAL_FLOPS, else kDefaultSerialFlops.
constexpr int64_t kDefaultSerialFlops = 1000000;
int64_t SerialFlops();
void SetSerialFlops(int64_t flops);

// OpenBLAS entry points (prefixed names of scipy-openblas32).
void BlasSetNumThreads(int n);
std::string BlasConfig();

}  // namespace tvm_ollie

#endif  // TVM_OLLIE_COMMON_H_
