// Processes and the two sides of a gate: OUR side (our libibverbs with the soft provider, or the
// mlx5 provider on a melon-emud the gate starts) and the PEER (a second process on this host, or a
// Linux box over SSH). Every data path is a stock tool (perftest, ibv_*_pingpong) or one of the
// build's test programs; this file only starts them, waits for them and keeps their output.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace melon::gate {

using Env = std::map<std::string, std::string>;

// A started process: its pid, its combined stdout+stderr in `log`.
struct Proc {
  pid_t pid = -1;
  std::string log;
  std::string what;
};
struct Done {
  int rc = -1;  // exit status; 128+signal when signalled; 124 on timeout
  double seconds = 0;
  std::string out;  // the log's text
};

// Starts argv with env added to this process's environment, output to `log` (truncated).
Proc spawn(const std::vector<std::string>& argv, const Env& env, const std::string& log, const std::string& what);
// Waits at most timeout_s (then SIGKILL to its process group: 124).
Done wait(Proc& p, double timeout_s);
// spawn + wait.
Done run(const std::vector<std::string>& argv, const Env& env, const std::string& log, double timeout_s,
         const std::string& what = "");
bool alive(const Proc& p);
void stop(Proc& p, int sig);  // signal its process group and reap it
std::string read_file(const std::string& path);
bool write_file(const std::string& path, const std::string& text);
std::string shell_quote(const std::string& s);
// A TCP port nobody on this host listens on.
int free_port();
double now_s();

// Where a command runs.
class Side {
 public:
  virtual ~Side() = default;
  virtual std::string name() const = 0;  // "ours", "peer"
  virtual std::string dev() const = 0;  // verbs device name
  virtual int gid() const = 0;  // GID index for perftest -x / pingpong -g
  // The address the OTHER side connects to for a tool's TCP rendezvous when this side serves.
  virtual std::string control_addr() const = 0;
  virtual Proc start(const std::string& cmdline, const std::string& log, const std::string& what) = 0;
  // True once something on this side listens on TCP `port` (ss).
  virtual bool listening(int port) = 0;
  virtual std::string describe() const = 0;
};

}  // namespace melon::gate
