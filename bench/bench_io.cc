// agentvfs_bench_io: one I/O workload in one directory, timed, printed as one
// JSON line. scripts/bench runs it against a native directory and against the
// same host directory seen through the FUSE /workspace route, and compares.
//
//   agentvfs_bench_io <op> <dir> [flags]
//
// ops:
//   seqwrite  write <dir>/seq.dat: --size bytes in --block blocks, fsync at end
//   seqread   read <dir>/seq.dat in --block blocks and verify every page
//   randread  --count 4 KiB preads at random page-aligned offsets (--seed),
//             each verified
//   create    --files files of --file-size bytes under <dir>/files
//             (open O_CREAT|O_WRONLY, write, close)
//   stat      stat every file made by `create` (and check its size)
//   unlink    unlink every file made by `create`, then the directory
//   exec      run the command after `--` with <dir> as its working directory
//
// Data is verifiable so a read path cannot cheat: every 4 KiB page of
// seq.dat starts with its own file offset (xor a seed-derived key) and the
// rest of the page comes from a seeded pseudo-random block. Only the system
// calls are timed; generating and checking the pattern is not.
//
// Exit status: 0 on success, 1 on an I/O error or a wrong read-back, 2 on a
// usage error.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr size_t kPage = 4096;

struct Options {
  std::string op;
  std::string dir;
  std::string file = "seq.dat";
  uint64_t size = 1ull << 30;     // seqwrite
  size_t block = 1u << 20;        // seqwrite / seqread
  uint64_t count = 100000;        // randread
  uint64_t seed = 42;             // pattern and randread offsets
  uint64_t files = 10000;         // create / stat / unlink
  size_t file_size = 4096;        // create
  std::vector<std::string> argv;  // exec
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "agentvfs_bench_io: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void DieErrno(const std::string& what) {
  Die(what + ": " + std::strerror(errno));
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "agentvfs_bench_io: %s\n"
               "usage: agentvfs_bench_io "
               "seqwrite|seqread|randread|create|stat|unlink|exec <dir>\n"
               "  [--size BYTES] [--block BYTES] [--count N] [--seed N]\n"
               "  [--files N] [--file-size BYTES] [--file NAME] "
               "[-- CMD ARGS... (exec)]\n"
               "  sizes accept K, M, G suffixes (powers of 1024)\n",
               why.c_str());
  std::exit(2);
}

uint64_t ParseSize(std::string_view flag, std::string_view s) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data()) {
    Usage("bad value for " + std::string(flag) + ": " + std::string(s));
  }
  std::string_view rest(p, s.data() + s.size() - p);
  if (rest == "K" || rest == "k" || rest == "KiB") {
    v <<= 10;
  } else if (rest == "M" || rest == "m" || rest == "MiB") {
    v <<= 20;
  } else if (rest == "G" || rest == "g" || rest == "GiB") {
    v <<= 30;
  } else if (!rest.empty()) {
    Usage("bad value for " + std::string(flag) + ": " + std::string(s));
  }
  return v;
}

Options Parse(int argc, char** argv) {
  if (argc < 3) Usage("missing <op> or <dir>");
  Options o;
  o.op = argv[1];
  o.dir = argv[2];
  for (int i = 3; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) o.argv.emplace_back(argv[i]);
      break;
    }
    if (i + 1 >= argc) Usage("missing value for " + std::string(a));
    std::string_view v = argv[++i];
    if (a == "--size") {
      o.size = ParseSize(a, v);
    } else if (a == "--block") {
      o.block = ParseSize(a, v);
    } else if (a == "--count") {
      o.count = ParseSize(a, v);
    } else if (a == "--seed") {
      o.seed = ParseSize(a, v);
    } else if (a == "--files") {
      o.files = ParseSize(a, v);
    } else if (a == "--file-size") {
      o.file_size = ParseSize(a, v);
    } else if (a == "--file") {
      o.file = std::string(v);
    } else {
      Usage("unknown flag " + std::string(a));
    }
  }
  if (o.block == 0 || o.block % kPage != 0) {
    Usage("--block must be a positive multiple of 4096");
  }
  if (o.size % kPage != 0) Usage("--size must be a multiple of 4096");
  return o;
}

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The expected content of seq.dat: `base` repeats every block; each page's
// first 8 bytes are replaced by its file offset xor `key`.
struct Pattern {
  std::vector<unsigned char> base;
  uint64_t key;

  Pattern(size_t block, uint64_t seed) : base(block) {
    uint64_t s = seed;
    key = SplitMix(s);
    for (size_t i = 0; i < block; i += 8) {
      uint64_t w = SplitMix(s);
      std::memcpy(&base[i], &w, 8);
    }
  }

  // Fills `buf` (block-aligned, `len` bytes) with the content at `offset`.
  void Fill(unsigned char* buf, uint64_t offset, size_t len) const {
    std::memcpy(buf, base.data(), len);
    for (size_t p = 0; p < len; p += kPage) {
      uint64_t h = (offset + p) ^ key;
      std::memcpy(buf + p, &h, 8);
    }
  }

