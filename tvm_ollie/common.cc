// Shared helpers of the tvm-ollie native library (see common.h).
#include "common.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "cblas.h"

namespace tvm_ollie {

namespace ffi = tvm::ffi;

// ---------------------------------------------------------------------------------------------
dnnl::primitive_attr ConvEpilogueAttr(bool residual, const Activation& act) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (residual) ops.append_sum(1.f);
  AppendActivation(act, &ops);
  attr.set_post_ops(ops);
  return attr;
}

void AppendActivation(const Activation& act, dnnl::post_ops* ops) {
  using alg = dnnl::algorithm;
  switch (act.kind) {
    case Act::kNone:
      return;
    case Act::kRelu:
      ops->append_eltwise(alg::eltwise_relu, 0.f, 0.f);
      return;
    case Act::kClip:
      ops->append_eltwise(alg::eltwise_clip, act.lo, act.hi);
      return;
    case Act::kSigmoid:
      ops->append_eltwise(alg::eltwise_logistic, 0.f, 0.f);
      return;
    case Act::kTanh:
      ops->append_eltwise(alg::eltwise_tanh, 0.f, 0.f);
      return;
    case Act::kGelu:
      ops->append_eltwise(alg::eltwise_gelu_erf, 0.f, 0.f);
      return;
    case Act::kGeluTanh:
      ops->append_eltwise(alg::eltwise_gelu_tanh, 0.f, 0.f);
      return;
    case Act::kSilu:
      ops->append_eltwise(alg::eltwise_swish, 1.f, 0.f);
      return;
    case Act::kHardswish:  // oneDNN 3: d = s * max(0, min(1, alpha * s + beta))
      ops->append_eltwise(alg::eltwise_hardswish, act.alpha, act.beta);
      return;
    case Act::kHardsigmoid:  // d = max(0, min(1, alpha * s + beta))
      ops->append_eltwise(alg::eltwise_hardsigmoid, act.alpha, act.beta);
      return;
    case Act::kLeakyRelu:  // relu with alpha: d = s > 0 ? s : alpha * s
      ops->append_eltwise(alg::eltwise_relu, act.alpha, 0.f);
      return;
    case Act::kScale:  // d = alpha * s + 0
      ops->append_eltwise(alg::eltwise_linear, act.alpha, 0.f);
      return;
  }
}

// ---------------------------------------------------------------------------------------------
float* CheckFloatTensor(const ffi::TensorView& t, const char* kernel, const char* what,
                        int min_rank) {
  DLDataType dt = t.dtype();
  if (dt.code != kDLFloat || dt.bits != 32 || dt.lanes != 1) {
    TVM_FFI_THROW(TypeError) << kernel << ": " << what << " must be float32";
  }
  if (t.device().device_type != kDLCPU) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must be on the CPU";
  }
  if (t.ndim() < min_rank) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must have rank >= " << min_rank
                              << ", got shape " << ShapeStr(t);
  }
  if (!t.IsContiguous()) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " must be contiguous (row-major)";
  }
  for (int i = 0; i < t.ndim(); ++i) {
    if (t.shape()[i] < 0) {
      TVM_FFI_THROW(ValueError) << kernel << ": " << what << " has a negative dimension";
    }
  }
  if (t.data_ptr() == nullptr && t.numel() > 0) {
    TVM_FFI_THROW(ValueError) << kernel << ": " << what << " has no data";
  }
  return reinterpret_cast<float*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

std::string_view AttrsView(ffi::PackedArgs args, const char* kernel,
                           std::optional<ffi::String>* holder) {
  if (args.size() < 1) TVM_FFI_THROW(TypeError) << kernel << ": missing attrs";
  *holder = args[0].try_cast<ffi::String>();
  if (!holder->has_value()) {
    TVM_FFI_THROW(TypeError) << kernel << ": first argument must be the attrs string";
  }
  const ffi::String& text = holder->value();
  return std::string_view(text.data(), text.size());
}

// ---------------------------------------------------------------------------------------------
dnnl::engine& Engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& Stream() {
  thread_local dnnl::stream s(Engine());
  return s;
}

void Execute(const dnnl::primitive& prim, const std::unordered_map<int, dnnl::memory>& args) {
  thread_local std::vector<dnnl_exec_arg_t> c_args;  // grows to the largest call, then reused
  c_args.clear();
  for (const auto& [arg, mem] : args) c_args.push_back({arg, mem.get(true)});
  dnnl::error::wrap_c_api(dnnl_primitive_execute(prim.get(), Stream().get(),
                                                 static_cast<int>(c_args.size()), c_args.data()),
                          "could not execute a primitive");
}

