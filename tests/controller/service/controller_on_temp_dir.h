// Test fixture: a Controller (no sockets) on a state directory of the running test's own, named
// after a prefix, the process and the test, empty at the start and removed at the end, with a
// FakeClock the test advances.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "controller/service/controller.h"
#include "gtest/gtest.h"
#include "runtime/base/clock.h"

namespace furnace::controller {

class ControllerOnTempDir : public ::testing::Test {
 protected:
  // Creates c_; `configure` adjusts the options (state dir and advertise address are set).
  void StartController(const std::string& prefix,
                       const std::function<void(ControllerOptions&)>& configure = nullptr) {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix + "-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    ControllerOptions o;
    o.state_dir = dir_.string();
    o.advertise_address = "127.0.0.1:1";
    if (configure) configure(o);
    auto c = Controller::Create(o, clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
  }
  void TearDown() override {
    c_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
  FakeClock clock_;  // outlives c_
  std::unique_ptr<Controller> c_;
};

}  // namespace furnace::controller
