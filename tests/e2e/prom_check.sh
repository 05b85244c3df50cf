#!/bin/bash
# prom_check.sh FILE: check a Prometheus text exposition (format 0.0.4) the
# way a scraper reads it: HELP/TYPE lines, metric and label names, label
# value escapes, numeric values, TYPE before samples, one TYPE per family,
# counters named *_total, every name with the accumd_ prefix. Prints the
# first problem and exits 1.
exec awk '
function bad(msg) { printf "line %d: %s: %s\n", NR, msg, $0; err = 1; exit 1 }
BEGIN { name_re = "^[a-zA-Z_:][a-zA-Z0-9_:]*$" }
/^# HELP / {
    if ($3 !~ name_re) bad("bad metric name in HELP")
    if (help[$3]++) bad("second HELP for " $3)
    next
}
/^# TYPE / {
    if (NF != 4) bad("TYPE needs a name and a type")
    if ($3 !~ name_re) bad("bad metric name in TYPE")
    if ($4 !~ /^(counter|gauge|histogram|summary|untyped)$/) bad("unknown type " $4)
    if ($3 in type) bad("second TYPE for " $3)
    if (seen[$3]) bad("TYPE after samples of " $3)
    type[$3] = $4
    if ($4 == "counter" && $3 !~ /_total$/) bad("counter not named *_total")
    next
}
/^#/ { next }
/^[ \t]*$/ { bad("empty line") }
{
    line = $0
    if (match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*/) == 0) bad("no metric name")
    name = substr(line, 1, RLENGTH); rest = substr(line, RLENGTH + 1)
    if (substr(rest, 1, 1) == "{") {
        if (match(rest, /^\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\\\|\\"|\\n)*")*,?)?\}/) == 0)
            bad("bad label set")
        labels = substr(rest, 1, RLENGTH); rest = substr(rest, RLENGTH + 1)
    } else labels = ""
    if (rest !~ /^ [-+]?([0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|\.[0-9]+([eE][-+]?[0-9]+)?|NaN|[-+]?Inf)( [-0-9]+)?$/)
        bad("bad value")
    if (name !~ /^accumd_/) bad("name without the accumd_ prefix")
    if (!(name in type)) bad("sample before its TYPE")
    if (seen_series[name labels]++) bad("duplicate series")
    seen[name] = 1
    samples++
}
END { if (err) exit 1; if (samples == 0) { print "no samples"; exit 1 } }
' "$1"
