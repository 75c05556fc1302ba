// melon-emud's view of client memory: a window reads and writes the process's own pages, honours
// its write permission, faults outside itself and after it is closed, and refuses to open on
// memory the process does not have.
#include <gtest/gtest.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dext/emuhost/client_dma.h"

namespace melon::dext {
namespace {

TEST(ClientDma, WindowReachesTheProcesssOwnPages) {
  mlx5::emu::TestHost host;
  ClientDma dma(host);
  alignas(4096) static uint8_t buf[8192];
  memset(buf, 0x5a, sizeof buf);
  uint64_t iova = dma.open_window(getpid(), uint64_t(buf), sizeof buf, true);
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
  uint64_t iova = dma.open_window(getpid(), uint64_t(buf), sizeof buf, false);
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
  EXPECT_EQ(dma.open_window(getpid(), uint64_t(p), 4096, true), 0u);
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
