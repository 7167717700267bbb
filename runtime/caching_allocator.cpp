// linac's default allocator for op calls' scratch memory (linac/ops.h): freed blocks are kept per
// stream and size and handed out again to later work on the same stream, which is ordered after the
// work that freed them; nothing goes back to the driver while the process runs.
#include <map>
#include <mutex>

#include "linac/ops.h"
#include "runtime/cuda_driver.h"

namespace linac {

namespace {

class CachingAllocator final : public ops::Allocator {
 public:
  void* allocate(std::size_t bytes, ops::Stream stream) override {
    {
      std::lock_guard lock(mu_);
      auto& pool = free_[stream];
      if (auto it = pool.lower_bound(bytes); it != pool.end() && it->first <= 2 * bytes) {
        cuda::DeviceBuffer b = std::move(it->second);
        pool.erase(it);
        void* p = reinterpret_cast<void*>(b.ptr());
        used_.emplace(p, std::move(b));
        return p;
      }
    }
    cuda::DeviceBuffer b(bytes);  // outside the lock: cuMemAlloc may take a while
    void* p = reinterpret_cast<void*>(b.ptr());
    std::lock_guard lock(mu_);
    used_.emplace(p, std::move(b));
    return p;
  }
  void deallocate(void* p, std::size_t, ops::Stream stream) override {
    std::lock_guard lock(mu_);
    auto it = used_.find(p);
    if (it == used_.end()) throw InternalError("default allocator: freeing memory it did not allocate");
    const size_t bytes = it->second.bytes();
    free_[stream].emplace(bytes, std::move(it->second));
    used_.erase(it);
  }

 private:
  std::mutex mu_;
  std::map<ops::Stream, std::multimap<size_t, cuda::DeviceBuffer>> free_;
  std::map<void*, cuda::DeviceBuffer> used_;
};

}  // namespace

namespace ops {

Allocator& default_allocator() {
  static CachingAllocator* a = new CachingAllocator;  // never destroyed: the driver may be gone at exit
  return *a;
}

}  // namespace ops

}  // namespace linac
