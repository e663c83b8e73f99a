// Tests for Path (lexical normalisation, the guarantee that no path climbs
// above the namespace root, the NAME_MAX/PATH_MAX limits) and for the Error
// helpers every failing operation reports through.
#include "vfs/path.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/support/result_matchers.h"
#include "vfs/error.h"

namespace agentvfs::vfs {
namespace {

using Parts = std::vector<std::string_view>;

// Parses a path the test knows to be valid; a failure is reported, not thrown.
Path P(std::string_view text) {
  auto p = Path::Parse(text);
  EXPECT_TRUE(p.has_value())
      << "Parse(\"" << text << "\") failed: " << p.error().ToString();
  return p.value_or(Path());
}

std::string Normalised(std::string_view text) {
  auto p = Path::Parse(text);
  if (!p) return "<error " + p.error().ToString() + ">";
  return p->str();
}

// "/" followed by `count` components of `len` bytes each, then one of
// `last_len` bytes (omitted when 0).
std::string LongPath(size_t count, size_t len, size_t last_len) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    out += '/';
    out += std::string(len, static_cast<char>('a' + i % 26));
  }
  if (last_len > 0) {
    out += '/';
    out += std::string(last_len, 'z');
  }
  return out;
}

TEST(PathParse, RootForms) {
  EXPECT_EQ(Normalised("/"), "/");
  EXPECT_EQ(Normalised("//"), "/");
  EXPECT_EQ(Normalised("///"), "/");
  EXPECT_EQ(Normalised("/."), "/");
  EXPECT_EQ(Normalised("/./"), "/");
  EXPECT_EQ(Normalised("/.."), "/");
  EXPECT_TRUE(P("//./").IsRoot());
}

TEST(PathParse, CollapsesSlashesAndDropsDots) {
  EXPECT_EQ(Normalised("/a//b"), "/a/b");
  EXPECT_EQ(Normalised("//a/b"), "/a/b");
  EXPECT_EQ(Normalised("/a/b/"), "/a/b");
  EXPECT_EQ(Normalised("/a/b//"), "/a/b");
  EXPECT_EQ(Normalised("/a/./b/."), "/a/b");
  EXPECT_EQ(Normalised("/a/./b/../c"), "/a/c");
}

TEST(PathParse, DotDotRemovesPreviousComponent) {
  EXPECT_EQ(Normalised("/a/b/.."), "/a");
  EXPECT_EQ(Normalised("/a/b/../.."), "/");
  EXPECT_EQ(Normalised("/a/b/../../c"), "/c");
}

TEST(PathParse, DotDotAtRootStaysAtRoot) {
  // The sandbox guarantee: no amount of '..' reaches above "/".
  EXPECT_EQ(Normalised("/../../etc"), "/etc");
  EXPECT_EQ(Normalised("/workspace/../../../etc/passwd"), "/etc/passwd");
  EXPECT_EQ(Normalised("/a/../../b"), "/b");
}

TEST(PathParse, NamesThatOnlyLookLikeDots) {
  EXPECT_EQ(Normalised("/..."), "/...");
  EXPECT_EQ(Normalised("/.hidden/..x"), "/.hidden/..x");
  EXPECT_EQ(Normalised("/a/.../.."), "/a");
}

TEST(PathParse, EmptyIsEnoent) { EXPECT_ERRNO(Path::Parse(""), ENOENT); }

TEST(PathParse, RelativeIsEinval) {
  EXPECT_ERRNO(Path::Parse("a"), EINVAL);
  EXPECT_ERRNO(Path::Parse("a/b"), EINVAL);
  EXPECT_ERRNO(Path::Parse("./a"), EINVAL);
  EXPECT_ERRNO(Path::Parse(".."), EINVAL);
  EXPECT_ERRNO(Path::Parse(" /a"), EINVAL);
}

TEST(PathParse, NulIsEinval) {
  EXPECT_ERRNO(Path::Parse(std::string("/a\0b", 4)), EINVAL);
  EXPECT_ERRNO(Path::Parse(std::string("/a/\0", 4)), EINVAL);
  EXPECT_ERRNO(Path::Parse(std::string("\0/a", 3)), EINVAL);
}

TEST(PathParse, ComponentLengthLimit) {
  const std::string name255(255, 'n');
  const std::string name256(256, 'n');
  auto ok = Path::Parse("/d/" + name255);
  ASSERT_OK(ok);
  EXPECT_EQ(ok->Name(), name255);
  EXPECT_ERRNO(Path::Parse("/" + name256), ENAMETOOLONG);
  EXPECT_ERRNO(Path::Parse("/d/" + name256 + "/e"), ENAMETOOLONG);
}

