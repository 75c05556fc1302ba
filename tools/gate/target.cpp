#include "target.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

namespace melon::gate {

namespace {

// A side on this host: a tool run through bash with the side's environment.
class LocalSide final : public Side {
 public:
  LocalSide(std::string name, std::string dev, int gid, Env env, std::string what, std::string control = "127.0.0.1")
      : name_(std::move(name)),
        dev_(std::move(dev)),
        gid_(gid),
        env_(std::move(env)),
        what_(std::move(what)),
        control_(std::move(control)) {}
  std::string name() const override { return name_; }
  std::string dev() const override { return dev_; }
  int gid() const override { return gid_; }
  std::string control_addr() const override { return control_; }
  Proc start(const std::string& cmd, const std::string& log, const std::string& what) override {
    return spawn({"bash", "-c", "exec " + cmd}, env_, log, what);
  }
  bool listening(int port) override {
    std::string tmp = "/tmp/melon-gate-ss." + std::to_string(getpid());
    run({"ss", "-Hltn", "sport = :" + std::to_string(port)}, {}, tmp, 5);
    bool yes = !read_file(tmp).empty();
    unlink(tmp.c_str());
    return yes;
  }
  std::string describe() const override { return what_; }

 private:
  std::string name_, dev_;
  int gid_;
  Env env_;
  std::string what_, control_;
};

// A side over SSH: the command line runs on the peer as the login user's shell runs it.
class SshSide final : public Side {
 public:
  SshSide(const Options& o, std::string target, std::string port)
      : o_(o), target_(std::move(target)), port_(std::move(port)) {}
  std::vector<std::string> argv(const std::string& cmd) const {
    std::vector<std::string> a{o_.ssh_cmd, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"};
    if (!o_.ssh_key.empty()) a.insert(a.end(), {"-i", o_.ssh_key});
    if (!port_.empty()) a.insert(a.end(), {"-p", port_});
    a.push_back(target_);
    a.push_back("--");
    a.push_back(cmd);
    return a;
  }
  std::string name() const override { return "peer"; }
  std::string dev() const override { return o_.peer_dev; }
  int gid() const override { return o_.peer_gid; }
  std::string control_addr() const override { return o_.control_host; }
  Proc start(const std::string& cmd, const std::string& log, const std::string& what) override {
    return spawn(argv(cmd), {}, log, what);
  }
  bool listening(int port) override {
    std::string tmp = "/tmp/melon-gate-ssh-ss." + std::to_string(getpid());
    Done d = run(argv("ss -Hltn 'sport = :" + std::to_string(port) + "'"), {}, tmp, 15);
    bool yes = d.rc == 0 && !d.out.empty();
    unlink(tmp.c_str());
    return yes;
  }
  std::string describe() const override {
    return "ssh " + target_ + " (" + o_.peer_dev + ", GID " + std::to_string(o_.peer_gid) + ")";
  }

 private:
  const Options& o_;
  std::string target_, port_;
};

}  // namespace

bool Target::up(std::string* why) {
  char tmpl[] = "/tmp/melon-gate.XXXXXX";
  if (!mkdtemp(tmpl)) return *why = "no temporary directory", false;
  dir_ = tmpl;
  Env base{{"LD_LIBRARY_PATH", lib()}, {"MELON_SOFT_AUTO", "0"}};
  std::string our_ip = is_ssh() ? o_.our_ip : o_.our_addr;
  if (access((lib() + "/libibverbs.so.1").c_str(), R_OK) != 0)
    return *why = "no " + lib() + "/libibverbs.so.1 (--build DIR: a build tree with the ibverbs target)", false;
  Env ours = base;
  if (o_.provider == "soft") {
    write_file(dir_ + "/ours.conf", "device soft0 " + our_ip + "\n");
    ours["MELON_SOFT_CONFIG"] = dir_ + "/ours.conf";
    ours_ = std::make_unique<LocalSide>("ours", "soft0", 0, ours, "MelonDMA soft provider, soft0 on " + our_ip,
                                        is_ssh() ? our_ip : "127.0.0.1");
    if (!is_ssh()) {
      Env o2 = base;
      write_file(dir_ + "/ours2.conf", "device soft2 " + o_.our2_addr + "\n");
      o2["MELON_SOFT_CONFIG"] = dir_ + "/ours2.conf";
      ours2_ = std::make_unique<LocalSide>("ours", "soft2", 0, o2, "soft2 on " + o_.our2_addr);
    }
  } else if (o_.provider == "mlx5") {
    std::string emud = o_.build + "/src/dext/emuhost/melon-emud";
    if (access(emud.c_str(), X_OK) != 0) return *why = "no melon-emud at " + emud, false;
    emud_sock_ = dir_ + "/mlx5_0.sock";
    std::string wire = is_ssh() ? o_.our_ip : o_.emud_addr;
    emud_ = spawn({emud, "--socket", emud_sock_, "--wire", wire, "--diagnostics"}, {}, emud_log(), "melon-emud");
    double t0 = now_s();
    struct stat st {};
    while (stat(emud_sock_.c_str(), &st) != 0) {
      if (!alive(emud_) || now_s() - t0 > 30) {
        std::string log = read_file(emud_log());
        return *why = "melon-emud did not come up: " + log, false;
      }
      usleep(50000);
    }
    write_file(dir_ + "/ours.conf", "");  // no soft devices on our side: mlx5_0 only
    ours["MELON_SOFT_CONFIG"] = dir_ + "/ours.conf";
    ours["MELON_EMUD_SOCKET"] = emud_sock_;
    ours_ = std::make_unique<LocalSide>("ours", "mlx5_0", 0, ours,
                                        "MelonDMA mlx5 provider, mlx5_0 on melon-emud (wire " + wire + ")",
                                        is_ssh() ? our_ip : "127.0.0.1");
  } else {
    return *why = "unknown provider " + o_.provider + " (soft, mlx5)", false;
  }
  if (o_.peer == "local") {
    Env peer = base;
    write_file(dir_ + "/peer.conf", "device soft1 " + o_.peer_addr + "\n");
    peer["MELON_SOFT_CONFIG"] = dir_ + "/peer.conf";
    peer_ = std::make_unique<LocalSide>(
        "peer", "soft1", 0, peer, "second process on this host: MelonDMA soft provider, soft1 on " + o_.peer_addr);
    Env p2 = base;
    write_file(dir_ + "/peer2.conf", "device soft3 " + o_.peer2_addr + "\n");
    p2["MELON_SOFT_CONFIG"] = dir_ + "/peer2.conf";
    peer2_ = std::make_unique<LocalSide>("peer", "soft3", 0, p2, "soft3 on " + o_.peer2_addr);
  } else if (is_ssh()) {
    std::string t = o_.peer.substr(6), port;
    size_t colon = t.rfind(':');
    if (colon != std::string::npos && t.find(']') == std::string::npos)
      port = t.substr(colon + 1), t = t.substr(0, colon);
    if (t.empty()) t = o_.ssh;
    if (t.empty()) return *why = "--peer ssh:// names no host (or set SPARK_SSH)", false;
    if (o_.control_host.empty())
      return *why = "--control-host (SPARK_CONTROL_HOST): the peer's address for the tools' TCP rendezvous", false;
    if (o_.our_ip.empty()) return *why = "--our-ip (MAC_ROCE_IP): our RoCE address", false;
    peer_ = std::make_unique<SshSide>(o_, t, port);
  } else if (!is_linux_peer()) {
    return *why = "unknown peer " + o_.peer + " (local, linux-peer, ssh://user@host)", false;
  }
  return true;
}

int Target::stop_emud() {
  if (emud_.pid <= 0) return -1;
  kill(emud_.pid, SIGTERM);
  Done d = wait(emud_, 30);
  return d.rc;
}

void Target::down() {
  if (emud_.pid > 0) stop(emud_, SIGTERM);
  if (!dir_.empty()) {
    run({"rm", "-rf", dir_}, {}, "/dev/null", 10);
    dir_.clear();
  }
}

std::string Target::capture_filter() const {
  if (is_linux_peer()) return "";
  std::string a = is_ssh() ? o_.our_ip : (is_mlx5() ? o_.emud_addr : o_.our_addr);
  return "udp port 4791 and host " + a;
}

Done Target::peer_shell(const std::string& cmd, const std::string& log, double timeout_s) {
  if (!peer_) return Done{};
  Proc p = peer_->start(cmd, log, "peer shell");
  return wait(p, timeout_s);
}

std::string Target::metadata() {
  std::ostringstream m;
  m << "provider: " << o_.provider << "\n";
  m << "our side: " << (ours_ ? ours_->describe() : "-") << "\n";
  m << "peer: " << o_.peer;
  if (peer_) m << " (" << peer_->describe() << ")";
  if (is_linux_peer()) m << " (rxe in a qemu guest: tests/peer/gate.sh)";
  m << "\npath MTU: " << o_.mtu << "\n";
  return m.str();
}

}  // namespace melon::gate
