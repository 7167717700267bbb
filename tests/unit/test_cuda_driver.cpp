// Tests for the CUDA driver layer (runtime/cuda_driver.h, runtime/cuda_module.h). Without a driver
// they check that linac says so plainly; the GPU tests skip themselves there, loudly, and run on a
// GPU machine.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "linac/error.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_module.h"

using namespace linac;
using namespace linac::cuda;

namespace {

// Two hand-written kernels (PTX ISA 8.0, sm_80, so any driver from CUDA 12.0 on JITs them for the
// device at hand):
//   store_tid:       out[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x
//   smem_roundtrip:  goes through dynamic shared memory past the first 48 KiB, which needs the
//                    opt-in of set_max_dynamic_shared: out[tid] = tid + 7
const char* const kTestPtx = R"(
.version 8.0
.target sm_80
.address_size 64

.visible .entry store_tid(
	.param .u64 out_param
)
{
	.reg .b32 	%r<5>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [out_param];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mad.lo.s32 	%r4, %r2, %r3, %r1;
	mul.wide.u32 	%rd3, %r4, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r1;
	ret;
}

.extern .shared .align 16 .b8 dyn_smem[];
.visible .entry smem_roundtrip(
	.param .u64 out_param
)
{
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<6>;

	ld.param.u64 	%rd1, [out_param];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	add.s32 	%r2, %r1, 7;
	mov.u32 	%r3, dyn_smem;
	shl.b32 	%r4, %r1, 2;
	add.s32 	%r5, %r3, %r4;
	st.shared.u32 	[%r5+49152], %r2;
	bar.sync 	0;
	ld.shared.u32 	%r2, [%r5+49152];
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r2;
	ret;
}
)";

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_SUITE("cuda_driver") {
  // ---------------------------------------------------------------------------------------------
  // Without a GPU (these hold on every machine)

  TEST_CASE("driver_available agrees with Driver::get and gives a reason when false") {
    std::string why;
    bool available = driver_available(&why);
    if (available) {
      CHECK_NOTHROW(Driver::get());
      CHECK(why.empty());
      return;
    }
    CHECK_FALSE(why.empty());
    CHECK(contains(why, "--device cpu"));
    CHECK(driver_available(nullptr) == false);  // no crash without a reason pointer
  }

  TEST_CASE("without a driver Driver::get throws a UserError pointing at --device cpu, every time") {
    if (driver_available()) {
      MESSAGE("a CUDA driver is present: the no-driver path is not exercised here");
      return;
    }
    for (int i = 0; i < 2; ++i) {  // the remembered failure, not a retry, answers the second call
      try {
        Driver::get();
        FAIL("Driver::get() returned without a driver");
      } catch (const UserError& e) {
        std::string msg = e.what();
        CHECK(contains(msg, "--device cpu"));
        CHECK((contains(msg, "libcuda.so.1") || contains(msg, "CUDA")));
      }
    }
    // Everything that needs the device says the same, and nothing crashes.
    CHECK_THROWS_AS(device_info(), UserError);
    CHECK_THROWS_AS(DeviceBuffer(16), UserError);
    CHECK_THROWS_AS(synchronize(), UserError);
    CHECK_THROWS_AS(EventTimer(), UserError);
    CHECK_THROWS_AS(link_ptx(kTestPtx, "store_tid"), UserError);
  }

  TEST_CASE("an empty DeviceBuffer needs no driver") {
    DeviceBuffer b;
    CHECK(b.bytes() == 0);
    CHECK(b.ptr() == 0);
    DeviceBuffer zero(0);
    CHECK(zero.ptr() == 0);
    zero.fill_bytes(0xff);  // no-ops on an empty buffer
    zero.copy_from_host(nullptr, 0);
    CHECK_THROWS_AS(zero.copy_from_host("x", 1), InternalError);  // larger than the buffer
  }

  // ---------------------------------------------------------------------------------------------
  // The ptxas log parser

  TEST_CASE("parse_ptxas_info_log: ptxas -v output with several functions") {
    const std::string log =
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'attn_fwd' for 'sm_90'\n"
        "ptxas info    : Function properties for attn_fwd\n"
        "    40 bytes stack frame, 36 bytes spill stores, 44 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 360 bytes cmem[0]\n"
        "ptxas info    : Compile time = 13.163 ms\n"
        "ptxas info    : Compiling entry function 'store_tid' for 'sm_90'\n"
        "ptxas info    : Function properties for store_tid\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 10 registers, used 0 barriers\n";
    auto fns = parse_ptxas_info_log(log);
    REQUIRE(fns.size() == 2);
    CHECK(fns[0].name == "attn_fwd");
    CHECK(fns[0].stack_frame_bytes == 40);
    CHECK(fns[0].spill_store_bytes == 36);
    CHECK(fns[0].spill_load_bytes == 44);
    CHECK(fns[0].registers == 255);
    CHECK(fns[1].name == "store_tid");
    CHECK(fns[1].spill_store_bytes == 0);
    CHECK(fns[1].spill_load_bytes == 0);
    CHECK(fns[1].registers == 10);
  }

  TEST_CASE("parse_ptxas_info_log: the driver linker's verbose log, fresh and from its JIT cache") {
    // Both as cuLinkComplete wrote them on an H200 (driver 580, CUDA 13.0) for the kernels of this
    // file: ptxas's lines, with "ptxas         ." continuation lines, then the linker's summary.
    const std::string fresh =
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'smem_roundtrip' for 'sm_90a'\n"
        "ptxas info    : Function properties for smem_roundtrip\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 12 registers, used 1 barriers\n"
        "ptxas info    : Compile time = 18.089 ms\n"
        "ptxas info    : Compiling entry function 'store_tid' for 'sm_90a'\n"
        "ptxas info    : Function properties for store_tid\n"
        "ptxas         .     24 bytes stack frame, 16 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Used 10 registers, used 0 barriers\n"
        "ptxas info    : Compile time = 1.575 ms\n"
        "info    : 0 bytes gmem\n"
        "info    : Function properties for 'store_tid':\n"
        "info    : used 10 registers, used 0 barriers, 24 stack, 0 bytes smem, 536 bytes cmem[0], 24 bytes lmem\n"
        "info    : Function properties for 'smem_roundtrip':\n"
        "info    : used 12 registers, used 1 barriers, 0 stack, 1024 bytes smem, 536 bytes cmem[0], 0 bytes lmem";
    auto fns = parse_ptxas_info_log(fresh);
    REQUIRE(fns.size() == 2);
    CHECK(fns[0].name == "smem_roundtrip");
    CHECK(fns[0].registers == 12);
    CHECK(fns[0].spill_store_bytes == 0);
    CHECK(fns[0].local_bytes == 0);
    CHECK(fns[1].name == "store_tid");
    CHECK(fns[1].stack_frame_bytes == 24);
    CHECK(fns[1].spill_store_bytes == 16);
    CHECK(fns[1].spill_load_bytes == 8);
    CHECK(fns[1].registers == 10);
    CHECK(fns[1].local_bytes == 24);

    // A link answered from the driver's JIT cache replays only the linker's summary: no spill counts.
    const std::string cached =
        "info    : 0 bytes gmem\n"
        "info    : Function properties for 'store_tid':\n"
        "info    : used 10 registers, used 0 barriers, 0 stack, 0 bytes smem, 536 bytes cmem[0], 0 bytes lmem\n";
    auto c = parse_ptxas_info_log(cached);
    REQUIRE(c.size() == 1);
    CHECK(c[0].name == "store_tid");
    CHECK(c[0].registers == 10);
    CHECK(c[0].local_bytes == 0);
    CHECK_FALSE(c[0].spill_store_bytes.has_value());
    CHECK_FALSE(c[0].spill_load_bytes.has_value());
  }

  TEST_CASE("parse_ptxas_info_log: a quoted name, a CRLF log") {
    auto quoted = parse_ptxas_info_log(
        "info    : Function properties for 'k':\r\n"
        "info    : 0 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads\r\n"
        "info    : Used 32 registers\r\n");
    REQUIRE(quoted.size() == 1);
    CHECK(quoted[0].name == "k");
    CHECK(quoted[0].spill_store_bytes == 12);
    CHECK(quoted[0].registers == 32);
  }

  TEST_CASE("parse_ptxas_info_log: logs without resource lines, a function met twice") {
    CHECK(parse_ptxas_info_log("").empty());
    CHECK(parse_ptxas_info_log("info    : 16 bytes gmem\n").empty());  // no function named
    CHECK(parse_ptxas_info_log("ptxas fatal   : Unresolved extern function 'foo'\n").empty());

    auto twice = parse_ptxas_info_log(
        "ptxas info    : Function properties for k\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n");
    REQUIRE(twice.size() == 1);
    CHECK(twice[0].spill_store_bytes == 4);

    // Stats before any header belong to an unnamed function rather than being lost.
    auto unnamed = parse_ptxas_info_log("    0 bytes stack frame, 4 bytes spill stores, 2 bytes spill loads\n");
    REQUIRE(unnamed.size() == 1);
    CHECK(unnamed[0].name.empty());
    CHECK(unnamed[0].spill_load_bytes == 2);
  }

  // ---------------------------------------------------------------------------------------------
  // On a GPU: without one these cases are reported as skipped (doctest's count), never as passed.

  bool no_gpu() {
    static const bool none = !driver_available();
    return none;
  }

  TEST_CASE("gpu: device info is plausible" * doctest::skip(no_gpu())) {
    const DeviceInfo& d = device_info();
    MESSAGE("device: " << d.summary() << ", driver " << Driver::get().version());
    CHECK_FALSE(d.name.empty());
    CHECK(d.cc_major >= 7);
    CHECK(d.sm_count > 0);
    CHECK(d.warp_size == 32);
    CHECK(d.max_threads_per_block >= 1024);
    CHECK(d.max_shared_per_block == 48 * 1024);
    CHECK(d.max_shared_per_block_optin >= d.max_shared_per_block);
    CHECK(d.regs_per_block > 0);
    CHECK(d.regs_per_sm > 0);
    CHECK(d.l2_bytes > 0);
    CHECK(d.total_memory > (1ull << 30));
    // linac bench's HBM floor: from 0.1 to 10 TB/s on any GPU linac targets (4.8 TB/s on an H200).
    MESSAGE("peak memory bandwidth: " << d.peak_memory_bytes_per_s() / 1e9 << " GB/s");
    CHECK(d.peak_memory_bytes_per_s() > 1e11);
    CHECK(d.peak_memory_bytes_per_s() < 1e13);
    MemInfo m = mem_info();
    CHECK(m.free_bytes > 0);
    CHECK(m.free_bytes <= m.total_bytes);
  }

  TEST_CASE("gpu: allocate, fill and copy round trip" * doctest::skip(no_gpu())) {
    std::vector<std::uint8_t> host(1 << 20);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint8_t>(i * 131 + 7);
    DeviceBuffer buf(host.size());
    CHECK(buf.bytes() == host.size());
    CHECK(buf.ptr() != 0);
    buf.copy_from_host(host.data(), host.size());
    std::vector<std::uint8_t> back(host.size(), 0);
    buf.copy_to_host(back.data(), back.size());
    CHECK(back == host);

    buf.fill_bytes(0xab);
    buf.copy_to_host(back.data(), back.size());
    CHECK(back == std::vector<std::uint8_t>(host.size(), 0xab));

    DeviceBuffer moved = std::move(buf);
    CHECK(buf.ptr() == 0);  // NOLINT(bugprone-use-after-move): the moved-from state is the point
    CHECK(moved.bytes() == host.size());
    CHECK_THROWS_AS(moved.copy_to_host(back.data(), back.size() + 1), InternalError);
  }

  TEST_CASE("gpu: another thread gets the context too" * doctest::skip(no_gpu())) {
    // A CUDA context is current per thread; without Driver::get() binding it, the copy below would
    // fail with CUDA_ERROR_INVALID_CONTEXT.
    std::vector<std::uint32_t> back(256, 0);
    std::string error;
    std::thread worker([&] {
      try {
        std::vector<std::uint32_t> host(256);
        for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint32_t>(i * i);
        DeviceBuffer buf(host.size() * sizeof(std::uint32_t));
        buf.copy_from_host(host.data(), buf.bytes());
        buf.copy_to_host(back.data(), buf.bytes());
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    worker.join();
    CHECK(error.empty());
    for (size_t i = 0; i < back.size(); ++i) CHECK(back[i] == i * i);
  }

  TEST_CASE("gpu: an allocation larger than the device is a UserError naming the size" * doctest::skip(no_gpu())) {
    try {
      DeviceBuffer huge(std::size_t{1} << 50);  // 1 PiB
      FAIL("a 1 PiB allocation succeeded");
    } catch (const UserError& e) {
      CHECK(contains(e.what(), "out of GPU memory"));
      CHECK(contains(e.what(), "1.00 PiB"));
    }
  }

  TEST_CASE("gpu: link a PTX kernel, launch it, read the result and its attributes" * doctest::skip(no_gpu())) {
    LinkedModule m = link_ptx(kTestPtx, "store_tid");
    CHECK(m.function() != Function::none);
    CHECK(m.kernel_name() == "store_tid");
    CHECK_FALSE(m.cubin().empty());
    CHECK(m.num_regs() > 0);
    CHECK(m.attributes().local_bytes == 0);
    CHECK(m.attributes().max_threads_per_block >= 64);
    CHECK(m.attributes().ptx_version == 80);
    CHECK(m.attributes().binary_version == device_info().sm());
    MESSAGE("info log:\n" << m.info_log());
    if (m.spill_store_bytes()) CHECK(*m.spill_store_bytes() == 0);
    if (m.spill_load_bytes()) CHECK(*m.spill_load_bytes() == 0);

    constexpr unsigned kBlocks = 3, kThreads = 64;
    DeviceBuffer out(kBlocks * kThreads * sizeof(std::uint32_t));
    out.fill_bytes(0xff);
    DevicePtr p = out.ptr();
    void* params[] = {&p};
    EventTimer timer;
    timer.start();
    launch(m.function(), {kBlocks, 1, 1}, {kThreads, 1, 1}, 0, params);
    timer.stop();
    synchronize();
    CHECK(timer.elapsed_ms() >= 0.0f);
    std::vector<std::uint32_t> host(kBlocks * kThreads);
    out.copy_to_host(host.data(), host.size() * sizeof(std::uint32_t));
    for (unsigned i = 0; i < host.size(); ++i) CHECK(host[i] == i % kThreads);

    // The same cubin loads again, as from the kernel cache, and runs the same.
    LinkedModule again = load_cubin(m.cubin(), "store_tid", m.info_log());
    CHECK(again.num_regs() == m.num_regs());
    CHECK(again.spill_store_bytes() == m.spill_store_bytes());
    out.fill_bytes(0);
    launch(again.function(), {kBlocks, 1, 1}, {kThreads, 1, 1}, 0, params);
    out.copy_to_host(host.data(), host.size() * sizeof(std::uint32_t));
    for (unsigned i = 0; i < host.size(); ++i) CHECK(host[i] == i % kThreads);
  }

  TEST_CASE("gpu: dynamic shared memory above 48 KiB after opting in" * doctest::skip(no_gpu())) {
    const DeviceInfo& d = device_info();
    constexpr unsigned kThreads = 128;
    const int shared = 48 * 1024 + kThreads * 4;
    REQUIRE(d.max_shared_per_block_optin >= shared);
    LinkedModule m = link_ptx(kTestPtx, "smem_roundtrip");
    CHECK_THROWS_AS(set_max_dynamic_shared(m.function(), d.max_shared_per_block_optin + 1), UserError);
    set_max_dynamic_shared(m.function(), shared);
    DeviceBuffer out(kThreads * sizeof(std::uint32_t));
    DevicePtr p = out.ptr();
    void* params[] = {&p};
    launch(m.function(), {1, 1, 1}, {kThreads, 1, 1}, shared, params);
    std::vector<std::uint32_t> host(kThreads);
    out.copy_to_host(host.data(), host.size() * sizeof(std::uint32_t));
    for (unsigned i = 0; i < kThreads; ++i) CHECK(host[i] == i + 7);
  }

  TEST_CASE("gpu: mistakes are errors, not crashes" * doctest::skip(no_gpu())) {
    // PTX ptxas rejects: a UserError carrying the linker's error log.
    std::string bad = std::string(kTestPtx) + "\n.visible .entry broken() { not_an_instruction; }\n";
    try {
      link_ptx(bad, "broken");
      FAIL("bad PTX linked");
    } catch (const UserError& e) {
      MESSAGE("bad PTX: " << std::string(e.what()));
      CHECK(contains(e.what(), "ptxas rejected the PTX of kernel 'broken'"));
      CHECK(contains(e.what(), "not_an_instruction"));
    }
    // An entry the module does not have: linac asked for the wrong name.
    CHECK_THROWS_AS(link_ptx(kTestPtx, "no_such_kernel"), InternalError);
    // A cubin that is not one.
    CHECK_THROWS_AS(load_cubin(std::vector<std::uint8_t>(64, 0x42), "store_tid"), UserError);

    LinkedModule m = link_ptx(kTestPtx, "store_tid");
    DeviceBuffer out(64 * sizeof(std::uint32_t));
    DevicePtr p = out.ptr();
    void* params[] = {&p};
    // A grid beyond the device's limits is the user's problem size.
    CHECK_THROWS_AS(launch(m.function(), {1, 70000, 1}, {64, 1, 1}, 0, params), UserError);
    // Block shapes are linac's own.
    CHECK_THROWS_AS(launch(m.function(), {1, 1, 1}, {4096, 1, 1}, 0, params), InternalError);
    CHECK_THROWS_AS(launch(m.function(), {0, 1, 1}, {64, 1, 1}, 0, params), InternalError);
    EventTimer t;
    CHECK_THROWS_AS(t.elapsed_ms(), InternalError);
    synchronize();  // the context is still healthy
  }
}
