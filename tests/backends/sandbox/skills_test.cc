// Off-the-shelf skills run unmodified in the sandbox: tests/data/skills
// holds a skill folder as people write them (SKILL.md, standard-library
// Python scripts, resources). It is imported through the store's skill
// importer, then run as a script that finds its resources next to itself and
// as a module from the skill's folder; both write into /workspace.
#include "backends/store/skills.h"

#include <fstream>

#include "tests/backends/sandbox/sandbox_fixture.h"

namespace agentvfs::testing {
namespace {

using ::testing::HasSubstr;

std::string SkillsDir() {
  std::string here = __FILE__;  // tests/backends/sandbox/skills_test.cc
  return here.substr(0, here.rfind("/backends/")) + "/data/skills";
}

class SkillsInSandboxTest : public SandboxTest {
 protected:
  void SetUp() override {
    SandboxTest::SetUp();
    auto backend = store_->OpenBackend();
    auto imported =
        store::ImportSkills(*backend, store_->CallerFor("admin"), SkillsDir());
    ASSERT_TRUE(imported.has_value()) << imported.error().message;
    ASSERT_EQ(imported->size(), 1u);
    EXPECT_EQ((*imported)[0].name, "csv-report");
    std::ofstream(workspace_ + "/data.csv")
        << "city,temp,rain\nOslo,4.5,120\nLisbon,17,40\nCairo,25.5,2\n";
    MakeSandbox(TestLimits());
  }
};

TEST_F(SkillsInSandboxTest, AScriptReadsItsResourcesRelativeToItself) {
  sandbox::Command c;
  c.argv = {"python3", "/skills/csv-report/scripts/report.py",
            "/workspace/data.csv"};
  auto r = sandbox_->Run(c);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->exit_code, 0) << r->err.text;
  EXPECT_EQ(r->out.text, "wrote /workspace/report.md\n");
  std::string report = ReadHostFile(workspace_ + "/report.md");
  EXPECT_THAT(report, HasSubstr("# Report on /workspace/data.csv"));
  EXPECT_THAT(report, HasSubstr("3 rows; columns: city, temp, rain"));
  EXPECT_THAT(report, HasSubstr("- temp: 4.5 to 25.5"));
  // The script is executable as imported (+x kept) and runs by its path.
  c.argv = {"/skills/csv-report/scripts/report.py", "/workspace/data.csv",
            "/workspace/again.md"};
  r = sandbox_->Run(c);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->exit_code, 0) << r->err.text;
  EXPECT_EQ(ReadHostFile(workspace_ + "/again.md"), report);
}

TEST_F(SkillsInSandboxTest, AModuleRunsFromTheSkillsFolder) {
  auto r =
      Sh("cd /skills/csv-report && python3 -m scripts.tool "
         "/workspace/data.csv");
  EXPECT_EQ(r.exit_code, 0) << r.err.text;
  EXPECT_EQ(r.out.text, "wrote /workspace/summary.json\n");
  std::string json = ReadHostFile(workspace_ + "/summary.json");
  EXPECT_THAT(json, HasSubstr("\"rows\": 3"));
  EXPECT_THAT(json, HasSubstr("\"city\""));
  // Nothing was written into the skill (byte code goes to /tmp).
  auto listing = Sh("find /skills/csv-report | sort");
  EXPECT_THAT(listing.out.text, ::testing::Not(HasSubstr("pycache")));
  EXPECT_THAT(listing.out.text,
              HasSubstr("/skills/csv-report/resources/template.md"));
}

}  // namespace
}  // namespace agentvfs::testing