void* ScratchBuffer(int slot, size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  constexpr int kSlots = 8;
  thread_local Buf bufs[kSlots];
  if (slot < 0 || slot >= kSlots) TVM_FFI_THROW(InternalError) << "bad scratch slot " << slot;
  Buf& b = bufs[slot];
  if (b.n < bytes || b.p == nullptr) {
    std::free(b.p);
    size_t n = ((bytes + 63) / 64) * 64;
    if (n == 0) n = 64;
    b.p = std::aligned_alloc(64, n);
    if (b.p == nullptr) TVM_FFI_THROW(RuntimeError) << "out of memory (" << n << " bytes)";
    b.n = n;
  }
  return b.p;
}

PrimitiveCache& PrimitiveCache::Global() {
  static PrimitiveCache* cache = new PrimitiveCache();  // never destroyed (exit-order safe)
  return *cache;
}

std::shared_ptr<void> PrimitiveCache::Get(const std::string& name,
                                          const std::function<std::shared_ptr<void>()>& create) {
  const std::string key = name + "|nthr=" + std::to_string(omp_get_max_threads());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      ++hits_;
      return it->second;
    }
  }
  // Create outside the lock (creation can take milliseconds); the first insert wins.
  std::shared_ptr<void> value = create();
  std::lock_guard<std::mutex> lock(mu_);
  ++misses_;
  auto res = map_.emplace(key, value);
  return res.first->second;
}

size_t PrimitiveCache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

// ---------------------------------------------------------------------------------------------
static std::atomic<int> g_num_threads{0};
static std::once_flag g_threads_once;

static int DefaultThreads() {
  const char* env = std::getenv("TVM_NUM_THREADS");
  if (env != nullptr && *env) {
    int64_t v;
    if (ParseInt(env, &v) && v > 0) return static_cast<int>(v);
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return 1;
}

static void ApplyNumThreads(int n) {
  g_num_threads = n;  // OpenMP's count is applied per kernel call (ThreadScope)
  BlasSetNumThreads(n);
}

void SetNumThreads(int n) {
  if (n <= 0) TVM_FFI_THROW(ValueError) << "set_num_threads: expected n >= 1, got " << n;
  // The default is now settled: a first kernel call must not replace the caller's count with it.
  std::call_once(g_threads_once, []() {});
  ApplyNumThreads(n);
}

void InitThreadsOnce() {
  std::call_once(g_threads_once, []() { ApplyNumThreads(DefaultThreads()); });
}

ThreadScope::ThreadScope() {
  InitThreadsOnce();
  previous_ = omp_get_max_threads();
  if (previous_ != g_num_threads) omp_set_num_threads(g_num_threads);
}

void ThreadScope::SerialBelow(double flops, int64_t* best_ns) {
  if (omp_get_max_threads() == 1) return;
  if (flops < static_cast<double>(SerialFlops())) {
    omp_set_num_threads(1);
    return;
  }
  const int64_t now = NowNs();
  if (SerialForStall(now)) {
    omp_set_num_threads(1);
    held_by_stall_ = true;
    return;
  }
  best_ns_ = best_ns;
  flops_ = flops;
  start_ns_ = now;
}

void ThreadScope::SerialBelowThreshold(double flops) {
  if (omp_get_max_threads() > 1 && flops < static_cast<double>(SerialFlops())) {
    omp_set_num_threads(1);
  }
}

void ThreadScope::Fix(int n) {
  best_ns_ = nullptr;
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

static std::atomic<int64_t> g_serial_flops{-1};  // -1: not read from the environment yet

int64_t SerialFlops() {
  int64_t v = g_serial_flops.load();
  if (v >= 0) return v;
  v = kDefaultSerialFlops;
  const char* env = std::getenv("TVM_OLLIE_SERIAL_FLOPS");
  int64_t parsed;
  if (env != nullptr && *env && ParseInt(env, &parsed) && parsed >= 0) v = parsed;
  int64_t unset = -1;
  g_serial_flops.compare_exchange_strong(unset, v);  // a concurrent setter wins
  return g_serial_flops.load();
}

void SetSerialFlops(int64_t flops) {
  if (flops < 0) TVM_FFI_THROW(ValueError) << "set_serial_flops: expected >= 0, got " << flops;
  g_serial_flops = flops;
}

ThreadScope::~ThreadScope() {
  if (best_ns_ != nullptr) NoteParallelRun(NowNs() - start_ns_, best_ns_, flops_);
  if (omp_get_max_threads() != previous_) omp_set_num_threads(previous_);
}

int GetNumThreads() {
  InitThreadsOnce();
  return g_num_threads;
}

void BlasSetNumThreads(int n) { scipy_openblas_set_num_threads(n); }

std::string BlasConfig() { return scipy_openblas_get_config(); }

}  // namespace tvm_ollie
