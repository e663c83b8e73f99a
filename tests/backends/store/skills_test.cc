// Tests for backends/store/skills: SKILL.md validation rule by rule (each
// rejection names the file and the field; each limit is accepted exactly at
// the limit), skill discovery in host folders, and import/export round trips
// through a real Router with a LocalDirBackend mounted at /skills, compared
// byte for byte with the host tree (names, types, modes, contents, symlink
// targets, mtimes).
#include "backends/store/skills.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/local_dir/local_dir.h"
#include "router/router.h"
#include "tests/support/files.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/result_matchers.h"
#include "tests/support/store_fixture.h"

namespace agentvfs::store {
namespace {

using testing::ListDir;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

constexpr char kFile[] = "skills/pdf/SKILL.md";

std::string SkillMd(std::string_view fields,
                    std::string_view body = "# Use\n") {
  return "---\n" + std::string(fields) + "---\n" + std::string(body);
}

vfs::Result<SkillInfo> Parse(std::string_view fields,
                             std::string_view folder = "pdf") {
  return ParseSkillMd(SkillMd(fields), folder, kFile);
}

// Fails unless `r` is EINVAL and its message contains `fragment`.
template <typename T>
::testing::AssertionResult RejectedWith(const vfs::Result<T>& r,
                                        const std::string& fragment) {
  if (r.has_value()) {
    return ::testing::AssertionFailure()
           << "accepted; expected EINVAL with \"" << fragment << "\"";
  }
  if (r.error().code != EINVAL ||
      r.error().message.find(fragment) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "got " << r.error().ToString() << "\nexpected EINVAL with \""
           << fragment << "\"";
  }
  return ::testing::AssertionSuccess();
}

// ------------------------------------------------------- rules, one by one

struct RejectCase {
  const char* label;
  std::string fields;  // front matter lines
  std::string field;   // the field the message must name
  std::string what;    // how the message must go on after the field
};

class SkillMdRejects : public ::testing::TestWithParam<RejectCase> {};

TEST_P(SkillMdRejects, NamesFileAndField) {
  const RejectCase& c = GetParam();
  EXPECT_TRUE(RejectedWith(Parse(c.fields), std::string(kFile) + ": field '" +
                                                c.field + "': " + c.what));
}

const std::string kDesc = "description: Fills PDF forms.\n";

INSTANTIATE_TEST_SUITE_P(
    Rules, SkillMdRejects,
    ::testing::Values(
        RejectCase{"NameMissing", kDesc, "name", "is required"},
        RejectCase{"NameEmpty", "name: ''\n" + kDesc, "name",
                   "must not be empty"},
        RejectCase{"NameNull", "name:\n" + kDesc, "name", "must not be empty"},
        RejectCase{"NameList", "name: [pdf]\n" + kDesc, "name",
                   "must be a string, not a list"},
        RejectCase{"NameUppercaseAndSpace", "name: PDF Tool\n" + kDesc, "name",
                   "must be lowercase letters, digits and hyphens (got \"PDF "
                   "Tool\")"},
        RejectCase{"NameUnderscore", "name: pdf_tool\n" + kDesc, "name",
                   "must be lowercase letters, digits and hyphens"},
        RejectCase{"NameNonAscii", "name: caf\xC3\xA9\n" + kDesc, "name",
                   "must be lowercase letters, digits and hyphens"},
        RejectCase{"NameLeadingHyphen", "name: -pdf\n" + kDesc, "name",
                   "must not start or end with a hyphen (got \"-pdf\")"},
        RejectCase{"NameTrailingHyphen", "name: pdf-\n" + kDesc, "name",
                   "must not start or end with a hyphen"},
        RejectCase{"NameDoubleHyphen", "name: pdf--tool\n" + kDesc, "name",
                   "must not contain two hyphens in a row"},
        RejectCase{"NameTooLong",
                   "name: " + std::string(65, 'a') + "\n" + kDesc, "name",
                   "must be at most 64 characters (got 65)"},
        RejectCase{"NameNotFolder", "name: pdf-tool\n" + kDesc, "name",
                   "must match the skill's folder name \"pdf\" (got "
                   "\"pdf-tool\")"},
        RejectCase{"NameTwice", "name: pdf\nname: pdf\n" + kDesc, "name",
                   "is given more than once"},
        RejectCase{"DescriptionMissing", "name: pdf\n", "description",
                   "is required"},
        RejectCase{"DescriptionEmpty", "name: pdf\ndescription: ''\n",
                   "description", "must not be empty"},
        RejectCase{"DescriptionBlank", "name: pdf\ndescription: '  '\n",
                   "description", "must not be empty"},
        RejectCase{"DescriptionMap", "name: pdf\ndescription: {a: b}\n",
                   "description", "must be a string, not a mapping"},
        RejectCase{"DescriptionTooLong",
                   "name: pdf\ndescription: " + std::string(1025, 'x') + "\n",
                   "description", "must be at most 1024 characters (got 1025)"},
        RejectCase{"CompatibilityEmpty",
                   "name: pdf\n" + kDesc + "compatibility: ''\n",
                   "compatibility", "must not be empty"},
        RejectCase{"CompatibilityTooLong",
                   "name: pdf\n" + kDesc +
                       "compatibility: " + std::string(501, 'c') + "\n",
                   "compatibility", "must be at most 500 characters (got 501)"},
        RejectCase{"LicenseList", "name: pdf\n" + kDesc + "license: [MIT]\n",
                   "license", "must be a string, not a list"},
        RejectCase{"LicenseNoValue", "name: pdf\n" + kDesc + "license:\n",
                   "license", "has no value"},
        RejectCase{"MetadataNotMap", "name: pdf\n" + kDesc + "metadata: x\n",
                   "metadata", "must be a mapping"},
        RejectCase{"MetadataNestedValue",
                   "name: pdf\n" + kDesc + "metadata:\n  a:\n    b: c\n",
                   "metadata", "the value of \"a\" must be a string"},
        RejectCase{"MetadataKeyTwice",
                   "name: pdf\n" + kDesc + "metadata:\n  a: x\n  a: y\n",
                   "metadata", "key \"a\" is given more than once"},
        RejectCase{"AllowedToolsMap",
                   "name: pdf\n" + kDesc + "allowed-tools: {Bash: yes}\n",
                   "allowed-tools", "must be a space-separated string"},
        RejectCase{"AllowedToolsNestedList",
                   "name: pdf\n" + kDesc + "allowed-tools: [[Bash]]\n",
                   "allowed-tools", "list items must be strings"},
        RejectCase{"UnknownField", "name: pdf\n" + kDesc + "version: 1.0\n",
                   "version", "not a field of the Agent Skills format"}),
    [](const ::testing::TestParamInfo<RejectCase>& info) {
      return std::string(info.param.label);
    });

TEST(SkillMd, AcceptsMinimalFrontMatter) {
  ASSERT_OK_AND_ASSIGN(SkillInfo info,
                       Parse("name: pdf\ndescription: Fills PDF forms.\n"));
  EXPECT_EQ(info.name, "pdf");
  EXPECT_EQ(info.description, "Fills PDF forms.");
  EXPECT_FALSE(info.license.has_value());
  EXPECT_FALSE(info.allowed_tools.has_value());
  EXPECT_TRUE(info.metadata.empty());
}

TEST(SkillMd, AcceptsEveryOptionalField) {
  ASSERT_OK_AND_ASSIGN(
      SkillInfo info,
      Parse("name: pdf\n"
            "description: >\n  Fills PDF forms\n  and merges PDFs.\n"
            "license: Proprietary. LICENSE.txt has complete terms\n"
            "compatibility: Requires python3 and poppler-utils\n"
            "metadata:\n  author: example-org\n  version: \"1.0\"\n"
            "allowed-tools: Bash(git:*) Read\n"));
  EXPECT_EQ(info.description, "Fills PDF forms and merges PDFs.\n");
  EXPECT_EQ(info.license, "Proprietary. LICENSE.txt has complete terms");
  EXPECT_EQ(info.compatibility, "Requires python3 and poppler-utils");
  EXPECT_EQ(info.metadata, (std::map<std::string, std::string>{
                               {"author", "example-org"}, {"version", "1.0"}}));
  EXPECT_EQ(info.allowed_tools, "Bash(git:*) Read");
}

TEST(SkillMd, JoinsAllowedToolsListWithSpaces) {
  ASSERT_OK_AND_ASSIGN(SkillInfo info,
                       Parse("name: pdf\n" + kDesc +
                             "allowed-tools:\n  - Read\n  - Bash(jq:*)\n"));
  EXPECT_EQ(info.allowed_tools, "Read Bash(jq:*)");
}

TEST(SkillMd, AcceptsValuesExactlyAtTheLimits) {
  std::string name64 = std::string(63, 'a') + "1";
  ASSERT_OK_AND_ASSIGN(
      SkillInfo at_limit,
      Parse("name: " + name64 + "\ndescription: " + std::string(1024, 'd') +
                "\ncompatibility: " + std::string(500, 'c') + "\n",
            name64));
  EXPECT_EQ(at_limit.name.size(), 64u);
  EXPECT_EQ(at_limit.description.size(), 1024u);
  // Limits count characters, not bytes: 1024 two-byte characters are fine,
  // 1025 are not.
  std::string e_acute = "\xC3\xA9";
  std::string chars1024, chars1025;
  for (int i = 0; i < 1024; ++i) chars1024 += e_acute;
  chars1025 = chars1024 + e_acute;
  EXPECT_OK(Parse("name: pdf\ndescription: " + chars1024 + "\n"));
  EXPECT_TRUE(RejectedWith(Parse("name: pdf\ndescription: " + chars1025 + "\n"),
                           "field 'description': must be at most 1024 "
                           "characters (got 1025)"));
  EXPECT_OK(Parse("name: a\n" + kDesc, "a"));
  EXPECT_OK(Parse("name: pdf-2-tools\n" + kDesc, "pdf-2-tools"));
}

TEST(SkillMd, ReportsEveryProblemInOneMessage) {
  auto r = Parse("name: PDF\ndescription: ''\nversion: 2\n");
  EXPECT_TRUE(RejectedWith(r, "field 'name': must be lowercase"));
  EXPECT_TRUE(RejectedWith(r, "field 'description': must not be empty"));
  EXPECT_TRUE(RejectedWith(r, "field 'version': not a field"));
}

TEST(SkillMd, RejectsMissingFrontMatter) {
  EXPECT_TRUE(
      RejectedWith(ParseSkillMd("# PDF\nname: pdf\n", "pdf", kFile),
                   std::string(kFile) + ": must start with YAML front matter"));
  EXPECT_TRUE(RejectedWith(ParseSkillMd("", "pdf", kFile),
                           "must start with YAML front matter"));
  // The opening line must be exactly "---".
  EXPECT_TRUE(RejectedWith(
      ParseSkillMd("----\nname: pdf\n" + kDesc + "---\n", "pdf", kFile),
      "must start with YAML front matter"));
}

TEST(SkillMd, RejectsUnclosedFrontMatter) {
  EXPECT_TRUE(RejectedWith(
      ParseSkillMd("---\nname: pdf\n" + kDesc + "# no end\n", "pdf", kFile),
      std::string(kFile) + ": front matter is not closed"));
}

TEST(SkillMd, RejectsMalformedYamlWithItsLine) {
  // The bad line is the file's third line.
  EXPECT_TRUE(RejectedWith(
      Parse("name: pdf\n description: x\n"),
      std::string(kFile) + ": front matter is not valid YAML (line 3"));
  EXPECT_TRUE(RejectedWith(Parse("name: pdf\ndescription: [unclosed\n"),
                           ": front matter is not valid YAML"));
}

// yaml-cpp alone reads a quoted string left open as ending at the end of
// the front matter; the file is refused, naming the line where it opens.
// Closed quotes, escaped quotes and '' inside single quotes are fine.
TEST(SkillMd, RejectsAQuotedStringThatIsNeverClosed) {
  for (const char* yaml :
       {"name: pdf\ndescription: \"unterminated\n",
        "name: pdf\ndescription: 'unterminated\n",
        "name: pdf\ndescription: \"ends in an escape \\\"\n",
        "name: pdf\ndescription: 'it''s open\n",
        "name: pdf\ndescription: x\nmetadata:\n  \"key: v\n"}) {
    EXPECT_TRUE(RejectedWith(Parse(yaml), std::string(kFile) +
                                              ": front matter is not valid "
                                              "YAML (line "))
        << yaml;
    EXPECT_TRUE(RejectedWith(Parse(yaml), "a quoted string is never closed"))
        << yaml;
  }
  auto ok = Parse(
      "name: \"pdf\"\ndescription: 'it''s \"fine\"'\nlicense: \"a \\\" b\"\n");
  ASSERT_TRUE(ok.has_value()) << ok.error().message;
  EXPECT_EQ(ok->description, "it's \"fine\"");
}

TEST(SkillMd, RejectsFrontMatterThatIsNotAMapping) {
  EXPECT_TRUE(RejectedWith(Parse("- name\n- description\n"),
                           ": front matter must be a mapping of fields"));
  EXPECT_TRUE(RejectedWith(Parse(""), ": front matter is empty"));
}

TEST(SkillMd, AcceptsCrlfLinesAndByteOrderMark) {
  EXPECT_OK(ParseSkillMd(
      "\xEF\xBB\xBF---\r\nname: pdf\r\ndescription: d\r\n---\r\nbody\r\n",
      "pdf", kFile));
}

// Text fields are UTF-8, as YAML is: a description with a stray byte was
// accepted (and reached prompts and terminals).
TEST(SkillMd, RejectsTextThatIsNotUtf8) {
  EXPECT_TRUE(
      RejectedWith(Parse("name: pdf\ndescription: caf\xe9 menu\n"),
                   "field 'description': must be UTF-8 text (byte 0xE9 at "
                   "offset 3 is not)"));
  EXPECT_TRUE(RejectedWith(
      Parse("name: pdf\ndescription: ok\ncompatibility: \xed\xa0\x80\n"),
      "field 'compatibility': must be UTF-8 text"));  // a surrogate
  EXPECT_OK(Parse("name: pdf\ndescription: caf\xc3\xa9 \xf0\x9f\x93\x84\n"));
}

TEST(SkillMd, EscapesControlCharactersInMessages) {
  auto r = Parse("name: \"a\\nb\"\n" + kDesc);
  EXPECT_TRUE(RejectedWith(r, "(got \"a\\x0ab\")"));
}

// ------------------------------------------------------------ host trees

// Writes a SKILL.md with `fields` into `dir` (created when missing).
void MakeSkill(const std::string& dir, std::string_view fields) {
  mkdir(dir.substr(0, dir.rfind('/')).c_str(), 0755);  // a folder of skills
  mkdir(dir.c_str(), 0755);
  ASSERT_TRUE(WriteFile(dir + "/SKILL.md", SkillMd(fields)));
}

std::string Fields(std::string_view name) {
  return "name: " + std::string(name) + "\ndescription: The " +
         std::string(name) + " skill.\n";
}

std::string Describe(const struct stat& st) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "type %o mode %04o mtime %lld.%09ld",
                st.st_mode & S_IFMT, st.st_mode & 07777,
                static_cast<long long>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec);
  return buf;
}

