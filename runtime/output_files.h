// Files a command writes, all or none. A command that writes several outputs (`linac run -o a=.. -o
// b=..`, `plan --json`, `dump`) either leaves every one of them written or none changed: each is written
// to a temporary beside its destination and renamed over it only when all are written; an error, an
// exception or SIGINT/SIGTERM removes the temporaries.
//
// Destinations: a regular file or a new name is replaced by rename; a symbolic link is written through
// (its target replaced, the link kept); an existing file that is not a regular one (a device such as
// /dev/null or /dev/full, a FIFO) is written directly at commit, never replaced; a directory is refused.
#pragma once
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace linac {

class OutputFiles {
 public:
  /// Writes the content to an open file; throws UserError on a failed write (see write_bytes).
  using Writer = std::function<void(std::FILE* f, const std::string& path)>;

  OutputFiles() = default;
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;
  /// Removes the temporaries of an uncommitted transaction.
  ~OutputFiles();

  /// Stages the file `path` with the content `write` produces (written to its temporary now).
  void add(const std::string& path, const Writer& write);
  /// Puts every staged file in place. UserError when one cannot be (the others may already be in place
  /// then: renames are not atomic together, but every temporary is complete before the first).
  void commit();

 private:
  struct Staged {
    std::string path;    // as given, for messages
    std::string target;  // the file replaced (a symlink's target)
    std::string temp;    // empty: written directly at commit (special files)
    Writer write;
  };
  std::vector<Staged> staged_;
};

/// fwrite of n bytes; UserError naming `path` on failure.
void write_bytes(std::FILE* f, const void* p, size_t n, const std::string& path);

/// Writes `text` to `path` as a transaction of one file.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace linac
