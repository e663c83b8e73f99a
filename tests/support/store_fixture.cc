// A fresh store per test (see store_fixture.h).
#include "tests/support/store_fixture.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "backends/store/admin.h"
#include "tests/support/pg_server.h"

namespace agentvfs::testing {

std::string EngineName(StoreEngine engine) {
  return engine == StoreEngine::kPostgres ? "Postgres" : "Sqlite";
}

vfs::Result<std::unique_ptr<StoreFixture>> StoreFixture::Create(
    const std::vector<std::string>& users,
    const std::map<std::string, std::vector<std::string>>& teams,
    StoreEngine kind) {
  auto f = std::unique_ptr<StoreFixture>(new StoreFixture());
  f->dir_ = std::make_unique<TempDir>("agentvfs-store");
  f->engine_ = kind;
  if (kind == StoreEngine::kPostgres) {
    auto uri = CreateTestDatabase();
    if (!uri) return std::unexpected(uri.error());
    f->db_ = *uri;
  } else {
    f->db_ = f->dir_->path() + "/store.db";
  }
  auto admin = store::InitStore(f->db_, "admin");
  if (!admin) return std::unexpected(admin.error());
  f->tokens_["admin"] = *admin;
  auto engine = store::Engine::Open(f->db_, false);
  if (!engine) return std::unexpected(engine.error());
  for (const auto& user : users) {
    std::vector<std::string> user_teams;
    if (auto it = teams.find(user); it != teams.end()) user_teams = it->second;
    auto token = store::AddUser(**engine, "admin", user, user_teams);
    if (!token) return std::unexpected(token.error());
    f->tokens_[user] = *token;
  }
  for (const auto& [user, token] : f->tokens_) {
    std::string path = f->dir_->path() + "/" + user + ".token";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return vfs::Fail(errno, "cannot write " + path);
    std::string line = token + "\n";
    if (write(fd, line.data(), line.size()) !=
        static_cast<ssize_t>(line.size())) {
      close(fd);
      return vfs::Fail(EIO, "short write of " + path);
    }
    close(fd);
  }
  return f;
}

StoreFixture::~StoreFixture() {
  if (engine_ == StoreEngine::kPostgres) DropTestDatabase(db_);
}

std::string StoreFixture::TokenFile(const std::string& user) const {
  return dir_->path() + "/" + user + ".token";
}

vfs::Caller StoreFixture::CallerFor(const std::string& user,
                                    std::string session) {
  vfs::Caller c;
  c.user = user;
  c.session = session.empty()
                  ? "api-" + user + "-" + std::to_string(++sessions_)
                  : std::move(session);
  return c;
}

std::unique_ptr<store::StoreBackend> StoreFixture::OpenBackend(
    store::StoreOptions options) const {
  auto backend = store::StoreBackend::Open(db_, options);
  if (!backend) {
    ADD_FAILURE() << "cannot open the store: " << backend.error().ToString();
    return nullptr;
  }
  return std::move(*backend);
}

std::unique_ptr<router::Router> StoreFixture::MakeRouter(
    store::StoreOptions options) const {
  auto r = std::make_unique<router::Router>();
  auto backend = OpenBackend(options);
  if (backend == nullptr) return r;
  vfs::Backend* b = r->Adopt(std::move(backend));
  router::MountOptions mo;
  mo.strip_prefix = false;
  EXPECT_TRUE(r->Mount("/memories", b, mo).has_value());
  EXPECT_TRUE(r->Mount("/skills", b, mo).has_value());
  return r;
}

std::vector<std::string> StoreFixture::MountArgs(
    const std::string& user) const {
  return {"--store", db_, "--token-file", TokenFile(user)};
}

}  // namespace agentvfs::testing