void CompareTrees(const std::string& a, const std::string& b,
                  const std::string& rel, std::vector<std::string>& diffs) {
  struct stat sa, sb;
  if (lstat(a.c_str(), &sa) != 0 || lstat(b.c_str(), &sb) != 0) {
    diffs.push_back(rel + ": missing on one side");
    return;
  }
  bool same_type = (sa.st_mode & S_IFMT) == (sb.st_mode & S_IFMT);
  bool same_mode = S_ISLNK(sa.st_mode) ||  // symlinks have no mode of their own
                   (sa.st_mode & 07777) == (sb.st_mode & 07777);
  bool same_mtime = sa.st_mtim.tv_sec == sb.st_mtim.tv_sec &&
                    sa.st_mtim.tv_nsec == sb.st_mtim.tv_nsec;
  if (!same_type || !same_mode || !same_mtime) {
    diffs.push_back(rel + ": " + Describe(sa) + " vs " + Describe(sb));
  }
  if (!same_type) return;
  if (S_ISREG(sa.st_mode)) {
    auto ca = ReadFile(a), cb = ReadFile(b);
    if (!ca || !cb || *ca != *cb) {
      diffs.push_back(rel + ": contents differ (" +
                      std::to_string(ca ? ca->size() : 0) + " vs " +
                      std::to_string(cb ? cb->size() : 0) + " bytes)");
    }
  } else if (S_ISLNK(sa.st_mode)) {
    char ta[PATH_MAX], tb[PATH_MAX];
    ssize_t na = readlink(a.c_str(), ta, sizeof ta);
    ssize_t nb = readlink(b.c_str(), tb, sizeof tb);
    if (na < 0 || nb < 0 ||
        std::string(ta, static_cast<size_t>(na)) !=
            std::string(tb, static_cast<size_t>(nb))) {
      diffs.push_back(rel + ": symlink targets differ");
    }
  } else if (S_ISDIR(sa.st_mode)) {
    auto la = ListDir(a), lb = ListDir(b);
    if (!la || !lb) {
      diffs.push_back(rel + ": cannot list");
      return;
    }
    for (const std::string& name : *la) {
      if (std::find(lb->begin(), lb->end(), name) == lb->end()) {
        diffs.push_back(rel + "/" + name + ": only in " + a);
      } else {
        CompareTrees(a + "/" + name, b + "/" + name, rel + "/" + name, diffs);
      }
    }
    for (const std::string& name : *lb) {
      if (std::find(la->begin(), la->end(), name) == la->end()) {
        diffs.push_back(rel + "/" + name + ": only in " + b);
      }
    }
  }
}

// The two host trees have the same names, types, permission bits, mtimes,
// contents and symlink targets (the roots included).
::testing::AssertionResult SameTree(const std::string& a,
                                    const std::string& b) {
  std::vector<std::string> diffs;
  CompareTrees(a, b, ".", diffs);
  if (diffs.empty()) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << a << " and " << b << " differ:";
  for (const std::string& d : diffs) failure << "\n  " << d;
  return failure;
}

