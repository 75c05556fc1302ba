// A setsockopt() of the test executable's own (setsockopt_spy.cpp): the soft provider, linked into
// the test as objects, calls this one, which records each (level, name), can make chosen options
// fail or shrink SO_RCVBUF, and otherwise forwards to the C library's.
#pragma once

namespace melon::test {

// Forget every record and every planned failure (SetUp/TearDown).
void sockopt_reset();
// From now on, setting (level, name) fails with `err`.
void sockopt_fail(int level, int name, int err);
// Whether (level, name) was set since the last reset.
bool sockopt_seen(int level, int name);
// Non-zero: SO_RCVBUF is set to `bytes` instead of what the caller asks.
void sockopt_rcvbuf(int bytes);

}  // namespace melon::test
