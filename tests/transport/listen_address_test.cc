#include "transport/listen_address.h"

#include <gtest/gtest.h>

namespace furnace::transport {
namespace {

TEST(IsLoopbackAddress, LoopbackHostsAndUnixSockets) {
  for (const char* a : {"127.0.0.1:7070", "127.1.2.3:0", "localhost:7070", "[::1]:7070",
                        "ipv4:127.0.0.1:5555", "ipv6:[::1]:5555", "unix:/tmp/furnace.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
}

TEST(IsLoopbackAddress, EverythingElseIsNot) {
  for (const char* a : {"0.0.0.0:0", "[::]:7070", "10.0.0.5:7070", "controller.example:7070",
                        "128.0.0.1:1", "[::1:7070", "", "ipv4:192.168.1.2:80",
                        // gRPC's address lists: loopback only if every address is; a list is
                        // not taken apart here, so it is never loopback.
                        "ipv6:[::1]:7000,[2001:db8::7]:7000", "ipv4:127.0.0.1:1,10.0.0.5:1",
                        "ipv4:127.0.0.1:1,127.0.0.2:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

// A listener on every interface: nobody can dial these (the controller needs --advertise).
TEST(IsWildcardAddress, TheUnspecifiedAddressInEachForm) {
  for (const char* a :
       {"0.0.0.0:7070", "[::]:7070", ":7070", "0:7070", "[::0]:7070", "[0:0:0:0:0:0:0:0]:1",
        "[::ffff:0.0.0.0]:7070", "ipv4:0.0.0.0:7070", "ipv6:[::]:7070", "0.0.0.0:0"}) {
    EXPECT_TRUE(IsWildcardAddress(a)) << a;
  }
}

TEST(IsWildcardAddress, AddressesSomeoneCanDialAreNot) {
  for (const char* a : {"127.0.0.1:7070", "10.0.0.5:7070", "[::1]:7070", "[2001:db8::7]:7070",
                        "ctl.example:7070", "localhost:7070", "unix:/tmp/furnace.sock",
                        "0.0.0.1:7070", "ipv4:0.0.0.0:1,10.0.0.5:1", "[::7070"}) {
    EXPECT_FALSE(IsWildcardAddress(a)) << a;
  }
}

}  // namespace
}  // namespace furnace::transport