// Gives every entry below and including `path` a distinct mtime with
// nanoseconds (children before their directory, which a child's creation
// would otherwise touch), so that a copy that drops mtimes cannot pass.
void StampMtimes(const std::string& path, long& next) {
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0) << path;
  if (S_ISDIR(st.st_mode)) {
    auto names = ListDir(path);
    ASSERT_TRUE(names.has_value());
    for (const std::string& name : *names) StampMtimes(path + "/" + name, next);
  }
  timespec times[2] = {{1'600'000'000 + next, 0},
                       {1'500'000'000 + next, 123'456'789 + next}};
  ++next;
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0)
      << path;
}

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen() & 0xFF);
  return out;
}

// A skill tree with everything a copy must keep.
void BuildSampleTree(const std::string& root) {
  ASSERT_EQ(mkdir(root.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(root + "/SKILL.md", SkillMd(Fields("sample"))));
  ASSERT_EQ(mkdir((root + "/scripts").c_str(), 0755), 0);
  ASSERT_TRUE(
      WriteFile(root + "/scripts/fill.sh", "#!/bin/sh\necho filled\n", 0755));
  ASSERT_EQ(mkdir((root + "/scripts/lib").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((root + "/scripts/lib/deep").c_str(), 0700), 0);
  ASSERT_TRUE(
      WriteFile(root + "/scripts/lib/deep/util.py", "print('util')\n", 0644));
  ASSERT_TRUE(WriteFile(root + "/secret.key", "k3y\n", 0600));
  ASSERT_TRUE(WriteFile(root + "/empty.txt", "", 0644));
  ASSERT_EQ(mkdir((root + "/assets").c_str(), 0750), 0);
  ASSERT_TRUE(WriteFile(root + "/assets/blob.bin",
                        RandomBytes((size_t{3} << 20) + 123, 7), 0644));
  ASSERT_TRUE(WriteFile(root + "/assets/readonly.txt", "ro\n", 0444));
  ASSERT_EQ(symlink("scripts/fill.sh", (root + "/run").c_str()), 0);
  ASSERT_EQ(symlink("../nowhere/at/all", (root + "/dangling").c_str()), 0);
  long next = 0;
  StampMtimes(root, next);
}

// Forwards to another backend and records how files are written and read:
// the largest single Read/Write and how often a written file was flushed.
class RecordingBackend final : public vfs::Backend {
 public:
  explicit RecordingBackend(vfs::Backend& inner) : inner_(inner) {}

  size_t max_write = 0, max_read = 0, writes = 0, flushes = 0;
  size_t opens_for_write_without_trunc = 0;
  std::string fail_open;               // a path whose Open fails with EIO
  size_t fail_write_after = SIZE_MAX;  // later Writes fail with EIO

  vfs::Result<vfs::Attr> Stat(const vfs::Caller& c,
                              const vfs::Path& p) override {
    return inner_.Stat(c, p);
  }
  vfs::Result<std::vector<vfs::DirEntry>> ReadDir(const vfs::Caller& c,
                                                  const vfs::Path& p) override {
    return inner_.ReadDir(c, p);
  }
  vfs::Result<std::unique_ptr<vfs::FileHandle>> Open(const vfs::Caller& c,
                                                     const vfs::Path& p,
                                                     int flags,
                                                     mode_t mode) override {
    if ((flags & O_ACCMODE) != O_RDONLY && (flags & O_TRUNC) == 0) {
      ++opens_for_write_without_trunc;
    }
    if (p.str() == fail_open) return vfs::Fail(EIO, "injected failure");
    auto h = inner_.Open(c, p, flags, mode);
    if (!h) return h;
    return std::make_unique<Handle>(std::move(*h), *this);
  }
  vfs::Status Mkdir(const vfs::Caller& c, const vfs::Path& p,
                    mode_t m) override {
    return inner_.Mkdir(c, p, m);
  }
  vfs::Status Unlink(const vfs::Caller& c, const vfs::Path& p) override {
    return inner_.Unlink(c, p);
  }
  vfs::Status Rmdir(const vfs::Caller& c, const vfs::Path& p) override {
    return inner_.Rmdir(c, p);
  }
  vfs::Status Symlink(const vfs::Caller& c, const std::string& t,
                      const vfs::Path& l) override {
    return inner_.Symlink(c, t, l);
  }
  vfs::Result<std::string> Readlink(const vfs::Caller& c,
                                    const vfs::Path& p) override {
    return inner_.Readlink(c, p);
  }
  vfs::Status Link(const vfs::Caller& c, const vfs::Path& f,
                   const vfs::Path& t) override {
    return inner_.Link(c, f, t);
  }
  vfs::Status Rename(const vfs::Caller& c, const vfs::Path& f,
                     const vfs::Path& t, unsigned flags) override {
    return inner_.Rename(c, f, t, flags);
  }
  vfs::Status Chmod(const vfs::Caller& c, const vfs::Path& p,
                    mode_t m) override {
    return inner_.Chmod(c, p, m);
  }
  vfs::Status Chown(const vfs::Caller& c, const vfs::Path& p, uid_t u,
                    gid_t g) override {
    return inner_.Chown(c, p, u, g);
  }
  vfs::Status Utimens(const vfs::Caller& c, const vfs::Path& p,
                      const struct timespec t[2]) override {
    return inner_.Utimens(c, p, t);
  }
  vfs::Status Truncate(const vfs::Caller& c, const vfs::Path& p,
                       off_t s) override {
    return inner_.Truncate(c, p, s);
  }
  vfs::Result<struct statvfs> StatFs(const vfs::Caller& c,
                                     const vfs::Path& p) override {
    return inner_.StatFs(c, p);
  }

 private:
  class Handle final : public vfs::FileHandle {
   public:
    Handle(std::unique_ptr<vfs::FileHandle> inner, RecordingBackend& rec)
        : inner_(std::move(inner)), rec_(rec) {}
    vfs::Result<size_t> Read(void* buf, size_t size, off_t off) override {
      rec_.max_read = std::max(rec_.max_read, size);
      return inner_->Read(buf, size, off);
    }
    vfs::Result<size_t> Write(const void* buf, size_t size,
                              off_t off) override {
      rec_.max_write = std::max(rec_.max_write, size);
      if (rec_.writes >= rec_.fail_write_after)
        return vfs::Fail(EIO, "injected write failure");
      ++rec_.writes;
      return inner_->Write(buf, size, off);
    }
    void Discard() override { inner_->Discard(); }
    vfs::Result<vfs::Attr> Stat() override { return inner_->Stat(); }
    vfs::Status Truncate(off_t size) override { return inner_->Truncate(size); }
    vfs::Status Sync(bool datasync) override { return inner_->Sync(datasync); }
    vfs::Status Flush() override {
      ++rec_.flushes;
      return inner_->Flush();
    }

   private:
    std::unique_ptr<vfs::FileHandle> inner_;
    RecordingBackend& rec_;
  };

  vfs::Backend& inner_;
};

class SkillsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = backends::LocalDirBackend::Open(store_.path());
    ASSERT_OK(backend);
    ASSERT_OK(router_.Mount("/skills", router_.Adopt(std::move(*backend))));
  }

  static vfs::Path P(std::string_view text) { return *vfs::Path::Parse(text); }

  // Declared before the router, so destroyed after it.
  TempDir host_{"agentvfs-skills-host"};
  TempDir store_{"agentvfs-skills-store"};
  TempDir out_{"agentvfs-skills-out"};
  router::Router router_;
  vfs::Caller caller_ = vfs::Caller::Local();
};

// ------------------------------------------------------------ validation

TEST_F(SkillsTest, ValidateSkillFolderAcceptsAValidSkill) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_OK_AND_ASSIGN(SkillInfo info, ValidateSkillFolder(host_.Sub("pdf")));
  EXPECT_EQ(info.name, "pdf");
  // The folder's name is found for "dir/" and "." too.
  EXPECT_OK(ValidateSkillFolder(host_.Sub("pdf/")));
  EXPECT_OK(ValidateSkillFolder(host_.Sub("pdf/.")));
}

TEST_F(SkillsTest, ValidateSkillFolderNamesTheFileAndField) {
  MakeSkill(host_.Sub("pdf"), "name: PDF Tool\ndescription: x\n");
  EXPECT_TRUE(RejectedWith(
      ValidateSkillFolder(host_.Sub("pdf")),
      host_.Sub("pdf/SKILL.md") +
          ": field 'name': must be lowercase letters, digits and hyphens "
          "(got \"PDF Tool\")"));
}

TEST_F(SkillsTest, ValidateSkillFolderRejectsNameOfAnotherFolder) {
  MakeSkill(host_.Sub("pdf-v2"), Fields("pdf"));
  EXPECT_TRUE(RejectedWith(ValidateSkillFolder(host_.Sub("pdf-v2")),
                           host_.Sub("pdf-v2/SKILL.md") +
                               ": field 'name': must match the skill's folder "
                               "name \"pdf-v2\" (got \"pdf\")"));
}

