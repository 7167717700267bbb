// SHA-256 (FIPS 180-4), written here because LLVM's implementation is not in linac's public link path.
// Used for the disk cache's keys and for checking cached files; not meant for secrets (no constant-time
// guarantees are needed for that use).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace linac {

/// An incremental SHA-256 hash. Copyable, so a caller can snapshot a partial hash and finish the copy.
class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  /// Appends bytes to the message.
  void update(const void* data, size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  /// Pads the message and returns its digest. The object must not be used afterwards (finish a copy to
  /// keep going).
  Digest finish();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;       // bytes waiting in buffer_
  uint64_t total_bytes_ = 0;  // message length so far
};

/// Lowercase hex of a digest (64 characters).
std::string to_hex(const Sha256::Digest& digest);

/// The SHA-256 of `data` as 64 lowercase hex characters.
std::string sha256_hex(std::string_view data);

}  // namespace linac
