// The session's system prompt (see prompt.h).
#include "harness/prompt.h"

#include <algorithm>

#include "backends/store/auth.h"
#include "backends/store/skills.h"

namespace agentvfs::harness {

std::string BuildSystemPrompt(vfs::Backend& router, store::Engine& engine,
                              const vfs::Caller& caller) {
  std::string p =
      "You are an agent working for user '" + caller.user +
      "'. You see one filesystem:\n"
      "- /workspace: the task's files (read and write).\n"
      "- /memories: memories shared with your user's teams and organisation; "
      "read what is relevant before you start, and keep what is worth "
      "keeping for next time.\n"
      "- /skills: skills. Each is a folder with SKILL.md (read it before "
      "using the skill) and its scripts and resources; run scripts with the "
      "bash tool, e.g. python3 /skills/NAME/scripts/x.py.\n"
      "Commands run in a sandbox without network. Each bash call starts a "
      "new shell in /workspace: cd and variables do not carry over (use "
      "absolute paths or `cd DIR && ...` in one call); files, /tmp and "
      "background processes do. A write that conflicts "
      "with someone else's is rejected: read the file again and redo the "
      "change.\n";
  std::vector<std::string> skills, invalid;
  if (auto root = vfs::Path::Parse("/skills")) {
    if (auto entries = router.ReadDir(caller, *root)) {
      for (const auto& e : *entries) {
        if (e.type != S_IFDIR || e.name.empty() || e.name[0] == '.') continue;
        auto dir = root->Child(e.name);
        if (!dir) continue;
        auto info = store::ReadSkillInfo(router, caller, *dir);
        if (info)
          skills.push_back("- " + info->name + " (/skills/" + e.name +
                           "/SKILL.md): " + info->description);
        else
          invalid.push_back(e.name);
      }
    }
  }
  std::sort(skills.begin(), skills.end());
  p += "\nSkills you can use:\n";
  if (skills.empty()) p += "(none)\n";
  for (const auto& s : skills) p += s + "\n";
  std::vector<std::string> writable;
  (void)engine.Read([&](store::Txn& txn) -> vfs::Status {
    auto policy = store::LoadPolicy(txn, caller.user);
    if (policy) {
      for (const auto& prefix : (*policy)->WritablePrefixes())
        if (prefix.rfind("/memories", 0) == 0 || prefix == "/")
          writable.push_back(prefix == "/" ? "/memories" : prefix);
    }
    return {};
  });
  p += "\nPlaces in /memories you may write:\n";
  if (writable.empty()) p += "(none: your memories are read-only)\n";
  for (const auto& w : writable) p += "- " + w + "\n";
  if (!invalid.empty()) {
    p += "\n(Skipped skills with an invalid SKILL.md:";
    for (const auto& n : invalid) p += " " + n;
    p += ")\n";
  }
  return p;
}

}  // namespace agentvfs::harness
