#!/usr/bin/env bash
# Prints the per-package times of one or more `go test` outputs (the "ok"/"FAIL" lines of
# `go tool task test 2>&1 | tee run.log`) side by side, one column per log, and each log's
# sum; F marks a package that failed. Usage: testtimes.sh before.log [after.log …]
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 run.log [run.log …]" >&2; exit 2; }
awk '
FNR == 1 { f++ }
($1 == "ok" || $1 == "FAIL") && $3 ~ /^[0-9.]+s$/ {
  p = $2; sub("^github.com/lock-sensors/lock-sensors/?", "", p); if (p == "") p = "."
  t = $3; sub("s$", "", t)
  v[f, p] = t + 0; sum[f] += t
  if (!(p in seen)) { seen[p] = 1; order[++n] = p }
  if ($1 == "FAIL") failed[f, p] = "F"
}
END {
  for (i = 1; i <= n; i++) {
    p = order[i]; line = sprintf("%-24s", p)
    for (j = 1; j <= f; j++) line = line sprintf(" %9.3f%1s", v[j, p], failed[j, p])
    print line
  }
  line = sprintf("%-24s", "sum")
  for (j = 1; j <= f; j++) line = line sprintf(" %9.3f ", sum[j])
  print line
}' "$@"