TEST(PathParse, TotalLengthLimit) {
  // 15 components of 255 bytes take 15 * 256 = 3840 bytes with their slashes.
  const std::string at_limit = LongPath(15, 255, 254);
  const std::string over_limit = LongPath(15, 255, 255);
  ASSERT_EQ(at_limit.size(), kPathMax - 1);
  ASSERT_EQ(over_limit.size(), kPathMax);

  auto ok = Path::Parse(at_limit);
  ASSERT_OK(ok);
  EXPECT_EQ(ok->str(), at_limit);
  EXPECT_ERRNO(Path::Parse(over_limit), ENAMETOOLONG);
  // The limit applies to the normalised text: redundant slashes are free.
  EXPECT_OK(Path::Parse("//" + at_limit + "/"));
}

TEST(PathName, ValidateName) {
  EXPECT_OK(Path::ValidateName("file.txt"));
  EXPECT_OK(Path::ValidateName("..."));
  EXPECT_OK(Path::ValidateName(std::string(255, 'x')));
  EXPECT_ERRNO(Path::ValidateName(""), EINVAL);
  EXPECT_ERRNO(Path::ValidateName("."), EINVAL);
  EXPECT_ERRNO(Path::ValidateName(".."), EINVAL);
  EXPECT_ERRNO(Path::ValidateName("a/b"), EINVAL);
  EXPECT_ERRNO(Path::ValidateName(std::string("a\0b", 3)), EINVAL);
  EXPECT_ERRNO(Path::ValidateName(std::string(256, 'x')), ENAMETOOLONG);
}

TEST(PathChild, AppendsOneName) {
  auto root_child = Path().Child("workspace");
  ASSERT_OK(root_child);
  EXPECT_EQ(root_child->str(), "/workspace");
  auto nested = P("/workspace").Child("a.txt");
  ASSERT_OK(nested);
  EXPECT_EQ(nested->str(), "/workspace/a.txt");
}

TEST(PathChild, RejectsInvalidNames) {
  const Path dir = P("/workspace");
  EXPECT_ERRNO(dir.Child(""), EINVAL);
  EXPECT_ERRNO(dir.Child("."), EINVAL);
  EXPECT_ERRNO(dir.Child(".."), EINVAL);
  EXPECT_ERRNO(dir.Child("a/b"), EINVAL);
  EXPECT_ERRNO(dir.Child("/"), EINVAL);
  EXPECT_ERRNO(dir.Child(std::string("a\0b", 3)), EINVAL);
  EXPECT_ERRNO(dir.Child(std::string(256, 'x')), ENAMETOOLONG);
  EXPECT_OK(dir.Child(std::string(255, 'x')));
}

TEST(PathChild, RejectsResultOverPathMax) {
  const Path dir = P(LongPath(15, 255, 0));     // 3840 bytes
  EXPECT_OK(dir.Child(std::string(254, 'x')));  // 4095 bytes
  EXPECT_ERRNO(dir.Child(std::string(255, 'x')), ENAMETOOLONG);
}

TEST(PathAccessors, Root) {
  const Path root;
  EXPECT_EQ(root.str(), "/");
  EXPECT_TRUE(root.IsRoot());
  EXPECT_EQ(root.Parent(), root);
  EXPECT_EQ(root.Name(), "");
  EXPECT_TRUE(root.Components().empty());
  EXPECT_EQ(root.Relative(), ".");
}

TEST(PathAccessors, ParentNameComponents) {
  const Path p = P("/workspace/src/main.cc");
  EXPECT_FALSE(p.IsRoot());
  EXPECT_EQ(p.Parent().str(), "/workspace/src");
  EXPECT_EQ(p.Parent().Parent().str(), "/workspace");
  EXPECT_TRUE(p.Parent().Parent().Parent().IsRoot());
  EXPECT_EQ(p.Name(), "main.cc");
  EXPECT_EQ(p.Components(), (Parts{"workspace", "src", "main.cc"}));
  EXPECT_EQ(p.Relative(), "workspace/src/main.cc");

  const Path top = P("/workspace");
  EXPECT_TRUE(top.Parent().IsRoot());
  EXPECT_EQ(top.Name(), "workspace");
  EXPECT_EQ(top.Components(), (Parts{"workspace"}));
  EXPECT_EQ(top.Relative(), "workspace");
}

