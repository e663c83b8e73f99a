// Assertions for vfs::Result / vfs::Status that print the error's errno name
// and message on failure, so a failing test says what the code under test
// reported instead of "expected true". Used by every agentvfs test binary.
//
//   EXPECT_ERRNO(backend.Stat(c, p), ENOENT);  // fails on success or other
//   errno ASSERT_OK(backend.Mkdir(c, p, 0755));      // fails with "EACCES:
//   ..." ASSERT_OK_AND_ASSIGN(auto attr, backend.Stat(c, p));
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "vfs/error.h"

namespace agentvfs::testing {

// "ENOENT (2)" for messages.
std::string DescribeErrno(int code);

template <typename T>
::testing::AssertionResult AssertOk(const char* expr_text,
                                    const vfs::Result<T>& result) {
  if (result.has_value()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << expr_text << " failed with " << result.error().ToString();
}

template <typename T>
::testing::AssertionResult AssertErrno(const char* expr_text,
                                       const char* errno_text,
                                       const vfs::Result<T>& result,
                                       int expected) {
  if (result.has_value()) {
    return ::testing::AssertionFailure()
           << expr_text << " succeeded, expected it to fail with "
           << DescribeErrno(expected) << " (" << errno_text << ")";
  }
  if (result.error().code == expected) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << expr_text << " failed with " << result.error().ToString()
         << ", expected " << DescribeErrno(expected);
}

}  // namespace agentvfs::testing

#define EXPECT_ERRNO(expr, err) \
  EXPECT_PRED_FORMAT2(::agentvfs::testing::AssertErrno, expr, err)
#define ASSERT_ERRNO(expr, err) \
  ASSERT_PRED_FORMAT2(::agentvfs::testing::AssertErrno, expr, err)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::agentvfs::testing::AssertOk, expr)
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::agentvfs::testing::AssertOk, expr)

#define AGENTVFS_TESTING_CONCAT_INNER(a, b) a##b
#define AGENTVFS_TESTING_CONCAT(a, b) AGENTVFS_TESTING_CONCAT_INNER(a, b)
// Asserts `expr` (a Result<T>) succeeded and moves its value into `lhs`,
// which may be a declaration: ASSERT_OK_AND_ASSIGN(auto fd, ops.Open(...)).
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                     \
  auto AGENTVFS_TESTING_CONCAT(agentvfs_result_, __LINE__) = (expr);        \
  ASSERT_PRED_FORMAT1(::agentvfs::testing::AssertOk,                        \
                      AGENTVFS_TESTING_CONCAT(agentvfs_result_, __LINE__)); \
  lhs = std::move(*AGENTVFS_TESTING_CONCAT(agentvfs_result_, __LINE__))
