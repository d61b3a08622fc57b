// Several hosts on one machine, for tests that launch one MPI job across them.
//
// Each host is a Linux network namespace with one interface (eth0, address 10.77.0.<k>/24) whose
// other end sits on a bridge in a namespace of the set's own; a process entering a host also
// gets a UTS namespace of its own whose host name is the host's name (a, b, c, ...). Jobs start
// the way they do on real machines: mpirun runs on host a with a hostfile naming the hosts and
// their slots, and starts its daemon on every other host through an rsh agent, a script that
// enters that host's namespaces where ssh would log in. Open MPI is told to use only the hosts'
// subnet (both its out-of-band channel and its TCP transport), so ranks on one host talk over
// shared memory and ranks on different hosts over TCP through the bridge, optionally capped
// by `tc` on each host's interface.
//
// Every namespace belongs to this set alone (names carry this process's id; a process holds
// one set at a time), so sets of concurrent tests do not meet even though they use the same
// addresses; the destructor removes them, and a new set removes the namespaces that sets of
// processes no longer alive left behind. The hosts share this machine's file system and cores.
//
// Needs root, `ip` and `tc` (iproute2), `nsenter` and `unshare` (util-linux); when any is
// missing, unavailable() says so and the test skips.
#pragma once

#include "support/command.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace oases::testing {

class NamespaceHosts {
 public:
  // `count` hosts (1 to 26, named a, b, ...) of `slots` ranks each. `rate_mbit` > 0 caps what
  // each host sends (a token bucket on its interface, as a NIC of that speed). The hostfile and
  // the rsh agent are written to `folder`.
  NamespaceHosts(const std::filesystem::path& folder, int count, int slots, int rate_mbit = 0)
      : prefix_("oases-hosts-" + std::to_string(getpid()) + "-"), folder_(folder) {
    if (count < 1 || count > 26 || slots < 1)
      throw std::invalid_argument("NamespaceHosts: 1 to 26 hosts of at least one slot each");
    if (geteuid() != 0) {
      unavailable_ = "network namespaces need root";
      return;
    }
    const CommandResult tools =
        run_command("command -v ip && command -v tc && command -v nsenter && command -v unshare");
    if (tools.exit_code != 0) {
      unavailable_ = "ip, tc (iproute2), nsenter and unshare (util-linux) are needed:\n" + tools.output;
      return;
    }
    remove_leftover_namespaces();
    for (int k = 0; k < count; ++k) hosts_.push_back(std::string(1, static_cast<char>('a' + k)));

    std::string script = "set -e\nip netns add " + bridge_namespace() + "\n" +
                         "ip -n " + bridge_namespace() + " link add br0 type bridge\n" +
                         "ip -n " + bridge_namespace() + " link set br0 up\n";
    for (int k = 0; k < count; ++k) {
      const std::string ns = host_namespace(hosts_[static_cast<std::size_t>(k)]);
      const std::string port = "p" + std::to_string(k);
      script += "ip netns add " + ns + "\n" +
                "ip -n " + bridge_namespace() + " link add " + port +
                " type veth peer name eth0 netns " + ns + "\n" +
                "ip -n " + bridge_namespace() + " link set " + port + " master br0 up\n" +
                "ip -n " + ns + " link set lo up\n" +
                "ip -n " + ns + " addr add " + address(k) + "/24 dev eth0\n" +
                "ip -n " + ns + " link set eth0 up\n";
      if (rate_mbit > 0) {
        // A bucket of 2 ms at the rate (at least 128 KiB), so that bursts cannot beat the cap.
        const std::int64_t burst = std::max<std::int64_t>(131072, std::int64_t{rate_mbit} * 1000 * 1000 / 8 / 500);
        script += "tc -n " + ns + " qdisc replace dev eth0 root tbf rate " +
                  std::to_string(rate_mbit) + "mbit burst " + std::to_string(burst) +
                  " latency 100ms\n";
      }
    }
    made_ = true;
    const CommandResult made = run_command("sh -c '" + script + "'");
    if (made.exit_code != 0) {
      unavailable_ = "could not create the hosts' network namespaces:\n" + made.output;
      remove_namespaces();
      return;
    }

    // Entering a host must give its host name (a UTS namespace needs CAP_SYS_ADMIN, which
    // some containers withhold even from root).
    const CommandResult entered = run_command(enter(hosts_.front()) + "hostname");
    if (entered.exit_code != 0 || entered.output != hosts_.front() + "\n") {
      unavailable_ = "could not enter host " + hosts_.front() + " with its own host name:\n" +
                     entered.output;
      remove_namespaces();
      return;
    }

    std::ofstream hostfile(hostfile_path());
    for (const std::string& host : hosts_) hostfile << host << " slots=" << slots << "\n";
    std::ofstream agent(agent_path());
    agent << "#!/bin/sh\n"
             "# Open MPI's rsh agent for these hosts: called as `agent HOST COMMAND...`, it enters\n"
             "# HOST's network namespace and a UTS namespace named HOST, and runs COMMAND as a\n"
             "# remote shell would (its words joined by spaces).\n"
             "host=$1; shift\n"
             "case $host in\n";
    for (const std::string& host : hosts_) agent << "  " << host << ") ;;\n";
    agent << "  *) echo \"rsh agent: no host $host here\" >&2; exit 255 ;;\n"
             "esac\n"
             "exec nsenter --net=/run/netns/" << prefix_ << "$host -- unshare --uts -- "
             "sh -c 'hostname \"$1\" && shift && exec sh -c \"$*\"' sh \"$host\" \"$@\"\n";
    agent.close();
    std::filesystem::permissions(agent_path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add);
  }