TEST_F(SkillsTest, ValidateSkillFolderNeedsARegularSkillMd) {
  ASSERT_EQ(mkdir(host_.Sub("pdf").c_str(), 0755), 0);
  EXPECT_TRUE(RejectedWith(ValidateSkillFolder(host_.Sub("pdf")),
                           host_.Sub("pdf/SKILL.md") + ": missing"));
  // A symlinked SKILL.md could point anywhere on the host.
  ASSERT_TRUE(WriteFile(host_.Sub("real.md"), SkillMd(Fields("pdf"))));
  ASSERT_EQ(
      symlink(host_.Sub("real.md").c_str(), host_.Sub("pdf/SKILL.md").c_str()),
      0);
  EXPECT_TRUE(RejectedWith(
      ValidateSkillFolder(host_.Sub("pdf")),
      host_.Sub("pdf/SKILL.md") + ": must be a regular file, not a symlink"));
  EXPECT_ERRNO(ValidateSkillFolder(host_.Sub("absent")), ENOENT);
}

TEST_F(SkillsTest, ValidateSkillFolderRejectsSpecialFiles) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_EQ(mkdir(host_.Sub("pdf/scripts").c_str(), 0755), 0);
  ASSERT_EQ(mkfifo(host_.Sub("pdf/scripts/pipe").c_str(), 0644), 0);
  EXPECT_TRUE(RejectedWith(ValidateSkillFolder(host_.Sub("pdf")),
                           host_.Sub("pdf/scripts/pipe") + ": is a FIFO"));
}

// A skill must be whole in its folder: a symlink that leads out of it
// (absolute, or up past the folder) is refused, naming the file; links
// within the folder are fine.
TEST_F(SkillsTest, ValidateSkillFolderRejectsLinksOutOfTheSkill) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_EQ(mkdir(host_.Sub("pdf/scripts").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/scripts/run.sh"), "#!/bin/sh\n"));
  ASSERT_EQ(symlink("scripts/run.sh", host_.Sub("pdf/run").c_str()), 0);
  ASSERT_EQ(symlink("../SKILL.md", host_.Sub("pdf/scripts/skill").c_str()), 0);
  ASSERT_OK(ValidateSkillFolder(host_.Sub("pdf")));

  ASSERT_EQ(symlink("/etc/shadow", host_.Sub("pdf/shadow").c_str()), 0);
  ASSERT_EQ(symlink("../../etc", host_.Sub("pdf/scripts/up").c_str()), 0);
  ASSERT_EQ(symlink("./x/../../other/f", host_.Sub("pdf/side").c_str()), 0);
  auto r = ValidateSkillFolder(host_.Sub("pdf"));
  ASSERT_FALSE(r.has_value());
  for (const char* bad : {"pdf/shadow", "pdf/scripts/up", "pdf/side"}) {
    EXPECT_NE(r.error().message.find(host_.Sub(bad) + ": a symlink to"),
              std::string::npos)
        << bad << ": " << r.error().message;
  }
  EXPECT_EQ(r.error().message.find("pdf/run:"), std::string::npos);
}

// A file the importing user cannot read is named before anything is
// copied (not after the files before it were committed). Checked as
// "nobody": root reads everything.
TEST_F(SkillsTest, ValidateSkillFolderNamesAFileTheUserCannotRead) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/a.md"), "a\n"));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/secret.md"), "s\n"));
  ASSERT_EQ(chmod(host_.Sub("pdf/secret.md").c_str(), 0600), 0);
  ASSERT_EQ(chmod(host_.path().c_str(), 0755), 0);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    std::string out = "could not become nobody";
    if (setresgid(65534, 65534, 65534) == 0 &&
        setresuid(65534, 65534, 65534) == 0) {
      auto r = ValidateSkillFolder(host_.Sub("pdf"));
      out = r ? "valid" : r.error().message;
    }
    (void)!write(pipefd[1], out.data(), out.size());
    _exit(0);
  }
  close(pipefd[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_NE(
      got.find(host_.Sub("pdf/secret.md") + ": cannot be read by this user"),
      std::string::npos)
      << got;
  EXPECT_EQ(got.find("a.md"), std::string::npos) << got;
}

// A link whose text stays inside but passes through another link is
// followed as the kernel follows it: with `up -> .`, `up/../secret` is the
// folder's parent, and a chain of such links reaches anywhere. A link
// through an in-folder link to a directory, and a dangling one, are fine.
TEST_F(SkillsTest, ValidateSkillFolderFollowsLinksOnTheWayOut) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_TRUE(WriteFile(host_.Sub("secret"), "outside\n"));
  ASSERT_EQ(mkdir(host_.Sub("pdf/src").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(host_.Sub("pdf/src/lib").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/src/lib/x.py"), "x = 1\n"));
  ASSERT_EQ(symlink("src/lib", host_.Sub("pdf/lib").c_str()), 0);
  ASSERT_EQ(symlink("lib/x.py", host_.Sub("pdf/x").c_str()), 0);
  ASSERT_EQ(symlink("lib/../lib/x.py", host_.Sub("pdf/y").c_str()), 0);
  ASSERT_EQ(symlink("lib/nowhere/../at/all", host_.Sub("pdf/gone").c_str()), 0);
  ASSERT_EQ(symlink(".", host_.Sub("pdf/up").c_str()), 0);
  ASSERT_EQ(symlink("up/SKILL.md", host_.Sub("pdf/skill").c_str()), 0);
  ASSERT_OK(ValidateSkillFolder(host_.Sub("pdf")));

  ASSERT_EQ(symlink("up/../secret", host_.Sub("pdf/leak").c_str()), 0);
  ASSERT_EQ(mkdir(host_.Sub("pdf/e").c_str(), 0755), 0);
  ASSERT_EQ(symlink("../up/..", host_.Sub("pdf/e/ee").c_str()), 0);
  ASSERT_EQ(symlink("e/ee/../secret", host_.Sub("pdf/chain").c_str()), 0);
  ASSERT_EQ(symlink("up/../missing/file", host_.Sub("pdf/far").c_str()), 0);
  // `..` after a file: the kernel stops there (ENOTDIR); it is no way in.
  ASSERT_EQ(symlink("SKILL.md/../e/ee/../secret", host_.Sub("pdf/ev").c_str()),
            0);
  auto r = ValidateSkillFolder(host_.Sub("pdf"));
  ASSERT_FALSE(r.has_value());
  for (const char* bad :
       {"pdf/leak", "pdf/e/ee", "pdf/chain", "pdf/far", "pdf/ev"}) {
    EXPECT_NE(r.error().message.find(host_.Sub(bad) + ": a symlink to"),
              std::string::npos)
        << bad << ": " << r.error().message;
  }
  for (const char* good :
       {"pdf/lib:", "pdf/x:", "pdf/y:", "pdf/gone:", "pdf/up:", "pdf/skill:"}) {
    EXPECT_EQ(r.error().message.find(good), std::string::npos)
        << good << ": " << r.error().message;
  }
}

// ------------------------------------------------------------ ImportSkills

TEST_F(SkillsTest, ImportSkillsImportsEveryFolderOfAFolderOfSkills) {
  MakeSkill(host_.Sub("skills/pdf"), Fields("pdf"));
  MakeSkill(host_.Sub("skills/docx"), Fields("docx"));
  ASSERT_TRUE(WriteFile(host_.Sub("skills/pdf/forms.md"), "# Forms\n"));
  // Skipped: files beside the skills and hidden folders.
  ASSERT_TRUE(WriteFile(host_.Sub("skills/README.md"), "# Skills\n"));
  ASSERT_EQ(mkdir(host_.Sub("skills/.git").c_str(), 0755), 0);

  ASSERT_OK_AND_ASSIGN(auto imported,
                       ImportSkills(router_, caller_, host_.Sub("skills")));
  ASSERT_EQ(imported.size(), 2u);
  EXPECT_EQ(imported[0].name, "docx");
  EXPECT_EQ(imported[1].name, "pdf");
  EXPECT_EQ(ListDir(store_.path()), (std::vector<std::string>{"docx", "pdf"}));
  EXPECT_TRUE(SameTree(host_.Sub("skills/pdf"), store_.Sub("pdf")));
  EXPECT_TRUE(SameTree(host_.Sub("skills/docx"), store_.Sub("docx")));

  // What was imported reads back as a valid skill through the backend.
  ASSERT_OK_AND_ASSIGN(SkillInfo read,
                       ReadSkillInfo(router_, caller_, P("/skills/pdf")));
  EXPECT_EQ(read.name, "pdf");
  EXPECT_EQ(read.description, "The pdf skill.");
}

// A stopped import (Ctrl-C of `skills import`) is EINTR and names the
// skill it was copying and those imported before it.
TEST_F(SkillsTest, AStoppedSkillsImportSaysWhichSkillMayBeMixed) {
  MakeSkill(host_.Sub("skills/aaa"), Fields("aaa"));
  MakeSkill(host_.Sub("skills/bbb"), Fields("bbb"));
  ASSERT_TRUE(WriteFile(host_.Sub("skills/bbb/more.md"), "more\n"));
  ASSERT_OK_AND_ASSIGN(auto found, FindSkills(host_.Sub("skills")));
  int asked = 0;
  bool in_bbb = false;
  auto r = ImportHostSkills(router_, caller_, std::move(found), [&] {
    in_bbb = in_bbb || std::filesystem::exists(store_.Sub("bbb"));
    return in_bbb && ++asked > 1;
  });
  ASSERT_ERRNO(r, EINTR);
  EXPECT_NE(r.error().message.find("interrupted while importing skill bbb"),
            std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("run the import again to finish "
                                   "(imported before it: aaa)"),
            std::string::npos)
      << r.error().message;
}

// A folder of skills others can write: a skill folder swapped for a
// symlink to a private directory between validation and import is refused,
// and nothing of that directory reaches /skills.
TEST_F(SkillsTest, ImportRefusesASkillFolderSwappedAfterItWasValidated) {
  MakeSkill(host_.Sub("skills/aaa"), Fields("aaa"));
  MakeSkill(host_.Sub("skills/zzz"), Fields("zzz"));
  TempDir secret("agentvfs-skills-secret");
  ASSERT_TRUE(WriteFile(secret.Sub("id_ed25519"), "PRIVATE KEY\n", 0600));
  ASSERT_OK_AND_ASSIGN(auto found, FindSkills(host_.Sub("skills")));
  ASSERT_EQ(found.size(), 2u);

  ASSERT_EQ(
      rename(host_.Sub("skills/zzz").c_str(), host_.Sub("zzz.old").c_str()), 0);
  ASSERT_EQ(symlink(secret.path().c_str(), host_.Sub("skills/zzz").c_str()), 0);
  auto r = ImportHostSkills(router_, caller_, std::move(found));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_NE(r.error().message.find("no longer the folder"), std::string::npos)
      << r.error().message;
  struct stat st;
  EXPECT_NE(lstat(store_.Sub("zzz/id_ed25519").c_str(), &st), 0);

  // The same with the folder's SKILL.md broken after validation.
  MakeSkill(host_.Sub("one"), Fields("one"));
  ASSERT_OK_AND_ASSIGN(found, FindSkills(host_.Sub("one")));
  ASSERT_TRUE(WriteFile(host_.Sub("one/SKILL.md"), "no front matter\n"));
  EXPECT_ERRNO(ImportHostSkills(router_, caller_, std::move(found)), EINVAL);
  EXPECT_NE(lstat(store_.Sub("one").c_str(), &st), 0);
}

TEST_F(SkillsTest, ImportSkillsTakesASingleSkillFolder) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_OK_AND_ASSIGN(auto imported,
                       ImportSkills(router_, caller_, host_.Sub("pdf")));
  ASSERT_EQ(imported.size(), 1u);
  EXPECT_EQ(imported[0].name, "pdf");
  EXPECT_TRUE(SameTree(host_.Sub("pdf"), store_.Sub("pdf")));
}

TEST_F(SkillsTest, OneBadSkillImportsNothing) {
  MakeSkill(host_.Sub("skills/alpha"), Fields("alpha"));
  MakeSkill(host_.Sub("skills/pdf"), "name: pdf-tool\ndescription: x\n");
  MakeSkill(host_.Sub("skills/zeta"), Fields("zeta"));
  auto r = ImportSkills(router_, caller_, host_.Sub("skills"));
  EXPECT_TRUE(RejectedWith(
      r, host_.Sub("skills/pdf/SKILL.md") + ": field 'name': must match"));
  EXPECT_EQ(ListDir(store_.path()), std::vector<std::string>{});
}

TEST_F(SkillsTest, ImportSkillsReportsEveryBadSkill) {
  MakeSkill(host_.Sub("skills/pdf"), "name: pdf\n");
  MakeSkill(host_.Sub("skills/docx"), "name: Docx\ndescription: d\n");
  ASSERT_EQ(mkdir(host_.Sub("skills/notes").c_str(), 0755), 0);
  ASSERT_EQ(symlink(host_.Sub("skills/pdf").c_str(),
                    host_.Sub("skills/pdf-link").c_str()),
            0);
  auto r = ImportSkills(router_, caller_, host_.Sub("skills"));
  EXPECT_TRUE(RejectedWith(r, host_.Sub("skills/pdf/SKILL.md") +
                                  ": field 'description': is required"));
  EXPECT_TRUE(RejectedWith(
      r, host_.Sub("skills/docx/SKILL.md") + ": field 'name': must be lower"));
  EXPECT_TRUE(
      RejectedWith(r, host_.Sub("skills/notes/SKILL.md") + ": missing"));
  EXPECT_TRUE(RejectedWith(r, host_.Sub("skills/pdf-link") + ": is a symlink"));
  EXPECT_EQ(ListDir(store_.path()), std::vector<std::string>{});
}

TEST_F(SkillsTest, ImportSkillsRejectsAFolderWithoutSkills) {
  ASSERT_EQ(mkdir(host_.Sub("empty").c_str(), 0755), 0);
  EXPECT_TRUE(RejectedWith(ImportSkills(router_, caller_, host_.Sub("empty")),
                           host_.Sub("empty") + ": holds no SKILL.md"));
}

TEST_F(SkillsTest, ImportSkillsWithASpecialFileImportsNothing) {
  MakeSkill(host_.Sub("skills/alpha"), Fields("alpha"));
  MakeSkill(host_.Sub("skills/pdf"), Fields("pdf"));
  ASSERT_EQ(mkfifo(host_.Sub("skills/pdf/fifo").c_str(), 0644), 0);
  EXPECT_TRUE(RejectedWith(ImportSkills(router_, caller_, host_.Sub("skills")),
                           host_.Sub("skills/pdf/fifo") + ": is a FIFO"));
  EXPECT_EQ(ListDir(store_.path()), std::vector<std::string>{});
}

TEST_F(SkillsTest, ReimportingASkillReplacesItsContents) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/old.md"), "old\n"));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/tool.sh"), "v1\n", 0644));
  ASSERT_OK(ImportSkills(router_, caller_, host_.Sub("pdf")));

  ASSERT_EQ(unlink(host_.Sub("pdf/old.md").c_str()), 0);
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/tool.sh"), "version two\n", 0755));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/new.md"), "new\n"));
  ASSERT_OK(ImportSkills(router_, caller_, host_.Sub("pdf")));
  EXPECT_TRUE(SameTree(host_.Sub("pdf"), store_.Sub("pdf")));
  EXPECT_EQ(ReadFile(store_.Sub("pdf/tool.sh")), "version two\n");
}

