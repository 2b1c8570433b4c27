# Writes OUT: a header holding the file IN as a raw string literal.
file(READ "${IN}" CONTENT)
set(DELIM "rmscore_json")
file(WRITE "${OUT}.tmp"
  "// Generated from ${IN} at build time; do not edit.\n#pragma once\n"
  "namespace rmscore {\ninline constexpr const char kMetricsJson[] = R\"${DELIM}(${CONTENT})${DELIM}\";\n}\n")
file(RENAME "${OUT}.tmp" "${OUT}")
