# The fp64 schedule and pipeline equivalence tests once more on asynchronous CPU streams: every
# `oases` they launch (under mpirun, and the one-process reference) runs its executor's compute,
# collectives and messages each on a thread of its own (OASES_ASYNC_CPU_STREAMS=1, which
# mpirun passes on to the ranks), and must still equal the one-process run at 1e-10; a missing
# event shows up as a wrong result. Names end in .async_streams; label async.
#
# Included from tests/CMakeLists.txt, after the test executables are defined.

foreach(test_name schedules_test pipeline_train_test pipeline_composition_test
                  pipeline_zero_bubble_test pipeline_2bw_test zero_runs_test plans_test
                  context_parallel_runs_test layer_policies_runs_test)
  gtest_discover_tests(${test_name} DISCOVERY_MODE PRE_TEST TEST_SUFFIX .async_streams
    PROPERTIES LABELS async ENVIRONMENT OASES_ASYNC_CPU_STREAMS=1
               ENVIRONMENT_MODIFICATION ${OASES_MPI_ASAN_ENVIRONMENT}
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
endforeach()
