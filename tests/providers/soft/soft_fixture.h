// The process environment of a soft-device test: counters in a private directory
// (MELON_STATS_DIR), no devices found automatically and no config file, the test's own devices
// (MELON_SOFT_DEVICES syntax) on addresses no other test uses, and the device list.
#pragma once

#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace melon::test {

class SoftDeviceTest : public ::testing::Test {
 protected:
  // From SetUp(): sets the environment; with `list_them`, lists the devices (before any is opened,
  // the provider reads the environment when the list is made).
  void use_devices(const char* devices, bool list_them = true) {
    char tmpl[] = "/tmp/melon-stats-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    stats_dir = tmpl;
    setenv("MELON_STATS_DIR", stats_dir.c_str(), 1);
    setenv("MELON_SOFT_AUTO", "0", 1);
    setenv("MELON_SOFT_CONFIG", "/nonexistent", 1);
    setenv("MELON_SOFT_DEVICES", devices, 1);
    if (!list_them) return;
    list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
  }
  void TearDown() override {
    if (list) ibv_free_device_list(list);
    list = nullptr;
    if (!stats_dir.empty()) ASSERT_EQ(system(("rm -rf '" + stats_dir + "'").c_str()), 0);
  }
  // What `melonctl stat` prints for this process's counter directory; its exit status is checked.
  std::string melonctl_stat() const {
    std::string cmd = "MELON_STATS_DIR='" + stats_dir + "' '" MELON_TEST_DATA "/../../tools/melonctl' stat";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) {
      ADD_FAILURE() << "cannot run " << cmd;
      return "";
    }
    char line[2048];
    std::string out;
    while (fgets(line, sizeof line, p)) out += line;
    EXPECT_EQ(pclose(p), 0) << out;
    return out;
  }
  ibv_device* dev(const char* name) const {
    for (int i = 0; i < n; ++i)
      if (!strcmp(ibv_get_device_name(list[i]), name)) return list[i];
    ADD_FAILURE() << "no device " << name;
    return nullptr;
  }

  std::string stats_dir;
  ibv_device** list = nullptr;
  int n = 0;
};

}  // namespace melon::test
