#include "runtime/build_id.h"

#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstring>

namespace linac {

namespace {

struct Search {
  const void* base;  // load address of the object that holds this function
  std::string id;
};

int visit(struct dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  if (reinterpret_cast<const void*>(info->dlpi_addr) != s->base) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* nh = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const unsigned char* desc = reinterpret_cast<const unsigned char*>(name + ((nh->n_namesz + 3) & ~3u));
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        for (unsigned j = 0; j < nh->n_descsz; ++j) s->id += fmt::format("{:02x}", desc[j]);
        return 1;
      }
      p = reinterpret_cast<const char*>(desc) + ((nh->n_descsz + 3) & ~3u);
    }
  }
  return 0;
}

}  // namespace

const std::string& library_build_id() {
  static const std::string id = [] {
    Dl_info info{};
    Search s{nullptr, {}};
    if (dladdr(reinterpret_cast<const void*>(&library_build_id), &info) && info.dli_fbase) {
      // dl_iterate_phdr reports dlpi_addr, the load bias; for a shared library it equals dli_fbase.
      s.base = info.dli_fbase;
      dl_iterate_phdr(visit, &s);
    }
    return s.id.empty() ? std::string("unknown") : s.id;
  }();
  return id;
}

}  // namespace linac
