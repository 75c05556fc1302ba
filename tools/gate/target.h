// What a gate runs against: our provider (soft, or mlx5 on a melon-emud the gate starts) and a peer
// (local: a second process on this host; ssh://user@host: a Linux box with rdma-core;
// linux-peer: the rxe guest of tests/peer, driven by tests/peer/gate.sh).
#pragma once

#include <memory>
#include <string>

#include "run.h"

namespace melon::gate {

struct Options {
  std::string provider = "soft";  // soft | mlx5
  std::string peer = "local";  // local | linux-peer | ssh://[user@]host[:port]
  std::string build;  // the build tree (lib/, src/dext/emuhost/melon-emud, tests/...)
  std::string source;  // the source tree (tests/peer/gate.sh, tools/gate/plot.py)
  std::string report;  // the run's folder
  bool quick = false;
  bool capture = true;  // keep a pcap of a failing step (where the provider has a wire we can see)
  int mtu = 4096;  // path MTU for the tools (PHASE2_MTU)
  int cycles = 10;  // STABLE_INIT_CYCLES
  double duration = 60;  // soak seconds
  int max_rounds = 0;  // MLX_MAX_ROUNDS: caps iteration counts (0: the gate's own)
  double min_gbps = 0;  // bulk write: each run at least this (0: any nonzero)
  // --peer ssh://: SPARK_* / MAC_* defaults, flags override.
  std::string ssh, ssh_key, control_host, our_ip, our_mac, peer_dev = "mlx5_0";
  int peer_gid = 3;
  std::string ssh_cmd = "ssh";  // the client (MELON_GATE_SSH: a stub in tests)
  // Local addresses (loopback, each gate run its own).
  std::string our_addr = "127.0.0.50", peer_addr = "127.0.0.51", emud_addr = "127.0.0.52";
  std::string our2_addr = "127.0.0.53", peer2_addr = "127.0.0.54";
};

class Target {
 public:
  explicit Target(const Options& o) : o_(o) {}
  ~Target() { down(); }
  // Starts what our side needs (melon-emud for mlx5); false with `why`.
  bool up(std::string* why);
  void down();
  // SIGTERM to our melon-emud and its exit status (0: it released everything and the core found no
  // leak at teardown); -1 when none ran.
  int stop_emud();
  Side& ours() { return *ours_; }
  Side& peer() { return *peer_; }
  // A second client on each side at the same time (isolation): mlx5_0 and a real peer device take
  // any number of processes; a soft device is one process's UDP socket, so local soft sides get
  // a device of their own on another address.
  Side& ours2() { return ours2_ ? *ours2_ : *ours_; }
  Side& peer2() { return peer2_ ? *peer2_ : *peer_; }
  bool has_peer() const { return peer_ != nullptr; }
  bool is_mlx5() const { return o_.provider == "mlx5"; }
  bool is_ssh() const { return o_.peer.rfind("ssh://", 0) == 0; }
  bool is_linux_peer() const { return o_.peer == "linux-peer"; }
  const std::string& emud_socket() const { return emud_sock_; }
  // Restarts nothing: true while our daemon is alive.
  bool emud_alive() const { return emud_.pid > 0 && alive(emud_); }
  // The loopback/link interface and filter a capture of our RoCE traffic uses ("" when none).
  std::string capture_filter() const;
  std::string capture_iface() const { return is_ssh() ? "any" : "lo"; }
  // metadata.txt lines about the two sides.
  std::string metadata();
  // Runs `cmd` on the peer and returns its output (ssh: the artifact collection; local: here).
  Done peer_shell(const std::string& cmd, const std::string& log, double timeout_s = 30);
  std::string lib() const { return o_.build + "/lib"; }
  std::string emud_log() const { return emud_sock_ + ".log"; }
  const Options& opts() const { return o_; }

 private:
  Options o_;
  std::unique_ptr<Side> ours_, peer_, ours2_, peer2_;
  Proc emud_;
  std::string emud_sock_, dir_;
};

}  // namespace melon::gate
