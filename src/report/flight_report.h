// Reading the flight records of a job (comm/flight_recorder.h) together: which rank the others
// wait for, and where the ranks of a group stopped agreeing. `oases flight RUN` prints it.
//
// From the records of every rank that wrote one (a rank may be missing: stopped, killed,
// hung where it could not write), in this order:
//   1. Disagreements. Every member of a group issues the same collectives in the same order, so
//      collective #k must be the same operation on each: the first #k of each group where the
//      members' kind, size, dtype or root differ, or the issuing instructions differ (a rank
//      that skipped or reordered a collective), is named with each side.
//   2. The ranks behind. For each operation a rank has waited in for at least min_wait_s (issued or started, not finished),
//      the members of its group that never issued it, or issued it much later than the waiter
//      (a rank that was stopped and resumed), are named, with what the waiters wait in and for
//      how long. A receive waits for the send of the same number from its peer.
//   3. Ranks that wait for each other in a cycle (each behind the other in some group): the
//      ranks disagree on the order of their collectives.
// The first finding is the headline: where to look first.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace oases::report {

struct FlightRecords {
  std::string directory;               // where they were read from
  std::vector<nlohmann::json> ranks;   // one record per rank that wrote one, by rank
  int world_size = 0;                  // from the records
};

// `path`: a run folder holding flight/, or the flight folder itself. UserError when it holds no
// rank_<R>.json, naming the folder and how records are made; a record that is not valid JSON
// of the expected form is a UserError naming the file.
FlightRecords read_flight_records(const std::string& path);

struct FlightDiagnosis {
  std::vector<std::string> findings;  // most telling first; empty: nobody waits for anybody
  std::vector<std::string> notes;     // the records themselves: who wrote one, why, when
};

// Waits shorter than `min_wait_s` are what a healthy job shows at any moment (a record taken by
// SIGUSR2): they make no finding.
FlightDiagnosis diagnose_flight(const FlightRecords& records, double min_wait_s = 1.0);

// The text `oases flight` prints: the notes, then the findings (or "no rank waits ...").
std::string format_flight_diagnosis(const FlightDiagnosis& diagnosis);

}  // namespace oases::report