  // Checks `len` bytes (page-aligned) read at file offset `offset`.
  bool Check(const unsigned char* buf, uint64_t offset, size_t len) const {
    for (size_t p = 0; p < len; p += kPage) {
      uint64_t at = offset + p;
      uint64_t h;
      std::memcpy(&h, buf + p, 8);
      if (h != (at ^ key)) return false;
      size_t in_block = at % base.size();
      size_t n = std::min(kPage, len - p);
      if (std::memcmp(buf + p + 8, base.data() + in_block + 8, n - 8) != 0) {
        return false;
      }
    }
    return true;
  }
};

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Accumulates time spent inside the timed sections only.
class Stopwatch {
 public:
  void Start() { t0_ = Clock::now(); }
  void Stop() { total_ += Clock::now() - t0_; }
  double seconds() const { return Seconds(total_); }

 private:
  Clock::time_point t0_;
  Clock::duration total_{};
};

void Report(const Options& o, double seconds, uint64_t bytes, uint64_t ops) {
  double s = seconds > 0 ? seconds : 1e-9;
  std::printf(
      "{\"op\":\"%s\",\"seconds\":%.6f,\"bytes\":%llu,\"ops\":%llu,"
      "\"mib_per_s\":%.3f,\"ops_per_s\":%.3f}\n",
      o.op.c_str(), seconds, static_cast<unsigned long long>(bytes),
      static_cast<unsigned long long>(ops),
      static_cast<double>(bytes) / (1 << 20) / s, static_cast<double>(ops) / s);
}

std::string SeqPath(const Options& o) { return o.dir + "/" + o.file; }

// Page-aligned buffer (so the same code would also work with O_DIRECT).
struct AlignedBuf {
  unsigned char* p = nullptr;
  explicit AlignedBuf(size_t n) {
    if (posix_memalign(reinterpret_cast<void**>(&p), kPage, n) != 0) {
      Die("out of memory");
    }
    std::memset(p, 0, n);
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
};

void WriteAll(int fd, const unsigned char* buf, size_t len,
              const std::string& path) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::write(fd, buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      DieErrno("write " + path);
    }
    if (n == 0) Die("write " + path + ": wrote nothing");
    done += static_cast<size_t>(n);
  }
}

void SeqWrite(const Options& o) {
  Pattern pat(o.block, o.seed);
  AlignedBuf buf(o.block);
  std::string path = SeqPath(o);
  Stopwatch sw;
  sw.Start();
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) DieErrno("open " + path);
  sw.Stop();
  for (uint64_t off = 0; off < o.size; off += o.block) {
    size_t len = static_cast<size_t>(std::min<uint64_t>(o.block, o.size - off));
    pat.Fill(buf.p, off, len);
    sw.Start();
    WriteAll(fd, buf.p, len, path);
    sw.Stop();
  }
  sw.Start();
  if (::fsync(fd) != 0) DieErrno("fsync " + path);
  if (::close(fd) != 0) DieErrno("close " + path);
  sw.Stop();
  Report(o, sw.seconds(), o.size, (o.size + o.block - 1) / o.block);
}

void SeqRead(const Options& o) {
  Pattern pat(o.block, o.seed);
  AlignedBuf buf(o.block);
  std::string path = SeqPath(o);
  Stopwatch sw;
  sw.Start();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DieErrno("open " + path);
  sw.Stop();
  struct stat st;
  if (::fstat(fd, &st) != 0) DieErrno("fstat " + path);
  uint64_t expect = static_cast<uint64_t>(st.st_size);
  if (expect == 0 || expect % kPage != 0) {
    Die(path + ": unexpected size " + std::to_string(expect));
  }
  uint64_t off = 0;
  uint64_t reads = 0;
  for (;;) {
    size_t filled = 0;
    // Fill a whole block (a short read is legal) before checking it.
    while (filled < o.block) {
      sw.Start();
      ssize_t n = ::read(fd, buf.p + filled, o.block - filled);
      sw.Stop();
      if (n < 0) {
        if (errno == EINTR) continue;
        DieErrno("read " + path);
      }
      ++reads;
      if (n == 0) break;
      filled += static_cast<size_t>(n);
    }
    if (filled == 0) break;
    if (filled % kPage != 0 || !pat.Check(buf.p, off, filled)) {
      Die(path + ": wrong data in the block at offset " + std::to_string(off));
    }
    off += filled;
    if (filled < o.block) break;
  }
  sw.Start();
  if (::close(fd) != 0) DieErrno("close " + path);
  sw.Stop();
  if (off != expect) {
    Die(path + ": read " + std::to_string(off) + " bytes, expected " +
        std::to_string(expect));
  }
  Report(o, sw.seconds(), off, reads);
}

