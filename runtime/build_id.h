// The identity of the linac library binary, for cache keys: the GNU build-id the linker computes
// over liblinac's contents (-Wl,--build-id=sha1), so any rebuild that changes code changes the key.
#pragma once
#include <string>

namespace linac {

/// Hex build-id of the loaded liblinac, or "unknown" if the binary has none.
const std::string& library_build_id();

}  // namespace linac
