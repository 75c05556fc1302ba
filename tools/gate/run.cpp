#include "run.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

extern char** environ;

namespace melon::gate {

double now_s() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  return bool(f);
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

Proc spawn(const std::vector<std::string>& argv, const Env& env, const std::string& log, const std::string& what) {
  Proc p;
  p.log = log;
  p.what = what;
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own group: a timeout kills the tool and whatever it started
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    dprintf(2, "melon-gate: cannot run %s: %m\n", a[0]);
    _exit(127);
  }
  if (fd >= 0) close(fd);
  if (pid > 0) setpgid(pid, pid);
  p.pid = pid;
  return p;
}

bool alive(const Proc& p) { return p.pid > 0 && waitpid(p.pid, nullptr, WNOHANG) == 0; }

Done wait(Proc& p, double timeout_s) {
  Done d;
  double t0 = now_s();
  if (p.pid <= 0) {
    d.rc = 127;
    return d;
  }
  int st = 0;
  for (;;) {
    pid_t r = waitpid(p.pid, &st, WNOHANG);
    if (r == p.pid) {
      d.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (now_s() - t0 > timeout_s) {
      kill(-p.pid, SIGKILL);
      waitpid(p.pid, &st, 0);
      d.rc = 124;
      break;
    }
    usleep(20000);
  }
  p.pid = -1;
  d.seconds = now_s() - t0;
  d.out = read_file(p.log);
  if (d.rc == 124) d.out += "\nmelon-gate: timed out after " + std::to_string(int(timeout_s)) + " s\n";
  return d;
}

Done run(const std::vector<std::string>& argv, const Env& env, const std::string& log, double timeout_s,
         const std::string& what) {
  Proc p = spawn(argv, env, log, what);
  return wait(p, timeout_s);
}

void stop(Proc& p, int sig) {
  if (p.pid <= 0) return;
  kill(-p.pid, sig);
  kill(p.pid, sig);
  int st;
  double t0 = now_s();
  while (waitpid(p.pid, &st, WNOHANG) == 0) {
    if (now_s() - t0 > 10) {
      kill(-p.pid, SIGKILL);
      waitpid(p.pid, &st, 0);
      break;
    }
    usleep(20000);
  }
  p.pid = -1;
}

int free_port() {
  // Bind port 0 and keep what the kernel picked (closed at once; the tool binds it next).
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t l = sizeof a;
  int port = 0;
  if (s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &l) == 0)
    port = ntohs(a.sin_port);
  if (s >= 0) close(s);
  return port ? port : 20000 + int(getpid() % 20000);
}

}  // namespace melon::gate
