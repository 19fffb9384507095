#!/usr/bin/env python3
"""The layering check on small made-up trees: each forbidden edge is reported, allowed ones not."""

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layering  # noqa: E402


class CheckLayeringTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="furnace_layering_")
        self.addCleanup(shutil.rmtree, self.root)
        # An allowed tree: each layer using what it may.
        self.write("runtime/base/status.h", "#pragma once\n")
        self.write("runtime/data/token_file.h", '#include "runtime/base/status.h"\n')
        self.write("runtime/model/gpt_moe.h", '#include "kernels/matmul.h"\n')
        self.write("runtime/train/trainer.h", '#include "runtime/model/gpt_moe.h"\n')
        self.write("kernels/include/kernels/matmul.h", "#include <cblas.h>\n")
        self.write("proto/furnace/v1/job.proto", 'syntax = "proto3";\n')
        self.write("worker/rank.cc", '#include "runtime/train/trainer.h"\n'
                   '#include "furnace/v1/job.pb.h"\n#include <grpcpp/grpcpp.h>\n')
        self.write("controller/service/controller.cc",
                   '#include "runtime/base/status.h"\n#include "furnace/v1/job.pb.h"\n')
        self.write("controller/cli/cmd_data.cc", '#include "runtime/data/token_file.h"\n')
        self.write("runtime/base/CMakeLists.txt", "add_library(furnace_base STATIC status.cc)\n")
        self.write("runtime/data/CMakeLists.txt",
                   "add_library(furnace_data STATIC a.cc)\n"
                   "target_link_libraries(furnace_data PUBLIC furnace_base\n"
                   "  PRIVATE $<$<BOOL:1>:x>)\n")
        self.write("runtime/model/CMakeLists.txt",
                   "add_library(furnace_model STATIC a.cc)\n"
                   "target_link_libraries(furnace_model PUBLIC furnace_base)\n")
        self.write("controller/cli/CMakeLists.txt",
                   "add_library(furnace_cli STATIC a.cc)\n"
                   "# target_link_libraries(furnace_cli PRIVATE furnace_model)\n"
                   "target_link_libraries(furnace_cli PUBLIC furnace_proto PRIVATE furnace_data)\n")
        self.write("proto/CMakeLists.txt",
                   "add_library(furnace_proto STATIC x)\n"
                   "target_link_libraries(furnace_proto PUBLIC protobuf::libprotobuf\n"
                   "  gRPC::grpc++)\n")

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)

    def problems(self):
        return check_layering.check(self.root)

    def assertOneProblem(self, *parts):
        problems = self.problems()
        self.assertEqual(len(problems), 1, "\n".join(problems))
        for part in parts:
            self.assertIn(part, problems[0])

    def test_allowed_tree_passes(self):
        self.assertEqual(self.problems(), [])

    def test_controller_including_the_model_names_file_and_line(self):
        self.write("controller/service/controller.cc", '#include "runtime/model/gpt_moe.h"\n')
        self.assertOneProblem("controller/service/controller.cc:3:", "controller -> runtime/model")

    def test_controller_may_not_use_what_the_cli_may(self):
        self.write("controller/service/controller.cc", '#include "runtime/data/token_file.h"\n')
        self.assertOneProblem("controller/service/controller.cc:3:", "controller -> runtime/data")

    def test_cli_including_the_training_loop(self):
        self.write("controller/cli/cmd_data.cc", '#include "runtime/train/trainer.h"\n')
        self.assertOneProblem("controller/cli/cmd_data.cc:2:", "controller/cli -> runtime/train")

    def test_controller_including_cuda_or_kernels(self):
        self.write("controller/service/controller.cc", "#include <cuda_runtime.h>\n")
        self.assertOneProblem("controller/service/controller.cc:3:", "controller -> ext:cuda")
        self.write("controller/cli/cmd_data.cc", '#include "kernels/matmul.h"\n')
        self.assertEqual(len(self.problems()), 2)

    def test_worker_and_controller_both_ways(self):
        self.write("controller/service/rank.h", "#pragma once\n")
        self.write("worker/rank.cc", '#include "controller/service/rank.h"\n')
        self.assertOneProblem("worker/rank.cc:4:", "worker -> controller")
        self.write("controller/cli/cmd_data.cc", '#include "../../worker/rank.cc"\n')
        self.assertEqual(len(self.problems()), 2)

    def test_runtime_using_protobuf_grpc_or_proto(self):
        self.write("runtime/data/token_file.h", '#include "google/protobuf/message.h"\n')
        self.assertOneProblem("runtime/data/token_file.h:2:", "runtime/data -> ext:protobuf")
        self.write("runtime/data/token_file.h", '#include "furnace/v1/job.pb.h"\n')
        self.write("runtime/data/token_file.h", "#include <grpcpp/grpcpp.h>\n")
        self.assertEqual(len(self.problems()), 3)

    def test_kernels_including_the_project(self):
        self.write("kernels/include/kernels/matmul.h", '#include "runtime/base/status.h"\n')
        self.assertOneProblem("kernels/include/kernels/matmul.h:2:", "kernels -> runtime/base")

    def test_transitive_link_is_reported_with_its_path(self):
        self.write("runtime/data/CMakeLists.txt",
                   "target_link_libraries(furnace_data PRIVATE furnace_model)\n")
        problems = self.problems()
        self.assertEqual(len(problems), 1, "\n".join(problems))
        self.assertIn("controller/cli/CMakeLists.txt:3:", problems[0])
        self.assertIn("furnace_cli links furnace_model (via furnace_data)", problems[0])

    def test_cuda_link_from_the_controller(self):
        self.write("controller/cli/CMakeLists.txt",
                   "if(FURNACE_ENABLE_CUDA)\n"
                   "  target_link_libraries(furnace_cli PRIVATE CUDA::cudart)\n"
                   "endif()\n")
        self.assertOneProblem("controller/cli/CMakeLists.txt:5:", "controller/cli -> ext:cuda",
                              "furnace_cli links CUDA::cudart")

    def test_cli_may_link_the_moe_schedules_but_not_the_dispatcher(self):
        self.write("runtime/moe/CMakeLists.txt",
                   "add_library(furnace_moe_schedule STATIC schedule.cc)\n"
                   "target_link_libraries(furnace_moe_schedule PUBLIC furnace_base)\n"
                   "add_library(furnace_moe STATIC dispatcher.cc)\n"
                   "target_link_libraries(furnace_moe PUBLIC furnace_moe_schedule)\n")
        self.write("runtime/moe/cost_model.h", '#include "runtime/base/status.h"\n')
        self.write("controller/cli/cmd_plan.cc", '#include "runtime/moe/cost_model.h"\n')
        self.write("controller/cli/CMakeLists.txt",
                   "target_link_libraries(furnace_cli PRIVATE furnace_moe_schedule)\n")
        self.assertEqual(self.problems(), [])
        self.write("controller/cli/CMakeLists.txt",
                   "target_link_libraries(furnace_cli PRIVATE furnace_moe)\n")
        self.assertOneProblem("controller/cli -> runtime/moe", "furnace_cli links furnace_moe",
                              "furnace_moe_schedule (pure)")

    def test_runtime_folder_cycle_names_each_edge(self):
        self.write("runtime/model/gpt_moe.h", '#include "runtime/train/trainer.h"\n')
        problems = self.problems()
        self.assertEqual(len(problems), 1, "\n".join(problems))
        self.assertIn("runtime/model -> runtime/train -> runtime/model", problems[0])
        self.assertIn("runtime/model/gpt_moe.h:2:", problems[0])
        self.assertIn("runtime/train/trainer.h:1:", problems[0])


if __name__ == "__main__":
    unittest.main()
