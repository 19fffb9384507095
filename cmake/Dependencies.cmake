# All dependencies come from Debian packages (scripts/setup.sh installs them). The pitfalls behind
# these lines are in ../shared/research/deps-feasibility.md.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

# protobuf has no CMake config on Debian: the FindProtobuf module. Pin protoc to the system one.
set(Protobuf_PROTOC_EXECUTABLE /usr/bin/protoc CACHE FILEPATH "protoc matching libprotobuf")
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)                 # needs protobuf-compiler-grpc for its plugins
find_package(absl CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)             # 0.7: target is plain `yaml-cpp`
find_package(CLI11 CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(ZLIB REQUIRED)                       # crc32 of checkpoint shards
find_package(Gloo CONFIG REQUIRED)                 # un-namespaced target `gloo`
# prometheus-cpp (1.0.1): only prometheus-cpp::core (families, text serializer) is linked. Its
# config also looks for civetweb, zlib and curl for the pull and push parts: prometheus-cpp-dev
# depends on their -dev packages and on `civetweb`, whose presence makes civetweb's config load.
find_package(prometheus-cpp CONFIG REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# SentencePiece (libsentencepiece-dev): linked only into the module runtime/data loads with
# dlopen (runtime/data/sentencepiece_bridge.h says why). OpenSSL's libcrypto: SHA-256 of
# tokenizer models (already a dependency of gRPC; libssl-dev).
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
find_package(OpenSSL REQUIRED)
find_package(Python3 COMPONENTS Interpreter REQUIRED)

# civetweb's CMake config is broken on Debian: find the library directly.
find_path(CIVETWEB_INCLUDE_DIR CivetServer.h REQUIRED)
find_library(CIVETWEB_LIBRARY civetweb REQUIRED)
find_library(CIVETWEB_CPP_LIBRARY civetweb-cpp REQUIRED)
add_library(furnace_civetweb INTERFACE)
target_include_directories(furnace_civetweb SYSTEM INTERFACE ${CIVETWEB_INCLUDE_DIR})
target_link_libraries(furnace_civetweb INTERFACE
  ${CIVETWEB_CPP_LIBRARY} ${CIVETWEB_LIBRARY} Threads::Threads ${CMAKE_DL_LIBS})

if(FURNACE_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "FURNACE_ENABLE_CUDA=ON but no nvcc was found")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  # No CUDA library is loaded at exec: the CUDA runtime is linked statically (it opens the driver,
  # libcuda, on the first CUDA call), and cuBLAS and NCCL are opened on their first call
  # (kernels/cuda/lazy_library.h: kernels/cuda/cublas_library.cc, runtime/comm/nccl_library.cc),
  # so CPU and emulated-device processes start fast and run on hosts without the libraries. Only
  # the headers are needed here; the directories below are where those calls look last.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  add_library(furnace_nccl_headers INTERFACE)
  target_include_directories(furnace_nccl_headers SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_LIBRARY)
    get_filename_component(FURNACE_NCCL_LIBRARY_DIR ${NCCL_LIBRARY} DIRECTORY)
  else()
    set(FURNACE_NCCL_LIBRARY_DIR ${CUDAToolkit_LIBRARY_DIR})
  endif()
  message(STATUS "Furnace: CUDA components ON (sm_${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "Furnace: CUDA components OFF (no nvcc found)")
endif()
