// melon-emud's view of client memory: a window reads and writes the process's own pages, honours
// its write permission, faults outside itself and after it is closed, refuses to open on memory
// the process does not have (or has without the access asked), and stays with its process when the
// pid goes to another.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dext/emuhost/client_dma.h"

namespace melon::dext {
namespace {

TEST(ClientDma, WindowReachesTheProcesssOwnPages) {
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  alignas(4096) static uint8_t buf[8192];
  memset(buf, 0x5a, sizeof buf);
  uint64_t iova = dma.open_window(ClientProcess::open(getpid()), uint64_t(buf), sizeof buf, true);
  ASSERT_NE(iova, 0u);
  uint8_t got[16];
  ASSERT_TRUE(dma.read(iova + 4090, got, sizeof got));  // across a page boundary
  EXPECT_EQ(got[0], 0x5a);
  const char msg[] = "written by the device";
  ASSERT_TRUE(dma.write(iova + 100, msg, sizeof msg));
  EXPECT_STREQ(reinterpret_cast<char*>(buf + 100), msg);
  EXPECT_FALSE(dma.read(iova + sizeof buf - 4, got, 8));  // runs past the window
  EXPECT_EQ(dma.faults(), 1u);
  dma.close_window(iova);
  EXPECT_FALSE(dma.read(iova, got, 1));  // closed: the IOVA faults
  EXPECT_EQ(dma.windows(), 0u);
}

TEST(ClientDma, ReadOnlyWindowRefusesWrites) {
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  static uint8_t buf[4096];
  uint64_t iova = dma.open_window(ClientProcess::open(getpid()), uint64_t(buf), sizeof buf, false);
  ASSERT_NE(iova, 0u);
  uint8_t b = 1;
  EXPECT_FALSE(dma.write(iova, &b, 1));
  EXPECT_EQ(buf[0], 0);
}

TEST(ClientDma, NoWindowOnMemoryTheProcessDoesNotHave) {
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  munmap(p, 4096);
  EXPECT_EQ(dma.open_window(ClientProcess::open(getpid()), uint64_t(p), 4096, true), 0u);
}

TEST(ClientDma, NoWritableWindowOnReadOnlyPagesNorAnyOverAHole) {
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  auto* p = static_cast<uint8_t*>(mmap(nullptr, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(mprotect(p + 2 * 4096, 4096, PROT_READ), 0);
  auto me = ClientProcess::open(getpid());
  EXPECT_EQ(dma.open_window(me, uint64_t(p), 3 * 4096, true), 0u) << "the last page is read-only";
  EXPECT_NE(dma.open_window(me, uint64_t(p), 3 * 4096, false), 0u);
  ASSERT_EQ(munmap(p + 4096, 4096), 0);
  EXPECT_EQ(dma.open_window(me, uint64_t(p), 3 * 4096, false), 0u) << "a hole";
  munmap(p, 3 * 4096);
}

// A client process exits and the kernel gives its pid to another process: the window reaches
// nothing, not the new process's memory at the same address. Root only (the pid is made to recur
// through /proc/sys/kernel/ns_last_pid); skips if another process takes the pid first.
TEST(ClientDma, AWindowStaysWithItsProcessWhenItsPidIsReused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to choose the next pid";
  alignas(4096) static uint8_t buf[4096];
  auto child = [](char fill, int ready, int go) {
    pid_t pid = fork();
    if (pid == 0) {
      memset(buf, fill, sizeof buf);
      char c = 1;
      (void)!write(ready, &c, 1);
      (void)!read(go, &c, 1);
      _exit(0);
    }
    return pid;
  };
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  pid_t first = child('P', ready[1], go[0]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  uint64_t iova = dma.open_window(ClientProcess::open(first), uint64_t(buf), sizeof buf, true);
  ASSERT_NE(iova, 0u);
  uint8_t got = 0;
  ASSERT_TRUE(dma.read(iova, &got, 1));
  EXPECT_EQ(got, 'P');
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  pid_t second = -1;
  for (int attempt = 0; attempt < 50 && second != first; attempt++) {
    if (second > 0) {
      kill(second, SIGKILL);
      waitpid(second, nullptr, 0);
    }
    FILE* f = fopen("/proc/sys/kernel/ns_last_pid", "w");
    if (!f) GTEST_SKIP() << "no /proc/sys/kernel/ns_last_pid";
    fprintf(f, "%d", int(first) - 1);
    fclose(f);
    second = child('V', ready[1], go[0]);
    ASSERT_EQ(read(ready[0], &c, 1), 1);
  }
  bool reused = second == first;
  got = 0;
  bool read_ok = dma.read(iova, &got, 1);
  uint8_t mark = 'D';
  bool write_ok = dma.write(iova, &mark, 1);
  kill(second, SIGKILL);
  waitpid(second, nullptr, 0);
  if (!reused) GTEST_SKIP() << "another process took the pid";
  EXPECT_FALSE(read_ok) << "read the new process's memory: '" << char(got) << "'";
  EXPECT_FALSE(write_ok);
}

TEST(ClientDma, DaemonMemoryStillGoesThroughTheIommu) {
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  auto b = host.alloc(4096);
  static_cast<uint8_t*>(b.va)[7] = 9;
  uint8_t got = 0;
  ASSERT_TRUE(dma.read(b.iova + 7, &got, 1));
  EXPECT_EQ(got, 9);
  EXPECT_FALSE(dma.read(b.iova + 4096, &got, 1));  // the guard page
}

}  // namespace
}  // namespace melon::dext
