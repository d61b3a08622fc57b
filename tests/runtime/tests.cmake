# MPI tests of runtime/ (ctest label `mpi`): runtime/*_mpitest.cc run under mpirun at 2 ranks
# with comm's MPI test main (tests/comm/tests.cmake defines oases_mpitest_main).
#
# Included from tests/CMakeLists.txt, so CMAKE_CURRENT_SOURCE_DIR is tests/ here.

file(GLOB OASES_RUNTIME_MPI_TEST_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/*_mpitest.cc)
foreach(test_source ${OASES_RUNTIME_MPI_TEST_SOURCES})
  get_filename_component(test_name ${test_source} NAME_WE)
  add_executable(${test_name} ${test_source})
  target_include_directories(${test_name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                                                   ${CMAKE_CURRENT_SOURCE_DIR}/comm)
  target_link_libraries(${test_name} PRIVATE oases_mpitest_main oases_warnings)
  add_test(NAME runtime.${test_name}.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${OASES_MPIRUN_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 2
            $<TARGET_FILE:${test_name}>)
  set_tests_properties(runtime.${test_name}.np2 PROPERTIES
    LABELS "mpi;runtime" TIMEOUT ${OASES_MPI_TEST_TIMEOUT} PROCESSORS 2
    ENVIRONMENT_MODIFICATION ${OASES_MPI_ASAN_ENVIRONMENT})
endforeach()

# executor_test once more on asynchronous CPU streams (OASES_ASYNC_CPU_STREAMS=1): the tests
# that train through TrainingEngine then run the executor's compute, collectives and messages
# each on a thread of its own. Names end in .async_streams; label async.
gtest_discover_tests(executor_test DISCOVERY_MODE PRE_TEST TEST_SUFFIX .async_streams
  PROPERTIES LABELS async ENVIRONMENT OASES_ASYNC_CPU_STREAMS=1
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
