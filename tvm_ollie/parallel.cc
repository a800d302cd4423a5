// tvm_ollie.cpu.set_parallel_runtime / get_parallel_runtime / parallel_stats: the parallel
// loops of TVM's generated CPU kernels run on the OpenMP pool the oneDNN kernels use, so that
// one call of a model has one pool of threads, not two.
//
// Why: TVM's kernels launch their parallel loops through the context symbol
// `__TVMBackendParallelLaunch` (a function pointer in every compiled library, filled when the
// library loads from the symbols registered with TVMFFIEnvModRegisterContextSymbol). By default
// it is TVM's own thread pool; the library kernels run on GNU OpenMP (the only runtime of the
// onednn-cpu-gomp wheel). A model alternating the two has two sets of threads taking turns on
// the same cores, each spinning or sleeping while the other works (docs/threads.md, "Two pools
// in one call"). Registering the launch and barrier below makes every library loaded afterwards
// run its parallel loops as OpenMP parallel regions: one set of threads for both.
//
// The launch keeps TVM's contract: the lambda gets (task_id, env, closure) with env->num_task
// the number of tasks actually running (the generated code splits its loop by it), task_ids
// 0..num_task-1 run concurrently (the barrier needs that: an OpenMP team guarantees it), and
// the launch returns nonzero when a task does. Called inside an active parallel region (a
// kernel run from someone's OpenMP loop), or with one thread, it runs the lambda inline as one
// task, as TVM's pool does with one worker.
#include <omp.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common.h"

namespace tvm_ollie {
namespace {

// The ABI of TVM's c_backend_api.h (TVMParallelGroupEnv, FTVMParallelLambda), declared here so
// that the library needs no TVM header.
struct ParallelGroupEnv {
  void* sync_handle;
  int32_t num_task;
};
using ParallelLambda = int (*)(int task_id, ParallelGroupEnv* penv, void* cdata);

constexpr const char* kLaunchSymbol = "__TVMBackendParallelLaunch";
constexpr const char* kBarrierSymbol = "__TVMBackendParallelBarrier";

std::atomic<int64_t> g_launches{0};
std::atomic<int64_t> g_barriers{0};

int OmpParallelLaunch(ParallelLambda flambda, void* cdata, int num_task) {
  InitThreadsOnce();
  g_launches.fetch_add(1, std::memory_order_relaxed);
  const int threads = GetNumThreads();
  const int wanted = num_task > 0 ? std::min(num_task, threads) : threads;
  const int64_t start = wanted > 1 ? NowNs() : 0;
  if (wanted <= 1 || omp_in_parallel() || SerialForStall(start)) {
    ParallelGroupEnv env{nullptr, 1};
    return flambda(0, &env, cdata);
  }
  std::atomic<int> result{0};
#pragma omp parallel num_threads(wanted)
  {
    ParallelGroupEnv env{nullptr, omp_get_num_threads()};
    int rc = flambda(omp_get_thread_num(), &env, cdata);
    if (rc != 0) result.store(rc, std::memory_order_relaxed);
  }
  // The fastest run of each kernel (by its lambda) on this thread: a launch far slower waited
  // for a descheduled worker (stall.h).
  thread_local std::unordered_map<void*, int64_t> best_by_kernel;
  auto it = best_by_kernel.try_emplace(reinterpret_cast<void*>(flambda), kNoBestNs).first;
  NoteParallelRun(NowNs() - start, &it->second);
  return result.load();
}

int OmpParallelBarrier(int /*task_id*/, ParallelGroupEnv* penv) {
  // One task (run inline): nothing to wait for, and an orphaned barrier would bind to an
  // enclosing region of someone else's.
  if (penv == nullptr || penv->num_task <= 1) return 0;
  g_barriers.fetch_add(1, std::memory_order_relaxed);
#pragma omp barrier
  return 0;
}

// The symbols registered before this library changed them (TVM's pool), so that the choice can
// be undone.
struct TvmSymbols {
  void* launch = nullptr;
  void* barrier = nullptr;
};

const TvmSymbols& OriginalSymbols() {
  static TvmSymbols symbols;
  static std::once_flag once;
  std::call_once(once, []() {
    tvm::ffi::Module::VisitContextSymbols([](tvm::ffi::String name, void* symbol) {
      if (name == kLaunchSymbol && symbols.launch == nullptr) symbols.launch = symbol;
      if (name == kBarrierSymbol && symbols.barrier == nullptr) symbols.barrier = symbol;
    });
  });
  return symbols;
}

std::mutex g_runtime_mu;
std::string g_runtime = "tvm";

void Register(void* launch, void* barrier) {
  TVM_FFI_CHECK_SAFE_CALL(TVMFFIEnvModRegisterContextSymbol(kLaunchSymbol, launch));
  TVM_FFI_CHECK_SAFE_CALL(TVMFFIEnvModRegisterContextSymbol(kBarrierSymbol, barrier));
}

void SetParallelRuntime(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  if (name == g_runtime) return;
  const TvmSymbols& tvm = OriginalSymbols();
  if (tvm.launch == nullptr || tvm.barrier == nullptr) {
    TVM_FFI_THROW(RuntimeError) << "set_parallel_runtime: TVM's runtime has not registered "
                                << kLaunchSymbol << " (load libtvm_runtime first)";
  }
  if (name == "openmp") {
    Register(reinterpret_cast<void*>(&OmpParallelLaunch),
             reinterpret_cast<void*>(&OmpParallelBarrier));
  } else if (name == "tvm") {
    Register(tvm.launch, tvm.barrier);
  } else {
    TVM_FFI_THROW(ValueError) << "set_parallel_runtime: expected 'openmp' or 'tvm', got '"
                              << name << "'";
  }
  g_runtime = name;
}

std::string GetParallelRuntime() {
  std::lock_guard<std::mutex> lock(g_runtime_mu);
  return g_runtime;
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def("tvm_ollie.cpu.set_parallel_runtime",
           [](const std::string& name) { SetParallelRuntime(name); })
      .def("tvm_ollie.cpu.get_parallel_runtime", []() -> std::string {
        return GetParallelRuntime();
      })
      .def("tvm_ollie.cpu.parallel_stats", []() -> std::string {
        return "launches=" + std::to_string(g_launches.load()) +
               ";barriers=" + std::to_string(g_barriers.load());
      });
}

}  // namespace tvm_ollie