// Files are committed one at a time: a re-import that fails part-way may
// leave the skill mixing new and old files, and the error says so and
// what to do (it said "no skill was imported").
TEST_F(SkillsTest, AReimportThatFailsPartWaySaysTheSkillMayBeMixed) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/a.md"), "a1\n"));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/b.md"), "b1\n"));
  ASSERT_OK(ImportSkills(router_, caller_, host_.Sub("pdf")));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/a.md"), "a2\n"));
  ASSERT_TRUE(WriteFile(host_.Sub("pdf/b.md"), "b2\n"));
  RecordingBackend failing(router_);
  failing.fail_open = "/skills/pdf/b.md";
  auto r = ImportSkills(failing, caller_, host_.Sub("pdf"));
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("/skills/pdf may now hold part of the new "
                                   "files"),
            std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("run the import again"), std::string::npos);
  EXPECT_EQ(ReadFile(store_.Sub("pdf/a.md")), "a2\n");
  EXPECT_EQ(ReadFile(store_.Sub("pdf/b.md")), "b1\n");
  ASSERT_OK(ImportSkills(router_, caller_, host_.Sub("pdf")));
  EXPECT_EQ(ReadFile(store_.Sub("pdf/b.md")), "b2\n");
}

// ------------------------------------------------------------ trees

TEST_F(SkillsTest, ImportThenExportRoundTripsATreeByteForByte) {
  std::string src = host_.Sub("sample");
  BuildSampleTree(src);
  ASSERT_OK(ImportTree(router_, caller_, src, P("/skills/sample")));
  EXPECT_TRUE(SameTree(src, store_.Sub("sample")));

  std::string back = out_.Sub("sample");
  ASSERT_OK(ExportTree(router_, caller_, P("/skills/sample"), back));
  EXPECT_TRUE(SameTree(src, back));
}

TEST_F(SkillsTest, CopiesMoveFileDataInPiecesAndCommitEachFileOnce) {
  std::string src = host_.Sub("sample");
  BuildSampleTree(src);
  RecordingBackend recording(router_);
  ASSERT_OK(ImportTree(recording, caller_, src, P("/skills/sample")));
  EXPECT_LE(recording.max_write, kCopyPieceBytes);
  EXPECT_GE(recording.writes, 4u);   // the 3 MiB file alone needs 4
  EXPECT_EQ(recording.flushes, 7u);  // one commit per regular file
  EXPECT_EQ(recording.opens_for_write_without_trunc, 0u);

  ASSERT_OK(
      ExportTree(recording, caller_, P("/skills/sample"), out_.Sub("sample")));
  EXPECT_GT(recording.max_read, 0u);
  EXPECT_LE(recording.max_read, kCopyPieceBytes);
  EXPECT_TRUE(SameTree(src, out_.Sub("sample")));
}