TEST(PathPrefix, HasPrefixComparesWholeComponents) {
  const Path ws = P("/workspace");
  EXPECT_TRUE(P("/workspace").HasPrefix(ws));
  EXPECT_TRUE(P("/workspace/a").HasPrefix(ws));
  EXPECT_TRUE(P("/workspace/a/b").HasPrefix(ws));
  EXPECT_FALSE(P("/workspacefoo").HasPrefix(ws));
  EXPECT_FALSE(P("/workspacefoo/a").HasPrefix(ws));
  EXPECT_FALSE(P("/work").HasPrefix(ws));
  EXPECT_FALSE(P("/workspace").HasPrefix(P("/work")));
  EXPECT_FALSE(Path().HasPrefix(ws));
  EXPECT_FALSE(P("/memories/workspace").HasPrefix(ws));
  // Everything is under the root.
  EXPECT_TRUE(Path().HasPrefix(Path()));
  EXPECT_TRUE(P("/workspace/a").HasPrefix(Path()));
  EXPECT_TRUE(P("/workspacefoo").HasPrefix(Path()));
}

TEST(PathPrefix, StripPrefix) {
  const Path ws = P("/workspace");
  EXPECT_EQ(P("/workspace/a/b").StripPrefix(ws).str(), "/a/b");
  EXPECT_EQ(P("/workspace/a").StripPrefix(ws).str(), "/a");
  EXPECT_TRUE(P("/workspace").StripPrefix(ws).IsRoot());
  EXPECT_EQ(P("/a/b").StripPrefix(Path()).str(), "/a/b");
  EXPECT_EQ(P("/x/y/z").StripPrefix(P("/x/y")).str(), "/z");
}

TEST(PathPrefix, Join) {
  const Path ws = P("/workspace");
  EXPECT_EQ(ws.Join(P("/a/b")).str(), "/workspace/a/b");
  EXPECT_EQ(ws.Join(Path()).str(), "/workspace");
  EXPECT_EQ(Path().Join(P("/a")).str(), "/a");
  EXPECT_TRUE(Path().Join(Path()).IsRoot());
}

TEST(PathPrefix, StripThenJoinRoundTrips) {
  const Path prefix = P("/memories/notes");
  for (const char* text :
       {"/memories/notes", "/memories/notes/a", "/memories/notes/a/b/c"}) {
    const Path p = P(text);
    ASSERT_TRUE(p.HasPrefix(prefix)) << text;
    EXPECT_EQ(prefix.Join(p.StripPrefix(prefix)), p) << text;
  }
}

TEST(PathCompare, EqualityIsOnNormalisedText) {
  EXPECT_EQ(P("/a//b/"), P("/a/./b"));
  EXPECT_NE(P("/a/b"), P("/a/c"));
  EXPECT_LT(P("/a"), P("/b"));
}

TEST(ErrnoName, KnownCodes) {
  EXPECT_EQ(ErrnoName(ENOENT), "ENOENT");
  EXPECT_EQ(ErrnoName(EACCES), "EACCES");
  EXPECT_EQ(ErrnoName(EROFS), "EROFS");
  EXPECT_EQ(ErrnoName(EXDEV), "EXDEV");
  EXPECT_EQ(ErrnoName(EBUSY), "EBUSY");
  EXPECT_EQ(ErrnoName(EISDIR), "EISDIR");
  EXPECT_EQ(ErrnoName(ENAMETOOLONG), "ENAMETOOLONG");
  EXPECT_EQ(ErrnoName(ENOTEMPTY), "ENOTEMPTY");
  EXPECT_EQ(ErrnoName(EINVAL), "EINVAL");
}

TEST(ErrnoName, UnknownCodeIsNumbered) {
  EXPECT_EQ(ErrnoName(9999), "E9999");
  EXPECT_EQ(std::string(ErrnoName(0)), "E0");
}

TEST(ErrorToString, NameAndMessage) {
  EXPECT_EQ((Error{ENOENT, "no such file: /workspace/a"}).ToString(),
            "ENOENT: no such file: /workspace/a");
  EXPECT_EQ((Error{EACCES, ""}).ToString(), "EACCES");
  EXPECT_EQ((Error{}).ToString(), "EIO");
}

TEST(ErrorFail, CarriesCodeAndMessage) {
  Status s = Fail(EROFS, "read-only");
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code, EROFS);
  EXPECT_EQ(s.error().message, "read-only");
}

TEST(FromErrno, NamesOperationPathAndReason) {
  const Error e = FromErrno(ENOENT, "open", "/workspace/a.txt");
  EXPECT_EQ(e.code, ENOENT);
  EXPECT_EQ(e.message,
            std::string("open /workspace/a.txt: ") + std::strerror(ENOENT));
  EXPECT_EQ(e.ToString(), "ENOENT: " + e.message);
}

TEST(FromErrno, WithoutPath) {
  const Error e = FromErrno(EACCES, "statfs", "");
  EXPECT_EQ(e.code, EACCES);
  EXPECT_EQ(e.message, std::string("statfs: ") + std::strerror(EACCES));
}

}  // namespace
}  // namespace agentvfs::vfs
