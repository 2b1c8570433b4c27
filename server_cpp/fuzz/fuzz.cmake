# libFuzzer targets (included by ../CMakeLists.txt when RMSCORE_FUZZ=ON).
# Everything under test is compiled with coverage instrumentation and
# AddressSanitizer + UBSan; Debian's libprotobuf/libgrpc++ stay uninstrumented.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "RMSCORE_FUZZ needs clang++ (libFuzzer): configure with CMAKE_CXX_COMPILER=clang++")
endif()
set(FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g)

# Only the message code of the generated sources: the gRPC stubs are not reached.
add_library(rmscore_fuzz_core STATIC "${GEN_DIR}/rmscore/v1/reward.pb.cc" src/validation.cc)
target_include_directories(rmscore_fuzz_core PUBLIC src "${GEN_DIR}")
target_link_libraries(rmscore_fuzz_core PUBLIC gRPC::grpc++)
target_compile_options(rmscore_fuzz_core PRIVATE -fsanitize=fuzzer-no-link ${FUZZ_SAN})

add_executable(fuzz_cpp_validation fuzz/fuzz_validation.cc)
target_link_libraries(fuzz_cpp_validation PRIVATE rmscore_fuzz_core)
target_compile_options(fuzz_cpp_validation PRIVATE -Wall -Wextra -fsanitize=fuzzer ${FUZZ_SAN})
target_link_options(fuzz_cpp_validation PRIVATE -fsanitize=fuzzer ${FUZZ_SAN})
