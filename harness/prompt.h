// The system prompt of a session: who the agent works for, the places it
// sees, the skills the user can read (name and description from each
// /skills/*/SKILL.md front matter; the model reads the rest on demand) and
// the /memories prefixes the user may write.
#pragma once

#include <string>

#include "backends/store/engine.h"
#include "vfs/backend.h"
#include "vfs/caller.h"

namespace agentvfs::harness {

// `router` serves /workspace, /memories and /skills; `engine` is the
// store's, for the user's grants. A skill whose SKILL.md is invalid is left
// out (and named at the end, so a person can fix it).
std::string BuildSystemPrompt(vfs::Backend& router, store::Engine& engine,
                              const vfs::Caller& caller);

}  // namespace agentvfs::harness
