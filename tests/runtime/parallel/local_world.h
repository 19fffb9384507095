// Test helper: a "world" of ranks that are threads of this process, with comm::LocalGroup as the
// transport. Factory() is a train::CommFactory: the first member asking for a prefix creates the
// group, the others join it. Run() starts one thread per rank and returns each rank's Status.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/comm/local_communicator.h"
#include "runtime/train/rank_layout.h"

namespace furnace::testing {

class LocalWorld {
 public:
  train::CommFactory Factory() {
    return [this](const std::string& prefix, const std::string& name, int rank,
                  int size) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
      std::lock_guard<std::mutex> lock(mu_);
      std::unique_ptr<comm::LocalGroup>& group = groups_[prefix];
      if (group == nullptr) {
        comm::LocalGroupOptions options;
        options.name = name;
        options.timeout_s = 60;
        group = std::make_unique<comm::LocalGroup>(size, options);
      }
      std::unique_ptr<comm::Communicator> member = group->Member(rank);
      if (member == nullptr) {
        return absl::InternalError(absl::StrCat("rank ", rank, " of ", prefix, " taken twice"));
      }
      return member;
    };
  }

  static std::vector<absl::Status> Run(int world, const std::function<absl::Status(int)>& body) {
    std::vector<absl::Status> out(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { out[r] = body(r); });
    for (std::thread& t : threads) t.join();
    return out;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<comm::LocalGroup>> groups_;
};

}  // namespace furnace::testing