  ~NamespaceHosts() { remove_namespaces(); }
  NamespaceHosts(const NamespaceHosts&) = delete;
  NamespaceHosts& operator=(const NamespaceHosts&) = delete;

  // Empty when the hosts are up; otherwise why they are not.
  const std::string& unavailable() const { return unavailable_; }
  // The hosts' names (also their host names and their names in the hostfile), in order.
  const std::vector<std::string>& names() const { return hosts_; }
  std::filesystem::path hostfile_path() const { return folder_ / "hostfile"; }

  // The start of a command line that runs `mpirun ... -np ranks` on host a over every host,
  // ranks placed as the hostfile's slots say (host a's first); the program and its arguments
  // follow, as after tests' mpirun_prefix().
  std::string mpirun_prefix(int ranks) const {
    return enter(hosts_.front()) + "mpirun --allow-run-as-root --hostfile " +
           hostfile_path().string() + " --mca plm_rsh_agent " + agent_path().string() +
           " --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24"
           " --mca btl self,vader,tcp -np " + std::to_string(ranks) + " ";
  }

  // The start of a command line that runs a program on `host` (as its rsh agent would).
  std::string enter(const std::string& host) const {
    return "nsenter --net=/run/netns/" + host_namespace(host) +
           " -- unshare --uts -- sh -c 'hostname \"$0\" && exec \"$@\"' " + host + " ";
  }

  // Bytes `host`'s interface has sent since the hosts were made; -1 when it cannot be read.
  std::int64_t bytes_sent(const std::string& host) const {
    const CommandResult r = run_command("ip netns exec " + host_namespace(host) +
                                        " cat /sys/class/net/eth0/statistics/tx_bytes");
    try {
      return r.exit_code == 0 ? std::stoll(r.output) : -1;
    } catch (const std::exception&) {
      return -1;
    }
  }

 private:
  std::string bridge_namespace() const { return prefix_ + "net"; }
  std::string host_namespace(const std::string& host) const { return prefix_ + host; }
  static std::string address(int k) { return "10.77.0." + std::to_string(k + 1); }
  std::filesystem::path agent_path() const { return folder_ / "rsh-agent"; }

  void remove_namespaces() {
    if (!made_) return;
    std::string script;
    for (const std::string& host : hosts_) script += "ip netns del " + host_namespace(host) + "; ";
    run_command(script + "ip netns del " + bridge_namespace());
  }

  // Namespaces named by this class for a process that no longer runs (a test killed before
  // its destructor ran), or for an earlier process with this one's id.
  static void remove_leftover_namespaces() {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator("/run/netns", error)) {
      const std::string name = entry.path().filename().string();
      const std::string tag = "oases-hosts-";
      if (name.rfind(tag, 0) != 0) continue;
      const std::size_t dash = name.find('-', tag.size());
      if (dash == std::string::npos) continue;
      const std::string pid = name.substr(tag.size(), dash - tag.size());
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      const auto owner = static_cast<pid_t>(std::stol(pid));
      if (owner != getpid() && (kill(owner, 0) == 0 || errno == EPERM)) continue;
      run_command("ip netns del " + name);
    }
  }

  std::string prefix_;  // oases-hosts-<pid>-: this set's namespaces
  std::filesystem::path folder_;
  std::vector<std::string> hosts_;
  std::string unavailable_;
  bool made_ = false;  // namespaces were (perhaps partly) created
};

}  // namespace oases::testing