void RandRead(const Options& o) {
  Pattern pat(o.block, o.seed);
  AlignedBuf buf(kPage);
  std::string path = SeqPath(o);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DieErrno("open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) DieErrno("fstat " + path);
  uint64_t pages = static_cast<uint64_t>(st.st_size) / kPage;
  if (pages == 0) Die(path + ": empty");
  uint64_t rng = o.seed ^ 0x5eed5eed5eed5eedull;
  Stopwatch sw;
  for (uint64_t i = 0; i < o.count; ++i) {
    uint64_t off = (SplitMix(rng) % pages) * kPage;
    sw.Start();
    ssize_t n = ::pread(fd, buf.p, kPage, static_cast<off_t>(off));
    sw.Stop();
    if (n < 0) DieErrno("pread " + path);
    if (static_cast<size_t>(n) != kPage || !pat.Check(buf.p, off, kPage)) {
      Die(path + ": wrong data in the page at offset " + std::to_string(off));
    }
  }
  ::close(fd);
  Report(o, sw.seconds(), o.count * kPage, o.count);
}

std::string FilesDir(const Options& o) { return o.dir + "/files"; }

std::string FileName(const std::string& dir, uint64_t i) {
  char name[32];
  std::snprintf(name, sizeof name, "/f%07llu",
                static_cast<unsigned long long>(i));
  return dir + name;
}

std::vector<std::string> FileNames(const Options& o) {
  std::string dir = FilesDir(o);
  std::vector<std::string> names;
  names.reserve(o.files);
  for (uint64_t i = 0; i < o.files; ++i) names.push_back(FileName(dir, i));
  return names;
}

void Create(const Options& o) {
  std::string dir = FilesDir(o);
  std::vector<std::string> names = FileNames(o);
  Pattern pat(std::max(kPage, (o.file_size + kPage - 1) / kPage * kPage),
              o.seed);
  AlignedBuf buf(pat.base.size());
  pat.Fill(buf.p, 0, pat.base.size());
  Stopwatch sw;
  sw.Start();
  if (::mkdir(dir.c_str(), 0755) != 0) DieErrno("mkdir " + dir);
  for (const std::string& name : names) {
    int fd =
        ::open(name.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) DieErrno("open " + name);
    WriteAll(fd, buf.p, o.file_size, name);
    if (::close(fd) != 0) DieErrno("close " + name);
  }
  sw.Stop();
  Report(o, sw.seconds(), o.files * o.file_size, o.files);
}

void Stat(const Options& o) {
  std::vector<std::string> names = FileNames(o);
  std::vector<off_t> sizes(names.size());
  Stopwatch sw;
  sw.Start();
  for (size_t i = 0; i < names.size(); ++i) {
    struct stat st;
    if (::stat(names[i].c_str(), &st) != 0) DieErrno("stat " + names[i]);
    sizes[i] = st.st_size;
  }
  sw.Stop();
  for (size_t i = 0; i < names.size(); ++i) {
    if (static_cast<uint64_t>(sizes[i]) != o.file_size) {
      Die(names[i] + ": size " + std::to_string(sizes[i]) + ", expected " +
          std::to_string(o.file_size));
    }
  }
  Report(o, sw.seconds(), 0, o.files);
}

void Unlink(const Options& o) {
  std::string dir = FilesDir(o);
  std::vector<std::string> names = FileNames(o);
  Stopwatch sw;
  sw.Start();
  for (const std::string& name : names) {
    if (::unlink(name.c_str()) != 0) DieErrno("unlink " + name);
  }
  if (::rmdir(dir.c_str()) != 0) DieErrno("rmdir " + dir);
  sw.Stop();
  Report(o, sw.seconds(), 0, o.files);
}

void Exec(const Options& o) {
  if (o.argv.empty()) Usage("exec needs a command after --");
  std::vector<char*> args;
  for (const std::string& a : o.argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);
  auto t0 = Clock::now();
  pid_t pid = ::fork();
  if (pid < 0) DieErrno("fork");
  if (pid == 0) {
    if (::chdir(o.dir.c_str()) != 0) {
      std::fprintf(stderr, "agentvfs_bench_io: chdir %s: %s\n", o.dir.c_str(),
                   std::strerror(errno));
      _exit(127);
    }
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "agentvfs_bench_io: exec %s: %s\n", args[0],
                 std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) DieErrno("waitpid");
  }
  double seconds = Seconds(Clock::now() - t0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Die("command `" + o.argv[0] + "` failed (status " + std::to_string(status) +
        ")");
  }
  Report(o, seconds, 0, 1);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = Parse(argc, argv);
  if (o.op == "seqwrite") {
    SeqWrite(o);
  } else if (o.op == "seqread") {
    SeqRead(o);
  } else if (o.op == "randread") {
    RandRead(o);
  } else if (o.op == "create") {
    Create(o);
  } else if (o.op == "stat") {
    Stat(o);
  } else if (o.op == "unlink") {
    Unlink(o);
  } else if (o.op == "exec") {
    Exec(o);
  } else {
    Usage("unknown op " + o.op);
  }
  return 0;
}
