// Many processes on one address in forward mode (src/providers/soft/share_forward.h: the path macOS
// takes, selected here with MELON_SOFT_SHARE=forward): one process, the owner, binds port 4791 and
// copies the others' datagrams into their receive rings.
//
//  - 2 processes on 127.0.26.2, each with an RC QP of its own, WRITE and READ verified against a
//    peer process on 127.0.26.3; one of them is the owner, both have rings.
//  - 16 processes on 127.0.26.4 the same way.
//  - the owner SIGKILLed mid-traffic (127.0.26.5): another member binds the port at its next tick
//    and the others go on (RC retransmits what was lost in between).
//  - the owner closing its device (127.0.26.6): it hands the port over, nobody has to reclaim it.
//  - a member SIGKILLed (127.0.26.7): its ring is reclaimed and the others go on.
#include <dirent.h>

#include <set>

#include "soft_share_harness.h"

namespace {

class SoftShareForward : public SoftShare {
 protected:
  const char* mode() const override { return "forward"; }

  // The index of the child that owns the port now (-1: none of them).
  static int owner_of(AddressRegistry& reg, const std::vector<Child>& c) {
    const uint32_t pid = reg.view().owner_pid;
    for (size_t i = 0; i < c.size(); ++i)
      if (uint32_t(c[i].pid) == pid) return int(i);
    return -1;
  }
  // Reads child i's reports until it completed `more` rounds past the next one it reports.
  static bool goes_on(const Child& c, uint32_t more) {
    uint32_t first = 0, r = 0;
    if (!read_all(c.up, &first, sizeof first)) return false;
    for (r = first; r < first + more;)
      if (!read_all(c.up, &r, sizeof r)) return false;
    return true;
  }
  void stop_all(std::vector<Child>& c, const std::set<size_t>& gone) {
    for (size_t i = 0; i < c.size(); ++i) {
      if (!gone.count(i)) {
        close(c[i].down);
        uint32_t r;
        while (read(c[i].up, &r, sizeof r) > 0) {}
        EXPECT_EQ(exit_code(c[i].pid), 0) << "child " << i;
      } else {
        close(c[i].down);
      }
      close(c[i].up);
    }
  }
  // The start the hand-over tests share: `n` children on `ip`, served from 127.0.26.3, each
  // through two rounds; then the address's registry and which child owns the port.
  void start(int n, const char* ip, std::vector<Child>& c, Node& srv, std::shared_ptr<AddressRegistry>& reg,
             int& owner) {
    c = spawn(n, ip, 0);
    serve(srv, "127.0.26.3", c);
    reg = registry_of(ip);
    ASSERT_NE(reg, nullptr);
    for (size_t i = 0; i < c.size(); ++i) ASSERT_TRUE(goes_on(c[i], 2)) << "child " << i;
    owner = owner_of(*reg, c);
    ASSERT_GE(owner, 0);
  }
  // Each child's region of the parent's buffer holds what it wrote in round `round`.
  static void expect_data(Node& srv, size_t children, uint32_t round) {
    for (size_t i = 0; i < children; ++i) {
      const uint8_t* r = srv.buf.data() + i * 2 * kRegion;
      bool same = true;
      for (uint32_t j = 0; j < kRegion && same; ++j) same = r[j] == uint8_t(j * 7 + int(i) * 31 + round);
      EXPECT_TRUE(same) << "child " << i << "'s data";
    }
  }
  // Runs `n` children for `rounds` rounds each on `cli_ip` against this process on `srv_ip`.
  void rounds_on_one_address(int n, const char* cli_ip, const char* srv_ip, uint32_t rounds) {
    std::vector<Child> c = spawn(n, cli_ip, int(rounds));
    Node srv;
    serve(srv, srv_ip, c);
    auto reg = registry_of(cli_ip);
    ASSERT_NE(reg, nullptr);
    for (size_t i = 0; i < c.size(); ++i)
      for (uint32_t want = 1; want <= rounds; ++want) {
        uint32_t round = 0;
        ASSERT_TRUE(read_all(c[i].up, &round, sizeof round))
            << "child " << i << " failed round " << want << ": exit code " << exit_code(c[i].pid);
        EXPECT_EQ(round, want);
      }
    const auto v = reg->view();
    EXPECT_EQ(v.members, uint32_t(n + 1));  // and this process, looking (no ring)
    EXPECT_EQ(v.rings, uint32_t(n));
    EXPECT_GE(owner_of(*reg, c), 0) << "the port's owner is one of the children";
    for (size_t i = 0; i < c.size(); ++i) {
      close(c[i].down);
      EXPECT_EQ(exit_code(c[i].pid), 0) << "child " << i;
      close(c[i].up);
    }
    expect_data(srv, c.size(), rounds);
    EXPECT_EQ(reg->view().rings, 0u);  // each removed its ring on the way out
  }
};

TEST_F(SoftShareForward, TwoProcessesOnOneAddressEachWithItsOwnQp) {
  rounds_on_one_address(2, "127.0.26.2", "127.0.26.3", 3);
}

TEST_F(SoftShareForward, SixteenProcessesOnOneAddress) { rounds_on_one_address(16, "127.0.26.4", "127.0.26.3", 2); }

TEST_F(SoftShareForward, TheOwnerKilledMidTrafficAnotherTakesThePortOver) {
  std::vector<Child> c;
  Node srv;
  std::shared_ptr<AddressRegistry> reg;
  int owner = -1;
  ASSERT_NO_FATAL_FAILURE(start(4, "127.0.26.5", c, srv, reg, owner));
  const auto before = reg->view();
  kill(c[owner].pid, SIGKILL);
  EXPECT_EQ(exit_code(c[owner].pid), 128 + SIGKILL);
  for (size_t i = 0; i < c.size(); ++i)
    if (int(i) != owner) ASSERT_TRUE(goes_on(c[i], 10)) << "child " << i << " stopped after the owner died";
  const int next = owner_of(*reg, c);
  EXPECT_GE(next, 0);
  EXPECT_NE(next, owner);
  const auto after = reg->view();
  EXPECT_EQ(after.members, before.members - 1);
  EXPECT_EQ(after.rings, before.rings - 1);  // the dead owner's ring reclaimed
  EXPECT_EQ(after.reclaimed, before.reclaimed + 1);
  stop_all(c, {size_t(owner)});
}

TEST_F(SoftShareForward, TheOwnerClosingHandsThePortOver) {
  std::vector<Child> c;
  Node srv;
  std::shared_ptr<AddressRegistry> reg;
  int owner = -1;
  ASSERT_NO_FATAL_FAILURE(start(3, "127.0.26.6", c, srv, reg, owner));
  const auto before = reg->view();
  close(c[owner].down);  // it stops, closes its device (handing the port over) and exits
  uint32_t r;
  while (read(c[owner].up, &r, sizeof r) > 0) {}
  EXPECT_EQ(exit_code(c[owner].pid), 0);
  for (size_t i = 0; i < c.size(); ++i)
    if (int(i) != owner) ASSERT_TRUE(goes_on(c[i], 10)) << "child " << i << " stopped after the owner left";
  const int next = owner_of(*reg, c);
  EXPECT_GE(next, 0);
  EXPECT_NE(next, owner);
  const auto after = reg->view();
  EXPECT_EQ(after.members, before.members - 1);
  EXPECT_EQ(after.rings, before.rings - 1);
  EXPECT_EQ(after.reclaimed, before.reclaimed);  // it left; nobody had to reclaim it
  stop_all(c, {size_t(owner)});
}

TEST_F(SoftShareForward, AMemberKilledHasItsRingReclaimedAndTheOthersGoOn) {
  std::vector<Child> c;
  Node srv;
  std::shared_ptr<AddressRegistry> reg;
  int owner = -1;
  ASSERT_NO_FATAL_FAILURE(start(3, "127.0.26.7", c, srv, reg, owner));
  const size_t victim = owner == 0 ? 1 : 0;
  // Ring files in the registry's directory before and after.
  auto rings = [&] {
    std::set<std::string> s;
    const std::string dir = reg->path().substr(0, reg->path().rfind('/'));
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string n = e->d_name;
        if (n.size() > 5 && n.compare(n.size() - 5, 5, ".ring") == 0) s.insert(n);
      }
      closedir(d);
    }
    return s;
  };
  const auto files_before = rings();
  const auto before = reg->view();
  kill(c[victim].pid, SIGKILL);
  EXPECT_EQ(exit_code(c[victim].pid), 128 + SIGKILL);
  for (size_t i = 0; i < c.size(); ++i)
    if (i != victim) ASSERT_TRUE(goes_on(c[i], 10)) << "child " << i;
  const auto after = reg->view();
  EXPECT_EQ(owner_of(*reg, c), owner);  // a member's death moves nothing
  EXPECT_EQ(after.members, before.members - 1);
  EXPECT_EQ(after.rings, before.rings - 1);
  EXPECT_EQ(after.reclaimed, before.reclaimed + 1);
  const auto files_after = rings();
  size_t removed = 0;
  for (const std::string& f : files_before) removed += !files_after.count(f);
  EXPECT_GE(removed, 1u) << "the dead member's ring file is removed";
  stop_all(c, {victim});
}

}  // namespace
