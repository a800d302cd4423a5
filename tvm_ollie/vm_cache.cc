// tvm_ollie.vm.cached_alloc: the planned memory of a static-shape Relax function, allocated once
// per virtual machine and reused by every later call of it.
//
// Why: after TVM's StaticPlanBlockMemory, a function's intermediate tensors live in a few
// planned storages, but the VM still allocates those storages and a tensor view of each
// intermediate at every call (vm.builtin.alloc_storage, vm.builtin.alloc_tensor) and frees them
// again (vm.builtin.null_value). The pass tvm_ollie.codegen.cached_alloc moves the planned
// allocations of a function with static shapes into a lifted Relax function returning them as
// a tuple, and calls it through this builtin:
//
//   cache = R.call_builtin_with_ctx("tvm_ollie.vm.cached_alloc", (alloc_fn,))
//
// The VM passes its context pointer and the closure of alloc_fn from its function pool. Each VM
// makes its own closure objects when it is created (VirtualMachineImpl::InitFuncPool) and keeps
// them while it lives, so the closure identifies "this function in this VM": the first call
// invokes it (vm.builtin.invoke_closure) and keeps the result, later calls return it. This is
// what TVM's CUDA-graph rewrite does with vm.builtin.cuda_graph.get_cached_alloc (a VM
// extension there; this library uses the tvm-ffi API only, so the cache is keyed by closure).
//
// Lifetime: an entry holds a reference to its closure, so that the address cannot be reused by
// another VM's closure while the entry exists. Once the VM is gone, that reference is the
// closure's last (use_count() == 1); such entries are dropped at the next cache miss (the first
// call of any new VM) or by tvm_ollie.vm.cached_alloc_clear(), freeing their buffers.
//
// Contract (the same as the Relax VM's): one call at a time per VM, since the calls of one VM
// share its buffers. Returned tensors are never in the cache: StaticPlanBlockMemory leaves every
// tensor that reaches the function's result unplanned (allocated per call).
#include <tvm/ffi/any.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace tvm_ollie {
namespace {

namespace ffi = tvm::ffi;

struct CachedEntry {
  ffi::ObjectRef closure;  // keeps the key's address from being reused while the entry exists
  ffi::Any value;          // what the closure returned: the tuple of planned tensors
};

std::mutex g_mutex;
std::unordered_map<const ffi::Object*, CachedEntry> g_cache;

// Drops the entries whose VM is gone (the entry holds the closure's only reference).
// g_mutex held.
int64_t SweepLocked() {
  int64_t dropped = 0;
  for (auto it = g_cache.begin(); it != g_cache.end();) {
    if (it->second.closure.use_count() == 1) {
      it = g_cache.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

// args[0]: the VM's context pointer; args[1]: the closure of the lifted allocation function.
void CachedAlloc(ffi::PackedArgs args, ffi::Any* rv) {
  TVM_FFI_ICHECK_EQ(args.size(), 2) << "tvm_ollie.vm.cached_alloc(ctx, alloc_fn)";
  ffi::ObjectRef closure = args[1].cast<ffi::ObjectRef>();
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_cache.find(closure.get());
    if (it != g_cache.end()) {
      *rv = it->second.value;
      return;
    }
  }
  // Invoked without the lock: the allocation function runs on the VM like any call.
  static const ffi::Function invoke = [] {
    auto f = ffi::Function::GetGlobal("vm.builtin.invoke_closure");
    TVM_FFI_ICHECK(f.has_value()) << "vm.builtin.invoke_closure is not registered";
    return *f;
  }();
  ffi::Any value = invoke(args[0], closure);
  std::lock_guard<std::mutex> lock(g_mutex);
  SweepLocked();
  auto it = g_cache.emplace(closure.get(), CachedEntry{closure, std::move(value)}).first;
  *rv = it->second.value;
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("tvm_ollie.vm.cached_alloc", CachedAlloc)
      // The number of cached functions of live VMs (entries of dead ones dropped first).
      .def("tvm_ollie.vm.cached_alloc_entries",
           []() -> int64_t {
             std::lock_guard<std::mutex> lock(g_mutex);
             SweepLocked();
             return static_cast<int64_t>(g_cache.size());
           })
      // Drops every entry: live VMs allocate again at their next call.
      .def("tvm_ollie.vm.cached_alloc_clear", []() -> int64_t {
        std::lock_guard<std::mutex> lock(g_mutex);
        int64_t n = static_cast<int64_t>(g_cache.size());
        g_cache.clear();
        return n;
      });
}

}  // namespace tvm_ollie
