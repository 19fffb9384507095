#include "runtime/checkpoint/safetensors.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::train {
namespace {

using ::testing::HasSubstr;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

std::vector<ParamInfo> Params() {
  return {{.name = "wte", .shape = {4, 3}, .offset = 0, .weight_decay = true},
          {.name = "lnf.bias", .shape = {3}, .offset = 12},
          {.name = "layers.0.attn.wqkv", .shape = {3, 9}, .offset = 15, .weight_decay = true}};
}

TEST(SafetensorsTest, ExportImportRoundTrip) {
  TestDir dir;
  std::vector<float> data(42);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5f * static_cast<float>(i) - 3.0f;
  ASSERT_TRUE(ExportSafetensors(dir / "m.safetensors", Params(), data.data(),
                                {{"format", "pt"}, {"step", "12"}})
                  .ok());
  auto file = ReadSafetensors(dir / "m.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("step"), "12");
  ASSERT_EQ(file->tensors.size(), 3u);
  EXPECT_EQ(file->tensors.at("wte").shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(file->tensors.at("lnf.bias").data, (std::vector<float>{3.0f, 3.5f, 4.0f}));
  std::vector<float> back(42, 0.0f);
  ASSERT_TRUE(ImportSafetensors(dir / "m.safetensors", Params(), back.data()).ok());
  EXPECT_EQ(back, data);
}

TEST(SafetensorsTest, StandardLayout) {
  TestDir dir;
  std::vector<float> data(42, 1.0f);
  ASSERT_TRUE(ExportSafetensors(dir / "m.safetensors", Params(), data.data()).ok());
  const std::string bytes = ReadAll(dir / "m.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 42 * 4);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["wte"]["dtype"], "F32");
  EXPECT_EQ(header["wte"]["data_offsets"], nlohmann::json({0, 48}));
  EXPECT_EQ(header["lnf.bias"]["data_offsets"], nlohmann::json({48, 60}));
  EXPECT_EQ(header["layers.0.attn.wqkv"]["shape"], nlohmann::json({3, 9}));
  EXPECT_FALSE(header.contains("__metadata__"));
}

TEST(SafetensorsTest, RefusesDamagedOrMismatchedFiles) {
  TestDir dir;
  std::vector<float> data(42, 1.0f);
  ASSERT_TRUE(ExportSafetensors(dir / "m.safetensors", Params(), data.data()).ok());
  const std::string bytes = ReadAll(dir / "m.safetensors");

  WriteAll(dir / "short.safetensors", bytes.substr(0, bytes.size() - 4));
  auto r = ReadSafetensors(dir / "short.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("short.safetensors"));

  std::string bad_len = bytes;
  bad_len[7] = 0x7F;
  WriteAll(dir / "len.safetensors", bad_len);
  EXPECT_THAT(ReadSafetensors(dir / "len.safetensors").status().message(),
              HasSubstr("header length"));

  std::vector<float> wrong(42);
  auto params = Params();
  params[1].shape = {2};
  params[2].offset = 14;
  EXPECT_THAT(ImportSafetensors(dir / "m.safetensors", params, wrong.data()).message(),
              HasSubstr("lnf.bias has shape [3], the model needs [2]"));
  params = Params();
  params.pop_back();
  EXPECT_THAT(ImportSafetensors(dir / "m.safetensors", params, wrong.data()).message(),
              HasSubstr("not a model parameter"));

  const float x[2] = {1, 2};
  ASSERT_TRUE(WriteSafetensors(dir / "dup.safetensors", {{"a", {2}, x}, {"a", {2}, x}}).code() ==
              absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace furnace::train