// Importing the same tree again commits nothing (no versions of unchanged
// files); a changed byte, or a size, is committed.
TEST_F(SkillsTest, ReimportingAnUnchangedTreeCommitsNothing) {
  std::string src = host_.Sub("sample");
  BuildSampleTree(src);
  ASSERT_OK(ImportTree(router_, caller_, src, P("/skills/sample")));
  RecordingBackend again(router_);
  ASSERT_OK(ImportTree(again, caller_, src, P("/skills/sample")));
  EXPECT_EQ(again.flushes, 0u);
  EXPECT_TRUE(SameTree(src, store_.Sub("sample")));

  ASSERT_TRUE(WriteFile(src + "/same-size", "abc"));
  ASSERT_OK(ImportTree(router_, caller_, src, P("/skills/sample")));
  ASSERT_TRUE(WriteFile(src + "/same-size", "abd"));
  RecordingBackend changed(router_);
  ASSERT_OK(ImportTree(changed, caller_, src, P("/skills/sample")));
  EXPECT_EQ(changed.flushes, 1u);
  EXPECT_EQ(ReadFile(store_.Sub("sample/same-size")), "abd");
}

// Without --delete, import removes nothing of the store: a store directory
// where the source has a file (or the reverse) is refused, naming both,
// before anything is written; with it, the entry is replaced.
TEST_F(SkillsTest, ImportWithoutDeleteRefusesToReplaceAnEntryOfAnotherType) {
  ASSERT_EQ(mkdir(host_.Sub("t").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(host_.Sub("t/X").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(host_.Sub("t/X/data"), "kept\n"));
  ASSERT_TRUE(WriteFile(host_.Sub("t/a"), "one\n"));
  ASSERT_OK(ImportTree(router_, caller_, host_.Sub("t"), P("/skills/t")));

  ASSERT_EQ(unlink(host_.Sub("t/X/data").c_str()), 0);
  ASSERT_EQ(rmdir(host_.Sub("t/X").c_str()), 0);
  ASSERT_TRUE(WriteFile(host_.Sub("t/X"), "a file now\n"));
  ASSERT_TRUE(WriteFile(host_.Sub("t/a"), "two\n"));
  ImportOptions keep;
  keep.remove_extra = false;
  auto refused =
      ImportTree(router_, caller_, host_.Sub("t"), P("/skills/t"), keep);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, EINVAL);
  EXPECT_NE(refused.error().message.find(host_.Sub("t/X") +
                                         " is a regular file but /skills/t/X "
                                         "is a directory; `import --delete`"),
            std::string::npos)
      << refused.error().message;
  EXPECT_EQ(ReadFile(store_.Sub("t/X/data")), "kept\n");
  EXPECT_EQ(ReadFile(store_.Sub("t/a")), "one\n");  // nothing written

  ASSERT_OK(ImportTree(router_, caller_, host_.Sub("t"), P("/skills/t")));
  EXPECT_EQ(ReadFile(store_.Sub("t/X")), "a file now\n");
}

// An export asked to stop (Ctrl-C of the command) stops between pieces;
// into a directory it made, it removes it, leaving no temporary file. A
// merge removes the temporary files a killed export left.
TEST_F(SkillsTest, AStoppedExportLeavesNothingHalfDone) {
  std::string src = host_.Sub("sample");
  BuildSampleTree(src);
  ASSERT_OK(ImportTree(router_, caller_, src, P("/skills/sample")));
  for (int after : {1, 3, 6}) {
    int asked = 0;
    ExportOptions stop;
    stop.stopped = [&] { return ++asked > after; };
    auto r = ExportTree(router_, caller_, P("/skills/sample"),
                        out_.Sub("stopped"), stop);
    ASSERT_ERRNO(r, EINTR);
    EXPECT_FALSE(std::filesystem::exists(out_.Sub("stopped"))) << after;
    // An empty directory that was there is emptied again, its mode kept.
    ASSERT_EQ(mkdir(out_.Sub("empty").c_str(), 0750), 0);
    asked = 0;
    r = ExportTree(router_, caller_, P("/skills/sample"), out_.Sub("empty"),
                   stop);
    ASSERT_ERRNO(r, EINTR);
    EXPECT_EQ(ListDir(out_.Sub("empty")), std::vector<std::string>{}) << after;
    struct stat st {};
    ASSERT_EQ(stat(out_.Sub("empty").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0750u);
    ASSERT_EQ(rmdir(out_.Sub("empty").c_str()), 0);
  }
  // A merge into a directory with a killed export's temporary file.
  ASSERT_EQ(mkdir(out_.Sub("merged").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(out_.Sub("merged/.agentvfs-export-0123abcd"), "x"));
  ExportOptions merge;
  merge.into_non_empty = true;
  ASSERT_OK(ExportTree(router_, caller_, P("/skills/sample"),
                       out_.Sub("merged"), merge));
  EXPECT_FALSE(
      std::filesystem::exists(out_.Sub("merged/.agentvfs-export-0123abcd")));
  EXPECT_TRUE(SameTree(src, out_.Sub("merged")));
}

TEST_F(SkillsTest, HostSymlinksLeavingTheTreeAreCopiedNotFollowed) {
  TempDir outside("agentvfs-skills-outside");
  ASSERT_TRUE(WriteFile(outside.Sub("secret.txt"), "top secret\n"));
  std::string src = host_.Sub("tree");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(src + "/a.txt", "a\n"));
  // An absolute link to a directory outside, and a relative one up and out.
  ASSERT_EQ(symlink(outside.path().c_str(), (src + "/abs").c_str()), 0);
  std::string up = "../../" + outside.path().substr(5) + "/secret.txt";
  ASSERT_EQ(symlink(up.c_str(), (src + "/up").c_str()), 0);

  ASSERT_OK(ImportTree(router_, caller_, src, P("/skills/tree")));
  EXPECT_TRUE(SameTree(src, store_.Sub("tree")));
  ASSERT_OK_AND_ASSIGN(vfs::Attr attr,
                       router_.Stat(caller_, P("/skills/tree/abs")));
  EXPECT_TRUE(S_ISLNK(attr.st_mode));
  ASSERT_OK_AND_ASSIGN(std::string target,
                       router_.Readlink(caller_, P("/skills/tree/abs")));
  EXPECT_EQ(target, outside.path());
  ASSERT_OK_AND_ASSIGN(target, router_.Readlink(caller_, P("/skills/tree/up")));
  EXPECT_EQ(target, up);
  EXPECT_EQ(ListDir(store_.Sub("tree")),
            (std::vector<std::string>{"a.txt", "abs", "up"}));

  ASSERT_OK(ExportTree(router_, caller_, P("/skills/tree"), out_.Sub("tree")));
  EXPECT_TRUE(SameTree(src, out_.Sub("tree")));
  EXPECT_EQ(ReadFile(outside.Sub("secret.txt")), "top secret\n");
}

TEST_F(SkillsTest, ImportRefusesSpecialFilesBeforeWritingAnything) {
  std::string src = host_.Sub("tree");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(src + "/a.txt", "a\n"));
  ASSERT_EQ(mkfifo((src + "/z-fifo").c_str(), 0644), 0);
  auto s = ImportTree(router_, caller_, src, P("/skills/tree"));
  ASSERT_ERRNO(s, EINVAL);
  EXPECT_NE(s.error().message.find(src + "/z-fifo: is a FIFO"),
            std::string::npos)
      << s.error().message;
  EXPECT_EQ(ListDir(store_.path()), std::vector<std::string>{});
}

TEST_F(SkillsTest, ImportMirrorsTheSourceIntoAnExistingDirectory) {
  std::string src = host_.Sub("tree");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(src + "/keep.txt", "new\n"));
  ASSERT_TRUE(WriteFile(src + "/was-dir", "now a file\n"));
  ASSERT_EQ(mkdir((src + "/was-file").c_str(), 0755), 0);
  ASSERT_EQ(symlink("keep.txt", (src + "/link").c_str()), 0);

  ASSERT_EQ(mkdir(store_.Sub("tree").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(store_.Sub("tree/keep.txt"), "old and longer\n"));
  ASSERT_TRUE(WriteFile(store_.Sub("tree/extra.txt"), "extra\n"));
  ASSERT_EQ(mkdir(store_.Sub("tree/was-dir").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(store_.Sub("tree/was-dir/inner"), "x"));
  ASSERT_TRUE(WriteFile(store_.Sub("tree/was-file"), "x"));
  ASSERT_EQ(symlink("elsewhere", store_.Sub("tree/link").c_str()), 0);

  ImportOptions keep_extra;
  keep_extra.remove_extra = false;
  // Keeping extras, nothing of the store is removed: entries of another
  // type are refused, and nothing is written.
  auto refused =
      ImportTree(router_, caller_, src, P("/skills/tree"), keep_extra);
  ASSERT_ERRNO(refused, EINVAL);
  for (const char* name : {"/was-dir is a regular file but /skills/tree/"
                           "was-dir is a directory",
                           "/was-file is a directory but /skills/tree/"
                           "was-file is a regular file"}) {
    EXPECT_NE(refused.error().message.find(src + name), std::string::npos)
        << refused.error().message;
  }
  EXPECT_EQ(ReadFile(store_.Sub("tree/keep.txt")), "old and longer\n");
  EXPECT_EQ(ReadFile(store_.Sub("tree/was-dir/inner")), "x");
  ASSERT_EQ(unlink(store_.Sub("tree/was-dir/inner").c_str()), 0);
  ASSERT_EQ(rmdir(store_.Sub("tree/was-dir").c_str()), 0);
  ASSERT_EQ(unlink(store_.Sub("tree/was-file").c_str()), 0);
  ASSERT_OK(ImportTree(router_, caller_, src, P("/skills/tree"), keep_extra));
  EXPECT_EQ(ListDir(store_.Sub("tree")),
            (std::vector<std::string>{"extra.txt", "keep.txt", "link",
                                      "was-dir", "was-file"}));
  EXPECT_EQ(ReadFile(store_.Sub("tree/extra.txt")), "extra\n");
  for (const char* name : {"keep.txt", "link", "was-dir", "was-file"}) {
    EXPECT_TRUE(SameTree(src + "/" + name, store_.Sub("tree/") + name));
  }

  // By default the destination ends up an exact copy: extras are removed.
  ASSERT_OK(ImportTree(router_, caller_, src, P("/skills/tree")));
  EXPECT_TRUE(SameTree(src, store_.Sub("tree")));
}

TEST_F(SkillsTest, ImportIntoANonDirectoryIsENOTDIR) {
  ASSERT_EQ(mkdir(host_.Sub("tree").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(store_.Sub("file"), "x"));
  EXPECT_ERRNO(
      ImportTree(router_, caller_, host_.Sub("tree"), P("/skills/file")),
      ENOTDIR);
  EXPECT_EQ(ReadFile(store_.Sub("file")), "x");
}

TEST_F(SkillsTest, ExportRefusesANonEmptyHostDirectoryUnlessAsked) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_OK(ImportTree(router_, caller_, host_.Sub("pdf"), P("/skills/pdf")));
  ASSERT_TRUE(WriteFile(out_.Sub("mine.txt"), "mine\n"));

  EXPECT_ERRNO(ExportTree(router_, caller_, P("/skills/pdf"), out_.path()),
               EEXIST);
  EXPECT_EQ(ListDir(out_.path()), std::vector<std::string>{"mine.txt"});

  // Asked to merge: the host's own entries stay, and a host symlink where a
  // file goes is replaced, not written through.
  TempDir outside("agentvfs-skills-outside");
  ASSERT_TRUE(WriteFile(outside.Sub("target.md"), "untouched\n"));
  ASSERT_EQ(
      symlink(outside.Sub("target.md").c_str(), out_.Sub("SKILL.md").c_str()),
      0);
  ExportOptions merge;
  merge.into_non_empty = true;
  ASSERT_OK(ExportTree(router_, caller_, P("/skills/pdf"), out_.path(), merge));
  EXPECT_EQ(ReadFile(outside.Sub("target.md")), "untouched\n");
  EXPECT_EQ(ReadFile(out_.Sub("SKILL.md")),
            ReadFile(host_.Sub("pdf/SKILL.md")));
  EXPECT_EQ(ReadFile(out_.Sub("mine.txt")), "mine\n");
}

// Merging replaces a host file only once its new copy is whole: a copy
// that fails leaves the old file, and no temporary file, behind.
TEST_F(SkillsTest, AFailedMergeLeavesTheHostFilesItDidNotReplace) {
  ASSERT_EQ(mkdir(store_.Sub("kit").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(store_.Sub("kit/a.md"), "new a\n"));
  ASSERT_TRUE(WriteFile(store_.Sub("kit/b.md"), "new b\n"));
  ASSERT_EQ(symlink("a.md", store_.Sub("kit/l").c_str()), 0);
  ASSERT_TRUE(WriteFile(out_.Sub("a.md"), "old a\n"));
  ASSERT_TRUE(WriteFile(out_.Sub("b.md"), "old b\n"));
  ASSERT_EQ(symlink("b.md", out_.Sub("l").c_str()), 0);
  RecordingBackend failing(router_);
  failing.fail_open = "/skills/kit/b.md";
  ExportOptions merge;
  merge.into_non_empty = true;
  EXPECT_ERRNO(
      ExportTree(failing, caller_, P("/skills/kit"), out_.path(), merge), EIO);
  EXPECT_EQ(ReadFile(out_.Sub("a.md")), "new a\n");
  EXPECT_EQ(ReadFile(out_.Sub("b.md")), "old b\n");
  EXPECT_EQ(ListDir(out_.path()),
            (std::vector<std::string>{"a.md", "b.md", "l"}));

  // Then whole: the link is replaced too, and nothing temporary is left.
  ASSERT_OK(ExportTree(router_, caller_, P("/skills/kit"), out_.path(), merge));
  EXPECT_EQ(ReadFile(out_.Sub("b.md")), "new b\n");
  char target[16] = {};
  ASSERT_GT(readlink(out_.Sub("l").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "a.md");
  EXPECT_EQ(ListDir(out_.path()),
            (std::vector<std::string>{"a.md", "b.md", "l"}));
}

TEST_F(SkillsTest, ExportIntoAnEmptyExistingDirectory) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_OK(ImportTree(router_, caller_, host_.Sub("pdf"), P("/skills/pdf")));
  ASSERT_OK(ExportTree(router_, caller_, P("/skills/pdf"), out_.path()));
  EXPECT_TRUE(SameTree(host_.Sub("pdf"), out_.path()));
}

// Whoever may write a skill in the store does not decide that its copy in
// someone's home is writable by everyone: the umask applies, as with tar.
TEST_F(SkillsTest, ExportAppliesTheUmaskToTheStoresModes) {
  ASSERT_EQ(mkdir(store_.Sub("open").c_str(), 0777), 0);
  ASSERT_TRUE(WriteFile(store_.Sub("open/run.sh"), "#!/bin/sh\n", 0777));
  ASSERT_TRUE(WriteFile(store_.Sub("open/notes.md"), "n\n", 0666));
  for (const char* p : {"open", "open/run.sh"}) {
    ASSERT_EQ(chmod(store_.Sub(p).c_str(), 0777), 0);
  }
  ASSERT_EQ(chmod(store_.Sub("open/notes.md").c_str(), 0666), 0);
  auto mode_of = [](const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 01000000u;
  };

  mode_t old = umask(022);
  auto exported =
      ExportTree(router_, caller_, P("/skills/open"), out_.Sub("a"));
  umask(old);
  ASSERT_OK(exported);
  EXPECT_EQ(mode_of(out_.Sub("a")), 0755u);
  EXPECT_EQ(mode_of(out_.Sub("a/run.sh")), 0755u);
  EXPECT_EQ(mode_of(out_.Sub("a/notes.md")), 0644u);

  // With a umask of 0 the modes come back as they are in the store.
  old = umask(0);
  exported = ExportTree(router_, caller_, P("/skills/open"), out_.Sub("b"));
  umask(old);
  ASSERT_OK(exported);
  EXPECT_EQ(mode_of(out_.Sub("b")), 0777u);
  EXPECT_EQ(mode_of(out_.Sub("b/run.sh")), 0777u);
  EXPECT_EQ(mode_of(out_.Sub("b/notes.md")), 0666u);
}

// The host directory a command names is never a symlink: one planted where
// an agent can write (its workspace) would send an export run as root into
// /etc, or an import into /root/.ssh.
TEST_F(SkillsTest, NeitherExportNorImportFollowsASymlinkAsTheirHostDirectory) {
  MakeSkill(host_.Sub("pdf"), Fields("pdf"));
  ASSERT_OK(ImportTree(router_, caller_, host_.Sub("pdf"), P("/skills/pdf")));
  TempDir elsewhere("agentvfs-skills-elsewhere");
  ASSERT_EQ(symlink(elsewhere.path().c_str(), out_.Sub("link").c_str()), 0);
  for (const char* dest : {"link", "link/"}) {
    SCOPED_TRACE(dest);
    auto refused =
        ExportTree(router_, caller_, P("/skills/pdf"), out_.Sub(dest));
    ASSERT_ERRNO(refused, ELOOP);
    EXPECT_NE(refused.error().message.find("symlink"), std::string::npos);
    ExportOptions merge;
    merge.into_non_empty = true;
    EXPECT_ERRNO(
        ExportTree(router_, caller_, P("/skills/pdf"), out_.Sub(dest), merge),
        ELOOP);
  }
  EXPECT_EQ(ListDir(elsewhere.path()), std::vector<std::string>{});

  ASSERT_EQ(symlink(host_.Sub("pdf").c_str(), out_.Sub("skill").c_str()), 0);
  EXPECT_ERRNO(ImportTree(router_, caller_, out_.Sub("skill"), P("/skills/x")),
               ELOOP);
  EXPECT_ERRNO(ImportSkills(router_, caller_, out_.Sub("skill")), ELOOP);
  EXPECT_ERRNO(ValidateSkillFolder(out_.Sub("skill")), ELOOP);
  EXPECT_ERRNO(router_.Stat(caller_, P("/skills/x")), ENOENT);
  // The directory itself, named as it is, works.
  EXPECT_OK(ImportTree(router_, caller_, host_.Sub("pdf"), P("/skills/x")));
}

// An export that fails removes the directory it made, and nothing else; an
// empty directory that was there before stays, emptied again.
TEST_F(SkillsTest, AFailedExportRemovesOnlyTheDirectoryItMade) {
  ASSERT_EQ(mkdir(store_.Sub("kit").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(store_.Sub("kit/a.md"), "a\n"));
  ASSERT_TRUE(WriteFile(store_.Sub("kit/b.md"), "b\n"));
  RecordingBackend failing(router_);
  failing.fail_open = "/skills/kit/b.md";
  EXPECT_ERRNO(ExportTree(failing, caller_, P("/skills/kit"), out_.Sub("new")),
               EIO);
  EXPECT_EQ(ListDir(out_.path()), std::vector<std::string>{});
  ASSERT_EQ(mkdir(out_.Sub("old").c_str(), 0755), 0);
  auto r = ExportTree(failing, caller_, P("/skills/kit"), out_.Sub("old"));
  ASSERT_ERRNO(r, EIO);
  EXPECT_EQ(ListDir(out_.path()), std::vector<std::string>{"old"});
  // The empty directory that was there is emptied again, and the error
  // says so (a.md was copied before b.md failed).
  EXPECT_EQ(ListDir(out_.Sub("old")), std::vector<std::string>{});
  EXPECT_NE(r.error().message.find("; what it had copied into " +
                                   out_.Sub("old") + " was removed"),
            std::string::npos)
      << r.error().message;
}

// Merging into host directories leaves their modes as they were: a 0700
// home or ~/.ssh is not opened up to the store's 0755.
TEST_F(SkillsTest, AMergeKeepsTheModesOfTheHostDirectories) {
  ASSERT_EQ(mkdir(store_.Sub("kit").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(store_.Sub("kit/sub").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(store_.Sub("kit/sub/a.md"), "a\n"));
  ASSERT_EQ(mkdir(out_.Sub("sub").c_str(), 0700), 0);
  ASSERT_TRUE(WriteFile(out_.Sub("mine.md"), "mine\n"));
  ASSERT_EQ(chmod(out_.path().c_str(), 0710), 0);
  ASSERT_EQ(chmod(out_.Sub("sub").c_str(), 0700), 0);
  ExportOptions merge;
  merge.into_non_empty = true;
  ASSERT_OK(ExportTree(router_, caller_, P("/skills/kit"), out_.path(), merge));
  struct stat st;
  ASSERT_EQ(stat(out_.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
  ASSERT_EQ(stat(out_.Sub("sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(ReadFile(out_.Sub("sub/a.md")), "a\n");
}

TEST_F(SkillsTest, ExportOfAFileIsENOTDIR) {
  ASSERT_TRUE(WriteFile(store_.Sub("file"), "x"));
  EXPECT_ERRNO(ExportTree(router_, caller_, P("/skills/file"), out_.Sub("f")),
               ENOTDIR);
}

// Zeros the size of a copy piece are left holes: a sparse file exported
// stays sparse, with its size and every byte as they were (trailing zeros
// included).
TEST_F(SkillsTest, ExportKeepsASparseFileSparse) {
  ASSERT_EQ(mkdir(store_.Sub("kit").c_str(), 0755), 0);
  const off_t kSize = off_t{64} << 20;
  {
    int fd = open(store_.Sub("kit/disk.img").c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "head", 4, 0), 4);
    ASSERT_EQ(pwrite(fd, "middle", 6, kSize / 2), 6);
    ASSERT_EQ(ftruncate(fd, kSize), 0);  // zeros to the end
    close(fd);
  }
  ASSERT_OK(ExportTree(router_, caller_, P("/skills/kit"), out_.Sub("kit")));
  struct stat st;
  ASSERT_EQ(stat(out_.Sub("kit/disk.img").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, kSize);
  EXPECT_LT(st.st_blocks * 512, off_t{8} << 20) << "the holes were written";
  auto back = ReadFile(out_.Sub("kit/disk.img"));
  ASSERT_TRUE(back.has_value());
  auto orig = ReadFile(store_.Sub("kit/disk.img"));
  EXPECT_TRUE(*back == *orig);
}

TEST_F(SkillsTest, ReadInPiecesDeliversTheWholeFile) {
  std::string data = RandomBytes((size_t{2} << 20) + 5, 3);
  ASSERT_TRUE(WriteFile(store_.Sub("big"), data));
  std::string got;
  size_t pieces = 0;
  ASSERT_OK(ReadInPieces(router_, caller_, P("/skills/big"),
                         [&](std::string_view piece) -> vfs::Status {
                           EXPECT_LE(piece.size(), kCopyPieceBytes);
                           got.append(piece);
                           ++pieces;
                           return {};
                         }));
  EXPECT_EQ(pieces, 3u);
  EXPECT_TRUE(got == data);
}

// `path` has one version, holding `content`.
void ExpectOnlyVersion(StoreBackend& backend, const vfs::Caller& caller,
                       const vfs::Path& path, const std::string& content) {
  ASSERT_OK_AND_ASSIGN(auto history, backend.History(caller, path));
  EXPECT_EQ(history.size(), 1u);
  ASSERT_OK_AND_ASSIGN(auto f, backend.Open(caller, path, O_RDONLY, 0));
  std::string got(content.size() + 1, '\0');
  ASSERT_OK_AND_ASSIGN(auto n, f->Read(got.data(), got.size(), 0));
  got.resize(n);
  EXPECT_TRUE(got == content) << "size " << got.size();
}

// A copy into the store that fails part-way commits nothing of the file
// it was writing: the file keeps the version it had, never a truncated one.
TEST(SkillsStoreTest, AnImportThatFailsPartWayLeavesTheFileAsItWas) {
  ASSERT_OK_AND_ASSIGN(auto fx, testing::StoreFixture::Create({"alice"}));
  auto backend = fx->OpenBackend();
  ASSERT_NE(backend, nullptr);
  const vfs::Caller admin = fx->CallerFor("admin");
  TempDir host("agentvfs-skills-partial");
  ASSERT_EQ(mkdir(host.Sub("kit").c_str(), 0755), 0);
  const std::string first(3 * kCopyPieceBytes, 'x');
  ASSERT_TRUE(WriteFile(host.Sub("kit/big.md"), first));
  const vfs::Path big = *vfs::Path::Parse("/skills/kit/big.md");
  ASSERT_OK(ImportTree(*backend, admin, host.Sub("kit"),
                       *vfs::Path::Parse("/skills/kit")));

  ASSERT_TRUE(
      WriteFile(host.Sub("kit/big.md"), std::string(3 * kCopyPieceBytes, 'y')));
  RecordingBackend failing(*backend);
  failing.fail_write_after = 1;
  EXPECT_ERRNO(ImportTree(failing, admin, host.Sub("kit"),
                          *vfs::Path::Parse("/skills/kit")),
               EIO);
  ExpectOnlyVersion(*backend, admin, big, first);
}

// An import asked to stop in the middle of a file commits nothing of it:
// the file keeps its version.
TEST(SkillsStoreTest, AStoppedImportLeavesTheFileAsItWas) {
  ASSERT_OK_AND_ASSIGN(auto fx, testing::StoreFixture::Create({"alice"}));
  auto backend = fx->OpenBackend();
  ASSERT_NE(backend, nullptr);
  const vfs::Caller admin = fx->CallerFor("admin");
  TempDir host("agentvfs-skills-stopped");
  ASSERT_EQ(mkdir(host.Sub("kit").c_str(), 0755), 0);
  const std::string first(3 * kCopyPieceBytes, 'x');
  ASSERT_TRUE(WriteFile(host.Sub("kit/big.md"), first));
  const vfs::Path big = *vfs::Path::Parse("/skills/kit/big.md");
  ASSERT_OK(ImportTree(*backend, admin, host.Sub("kit"),
                       *vfs::Path::Parse("/skills/kit")));
  ASSERT_TRUE(
      WriteFile(host.Sub("kit/big.md"), std::string(3 * kCopyPieceBytes, 'y')));
  int asked = 0;
  ImportOptions stop;
  stop.stopped = [&] { return ++asked > 2; };  // after the first piece
  EXPECT_ERRNO(ImportTree(*backend, admin, host.Sub("kit"),
                          *vfs::Path::Parse("/skills/kit"), stop),
               EINTR);
  EXPECT_EQ(asked, 3);
  ExpectOnlyVersion(*backend, admin, big, first);
}

}  // namespace
}  // namespace agentvfs::store
